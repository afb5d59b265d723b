"""Decoder models and KV-cache sessions over HTTP (SPEC section 7): the
decoder goldens of tests/gen_golden_decoder.py (grouped heads, head_dim,
scale, rotary positions; a float64 reference checked against Hugging Face
transformers) through POST /v1/attention to 1e-5; the same sequences fed
through a session, prefix then steps, equal to the whole sequence at every
step; and the session contract: 201 on open, 404 with the re-open advice,
204 on DELETE, 409 for a taken id, 413 past one session's budget, 429 with
Retry-After past the total, the idle timeout, and the /metrics lines."""
import json
import math
import re
import threading
import time

import numpy as np
import pytest

import support
from support import check_error_body, golden_body, parse_prometheus, rel_err

TOL = 1e-5
DEC_DIR = support.GOLDEN_DIR / "decoder"
GOLDENS = [json.loads(p.read_text()) for p in sorted(DEC_DIR.glob("*.json"))]


def config_entry(g, **extra):
    c = dict(g["config"])
    c["weights"] = str(DEC_DIR / c["weights"])
    c.update(extra)
    return c


def decoder_config(limits=None):
    cfg = {"models": [config_entry(g) for g in GOLDENS]}
    if limits:
        cfg["limits"] = limits
    return cfg


@pytest.fixture(scope="module")
def d(daemons):
    return daemons(decoder_config())


WHOLE = [pytest.param(g["name"], i, id="%s-%d" % (g["name"], i))
         for g in GOLDENS for i in range(len(g["sequences"]))]


def test_goldens_present():
    assert len(GOLDENS) >= 4, "no decoder goldens in %s" % DEC_DIR
    assert len(WHOLE) >= 24
    assert sum(s["positions"] is not None for g in GOLDENS for s in g["sequences"]) >= 12


def test_listing_shows_rope_scaling(d):
    """GET /v1/models gives each model's rope as its config does; YaRN's
    scaling with its defaults filled in (betas 32 and 1, truncate true) and
    the attention factor it multiplies cos and sin by: given, 0.1 ln(factor)
    + 1, or DeepSeek's ratio of the two mscales."""
    listed = {m["name"]: m for m in d.get("/v1/models").json()["models"]}
    yarns = 0
    for g in GOLDENS:
        rope, got = g["config"]["rope"], listed[g["name"]]["rope"]
        assert (got["theta"], got["dim"], got["style"]) == (rope["theta"], rope["dim"],
                                                           rope["style"]), got
        sc, gs = rope.get("scaling"), got.get("scaling")
        if not sc:
            assert gs is None, got
            continue
        assert gs["type"] == sc["type"] and gs["factor"] == sc["factor"], gs
        if sc["type"] != "yarn":
            continue
        yarns += 1
        f = sc["factor"]
        want = 0.1 * math.log(f) + 1
        if sc.get("mscale") and sc.get("mscale_all_dim"):
            want = (0.1 * sc["mscale"] * math.log(f) + 1) / (0.1 * sc["mscale_all_dim"] *
                                                            math.log(f) + 1)
        assert abs(gs["attention_factor"] - want) < 1e-12, (gs, want)
        assert gs["beta_fast"] == sc.get("beta_fast", 32), gs
        assert gs["beta_slow"] == sc.get("beta_slow", 1), gs
        assert gs["truncate"] is sc.get("truncate", True), gs
        assert gs["original_max_position_embeddings"] == sc["original_max_position_embeddings"]
    assert yarns >= 2


@pytest.mark.parametrize("name,i", WHOLE)
def test_whole_sequence_golden(d, name, i):
    """Each golden sequence, positions given (continued and packed sequences,
    positions far past training) or left to 0..L-1."""
    g = next(g for g in GOLDENS if g["name"] == name)
    s = g["sequences"][i]
    body = golden_body(s, model_name=name)
    if s["positions"] is not None:
        body["positions"] = s["positions"]
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    assert rel_err(np.float32(a["output"]), s["output"]) <= TOL
    if s["attention"] != "none":
        assert rel_err(np.float32(a["attention"]), s["attn_weights"]) <= TOL


def test_positions_batched_and_refused(d):
    """B×L positions in one batched request; bad positions name the index."""
    g = GOLDENS[0]
    s1, s4 = g["sequences"][1], g["sequences"][4]  # L = 7 and 6 with positions
    L = 6
    q = [s1["query"][:L], s4["query"]]
    pos = [s1["positions"][:L], s4["positions"]]
    r = d.post("/v1/attention", {"model": g["name"], "query": q, "positions": pos})
    assert r.status_code == 200, r.text[:300]
    out = np.array(r.json()["output"])
    assert rel_err(np.float32(out[1]), s4["output"]) <= TOL
    # one L list applies to every sequence
    r = d.post("/v1/attention", {"model": g["name"], "query": [s4["query"]] * 2,
                                 "positions": s4["positions"]})
    assert rel_err(np.float32(np.array(r.json()["output"])[1]), s4["output"]) <= TOL
    E = g["embed_dim"]
    rows = [[0.1] * E] * 3
    for bad, frag in (([0, 1], "expected 3 whole numbers"), ([0, -1, 2], "positions[1]"),
                      ([0, 1.5, 2], "positions[1]: 1.5 is not a whole number"),
                      ([[0, 1, 2]] * 2, "expected 3 whole numbers")):
        msg = check_error_body(d.post("/v1/attention", {"model": g["name"], "query": rows,
                                                        "positions": bad}), 400)
        assert frag in msg, msg
    # B×L positions: the sequence and the row
    msg = check_error_body(d.post("/v1/attention", {"model": g["name"], "query": [rows, rows],
                                                    "positions": [[0, 1, 2], [0, 1, -2]]}), 400)
    assert msg.startswith("positions[1][2]: -2 is not a whole number"), msg


def test_max_positions(daemons):
    """max_positions: a position at or past it is refused, naming it."""
    cfg = decoder_config()
    cfg["models"][0]["max_positions"] = 100
    d = daemons(cfg)
    g = GOLDENS[0]
    rows = [[0.1] * g["embed_dim"]] * 2
    msg = check_error_body(d.post("/v1/attention", {"model": g["name"], "query": rows,
                                                    "positions": [98, 100]}), 400)
    assert "positions[1]: 100" in msg and "max_positions" in msg
    assert d.post("/v1/attention", {"model": g["name"], "query": rows,
                                    "positions": [98, 99]}).status_code == 200
    sid = open_session(d, g["name"], rows * 49).json()["session"]  # 98 tokens
    assert step(d, sid, rows[:1]).status_code == 200               # position 98
    msg = check_error_body(step(d, sid, rows), 413)                 # 99 and 100
    assert "max_positions" in msg


def open_session(d, name, prefix=None, **kw):
    body = {"model": name}
    if prefix is not None:
        body["query"] = prefix
    return d.post("/v1/sessions", body, **kw)


def step(d, sid, rows, attention="none"):
    return d.post("/v1/sessions/%s/attention" % sid, {"query": rows, "attention": attention})


@pytest.mark.parametrize("name", [g["name"] for g in GOLDENS])
def test_session_replays_whole_sequence(d, name):
    """Sequence 0 (causal, positions 0..15): a prefix of 5, then steps of 1,
    2 and 1 rows; every answer equals the golden rows, attention included."""
    g = next(g for g in GOLDENS if g["name"] == name)
    s = g["sequences"][0]
    q, want, w = s["query"], np.array(s["output"]), np.array(s["attn_weights"])
    r = open_session(d, name, q[:5])
    assert r.status_code == 201, r.text[:300]
    a = r.json()
    sid = a["session"]
    assert a["model"] == name and a["cached_tokens"] == 5
    assert rel_err(np.float32(a["output"]), want[:5]) <= TOL
    at = 5
    sizes = [1, 2, 1] + [1] * (len(q) - 9)
    for k, n in enumerate(sizes):
        r = step(d, sid, q[at:at + n], attention="heads" if k % 2 == 0 else "mean")
        assert r.status_code == 200, r.text[:300]
        a = r.json()
        assert a["session"] == sid and a["cached_tokens"] == at + n
        assert rel_err(np.float32(a["output"]), want[at:at + n]) <= TOL, "step at %d" % at
        heads = w[:, at:at + n, :at + n]
        got = np.array(a["attention"])
        assert rel_err(np.float32(got), heads if k % 2 == 0 else heads.mean(axis=0)) <= TOL
        at += n
    assert at == len(q)
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_sessions_of_one_model_batch_together(daemons):
    """Eight sessions stepping at once all get their own rows right, and
    steps of different sessions share batches: each round, the eight send
    a step together, and the batcher waits (up to a second) for eight
    requests before it computes, so some answer says usage.batch > 1."""
    d = daemons(dict(decoder_config(), batching={"max_queue_delay_us": 1000000,
                                                 "max_batch_requests": 8}))
    g = GOLDENS[0]
    s = g["sequences"][0]
    q, want = s["query"], np.array(s["output"])
    sids = [open_session(d, g["name"], q[:3]).json()["session"] for _ in range(8)]
    errors, batches = [], []
    rounds = threading.Barrier(len(sids))

    def run(sid):
        for at in range(3, 10):
            rounds.wait(60)
            r = step(d, sid, q[at:at + 1])
            if r.status_code != 200:
                errors.append((sid, at, r.status_code))
                continue
            a = r.json()
            batches.append(a["usage"]["batch"])
            if rel_err(np.float32(a["output"]), want[at:at + 1]) > TOL:
                errors.append((sid, at))

    ts = [threading.Thread(target=run, args=(sid,)) for sid in sids]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not errors
    assert len(batches) == 8 * 7
    assert max(batches) > 1, "no two sessions' steps shared a batch: %s" % batches
    for sid in sids:
        assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def queue_depth(d):
    _, samples = parse_prometheus(d.get("/metrics").text)
    return sum(v for n, labels, v in samples if n == "attnd_queue_depth")


def test_queued_step_is_409(daemons):
    """A step whose previous step is only queued (the batcher waits up to
    10 s for a second request) gets the same 409 as one that meets a
    computing step, with words that say so. An open with a prefix, a step
    of another session, then fills the batch, and both are answered."""
    d = daemons(dict(decoder_config(), batching={"max_queue_delay_us": 10000000,
                                                 "max_batch_requests": 2}))
    g = GOLDENS[0]
    q = g["sequences"][0]["query"]
    sid = open_session(d, g["name"]).json()["session"]
    done = {}
    t = threading.Thread(target=lambda: done.setdefault("r", step(d, sid, q[:1])))
    t.start()
    deadline = time.monotonic() + 30
    while queue_depth(d) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert "r" not in done, "the first step was answered before it could be met in the queue"
    msg = check_error_body(step(d, sid, q[1:2]), 409)
    assert "previous step is still queued or computing" in msg
    other = open_session(d, g["name"], q[:2])
    t.join(60)
    assert other.status_code == 201 and other.json()["usage"]["batch"] == 2
    assert done["r"].status_code == 200 and done["r"].json()["cached_tokens"] == 1
    for s in (sid, other.json()["session"]):
        assert d.request("DELETE", "/v1/sessions/" + s).status_code == 204


def test_unknown_and_deleted_sessions(d):
    name = GOLDENS[0]["name"]
    msg = check_error_body(step(d, "0123456789abcdef0123456789abcdef", [[0.0] * 64]), 404)
    assert "open a new session with the whole prefix" in msg
    sid = open_session(d, name).json()["session"]
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204
    check_error_body(d.request("DELETE", "/v1/sessions/" + sid), 404)
    check_error_body(step(d, sid, [[0.0] * 64]), 404)


def test_bad_session_bodies(d):
    g = GOLDENS[0]
    E = g["embed_dim"]
    sid = open_session(d, g["name"]).json()["session"]
    rows = [[0.1] * E]
    msg = check_error_body(d.post("/v1/sessions/%s/attention" % sid,
                                  {"query": rows, "key_padding_mask": [False]}), 400)
    assert "query rows only" in msg
    # a key is refused as a session's extra, before anything else is said of it
    msg = check_error_body(d.post("/v1/sessions/%s/attention" % sid,
                                  {"query": rows, "key": rows}), 400)
    assert msg.startswith("key: a session step takes query rows only"), msg
    msg = check_error_body(d.post("/v1/sessions/%s/attention" % sid,
                                  {"query": [rows, rows]}), 400)
    assert "one sequence" in msg
    msg = check_error_body(d.post("/v1/sessions/%s/attention" % sid, {"query": [[0.1] * 3]}), 400)
    assert "query" in msg
    check_error_body(d.post("/v1/sessions", {"model": "nope"}), 404)
    check_error_body(d.post("/v1/sessions", {"model": g["name"], "extra": 1}), 400)
    # a failed step keeps nothing: the session still has 0 tokens
    a = step(d, sid, rows).json()
    assert a["cached_tokens"] == 1
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def opened_total(d):
    _, samples = parse_prometheus(d.get("/metrics").text)
    return sum(v for n, _, v in samples if n == "attnd_sessions_opened_total")


def session_open_refusals(name, E):
    """Bodies of POST /v1/sessions that must be refused: (body bytes, status,
    the words the message must hold, the first naming the path)."""
    row = "[" + ", ".join(["0.1"] * E) + "]"
    m = '"model": "%s"' % name
    return [
        (b'{"model": 5}', 400, ["model: expected a model name, got a number"]),
        (b'{"model": "nope"}', 404, ["unknown model 'nope'", name]),
        (('{%s, "extra": 1}' % m).encode(), 400, ["extra: unknown field"]),
        (('{%s, %s}' % (m, m)).encode(), 400, ["model: given twice"]),
        (('{%s, "query": [%s], "query": [%s]}' % (m, row, row)).encode(), 400,
         ["query: given twice"]),
        (('{%s, "attention": "mean"}' % m).encode(), 400,
         ["attention: a session opened without a prefix takes only \"model\""]),
        (('{%s, "causal": false}' % m).encode(), 400, ["causal: a session is always causal"]),
        (('{%s, "attention": "all", "query": [%s]}' % (m, row)).encode(), 400,
         ["attention: expected one of"]),
        (('{%s, "query": [[0.1, 0.2]]}' % m).encode(), 400, ["query[0]: 2 numbers"]),
        (('{%s, "query": [%s, [0.1]]}' % (m, row)).encode(), 400, ["query[1]"]),
        (('{%s, "query": [[NaN%s]]}' % (m, ", 0" * (E - 1))).encode(), 400,
         ["query[0][0]: NaN"]),
        (('{%s, "query": [%s], "key": [%s]}' % (m, row, row)).encode(), 400, ["key: "]),
        (('{%s, "query": [%s], "positions": [3]}' % (m, row)).encode(), 400,
         ["positions: a session step takes query rows only"]),
        (('{%s, "query": [[%s], [%s]]}' % (m, row, row)).encode(), 400,
         ["query: a session holds one"]),
        (('{%s, "query": {"shape": [268435456, 134217728, 512], "b64": ""}}' % m).encode(),
         413, ["query.shape: too large"]),
        (('{%s, "query": [%s]} x' % (m, row)).encode(), 400, ["not valid JSON"]),
        (('{%s, "query": [%s' % (m, row)).encode(), 400, ["query", "not valid JSON"]),
        (b'[1, 2]', 400, ["body must be a JSON object"]),
        (b'model=x', 400, ["body must be JSON", "HTML form"]),
        (b'   ', 400, ["body is empty"]),
        (b'', 400, ["model: required when more than one model is loaded"]),
    ]


def test_session_open_bodies_refused_naming_the_path(d):
    """POST /v1/sessions is read by the request reader once: each bad body
    gets its status and a message naming the field, and opens nothing."""
    g = GOLDENS[0]
    before = opened_total(d)
    for body, status, words in session_open_refusals(g["name"], g["embed_dim"]):
        r = d.post("/v1/sessions", data=body, headers={"Content-Type": "application/json"})
        msg = check_error_body(r, status)
        for w in words:
            assert w in msg, "%r: %r lacks %r" % (body[:80], msg, w)
        path = re.match(r"[a-z_]+(\[\d+\])*(\.[a-z]+)?: ", words[0])
        if path:  # the message starts with the path of the field to blame
            assert msg.startswith(path.group(0)), "%r: %r" % (body[:80], msg)
    assert opened_total(d) == before, "a refused open opened a session"
    # what is left: no query opens an empty session, a query opens it with a prefix
    r = d.post("/v1/sessions", data=('{"model": "%s"}' % g["name"]).encode())
    assert r.status_code == 201 and r.json()["cached_tokens"] == 0, r.text[:300]
    assert d.request("DELETE", "/v1/sessions/" + r.json()["session"]).status_code == 204
    r = open_session(d, g["name"], g["sequences"][0]["query"][:2])
    assert r.status_code == 201 and r.json()["cached_tokens"] == 2, r.text[:300]
    assert d.request("DELETE", "/v1/sessions/" + r.json()["session"]).status_code == 204
    assert opened_total(d) == before + 2


def test_session_open_empty_body_with_one_model(daemons):
    """With one model served, an empty body (or one naming no model) opens an
    empty session of it."""
    g = GOLDENS[0]
    d = daemons({"models": [config_entry(g)]})
    for body in (b"", b"{}", b'{"model": null}'):
        r = d.post("/v1/sessions", data=body)
        assert r.status_code == 201, (body, r.text[:300])
        assert r.json()["model"] == g["name"] and r.json()["cached_tokens"] == 0
        assert d.request("DELETE", "/v1/sessions/" + r.json()["session"]).status_code == 204


def test_refused_prefix_opens_nothing(daemons):
    """An open whose prefix is refused after the session was made (here its
    output overflows float32: a 400, like /v1/attention's) takes the
    session with it: the client never got its id, so it must not hold a
    slot until the idle timeout. A step refused the same way keeps the
    session as it was."""
    d = daemons(decoder_config({"max_sessions": 2}))
    g = GOLDENS[0]
    E = g["embed_dim"]
    q = g["sequences"][0]["query"]
    huge = [[3e38] * E] * 2
    for _ in range(3):
        msg = check_error_body(open_session(d, g["name"], huge), 400)
        assert "overflows float32" in msg, msg
    _, samples = parse_prometheus(d.get("/metrics").text)
    val = {n: v for n, labels, v in samples if n.startswith("attnd_session")}
    assert val["attnd_sessions"] == 0 and val["attnd_session_bytes"] == 0, val
    sids = [open_session(d, g["name"], q[:2]).json()["session"] for _ in range(2)]
    assert "overflows float32" in check_error_body(step(d, sids[0], huge[:1]), 400)
    assert step(d, sids[0], q[2:3]).json()["cached_tokens"] == 3
    for sid in sids:
        assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_proposed_session_id(d):
    """A load balancer may name the session (X-Session-Id, docs/deploy.md);
    every answer of a session, its open and its steps, names it in its own
    X-Session-Id header."""
    name = GOLDENS[0]["name"]
    want = "00112233445566778899aabbccddeeff"
    r = open_session(d, name, headers={"X-Session-Id": want})
    assert r.status_code == 201 and r.json()["session"] == want
    assert r.headers["X-Session-Id"] == want
    r = open_session(d, name)
    other = r.json()["session"]
    assert r.status_code == 201 and r.headers["X-Session-Id"] == other != want
    g = GOLDENS[0]
    r = step(d, want, g["sequences"][0]["query"][:1])
    assert r.status_code == 200 and r.headers["X-Session-Id"] == want, r.text[:300]
    assert "X-Session-Id" not in d.get("/v1/models").headers
    assert d.request("DELETE", "/v1/sessions/" + other).status_code == 204
    check_error_body(open_session(d, name, headers={"X-Session-Id": want}), 409)
    check_error_body(open_session(d, name, headers={"X-Session-Id": "Not-An-Id"}), 400)
    assert d.request("DELETE", "/v1/sessions/" + want).status_code == 204


def test_empty_open_takes_causal_true(d):
    """A session is always causal, so an open without a prefix may say so
    (docs/api.md): 201, as with a prefix; null is left out."""
    name = GOLDENS[0]["name"]
    for body in ({"model": name, "causal": True}, {"model": name, "causal": None}):
        r = d.post("/v1/sessions", body)
        assert r.status_code == 201 and r.json()["cached_tokens"] == 0, r.text[:300]
        sid = r.json()["session"]
        assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_budgets(daemons):
    """gqa_half caches 128 bytes a token: 6 tokens a session, 8 in all."""
    d = daemons(decoder_config({"max_session_bytes": 1024, "max_session_bytes_each": 768,
                                "session_idle_s": 30}))
    g = GOLDENS[[x["name"] for x in GOLDENS].index("gqa_half")]
    q = g["sequences"][0]["query"]
    a = open_session(d, "gqa_half", q[:5]).json()
    msg = check_error_body(step(d, a["session"], q[5:7]), 413)
    assert "max_session_bytes_each" in msg
    assert step(d, a["session"], q[5:6]).status_code == 200  # exactly the limit
    r = open_session(d, "gqa_half", q[:3])
    check_error_body(r, 429)
    assert 1 <= int(r.headers["Retry-After"]) <= 30
    assert d.request("DELETE", "/v1/sessions/" + a["session"]).status_code == 204
    assert open_session(d, "gqa_half", q[:3]).status_code == 201


def session_metrics(d):
    _, samples = parse_prometheus(d.get("/metrics").text)
    return {(n, labels.get("reason")): v for n, labels, v in samples
            if n.startswith("attnd_session")}


def test_idle_sessions_end_without_traffic(daemons):
    """A session left idle past session_idle_s is ended by the daemon on its
    own: nothing is sent until well after the timeout, and then /metrics
    (which only reads) shows the session gone, its bytes freed and one idle
    eviction; a step for it then gets 404 saying it may have timed out."""
    idle = 2
    d = daemons(decoder_config({"session_idle_s": idle}))
    g = GOLDENS[0]
    q = g["sequences"][0]["query"]
    sid = open_session(d, g["name"], q[:4]).json()["session"]
    val = session_metrics(d)
    assert val[("attnd_sessions", None)] == 1 and val[("attnd_session_cached_tokens", None)] == 4
    assert val[("attnd_session_bytes", None)] > 0
    time.sleep(idle + 1.5)  # no request of any kind meanwhile
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        val = session_metrics(d)
        if val[("attnd_session_evictions_total", "idle")] >= 1:
            break
        time.sleep(0.2)
    assert val[("attnd_session_evictions_total", "idle")] == 1, val
    assert val[("attnd_sessions", None)] == 0
    assert val[("attnd_session_cached_tokens", None)] == 0
    assert val[("attnd_session_bytes", None)] == 0
    msg = check_error_body(step(d, sid, q[4:5]), 404)
    assert "timed out" in msg


def test_v2_positions(d):
    """KServe v2: positions as an INT64 input give the golden answer."""
    g = GOLDENS[0]
    s = g["sequences"][1]  # positions 100..106
    q = np.array(s["query"], dtype=np.float32)
    body = {"inputs": [
        {"name": "query", "shape": [1, q.shape[0], q.shape[1]], "datatype": "FP32",
         "data": q.reshape(-1).tolist()},
        {"name": "positions", "shape": [q.shape[0]], "datatype": "INT64",
         "data": s["positions"]}]}
    r = d.post("/v2/models/%s/infer" % g["name"], body)
    assert r.status_code == 200, r.text[:300]
    out = np.array(r.json()["outputs"][0]["data"], dtype=np.float32).reshape(q.shape)
    assert rel_err(out, s["output"]) <= TOL


def test_step_while_busy_is_409(d):
    """Steps of one session sent while its long step (8000 rows) computes
    get 409 at once and change nothing; the ones sent before or after it
    are answered. Short steps are sent back to back until one is refused
    or the long one is answered, so no sleep decides the order. A short
    step may still reach the session before the long one (whose body takes
    longer to read): then the long step is the one refused, which is right
    too, and the round is tried again; every round's answers are counted in
    the session's cached tokens."""
    g = GOLDENS[[x["name"] for x in GOLDENS].index("gqa_half")]
    sid = open_session(d, "gqa_half").json()["session"]
    rng = np.random.default_rng(7)
    big = np.round(rng.standard_normal((8000, g["embed_dim"])), 2).tolist()  # 16000 tokens
    cached, met = 0, None
    for _ in range(5):
        done = {}
        t = threading.Thread(target=lambda: done.setdefault("r", step(d, sid, big)))
        t.start()
        refused = None
        while refused is None and t.is_alive():
            r = step(d, sid, big[:1])
            if r.status_code == 409:
                refused = r
            else:
                assert r.status_code == 200, r.text[:200]
                cached += 1
        t.join(300)
        long = done["r"]
        assert long.status_code in (200, 409), long.text[:200]
        if long.status_code == 200:
            cached += len(big)
            if refused is not None:
                met = refused
                break
        else:  # a short step was ahead of it: refused, and nothing cached
            assert "previous step is still queued or computing" in check_error_body(long, 409)
    assert met is not None, "in five rounds no short step met the long one computing"
    assert "previous step is still queued or computing" in check_error_body(met, 409)
    after = step(d, sid, big[:1]).json()["cached_tokens"]
    assert after == cached + 1
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_v2_sessions_through_parameters(d):
    """KServe v2: parameters.session_open opens a session with the query as
    its prefix, parameters.session_id steps it; the answers' parameters
    carry session_id and cached_tokens, and equal the golden rows."""
    g = GOLDENS[0]
    s = g["sequences"][0]
    q, want = np.array(s["query"], dtype=np.float32), np.array(s["output"])
    E = g["embed_dim"]

    def infer(rows, params):
        body = {"inputs": [{"name": "query", "shape": [1, len(rows), E], "datatype": "FP32",
                            "data": np.asarray(rows).reshape(-1).tolist()}],
                "parameters": params}
        return d.post("/v2/models/%s/infer" % g["name"], body)

    r = infer(q[:5], {"session_open": True})
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    sid, p = a["parameters"]["session_id"], a["parameters"]
    assert p["cached_tokens"] == 5 and "batch" in p
    out = np.array(a["outputs"][0]["data"], dtype=np.float32).reshape(5, E)
    assert rel_err(out, want[:5]) <= TOL
    for at in range(5, 8):
        a = infer(q[at:at + 1], {"session_id": sid}).json()
        assert a["parameters"]["cached_tokens"] == at + 1
        out = np.array(a["outputs"][0]["data"], dtype=np.float32).reshape(1, E)
        assert rel_err(out, want[at:at + 1]) <= TOL
    check_error_body(infer(q[:1], {"session_id": "0123456789abcdef0123456789abcdef"}), 404)
    check_error_body(infer(q[:1], {"session_id": sid, "session_open": True}), 400)
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_v2_open_takes_x_session_id(d):
    """A v2 open names its session from X-Session-Id, as the native open
    does (what a load balancer sets for affinity, docs/deploy.md); a taken
    id gets 409, a malformed one 400; steps carry the header too and are
    answered from the session their parameters name."""
    g = GOLDENS[0]
    s = g["sequences"][0]
    q, want = np.array(s["query"], dtype=np.float32), np.array(s["output"])
    E = g["embed_dim"]
    sid = "0123456789abcdef0123456789abcd01"

    def infer(rows, params, header):
        body = {"inputs": [{"name": "query", "shape": [1, len(rows), E], "datatype": "FP32",
                            "data": np.asarray(rows).reshape(-1).tolist()}],
                "parameters": params}
        return d.post("/v2/models/%s/infer" % g["name"], body,
                      headers={"X-Session-Id": header})

    r = infer(q[:3], {"session_open": True}, sid)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["parameters"]["session_id"] == sid == r.headers["X-Session-Id"]
    msg = check_error_body(infer(q[:3], {"session_open": True}, sid), 409)
    assert "open already" in msg
    msg = check_error_body(infer(q[:3], {"session_open": True}, "NOT-hex"), 400)
    assert "X-Session-Id" in msg
    a = infer(q[3:4], {"session_id": sid}, sid).json()
    assert a["parameters"]["session_id"] == sid and a["parameters"]["cached_tokens"] == 4
    out = np.array(a["outputs"][0]["data"], dtype=np.float32).reshape(1, E)
    assert rel_err(out, want[3:4]) <= TOL
    # an ordinary infer ignores the header
    r = infer(q[:2], {}, "NOT-hex")
    assert r.status_code == 200 and "session_id" not in (r.json().get("parameters") or {})
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_model_without_sessions_says_so_once(daemons):
    """A model whose kdim or vdim differ from embed_dim cannot hold sessions:
    an open without a prefix, with one, with a key added, and a v2 open all
    get the one 400 that says why, and nothing is opened."""
    goldens = {g["name"]: m for g, m in support.load_goldens()}
    m = goldens["cross_e48_h4_k40_v24"]
    d = daemons({"models": [m.config()]})
    E = 48
    rows = [[0.1] * E] * 2
    bodies = [{}, {"query": rows}, {"query": rows, "key": [[0.1] * 40] * 2,
                                    "value": [[0.1] * 24] * 2}]
    for body in bodies:
        msg = check_error_body(d.post("/v1/sessions", body), 400)
        assert msg.startswith("model 'cross_e48_h4_k40_v24' cannot hold sessions: its kdim 40 "
                              "and vdim 24 differ from its embed_dim 48"), (body.keys(), msg)
    v2 = {"inputs": [{"name": "query", "shape": [1, 2, E], "datatype": "FP32",
                      "data": [0.1] * (2 * E)}], "parameters": {"session_open": True}}
    msg = check_error_body(d.post("/v2/models/cross_e48_h4_k40_v24/infer", v2), 400)
    assert "cannot hold sessions" in msg, msg
    assert opened_total(d) == 0


def test_causal_false_refused_in_sessions(d):
    """A session is always causal: causal false on an open's prefix, a step
    or a v2 session is a 400 naming the field, not silently ignored; causal
    true is accepted."""
    g = GOLDENS[0]
    E = g["embed_dim"]
    rows = [[0.1] * E]
    msg = check_error_body(d.post("/v1/sessions", {"model": g["name"], "query": rows,
                                                   "causal": False}), 400)
    assert msg.startswith("causal: a session is always causal"), msg
    sid = open_session(d, g["name"], rows).json()["session"]
    msg = check_error_body(d.post("/v1/sessions/%s/attention" % sid,
                                  {"query": rows, "causal": False}), 400)
    assert msg.startswith("causal: a session is always causal"), msg
    r = d.post("/v1/sessions/%s/attention" % sid, {"query": rows, "causal": True})
    assert r.status_code == 200 and r.json()["cached_tokens"] == 2, r.text[:200]
    v2 = {"inputs": [{"name": "query", "shape": [1, 1, E], "datatype": "FP32",
                      "data": [0.1] * E}], "parameters": {"session_id": sid, "causal": False}}
    msg = check_error_body(d.post("/v2/models/%s/infer" % g["name"], v2), 400)
    assert msg.startswith("parameters.causal: a session is always causal"), msg
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_step_extras_refused_before_their_shapes(d):
    """A step's attn_mask (or key_padding_mask, positions) of any shape gets
    the one sentence that says a step takes query rows only: no message
    names a shape that would then be refused too."""
    g = GOLDENS[0]
    E = g["embed_dim"]
    sid = open_session(d, g["name"], [[0.1] * E] * 3).json()["session"]
    for extra in ({"attn_mask": [[False] * 5]}, {"attn_mask": [[False]]},
                  {"attn_mask": [[False] * 4]}, {"key_padding_mask": [False] * 9},
                  {"positions": [3]}):
        body = dict({"query": [[0.1] * E]}, **extra)
        msg = check_error_body(d.post("/v1/sessions/%s/attention" % sid, body), 400)
        field = next(iter(extra))
        assert msg.startswith(field + ": a session step takes query rows only"), msg
        assert "expected" not in msg, msg
    assert step(d, sid, [[0.1] * E]).json()["cached_tokens"] == 4
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_session_limits_name_themselves(daemons):
    """Each 429 and 413 of a session limit names its config key and the
    numbers: limits.max_sessions, limits.max_session_bytes (all caches) and
    limits.max_session_bytes_each (one; a prefix is called the prefix), and
    max_positions with the position as digits."""
    gi = [x["name"] for x in GOLDENS].index("gqa_half")
    g = GOLDENS[gi]
    q = g["sequences"][0]["query"]  # gqa_half: 128 bytes a cached token
    cfg = decoder_config({"max_sessions": 2, "max_session_bytes": 1024,
                          "max_session_bytes_each": 768})
    d = daemons(cfg)
    msg = check_error_body(open_session(d, "gqa_half", q[:7]), 413)
    assert msg.startswith("limits.max_session_bytes_each: the prefix would take the session to "
                          "7 tokens, a cache of 896 bytes (128 a token)"), msg
    assert "768 bytes (6 tokens)" in msg, msg
    a = open_session(d, "gqa_half", q[:5]).json()["session"]
    msg = check_error_body(step(d, a, q[5:7]), 413)
    assert msg.startswith("limits.max_session_bytes_each: the step would take the session to 7 "
                          "tokens"), msg
    b = open_session(d, "gqa_half", q[:2]).json()["session"]
    msg = check_error_body(step(d, b, q[2:4]), 429)
    assert msg.startswith("limits.max_session_bytes: the step needs a cache of 512 bytes (4 "
                          "tokens)"), msg
    assert "of the 1024 bytes" in msg, msg
    r = open_session(d, "gqa_half")
    msg = check_error_body(r, 429)
    assert msg.startswith("limits.max_sessions: 2 sessions are open"), msg
    assert int(r.headers["Retry-After"]) >= 1
    for sid in (a, b):
        assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_positions_printed_as_digits(d):
    """A position past the limit is printed as its digits (16777216), never
    as 1.67772e+07."""
    g = GOLDENS[0]
    rows = [[0.1] * g["embed_dim"]] * 2
    msg = check_error_body(d.post("/v1/attention", {"model": g["name"], "query": rows,
                                                    "positions": [1, 16777216]}), 400)
    assert "positions[1]: 16777216 is not" in msg and "e+" not in msg, msg
