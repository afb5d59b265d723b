"""KServe's own Python client (kserve.InferenceRESTClient, protocol v2)
against the real daemon, as a KServe user would call it: the health calls,
which read the Open Inference Protocol's bodies ({"live": true},
{"ready": true}), while serving and while draining; infer in JSON and in
the binary data extension, against the torch goldens; and a refusal, read
the way the client reads one (its exception carries attnd's "error").
tritonclient has its own suite, test_v2_client.py."""
import asyncio
import json
import signal
import socket
import threading

import httpx
import numpy as np
import pytest
import requests
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput

import support
from support import golden_mask, rel_err, v2_ranked

GOLDENS = {g["name"]: (g, m) for g, m in support.load_goldens()}
TIMEOUT = 60


def client():
    return InferenceRESTClient(RESTConfig(protocol="v2", timeout=TIMEOUT))


def run(coro):
    """One call's coroutine on a loop of its own (the client is asyncio only)."""
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def d(daemons, golden_config):
    return daemons(golden_config)


# ---------------------------------------------------------------- health

def test_health_while_serving(d):
    async def calls():
        c = client()
        try:
            got = [await c.is_server_live(d.url), await c.is_server_ready(d.url)]
            got += [await c.is_model_ready(d.url, name) for name in sorted(GOLDENS)]
            return got, await c.is_model_ready(d.url, "no_such_model")
        finally:
            await c.close()
    # `is True`: the client returns what the body says, not the status
    ready, unknown = run(calls())
    assert all(r is True for r in ready), ready
    assert unknown is False


# ---------------------------------------------------------------- infer

def request(name, s, binary):
    """The golden sequence s as the v2 ranks have it (B = 1; the mask,
    shared by every sequence, unbatched), inputs and outputs in JSON or in
    the binary data extension."""
    def tensor(n, a, dt):
        t = InferInput(n, list(a.shape), dt)
        t.set_data_from_numpy(np.ascontiguousarray(a), binary_data=binary)
        return t
    ins = [tensor("query", np.asarray([s["query"]], dtype=np.float32), "FP32")]
    for n in ("key", "value"):
        if s[n] is not None:
            ins.append(tensor(n, np.asarray([s[n]], dtype=np.float32), "FP32"))
    if s["key_padding_mask"] is not None:
        ins.append(tensor("key_padding_mask", np.asarray([s["key_padding_mask"]], dtype=np.bool_),
                          "BOOL"))
    am = golden_mask(s)
    if am is not None:
        ins.append(tensor("attn_mask", am if am.dtype == np.bool_ else am.astype(np.float32),
                          "BOOL" if am.dtype == np.bool_ else "FP32"))
    outs = [RequestedOutput("output", {"binary_data": binary})]
    if s["attention"] != "none":
        outs.append(RequestedOutput("attention", {"binary_data": binary}))
    return InferRequest(name, ins, request_id="kserve-%s" % name, request_outputs=outs,
                        parameters={"causal": bool(s["causal"]), "attention": s["attention"]})


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_infer_golden(d, name, binary):
    """Every golden sequence of the model: outputs (and attention when asked)
    within 1e-5 of torch's, in the ranks the model metadata declares."""
    g, _ = GOLDENS[name]

    async def calls():
        c = client()
        try:
            got = []
            for s in g["sequences"]:
                headers = {}
                res = await c.infer(d.url, request(name, s, binary), model_name=name,
                                    response_headers=headers)
                got.append((res, headers))
            return got
        finally:
            await c.close()
    for i, (s, (res, headers)) in enumerate(zip(g["sequences"], run(calls()))):
        assert res.model_name == name and res.id == "kserve-%s" % name, (i, res.model_name, res.id)
        # binary outputs come as bytes after the JSON, whose length this header gives
        assert ("inference-header-content-length" in headers) == binary, (i, headers)
        outs = {o.name: o for o in res.outputs}
        assert set(outs) == {"output"} | ({"attention"} if s["attention"] != "none" else set())
        out = outs["output"].as_numpy()
        assert out.dtype == np.float32
        assert rel_err(out, v2_ranked(s["output"])) <= 1e-5, i
        if s["attention"] != "none":
            att = outs["attention"].as_numpy()
            assert rel_err(att, v2_ranked(s["attn_weights"], s["attention"])) <= 1e-5, i


# ---------------------------------------------------------------- refusals

def raised(coro):
    """The httpx.HTTPStatusError the client raises for a refusal."""
    with pytest.raises(httpx.HTTPStatusError) as e:
        run(coro)
    return e.value


def test_refusal_read_as_the_client_reads_it(d):
    """The client puts a refusal's "error" (application/json) in its
    exception's message: attnd's sentence, naming the field, reaches the
    user as attnd wrote it."""
    name = "self_e64_h8"
    bad = np.zeros((1, 2, 63), dtype=np.float32)  # the model is 64 wide

    async def infer(model, binary):
        c = client()
        try:
            q = InferInput("query", list(bad.shape), "FP32")
            q.set_data_from_numpy(bad, binary_data=binary)
            return await c.infer(d.url, InferRequest(model, [q]), model_name=model)
        finally:
            await c.close()
    for binary in (False, True):
        e = raised(infer(name, binary))
        assert e.response.status_code == 400
        msg = e.response.json()["error"]
        assert "query" in msg and "64" in msg, msg
        assert str(e).startswith(msg + ", '400 Bad Request'"), str(e)
    e = raised(infer("no_such_model", False))
    assert e.response.status_code == 404
    assert str(e).startswith("unknown model 'no_such_model'"), str(e)


# ---------------------------------------------------------------- draining

BIG_E, BIG_H, ROWS = 512, 8, 2048 if support.sanitized_build() else 6144  # ~0.6 s each


def test_health_while_draining(fresh_daemons, tmp_path):
    """SIGTERM with requests in flight: on connections opened before it,
    is_server_live stays True, is_server_ready raises the 503 whose body says
    {"ready": false, "error": "draining"}, and is_model_ready is False (a
    503 {"name", "ready": false, "error"}); the requests in flight are all
    answered, and attnd exits 0."""
    big = support.Model.random("big", BIG_E, BIG_H, seed=5)
    big.save(tmp_path / "big.safetensors")
    d = fresh_daemons({"models": [big.config()], "workers": {"threads": 1},
                       "batching": {"max_batch_requests": 1},
                       "server": {"max_body_bytes": 64 << 20, "request_timeout_ms": 120000},
                       "limits": {"max_tokens_per_request": 16384}})
    q = np.random.default_rng(1).standard_normal((ROWS, BIG_E)).astype(np.float32)
    body = json.dumps({"query": support.b64_tensor(q)})
    answers = []
    senders = [threading.Thread(target=lambda: answers.append(
        requests.post(d.url + "/v1/attention", data=body, timeout=120).status_code))
        for _ in range(3)]

    async def calls():
        # three clients, each holding a connection opened while serving
        live, ready, model = client(), client(), client()
        raw = httpx.AsyncClient(timeout=TIMEOUT)
        try:
            assert await live.is_server_live(d.url) is True
            assert await ready.is_server_ready(d.url) is True
            assert await model.is_model_ready(d.url, "big") is True
            assert (await raw.get(d.url + "/v2/models/big/ready")).json() == {
                "name": "big", "ready": True}
            for t in senders:
                t.start()
            assert support.wait_until(lambda: queue_depth(d) >= 1, 20), "nothing queued"
            d.send_signal(signal.SIGTERM)
            # draining once the listening socket is closed (the state is set first)
            assert support.wait_until(lambda: refused(d.port), 10), "still listening"
            got = {"live": await live.is_server_live(d.url)}
            with pytest.raises(httpx.HTTPStatusError) as e:
                await ready.is_server_ready(d.url)
            got["ready"] = (e.value.response.status_code, e.value.response.json(), str(e.value))
            got["model"] = await model.is_model_ready(d.url, "big")
            r = await raw.get(d.url + "/v2/models/big/ready")
            got["raw"] = (r.status_code, r.headers.get("Retry-After"), r.json())
            return got
        finally:
            for c in (live, ready, model):
                await c.close()
            await raw.aclose()
    got = run(calls())
    for t in senders:
        t.join(120)
    assert d.wait_exit(60) == 0, d.logs()
    assert answers == [200] * 3, answers
    assert got["live"] is True, got
    assert got["ready"][:2] == (503, {"ready": False, "error": "draining"}), got
    assert got["ready"][2].startswith("draining, '503 Service Unavailable'"), got
    assert got["model"] is False, got
    assert got["raw"] == (503, "1", {"name": "big", "ready": False, "error": "draining"}), got


def refused(port):
    """True when a new connection to port is refused."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        return False
    except OSError:
        return True


def queue_depth(d):
    """The requests waiting in the model's queue (/metrics), -1 when unknown."""
    try:
        _, samples = support.parse_prometheus(d.get("/metrics", timeout=5).text)
    except requests.RequestException:
        return -1
    return sum(v for n, _, v in samples if n == "attnd_queue_depth")
