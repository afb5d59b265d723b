"""KServe v2 / Open Inference Protocol through an existing client
(tritonclient.http): health, metadata, readiness and infer, with the numbers
of the golden files."""
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import support
from support import golden_mask, rel_err, v2_ranked

GOLDENS = support.load_goldens()
BY_NAME = {g["name"]: (g, m) for g, m in GOLDENS}
CASES = [pytest.param(g["name"], i, id="%s-%d" % (g["name"], i))
         for g, _ in GOLDENS for i in range(len(g["sequences"]))]


@pytest.fixture(scope="module")
def d(daemons, golden_config):
    return daemons(golden_config)


@pytest.fixture(scope="module")
def client(d):
    c = httpclient.InferenceServerClient(url="127.0.0.1:%d" % d.port, connection_timeout=30,
                                         network_timeout=60)
    yield c
    c.close()


def test_server_live_ready(client):
    assert client.is_server_live() is True
    assert client.is_server_ready() is True


def test_server_metadata(client):
    md = client.get_server_metadata()
    assert isinstance(md.get("name"), str) and md["name"]
    assert isinstance(md.get("version"), str) and md["version"]
    assert isinstance(md.get("extensions", []), list)


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_model_ready_and_metadata(client, name):
    g, _ = BY_NAME[name]
    assert client.is_model_ready(name) is True
    md = client.get_model_metadata(name)
    assert md["name"] == name
    # the protocol's "<project>_<format>" (Platforms): weights from safetensors
    assert md.get("platform") == "attnd_safetensors", md.get("platform")
    ins = {i["name"]: i for i in md["inputs"]}
    outs = {o["name"]: o for o in md["outputs"]}
    assert {"query", "key", "value", "key_padding_mask", "attn_mask"} <= set(ins), sorted(ins)
    for n in ("query", "key", "value"):
        assert ins[n]["datatype"] == "FP32", ins[n]
    assert ins["key_padding_mask"]["datatype"] == "BOOL"
    assert ins["attn_mask"]["datatype"] in ("BOOL", "FP32")
    assert ins["query"]["shape"][-1] == g["embed_dim"], ins["query"]
    assert ins["key"]["shape"][-1] == g["kdim"], ins["key"]
    assert ins["value"]["shape"][-1] == g["vdim"], ins["value"]
    assert {"output", "attention"} <= set(outs), sorted(outs)
    assert outs["output"]["datatype"] == "FP32"
    assert outs["output"]["shape"][-1] == g["embed_dim"]


@pytest.mark.parametrize("attention", ["none", "mean", "heads"])
@pytest.mark.parametrize("batched", [False, True], ids=["query-LxE", "query-BxLxE"])
def test_answers_have_the_declared_ranks(client, attention, batched):
    """The model metadata's shapes are what the answers have: output (B,L,E)
    and attention (B,H,L,S), H = 1 for "mean", even for an (L,E) query."""
    name = "self_e30_h3"
    g, _ = BY_NAME[name]
    md = client.get_model_metadata(name)
    decl = {o["name"]: o["shape"] for o in md["outputs"]}
    s = g["sequences"][0]
    outs = [httpclient.InferRequestedOutput("output", binary_data=False)]
    if attention != "none":
        outs.append(httpclient.InferRequestedOutput("attention", binary_data=False))
    res = client.infer(name, make_inputs(s, batch=batched), outputs=outs,
                       parameters={"attention": attention, "causal": bool(s["causal"])})
    got = {"output": res.as_numpy("output")}
    if attention != "none":
        got["attention"] = res.as_numpy("attention")
    L, S = len(s["query"]), len(s["key"] if s["key"] is not None else s["query"])
    want = {"output": (1, L, g["embed_dim"]),
            "attention": (1, g["num_heads"] if attention == "heads" else 1, L, S)}
    for n, a in got.items():
        assert a.shape == want[n], (n, a.shape, want[n])
        assert len(a.shape) == len(decl[n]), (n, a.shape, decl[n])
        for have, d in zip(a.shape, decl[n]):
            assert d == -1 or d == have, (n, a.shape, decl[n])


def test_health_bodies_and_extensions(d, client):
    """The protocol's REST spec: the health answers are its JSON objects
    ($live_server_response, $ready_server_response, $ready_model_response)
    with the status saying the same (what tritonclient and probes read); a
    HEAD gets the status alone. Server metadata lists the extensions really
    implemented."""
    import requests
    for path, body in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True}),
                       ("/v2/models/self_e16_h1/ready", {"name": "self_e16_h1", "ready": True}),
                       ("/v2/models/self_e16_h1/versions/1/ready",
                        {"name": "self_e16_h1", "ready": True})):
        r = requests.get(d.url + path, timeout=30)
        assert r.status_code == 200, (path, r.status_code, r.content)
        assert r.headers.get("Content-Type") == "application/json", (path, r.headers)
        assert r.json() == body, (path, r.content)
        h = requests.head(d.url + path, timeout=30)
        assert h.status_code == 200 and h.content == b"", (path, h.status_code, h.content)
    assert "binary_tensor_data" in client.get_server_metadata()["extensions"]


def test_unknown_model(client):
    assert client.is_model_ready("no_such_model") is False
    with pytest.raises(InferenceServerException):
        client.get_model_metadata("no_such_model")
    q = httpclient.InferInput("query", [1, 16], "FP32")
    q.set_data_from_numpy(np.zeros((1, 16), dtype=np.float32), binary_data=False)
    with pytest.raises(InferenceServerException):
        client.infer("no_such_model", [q])


def make_inputs(s, batch=False):
    def add(name, a, dt):
        a = np.asarray(a, dtype=np.bool_ if dt == "BOOL" else np.float32)
        if batch:
            a = a[None]
        t = httpclient.InferInput(name, list(a.shape), dt)
        t.set_data_from_numpy(a, binary_data=False)
        return t
    ins = [add("query", s["query"], "FP32")]
    if s["key"] is not None:
        ins.append(add("key", s["key"], "FP32"))
    if s["value"] is not None:
        ins.append(add("value", s["value"], "FP32"))
    if s["key_padding_mask"] is not None:
        ins.append(add("key_padding_mask", s["key_padding_mask"], "BOOL"))
    am = golden_mask(s)
    if am is not None:
        # the mask is shared by every sequence of a batch: never batched
        t = httpclient.InferInput("attn_mask", list(am.shape),
                                  "BOOL" if am.dtype == np.bool_ else "FP32")
        t.set_data_from_numpy(am if am.dtype == np.bool_ else am.astype(np.float32),
                              binary_data=False)
        ins.append(t)
    return ins


@pytest.mark.parametrize("name,i", CASES)
def test_infer_golden(client, name, i):
    g, _ = BY_NAME[name]
    s = g["sequences"][i]
    outs = [httpclient.InferRequestedOutput("output", binary_data=False)]
    if s["attention"] != "none":
        outs.append(httpclient.InferRequestedOutput("attention", binary_data=False))
    res = client.infer(name, make_inputs(s), outputs=outs,
                       parameters={"causal": bool(s["causal"]), "attention": s["attention"]})
    out = res.as_numpy("output")
    assert out is not None and out.dtype == np.float32
    # the ranks the model metadata declares, whatever the rank of the query
    assert rel_err(out, v2_ranked(s["output"])) <= 1e-5
    if s["attention"] != "none":
        assert rel_err(res.as_numpy("attention"), v2_ranked(s["attn_weights"], s["attention"])) <= 1e-5
    resp = res.get_response()
    assert resp["model_name"] == name


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_infer_batched_golden(client, name):
    """The golden sequences as B=1 batches (1 x L x E)."""
    g, _ = BY_NAME[name]
    for s in g["sequences"]:
        outs = [httpclient.InferRequestedOutput("output", binary_data=False)]
        if s["attention"] != "none":
            outs.append(httpclient.InferRequestedOutput("attention", binary_data=False))
        res = client.infer(name, make_inputs(s, batch=True), outputs=outs,
                           parameters={"causal": bool(s["causal"]),
                                       "attention": s["attention"]})
        out = res.as_numpy("output")
        assert out.shape == (1, len(s["query"]), g["embed_dim"])
        assert rel_err(out[0], s["output"]) <= 1e-5
        if s["attention"] != "none":
            att = res.as_numpy("attention")
            assert rel_err(att, v2_ranked(s["attn_weights"], s["attention"])) <= 1e-5


def test_infer_bad_input_is_an_error(client):
    name = "self_e64_h8"
    q = httpclient.InferInput("query", [2, 63], "FP32")
    q.set_data_from_numpy(np.zeros((2, 63), dtype=np.float32), binary_data=False)
    with pytest.raises(InferenceServerException) as e:
        client.infer(name, [q])
    assert "query" in str(e.value)


def test_infer_request_id_echoed(client):
    """KServe v2: a request's id comes back in the response."""
    g, _ = BY_NAME["self_e64_h8"]
    s = g["sequences"][0]
    res = client.infer("self_e64_h8", make_inputs(s), request_id="req-v2-7",
                       outputs=[httpclient.InferRequestedOutput("output", binary_data=False)])
    assert res.get_response().get("id") == "req-v2-7"
    assert rel_err(res.as_numpy("output"), v2_ranked(s["output"])) <= 1e-5


def test_infer_binary_tensors_right_or_refused(client):
    """tritonclient's default sends tensors in the binary extension; the daemon
    either answers right or refuses it clearly, never a wrong number or a 500."""
    g, _ = BY_NAME["self_e64_h8"]
    s = g["sequences"][0]
    q = httpclient.InferInput("query", [len(s["query"]), 64], "FP32")
    q.set_data_from_numpy(np.asarray(s["query"], dtype=np.float32), binary_data=True)
    try:
        res = client.infer("self_e64_h8", [q], outputs=[
            httpclient.InferRequestedOutput("output", binary_data=True)])
    except InferenceServerException as e:
        assert e.status() in ("400", "415", 400, 415), (e.status(), e.message())
        assert e.message(), e
        return
    assert rel_err(res.as_numpy("output"), v2_ranked(s["output"])) <= 1e-5


def test_client_with_api_key(daemons):
    """An API key travels as a client header; health stays open without it."""
    name = "self_e16_h1"
    g, m = BY_NAME[name]
    d = daemons({"models": [m.config()]}, env={"ATTND_API_KEY": "v2-key-9"})
    url = "127.0.0.1:%d" % d.port
    anon = httpclient.InferenceServerClient(url=url, network_timeout=60)
    keyed = httpclient.InferenceServerClient(url=url, network_timeout=60)
    auth = {"Authorization": "Bearer v2-key-9"}
    try:
        assert anon.is_server_live() is True
        assert anon.is_server_ready() is True
        s = g["sequences"][0]
        with pytest.raises(InferenceServerException) as e:
            anon.infer(name, make_inputs(s))
        assert e.value.status() in ("401", 401), e.value.status()
        with pytest.raises(InferenceServerException):
            anon.get_model_metadata(name)
        assert keyed.get_model_metadata(name, headers=auth)["name"] == name
        res = keyed.infer(name, make_inputs(s), headers=auth, outputs=[
            httpclient.InferRequestedOutput("output", binary_data=False)])
        assert rel_err(res.as_numpy("output"), v2_ranked(s["output"])) <= 1e-5
    finally:
        anon.close()
        keyed.close()


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_returns_only_the_outputs_asked_for(client, binary):
    """A request that lists outputs gets only those; one the model
    cannot give is a 400 that names it."""
    name, s = next((g["name"], s) for g, _ in GOLDENS for s in g["sequences"]
                   if s["attention"] == "heads")
    params = {"attention": "heads", "causal": bool(s["causal"])}
    only_attn = client.infer(name, make_inputs(s), parameters=params, outputs=[
        httpclient.InferRequestedOutput("attention", binary_data=binary)])
    assert [o["name"] for o in only_attn.get_response()["outputs"]] == ["attention"]
    assert only_attn.as_numpy("output") is None
    assert rel_err(only_attn.as_numpy("attention"), v2_ranked(s["attn_weights"], "heads")) <= 1e-5
    only_out = client.infer(name, make_inputs(s), parameters=params, outputs=[
        httpclient.InferRequestedOutput("output", binary_data=binary)])
    assert [o["name"] for o in only_out.get_response()["outputs"]] == ["output"]
    assert rel_err(only_out.as_numpy("output"), v2_ranked(s["output"])) <= 1e-5
    with pytest.raises(InferenceServerException) as e:
        client.infer(name, make_inputs(s), outputs=[
            httpclient.InferRequestedOutput("output", binary_data=binary),
            httpclient.InferRequestedOutput("logits", binary_data=binary)])
    assert "logits" in str(e.value)


# ---------------------------------------------------------------- decoder models

EXAMPLE = support.REPO / "docs" / "examples" / "llama-gqa.json"
DECODER_GOLDEN = support.GOLDEN_DIR / "decoder" / "gqa_half.json"
V2_INPUT_NAMES = ("query", "key", "value", "key_padding_mask", "attn_mask", "positions")


def _probe_input(name, datatype, decl_shape, E, L, binary):
    """An input of the declared datatype and shape (B = 1, L = S = L),
    holding harmless values: zeros, no key hidden, positions 0..L-1."""
    shape = [1 if i == 0 else (L if d == -1 else d) for i, d in enumerate(decl_shape)]
    if name in ("query", "key", "value"):
        a = np.full(shape, 0.01, dtype=np.float32)
    elif name == "positions":
        a = np.broadcast_to(np.arange(L), shape).astype(np.int64 if datatype == "INT64"
                                                         else np.int32)
    else:
        a = np.zeros(shape, dtype=np.bool_)
    t = httpclient.InferInput(name, shape, datatype)
    t.set_data_from_numpy(np.ascontiguousarray(a), binary_data=binary)
    return t


def _accepted(client, model, extra):
    try:
        client.infer(model, extra)
        return True
    except InferenceServerException as e:
        assert str(e.status()) == "400", (e.status(), e.message())
        return False


def _metadata_is_what_is_accepted(client, model, E, binary):
    """Every declared input, in its declared datatype and shape, is accepted
    beside the query; every other input name is refused with 400."""
    md = client.get_model_metadata(model)
    decl = {i["name"]: i for i in md["inputs"]}
    L = 3
    q = decl["query"]
    query = _probe_input("query", q["datatype"], q["shape"], E, L, binary)
    accepted = {"query"}
    for name in V2_INPUT_NAMES[1:]:
        if name in decl:
            i = decl[name]
            extra = [_probe_input(name, i["datatype"], i["shape"], E, L, binary)]
            if name == "value":  # value goes with a key
                k = decl["key"]
                extra.insert(0, _probe_input("key", k["datatype"], k["shape"], E, L, binary))
        else:  # not declared: sent in the query's datatype and shape, or as booleans
            dt, shape = ("FP32", q["shape"]) if name in ("key", "value") else \
                        ("INT64", [-1, -1]) if name == "positions" else ("BOOL", [-1, -1, -1])
            extra = [_probe_input(name, dt, shape, E, L, binary)]
        if _accepted(client, model, [query] + extra):
            accepted.add(name)
    assert accepted == set(decl), "declared %s, accepted %s" % (sorted(decl), sorted(accepted))
    return decl


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_decoder_metadata_is_what_it_accepts(daemons, binary):
    """A model with rotary positions (the llama-gqa example) declares
    positions and no key or value, and takes exactly what it declares;
    positions sent as the metadata says give Hugging Face's numbers (the
    decoder golden, 1e-5)."""
    dd = daemons(args=["--config", str(EXAMPLE)])
    c = httpclient.InferenceServerClient(url="127.0.0.1:%d" % dd.port, network_timeout=60)
    try:
        decl = _metadata_is_what_is_accepted(c, "llama-gqa", 64, binary)
        assert decl["positions"]["datatype"] == "INT64", decl["positions"]
        assert decl["positions"]["shape"] == [-1, -1], decl["positions"]
        s = json.loads(DECODER_GOLDEN.read_text())["sequences"][1]
        assert s["positions"] and s["positions"] != list(range(len(s["query"])))
        q = httpclient.InferInput("query", [1, len(s["query"]), 64], "FP32")
        q.set_data_from_numpy(np.asarray([s["query"]], dtype=np.float32), binary_data=binary)
        p = httpclient.InferInput("positions", [1, len(s["positions"])], "INT64")
        p.set_data_from_numpy(np.asarray([s["positions"]], dtype=np.int64), binary_data=binary)
        res = c.infer("llama-gqa", [q, p], parameters={"causal": bool(s["causal"])},
                      outputs=[httpclient.InferRequestedOutput("output", binary_data=binary)])
        assert rel_err(res.as_numpy("output"), np.asarray([s["output"]])) <= 1e-5
        # the native API refuses a key the same way, before any compute
        rows = [[0.01] * 64] * 3
        msg = support.check_error_body(dd.post("/v1/attention", {"query": rows, "key": rows}), 400)
        assert msg.startswith("key: ") and "rotary" in msg, msg
    finally:
        c.close()


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_encoder_metadata_is_what_it_accepts(client, binary):
    """An nn.MultiheadAttention model declares key and value and no positions,
    and takes exactly that."""
    decl = _metadata_is_what_is_accepted(client, "self_e64_h8", 64, binary)
    assert "positions" not in decl


# input -> (datatypes taken as JSON data, datatypes refused); docs/api.md,
# "Open Inference Protocol: MUST and SHOULD", tensor datatypes
DATATYPES = {
    "query": (("FP32", "FP16", "FP64"), ("BOOL", "INT32", "INT64", "UINT8", "BYTES")),
    "key_padding_mask": (("BOOL",), ("FP32", "INT64", "UINT8")),
    "attn_mask": (("BOOL", "FP32", "FP16", "FP64"), ("INT32", "INT64", "UINT8")),
    "positions": (("INT64", "INT32", "FP32", "FP64"), ("BOOL", "UINT8", "BYTES")),
}


def test_each_input_takes_its_documented_datatypes(daemons):
    import requests
    dd = daemons(args=["--config", str(EXAMPLE)])
    L, E = 3, 64

    def body(name, dt):
        def val(i):  # booleans, or numbers (positions 0..L-1)
            return i % 2 == 1 if dt == "BOOL" else i % L if name == "positions" else 0.0
        shape = {"query": [1, L, E], "key_padding_mask": [1, L], "attn_mask": [L, L],
                 "positions": [1, L]}[name]
        n = int(np.prod(shape))
        ins = [{"name": name, "shape": shape, "datatype": dt, "data": [val(i) for i in range(n)]}]
        if name != "query":
            ins.insert(0, {"name": "query", "shape": [1, L, E], "datatype": "FP32",
                           "data": [0.01] * (L * E)})
        return {"inputs": ins}

    for name, (ok, refused) in DATATYPES.items():
        for dt in ok:
            r = requests.post(dd.url + "/v2/models/llama-gqa/infer", json=body(name, dt), timeout=30)
            assert r.status_code == 200, (name, dt, r.text[:200])
        for dt in refused:
            r = requests.post(dd.url + "/v2/models/llama-gqa/infer", json=body(name, dt), timeout=30)
            msg = support.check_error_body(r, 400)
            assert name in msg, (name, dt, msg)
