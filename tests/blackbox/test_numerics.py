"""Numbers: every golden sequence (torch.nn.MultiheadAttention, made by
tests/gen_golden.py) through the native API with JSON and base64 tensors and
through KServe v2 infer, single and batched, to a relative error of 1e-5;
and the embedded default model (no config)."""
import json

import numpy as np
import pytest

import support
from support import b64_tensor, from_b64_tensor, golden_body, golden_mask, rel_err

TOL = 1e-5
GOLDENS = support.load_goldens()
CASES = [pytest.param(g["name"], i, id="%s-%d" % (g["name"], i))
         for g, _ in GOLDENS for i in range(len(g["sequences"]))]
BY_NAME = {g["name"]: (g, m) for g, m in GOLDENS}


@pytest.fixture(scope="module")
def d(daemons, golden_config):
    return daemons(golden_config)


def test_golden_files_present():
    assert len(GOLDENS) >= 1, "no golden files under %s" % support.GOLDEN_DIR
    for g, m in GOLDENS:
        assert m.path.exists(), m.path
        assert g["sequences"], g["name"]


@pytest.mark.parametrize("name,i", CASES)
def test_reference_matches_golden(name, i):
    """The numpy reference used for random inputs below agrees with torch."""
    g, m = BY_NAME[name]
    s = g["sequences"][i]
    out, w = m.forward(s["query"], s["key"], s["value"], s["causal"], s["key_padding_mask"],
                       golden_mask(s))
    assert rel_err(np.float32(out), s["output"]) <= 1e-6
    if s["attention"] == "heads":
        assert rel_err(np.float32(w), s["attn_weights"]) <= 1e-6
    elif s["attention"] == "mean":
        assert rel_err(np.float32(w.mean(axis=0)), s["attn_weights"]) <= 1e-6


def check_native(r, seq, name):
    assert r.status_code == 200, r.text[:500]
    assert r.headers.get("Content-Type", "").startswith("application/json")
    body = r.json()
    assert body.get("model") == name
    out = body["output"]
    if isinstance(out, dict):
        out = from_b64_tensor(out)
    out = np.asarray(out, dtype=np.float64)
    err = rel_err(out, seq["output"])
    assert err <= TOL, "output relative error %.3g" % err
    mode = seq["attention"]
    if mode == "none":
        assert "attention" not in body, "attention returned although not asked"
    else:
        att = body["attention"]
        if isinstance(att, dict):
            att = from_b64_tensor(att)
        err = rel_err(np.asarray(att, dtype=np.float64), seq["attn_weights"])
        assert err <= TOL, "attention relative error %.3g" % err
    return body


@pytest.mark.parametrize("name,i", CASES)
@pytest.mark.parametrize("how", ["json", "model_route", "b64_in", "b64_out", "b64_both"])
def test_golden_native(d, name, i, how):
    g, _ = BY_NAME[name]
    seq = g["sequences"][i]
    b64_in = how in ("b64_in", "b64_both")
    encoding = "base64" if how in ("b64_out", "b64_both") else None
    if how == "model_route":
        r = d.post("/v1/models/%s/attention" % name, golden_body(seq, None, encoding, b64_in))
    else:
        r = d.post("/v1/attention", golden_body(seq, name, encoding, b64_in))
    body = check_native(r, seq, name)
    if encoding == "base64":
        assert isinstance(body["output"], dict) and body["output"]["shape"] == [
            len(seq["query"]), g["embed_dim"]]
        if seq["attention"] != "none":
            assert isinstance(body["attention"], dict)
    else:
        assert isinstance(body["output"], list)
    L = len(seq["query"])
    S = L if seq["key"] is None else len(seq["key"])
    u = body.get("usage")
    assert isinstance(u, dict), "usage missing"
    assert u.get("query_tokens") == L and u.get("key_tokens") == S, u
    for k in ("batch", "queue_us", "compute_us"):
        assert isinstance(u.get(k), int) and u[k] >= 0, (k, u)
    assert u["batch"] >= 1


@pytest.mark.parametrize("name", sorted(BY_NAME))
def test_json_floats_round_trip_float32(d, name):
    """JSON answers carry enough digits to give back the very float32 the
    base64 answer carries (SPEC: 9 significant digits)."""
    g, _ = BY_NAME[name]
    for seq in g["sequences"]:
        rj = d.post("/v1/attention", golden_body(seq, name))
        rb = d.post("/v1/attention", golden_body(seq, name, "base64"))
        assert rj.status_code == 200 and rb.status_code == 200, (rj.text[:300], rb.text[:300])
        oj = np.asarray(rj.json()["output"], dtype=np.float64).astype(np.float32)
        ob = from_b64_tensor(rb.json()["output"])
        assert np.array_equal(oj, ob), "JSON output differs from the base64 output: max %g" % (
            np.abs(oj - ob).max())


def v2_inputs(query, key=None, value=None, kpm=None, am=None):
    def t(name, a, dt):
        a = np.asarray(a)
        data = a.reshape(-1).tolist() if dt == "BOOL" else a.astype(np.float32).reshape(
            -1).astype(np.float64).tolist()
        return {"name": name, "shape": list(a.shape), "datatype": dt, "data": data}
    ins = [t("query", query, "FP32")]
    if key is not None:
        ins.append(t("key", key, "FP32"))
    if value is not None:
        ins.append(t("value", value, "FP32"))
    if kpm is not None:
        ins.append(t("key_padding_mask", np.asarray(kpm, dtype=bool), "BOOL"))
    if am is not None:
        am = np.asarray(am)
        ins.append(t("attn_mask", am, "BOOL" if am.dtype == np.bool_ else "FP32"))
    return ins


def v2_outputs(body):
    assert isinstance(body.get("outputs"), list), body
    outs = {}
    for o in body["outputs"]:
        assert o["datatype"] == "FP32", o.get("datatype")
        a = np.asarray(o["data"], dtype=np.float64)
        assert a.size == int(np.prod(o["shape"])), (a.size, o["shape"])
        outs[o["name"]] = a.reshape(o["shape"])
    return outs


@pytest.mark.parametrize("name,i", CASES)
@pytest.mark.parametrize("ask", ["explicit_outputs", "default_outputs"])
def test_golden_v2(d, name, i, ask):
    g, _ = BY_NAME[name]
    s = g["sequences"][i]
    req = {"inputs": v2_inputs(s["query"], s["key"], s["value"], s["key_padding_mask"],
                               golden_mask(s)),
           "parameters": {"causal": bool(s["causal"]), "attention": s["attention"]}}
    if ask == "explicit_outputs":
        req["outputs"] = [{"name": "output"}]
        if s["attention"] != "none":
            req["outputs"].append({"name": "attention"})
    r = d.post("/v2/models/%s/infer" % name, req)
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    assert body.get("model_name") == name
    outs = v2_outputs(body)
    assert rel_err(outs["output"], support.v2_ranked(s["output"])) <= TOL
    if s["attention"] == "none":
        assert "attention" not in outs
    else:
        assert rel_err(outs["attention"], support.v2_ranked(s["attn_weights"], s["attention"])) <= TOL


def random_batch(m, rng, B, L, S, cross, causal, kpm, mask):
    q = rng.standard_normal((B, L, m.E)).astype(np.float32)
    k = v = None
    if cross:
        k = rng.standard_normal((B, S, m.kdim)).astype(np.float32)
        v = rng.standard_normal((B, S, m.vdim)).astype(np.float32)
    else:
        S = L
    kp = None
    if kpm:
        kp = rng.random((B, S)) < 0.3
        kp[:, 0] = False
        kp[-1, :] = True  # one sequence fully hidden: output rows = out_proj.bias
    am = None
    if mask == "bool":
        am = rng.random((L, S)) < 0.25
        am[:, -1] = False
    elif mask == "float":
        am = (rng.standard_normal((L, S)) * 2).astype(np.float32)
    return q, k, v, kp, am


BATCH_CASES = [
    dict(B=3, L=4, S=4, cross=False, causal=False, kpm=False, mask=None, attention="heads"),
    dict(B=2, L=5, S=7, cross=True, causal=False, kpm=True, mask=None, attention="mean"),
    dict(B=4, L=6, S=6, cross=False, causal=True, kpm=True, mask="float", attention="heads"),
    dict(B=2, L=3, S=5, cross=True, causal=False, kpm=False, mask="bool", attention="none"),
    dict(B=1, L=2, S=2, cross=False, causal=False, kpm=False, mask=None, attention="mean"),
]


@pytest.mark.parametrize("name", sorted(BY_NAME))
@pytest.mark.parametrize("ci", range(len(BATCH_CASES)))
@pytest.mark.parametrize("how", ["json", "b64", "v2"])
def test_batched(d, name, ci, how):
    """B x L x E requests: each sequence of the batch equals its own reference."""
    g, m = BY_NAME[name]
    c = BATCH_CASES[ci]
    cross = c["cross"] or m.kdim != m.E or m.vdim != m.E
    rng = np.random.default_rng(100 + ci)
    q, k, v, kp, am = random_batch(m, rng, c["B"], c["L"], c["S"], cross, c["causal"],
                                   c["kpm"], c["mask"])
    ref, w = m.forward(q, k, v, c["causal"], kp, am)
    if c["attention"] == "mean":
        w = w.mean(axis=1)
    if how == "v2":
        req = {"inputs": v2_inputs(q, k, v, kp, am),
               "parameters": {"causal": c["causal"], "attention": c["attention"]}}
        r = d.post("/v2/models/%s/infer" % name, req)
        assert r.status_code == 200, r.text[:500]
        outs = v2_outputs(r.json())
        assert outs["output"].shape == ref.shape
        assert rel_err(outs["output"], ref) <= TOL
        if c["attention"] != "none":
            assert rel_err(outs["attention"], support.v2_ranked(w, c["attention"])) <= TOL
        return
    enc = b64_tensor if how == "b64" else support.tolist32
    body = {"model": name, "query": enc(q), "causal": c["causal"], "attention": c["attention"]}
    if k is not None:
        body["key"], body["value"] = enc(k), enc(v)
    if kp is not None:
        body["key_padding_mask"] = kp.tolist()
    if am is not None:
        body["attn_mask"] = am.tolist() if am.dtype == np.bool_ else enc(am)
    if how == "b64":
        body["encoding"] = "base64"
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:500]
    resp = r.json()
    out = resp["output"]
    out = from_b64_tensor(out) if how == "b64" else np.asarray(out)
    assert out.shape == ref.shape, (out.shape, ref.shape)
    assert rel_err(out, ref) <= TOL
    if m.bias and kp is not None:
        # the fully hidden last sequence answers out_proj.bias on every row
        assert np.allclose(out[-1], m.sd["out_proj.bias"][None, :], rtol=0, atol=1e-6)
    if c["attention"] == "none":
        assert "attention" not in resp
    else:
        att = resp["attention"]
        att = from_b64_tensor(att) if how == "b64" else np.asarray(att)
        assert att.shape == w.shape, (att.shape, w.shape)
        assert rel_err(att, w) <= TOL
        if kp is not None:
            assert np.all(att[-1] == 0), "fully hidden rows must have zero attention weights"
    u = resp["usage"]
    assert u["query_tokens"] == c["B"] * c["L"], u
    assert u["key_tokens"] == c["B"] * (c["S"] if cross else c["L"]), u


def test_batched_matches_single(d):
    """A batch answers what its sequences answer one by one."""
    g, m = BY_NAME["self_e64_h8"]
    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 5, m.E)).astype(np.float32)
    rb = d.post("/v1/attention", {"model": m.name, "query": b64_tensor(q), "encoding": "base64",
                                  "attention": "heads"})
    assert rb.status_code == 200, rb.text[:300]
    ob = from_b64_tensor(rb.json()["output"])
    ab = from_b64_tensor(rb.json()["attention"])
    for b in range(3):
        r = d.post("/v1/attention", {"model": m.name, "query": b64_tensor(q[b]),
                                     "encoding": "base64", "attention": "heads"})
        assert r.status_code == 200
        assert rel_err(from_b64_tensor(r.json()["output"]), ob[b]) <= TOL
        assert rel_err(from_b64_tensor(r.json()["attention"]), ab[b]) <= TOL


def test_large_answers_same_bits_in_every_encoding(d):
    """Answers large enough to be written in chunks by every thread (an
    output of 38,400 numbers and a mean attention matrix of 180,000, rows
    cut across chunks) carry the same float32 bits as native JSON text,
    base64, v2 JSON data and v2 binary data, and equal the reference."""
    g, m = BY_NAME["self_e64_h8"]
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 300, m.E)).astype(np.float32)
    base = {"model": m.name, "query": b64_tensor(q), "attention": "mean"}
    rj = d.post("/v1/attention", base)
    rb = d.post("/v1/attention", dict(base, encoding="base64"))
    assert rj.status_code == 200 and rb.status_code == 200, (rj.text[:300], rb.text[:300])
    out = from_b64_tensor(rb.json()["output"])
    att = from_b64_tensor(rb.json()["attention"])
    assert out.shape == (2, 300, m.E) and att.shape == (2, 300, 300)
    for b in range(2):
        ref, w = m.forward(q[b], None, None, False, None, None)
        assert rel_err(out[b], ref) <= TOL
        assert rel_err(att[b], w.mean(axis=0)) <= TOL
    as_f32 = lambda x: np.asarray(x, dtype=np.float64).astype(np.float32)
    assert np.array_equal(as_f32(rj.json()["output"]), out)
    assert np.array_equal(as_f32(rj.json()["attention"]), att)
    req = {"inputs": v2_inputs(q), "parameters": {"attention": "mean"}}
    r2 = d.post("/v2/models/%s/infer" % m.name, req)
    assert r2.status_code == 200, r2.text[:300]
    outs = {o["name"]: o for o in r2.json()["outputs"]}
    assert np.array_equal(as_f32(outs["output"]["data"]), out.reshape(-1))
    assert np.array_equal(as_f32(outs["attention"]["data"]), att.reshape(-1))
    req["outputs"] = [{"name": "output", "parameters": {"binary_data": True}},
                      {"name": "attention", "parameters": {"binary_data": True}}]
    rbin = d.post("/v2/models/%s/infer" % m.name, req)
    assert rbin.status_code == 200, rbin.text[:300]
    n = int(rbin.headers["Inference-Header-Content-Length"])
    head = json.loads(rbin.content[:n])
    sizes = [o["parameters"]["binary_data_size"] for o in head["outputs"]]
    data = rbin.content[n:]
    assert sizes == [out.nbytes, att.nbytes] and len(data) == sum(sizes)
    assert np.frombuffer(data[:sizes[0]], dtype="<f4").tobytes() == out.tobytes()
    assert data[sizes[0]:] == att.astype("<f4").tobytes()


def test_models_listing(d):
    r = d.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    models = body.get("models", body) if isinstance(body, dict) else body
    assert isinstance(models, list), body
    by = {x["name"]: x for x in models}
    assert set(by) == set(BY_NAME), sorted(by)
    for name, (g, _) in BY_NAME.items():
        for k in ("embed_dim", "num_heads", "kdim", "vdim", "bias"):
            assert by[name].get(k) == g[k], (name, k, by[name].get(k), g[k])


# ---------------------------------------------------------------- default model

def default_request(d):
    rng = np.random.default_rng(42)
    q = rng.standard_normal((6, 512)).astype(np.float32)
    r = d.post("/v1/attention", {"query": support.tolist32(q), "attention": "heads"})
    assert r.status_code == 200, r.text[:500]
    body = r.json()
    assert body["model"] == "default"
    out = np.asarray(body["output"], dtype=np.float64)
    att = np.asarray(body["attention"], dtype=np.float64)
    assert out.shape == (6, 512)
    assert att.shape == (8, 6, 6)
    assert np.isfinite(out).all() and np.isfinite(att).all()
    assert np.abs(out).max() > 0
    assert np.allclose(att.sum(axis=-1), 1.0, atol=1e-5)
    return out, att


def test_default_model_deterministic(fresh_daemons):
    outs = []
    for _ in range(2):
        d = fresh_daemons()
        r = d.get("/v1/models")
        assert r.status_code == 200
        assert "default" in r.text and "512" in r.text
        outs.append(default_request(d))
        d.check_clean_exit()
        log = (d.stdout() + d.stderr()).lower()
        assert "default" in log, "the log does not say the default model is served"
    assert rel_err(outs[1][0], outs[0][0]) <= 1e-6, "default model differs across starts"
    assert rel_err(outs[1][1], outs[0][1]) <= 1e-6


def test_default_model_initialised_like_torch(fresh_daemons):
    """torch initialises nn.MultiheadAttention with zero biases, in_proj_weight
    xavier-uniform and out_proj.weight uniform(+-1/sqrt(E)). Through the API:
    a zero query gives a zero output (all biases 0), and one-token sequences
    e_i give out = Wo Wv e_i, whose entries have variance
    E * (1/E / 3) * (6/(4E) / 3) = 1/(6E)."""
    d = fresh_daemons()
    r = d.post("/v1/attention", {"query": b64_tensor(np.zeros((3, 512))), "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    assert np.abs(from_b64_tensor(r.json()["output"])).max() == 0.0
    eye = np.eye(512, dtype=np.float32).reshape(512, 1, 512)
    r = d.post("/v1/attention", {"query": b64_tensor(eye), "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    prod = from_b64_tensor(r.json()["output"]).reshape(512, 512)
    var = prod.astype(np.float64).var()
    expect = 1.0 / (6 * 512)
    assert 0.9 * expect < var < 1.1 * expect, "variance %.3g, torch's init gives %.3g" % (
        var, expect)
    assert abs(prod.mean()) < 0.1 * np.sqrt(expect)


def test_batched_shared_key_padding_mask(d):
    """A key_padding_mask of shape S applies to every sequence of a batch."""
    g, m = BY_NAME["self_e64_h8"]
    rng = np.random.default_rng(9)
    q = rng.standard_normal((3, 5, m.E)).astype(np.float32)
    kpm = np.array([False, True, False, False, True])
    ref, _ = m.forward(q, key_padding_mask=np.tile(kpm, (3, 1)))
    r = d.post("/v1/attention", {"model": m.name, "query": b64_tensor(q),
                                 "key_padding_mask": kpm.tolist(), "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    assert rel_err(from_b64_tensor(r.json()["output"]), ref) <= TOL


# ---------------------------------------------------------------- tile edges

@pytest.fixture(scope="module")
def tiles(daemons, tmp_path_factory):
    """Two random models whose head widths take different kernels (16 and 12)."""
    tmp = tmp_path_factory.mktemp("tiles")
    ms = [support.Model.random("d16", 64, 4, seed=71),
          support.Model.random("d12", 48, 4, kdim=40, vdim=24, seed=72)]
    for m in ms:
        m.save(tmp / (m.name + ".safetensors"))
    d = daemons({"models": [m.config() for m in ms], "server": {"max_body_bytes": 64 << 20},
                 "limits": {"max_tokens_per_request": 16384,
                            "max_attention_floats": 1 << 26}})
    return d, {m.name: m for m in ms}


TILE_CASES = [
    # (L, S, options): lengths around 16/64/128/256-row and key tiles
    (1, 1, ""), (15, 17, ""), (16, 64, ""), (17, 65, "kpm"), (63, 129, "causal"),
    (255, 256, ""), (256, 257, "kpm_first_tile"), (257, 255, "causal"),
    (300, 513, "kpm_first_tile"), (3, 1500, "kpm_last_tile"), (700, 5, "float_mask"),
    (129, 300, "causal_kpm"), (64, 600, "bool_mask"), (2, 1025, "kpm_all_but_one"),
]


@pytest.mark.parametrize("model", ["d16", "d12"])
@pytest.mark.parametrize("attention", ["none", "heads"])
@pytest.mark.parametrize("case", TILE_CASES, ids=["L%d-S%d-%s" % c for c in TILE_CASES])
def test_tile_edges(tiles, model, attention, case):
    """Query and key lengths on both sides of the kernels' tile sizes, with
    whole key tiles hidden: each equals the reference (online softmax must
    survive a tile whose keys are all hidden)."""
    d, models = tiles
    m = models[model]
    L, S, opt = case
    rng = np.random.default_rng(L * 10007 + S)
    q = rng.standard_normal((L, m.E)).astype(np.float32)
    cross = m.kdim != m.E or L != S
    k = rng.standard_normal((S, m.kdim)).astype(np.float32) if cross else None
    v = rng.standard_normal((S, m.vdim)).astype(np.float32) if cross else None
    if not cross:
        S = L
    kpm = am = None
    causal = "causal" in opt
    if "kpm" in opt:
        kpm = rng.random(S) < 0.3
        if opt == "kpm_first_tile":
            kpm[:min(S - 1, 256)] = True
        elif opt == "kpm_last_tile":
            kpm[:] = False
            kpm[-min(S - 1, 300):] = True
        elif opt == "kpm_all_but_one":
            kpm[:] = True
            kpm[S // 2 + 1] = False
    if opt == "float_mask":
        am = (rng.standard_normal((L, S)) * 3).astype(np.float32)
        am[:, :2] = -1e9
    elif opt == "bool_mask":
        am = rng.random((L, S)) < 0.5
        am[:, :256] = True  # the first key tile is hidden from every row...
        am[5] = True        # ...and row 5 sees nothing at all
    ref, w = m.forward(q, k, v, causal, kpm, am)
    body = {"model": model, "query": b64_tensor(q), "causal": causal, "attention": attention,
            "encoding": "base64"}
    if cross:
        body["key"], body["value"] = b64_tensor(k), b64_tensor(v)
    if kpm is not None:
        body["key_padding_mask"] = kpm.tolist()
    if am is not None:
        body["attn_mask"] = am.tolist() if am.dtype == np.bool_ else b64_tensor(am)
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    out = from_b64_tensor(r.json()["output"])
    err = rel_err(out, ref)
    assert err <= TOL, "output relative error %.3g" % err
    if attention == "heads":
        err = rel_err(from_b64_tensor(r.json()["attention"]), w)
        assert err <= TOL, "attention relative error %.3g" % err
