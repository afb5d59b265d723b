"""Selections of the attention matrices (SPEC section 9) against torch: the
golden sequences of tests/gen_golden.py that carry "selections" (heads in a
given order, means over some heads, rows across the core's 128-row blocks,
top-k, a fully hidden row), each asked of the real daemon and compared with
torch's weights of the same rows (torch_weights), sliced and averaged here:

- native JSON to 1e-5; top-k against numpy's argsort of torch's weights
  (values to 1e-5, the same keys unless two keys' weights tie within float32
  noise, descending, the lower key first among equal weights);
- native base64 in float16 and bfloat16 within one unit in the last place
  of that dtype, and their JSON numbers the very rounded values;
- KServe v2: JSON outputs, and tritonclient's binary outputs FP16 and BF16
  (attention, attention_topk_indices INT32, attention_topk_values);
- KV-cache session steps with a selection, native and v2;
- 400s that name the field and the value; 413 only when the selection
  itself is over limits.max_attention_floats;
- a long sequence (8192 x 512) whose one head x 10 rows is served while its
  whole matrices are 413.
"""
import base64

import numpy as np
import pytest
import requests

import support
from support import b64_tensor, golden_body, rel_err

TOL = 1e-5
GOLDENS = support.load_goldens()
BY_NAME = {g["name"]: (g, m) for g, m in GOLDENS}
CASES = [pytest.param(g["name"], i, j, id="%s-%d-%d" % (g["name"], i, j))
         for g, _ in GOLDENS for i, s in enumerate(g["sequences"])
         for j in range(len(s.get("selections", [])))]
SEL_FIELDS = ("attention", "attention_heads", "attention_rows", "attention_top_k")


@pytest.fixture(scope="module")
def d(daemons, golden_config):
    return daemons(golden_config)


def test_selection_goldens_present():
    assert CASES, "no golden sequence with selections (run /usr/bin/python3 tests/gen_golden.py)"


def case(name, i, j):
    g, _ = BY_NAME[name]
    seq = g["sequences"][i]
    return g, seq, seq["selections"][j]


def expected(g, seq, sel):
    """torch's weights of the selection: (heads, rows, S), or (rows, S) for a
    mean, in float64."""
    w = np.asarray(seq["torch_weights"], dtype=np.float64)
    t0, _ = seq["torch_rows"]
    r0, r1 = sel.get("attention_rows", [0, len(seq["query"])])
    part = w[sel.get("attention_heads", list(range(g["num_heads"]))), r0 - t0:r1 - t0]
    return part.mean(axis=0) if sel["attention"] == "mean" else part


def request_of(name, seq, sel, **extra):
    body = golden_body(seq, name, extra.pop("encoding", None))
    body.update({k: v for k, v in sel.items() if k in SEL_FIELDS})
    body.update(extra)
    return body


def check_top_k(idx, val, want, tol=TOL):
    """attnd's top-k (idx, val: (..., k)) against numpy's argsort of torch's
    weights want (..., S)."""
    k = idx.shape[-1]
    w = want.reshape(-1, want.shape[-1])
    fi, fv = idx.reshape(-1, k), np.asarray(val, dtype=np.float64).reshape(-1, k)
    order = np.argsort(-w, axis=-1, kind="stable")[:, :k]  # descending, lower key first
    top = np.take_along_axis(w, order, -1)
    assert rel_err(fv, top) <= tol, "top-k values off by %g" % rel_err(fv, top)
    at = np.take_along_axis(w, fi, -1)  # torch's weights at attnd's keys
    other = fi != order
    assert np.all(np.abs(at - top)[other] <= 1e-6), (
        "keys other than argsort's where torch's weights do not tie: %s vs %s"
        % (fi[other.any(axis=1)][:3], order[other.any(axis=1)][:3]))
    assert all(len(set(r)) == k for r in fi.tolist()), "a key given twice in one row"
    steps = np.diff(fv, axis=-1)
    assert np.all(steps <= 0), "top-k values not in descending order"
    assert np.all(np.diff(fi, axis=-1)[steps == 0] > 0), "equal weights: lower key not first"


def check_answer(att, seq, g, sel, tol=TOL):
    """A native answer's attention (JSON numbers) against torch's."""
    want = expected(g, seq, sel)
    if sel.get("attention_top_k"):
        assert set(att) == {"indices", "values"}, att.keys()
        idx, val = np.asarray(att["indices"]), np.asarray(att["values"], dtype=np.float64)
        assert idx.shape == want.shape[:-1] + (sel["attention_top_k"],), idx.shape
        assert idx.dtype.kind == "i", "indices are not whole numbers"
        check_top_k(idx, val, want, tol)
    else:
        a = np.asarray(att, dtype=np.float64)
        assert a.shape == want.shape, (a.shape, want.shape)
        assert rel_err(a, want) <= tol, "selection off torch by %g" % rel_err(a, want)


@pytest.mark.parametrize("name,i,j", CASES)
def test_native_json_against_torch(d, name, i, j):
    g, seq, sel = case(name, i, j)
    r = d.post("/v1/attention", request_of(name, seq, sel))
    assert r.status_code == 200, r.text[:400]
    body = r.json()
    assert rel_err(body["output"], seq["output"]) <= TOL  # the output is the whole output
    check_answer(body["attention"], seq, g, sel)


def decode(obj):
    """A tensor object of an answer, by its dtype."""
    raw = base64.b64decode(obj["b64"], validate=True)
    dt = obj["dtype"]
    if dt == "float16":
        a = np.frombuffer(raw, "<f2").astype(np.float32)
    elif dt == "bfloat16":
        a = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        a = np.frombuffer(raw, {"float32": "<f4", "int32": "<i4"}[dt])
    assert a.size == int(np.prod(obj["shape"])), (a.size, obj["shape"])
    return a.reshape(obj["shape"])


def ulp(x, dtype):
    """One unit in the last place of dtype at |x|."""
    x = np.abs(np.asarray(x, dtype=np.float64))
    if dtype == "float16":
        return np.spacing(x.astype(np.float16)).astype(np.float64)
    e = np.floor(np.log2(np.maximum(x, np.finfo(np.float32).tiny)))
    return np.exp2(e - 7)  # bfloat16: 8 bits of significand


def bf16_exact(a):
    return np.all((np.asarray(a, np.float32).view(np.uint32) & 0xFFFF) == 0)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,i,j", CASES)
def test_native_rounded_dtypes(d, name, i, j, dtype):
    """base64 in the dtype within one unit in its last place of torch's
    weights; the JSON answer's numbers are the same rounded values."""
    g, seq, sel = case(name, i, j)
    rb = d.post("/v1/attention", request_of(name, seq, sel, encoding="base64",
                                            attention_dtype=dtype))
    rj = d.post("/v1/attention", request_of(name, seq, sel, attention_dtype=dtype))
    assert rb.status_code == 200 and rj.status_code == 200, (rb.text[:300], rj.text[:300])
    att_b, att_j = rb.json()["attention"], rj.json()["attention"]
    want = expected(g, seq, sel)
    if sel.get("attention_top_k"):
        assert att_b["indices"]["dtype"] == "int32"
        idx, val = decode(att_b["indices"]), att_b["values"]
        assert np.array_equal(idx, np.asarray(att_j["indices"]))
        order_want = np.take_along_axis(want, idx.astype(np.int64), -1)
        att_b, att_j, want = val, att_j["values"], order_want
    assert att_b["dtype"] == dtype
    got = decode(att_b)
    assert got.shape == want.shape, (got.shape, want.shape)
    err = np.abs(got - want) / ulp(want, dtype)
    assert err.max() <= 1.0, "%.2f units in the last place of %s" % (err.max(), dtype)
    assert np.array_equal(np.asarray(att_j, dtype=np.float32), got), "JSON numbers not the rounded"
    if dtype == "bfloat16":
        assert bf16_exact(got)


def v2_request(g, seq, sel, outputs=None, **params):
    L, E = len(seq["query"]), g["embed_dim"]
    ins = [{"name": "query", "shape": [1, L, E], "datatype": "FP32",
            "data": np.asarray(seq["query"], np.float32).reshape(-1).tolist()}]
    for f in ("key", "value"):
        if seq.get(f) is not None:
            a = np.asarray(seq[f], np.float32)
            ins.append({"name": f, "shape": [1] + list(a.shape), "datatype": "FP32",
                        "data": a.reshape(-1).tolist()})
    if seq.get("key_padding_mask") is not None:
        ins.append({"name": "key_padding_mask", "shape": [1, len(seq["key_padding_mask"])],
                    "datatype": "BOOL", "data": seq["key_padding_mask"]})
    if seq.get("attn_mask") is not None:
        am = np.asarray(seq["attn_mask"])
        kind = "BOOL" if seq["attn_mask_kind"] == "bool" else "FP32"
        ins.append({"name": "attn_mask", "shape": list(am.shape), "datatype": kind,
                    "data": am.reshape(-1).tolist()})
    p = {"causal": bool(seq["causal"]), "attention": sel["attention"]}
    if "attention_heads" in sel:
        p["attention_heads"] = ",".join(str(h) for h in sel["attention_heads"])
    if "attention_rows" in sel:
        p["attention_rows"] = "%d:%d" % tuple(sel["attention_rows"])
    if "attention_top_k" in sel:
        p["attention_top_k"] = sel["attention_top_k"]
    p.update(params)
    body = {"inputs": ins, "parameters": p}
    if outputs:
        body["outputs"] = [{"name": o} for o in outputs]
    return body


def v2_want(g, seq, sel):
    """torch's selection in the ranks of the v2 answer: (1, heads or 1, rows, S)."""
    w = expected(g, seq, sel)
    return w[None, None] if sel["attention"] == "mean" else w[None]


@pytest.mark.parametrize("name,i,j", CASES)
def test_v2_json_against_torch(d, name, i, j):
    g, seq, sel = case(name, i, j)
    r = d.post("/v2/models/%s/infer" % name, v2_request(g, seq, sel))
    assert r.status_code == 200, r.text[:400]
    outs = {o["name"]: o for o in r.json()["outputs"]}
    want = v2_want(g, seq, sel)
    if sel.get("attention_top_k"):
        assert set(outs) == {"output", "attention_topk_indices", "attention_topk_values"}
        ix, vs = outs["attention_topk_indices"], outs["attention_topk_values"]
        assert ix["datatype"] == "INT32" and vs["datatype"] == "FP32"
        shape = list(want.shape[:-1]) + [sel["attention_top_k"]]
        assert ix["shape"] == shape and vs["shape"] == shape, (ix["shape"], shape)
        check_top_k(np.asarray(ix["data"]).reshape(shape), np.asarray(vs["data"]).reshape(shape),
                    want)
    else:
        a = outs["attention"]
        assert a["shape"] == list(want.shape), (a["shape"], want.shape)
        err = rel_err(np.asarray(a["data"]).reshape(a["shape"]), want)
        assert err <= TOL, err


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
@pytest.mark.parametrize("name,i,j", CASES)
def test_v2_tritonclient_binary(d, name, i, j, datatype):
    """tritonclient asks for binary outputs (its default): the weights come
    as FP16 or BF16 bytes, the indices as INT32."""
    import tritonclient.http as httpclient
    g, seq, sel = case(name, i, j)
    c = httpclient.InferenceServerClient(d.url.replace("http://", ""))
    body = v2_request(g, seq, sel, attention_datatype=datatype)
    ins = []
    for x in body["inputs"]:
        t = httpclient.InferInput(x["name"], x["shape"], x["datatype"])
        dt = np.bool_ if x["datatype"] == "BOOL" else np.float32
        t.set_data_from_numpy(np.asarray(x["data"], dtype=dt).reshape(x["shape"]))
        ins.append(t)
    topk = bool(sel.get("attention_top_k"))
    names = ["attention_topk_indices", "attention_topk_values"] if topk else ["attention"]
    outs = [httpclient.InferRequestedOutput(n, binary_data=True) for n in names]
    res = c.infer(name, ins, outputs=outs, parameters=body["parameters"])
    want = v2_want(g, seq, sel)
    vals = res.as_numpy(names[-1])
    declared = {o["name"]: o["datatype"] for o in res.get_response()["outputs"]}
    assert declared[names[-1]] == datatype, declared
    if topk:
        idx = res.as_numpy("attention_topk_indices")
        assert idx.dtype == np.int32 and declared["attention_topk_indices"] == "INT32"
        want = np.take_along_axis(want, idx.astype(np.int64), -1)
    assert vals.shape == want.shape, (vals.shape, want.shape)
    kind = "float16" if datatype == "FP16" else "bfloat16"
    err = np.abs(vals.astype(np.float64) - want) / ulp(want, kind)
    assert err.max() <= 1.0, "%.2f units in the last place of %s" % (err.max(), kind)


# ---- sessions ---------------------------------------------------------------

def long_case():
    """The long causal golden sequence: its model, sequence and the rows
    torch's weights cover."""
    g, _ = BY_NAME["select_e32_h4"]
    seq = g["sequences"][0]
    assert seq["causal"] and seq["key"] is None
    return g, seq


@pytest.mark.parametrize("api", ["native", "v2"])
def test_session_step_selection(d, api):
    """A step's selection: its rows are the step's own, its keys the cache
    and itself; the weights are those of the same rows of the whole causal
    sequence (torch)."""
    g, seq = long_case()
    t0, t1 = seq["torch_rows"]
    name = g["name"]
    r = d.post("/v1/sessions", {"model": name, "query": seq["query"][:t0]})
    assert r.status_code == 201, r.text[:300]
    sid = r.json()["session"]
    try:
        rows = seq["query"][t0:t1]
        sel = {"attention": "heads", "attention_heads": [3, 1], "attention_rows": [4, 11]}
        want = expected(g, seq, dict(sel, attention_rows=[t0 + 4, t0 + 11]))
        if api == "native":
            r = d.post("/v1/sessions/%s/attention" % sid, dict(sel, query=rows))
            assert r.status_code == 200, r.text[:300]
            body = r.json()
            att = np.asarray(body["attention"])
            out = body["output"]
        else:
            body = v2_request(g, {"query": rows, "causal": False}, sel, session_id=sid)
            del body["parameters"]["causal"]
            r = d.post("/v2/models/%s/infer" % name, body)
            assert r.status_code == 200, r.text[:300]
            outs = {o["name"]: o for o in r.json()["outputs"]}
            att = np.asarray(outs["attention"]["data"]).reshape(outs["attention"]["shape"])[0]
            out = np.asarray(outs["output"]["data"]).reshape(outs["output"]["shape"])[0]
        assert att.shape == (2, 7, t1), att.shape
        assert rel_err(att, want) <= TOL, rel_err(att, want)
        assert rel_err(out, seq["output"][t0:t1]) <= TOL
        # the session moved on by the step's rows; top-k over its 136 keys
        r = d.post("/v1/sessions/%s/attention" % sid,
                   {"query": seq["query"][:1], "attention": "mean", "attention_top_k": t1 + 2})
        assert r.status_code == 400, r.text[:300]
        assert "attention_top_k: %d is more than the %d keys" % (t1 + 2, t1 + 1) in r.json()["error"]
        r = d.post("/v1/sessions/%s/attention" % sid,
                   {"query": seq["query"][:1], "attention": "mean", "attention_top_k": t1 + 1})
        assert r.status_code == 200, r.text[:300]
        v = np.asarray(r.json()["attention"]["values"])
        assert v.shape == (1, t1 + 1) and abs(v.sum() - 1) < 1e-5
    finally:
        requests.delete(d.url + "/v1/sessions/" + sid, timeout=30)


# ---- refusals and limits ------------------------------------------------------

NATIVE_REFUSALS = [
    ({"attention": "heads", "attention_heads": [1, 4]},
     "attention_heads[1]: head 4 is out of range: model 'select_e32_h4' has 4 heads (0 to 3)"),
    ({"attention": "heads", "attention_heads": [2, 2]}, "attention_heads[1]: head 2 is given twice"),
    ({"attention": "mean", "attention_rows": [7, 3]}, "attention_rows: [7, 3] is reversed"),
    ({"attention": "mean", "attention_rows": [4, 4]}, "attention_rows: [4, 4] is empty"),
    ({"attention": "mean", "attention_rows": [0, 11]},
     "attention_rows: [0, 11] is out of range: the query has 10 rows"),
    ({"attention": "mean", "attention_top_k": 0}, "attention_top_k: 0: k must be at least 1"),
    ({"attention": "mean", "attention_top_k": 11},
     "attention_top_k: 11 is more than the 10 keys"),
    ({"attention": "mean", "attention_dtype": "float8"},
     'attention_dtype: expected one of "float32", "float16", "bfloat16", got "float8"'),
    ({"attention_heads": [0]}, "attention_heads: given, but no attention is asked for"),
    ({"attention": "none", "attention_top_k": 2},
     "attention_top_k: given, but no attention is asked for"),
    # past 2^53: out of range like any other number, not a size over a limit (413)
    ({"attention": "heads", "attention_heads": [0, 1e30]}, "attention_heads[1]: 1e+30 is too large"),
    ({"attention": "mean", "attention_rows": [0, 1e30]}, "attention_rows[1]: 1e+30 is too large"),
    ({"attention": "mean", "attention_top_k": 1e30}, "attention_top_k: 1e+30 is too large"),
    ({"attention": "mean", "attention_top_k": 18446744073709551616},
     "attention_top_k: 18446744073709551616"),
    ({"attention": "mean", "attention_top_k": "3"},
     "attention_top_k: expected a size (a whole number), got a string"),
]
V2_REFUSALS = [
    ({"attention": "mean", "attention_heads": "0,7"},
     "parameters.attention_heads: head 7 is out of range"),
    ({"attention": "mean", "attention_heads": "0;1"},
     'parameters.attention_heads: "0;1" is not a list of heads'),
    ({"attention": "mean", "attention_rows": "3-5"},
     'parameters.attention_rows: "3-5" is not "start:end"'),
    ({"attention": "mean", "attention_rows": "5:3"}, 'parameters.attention_rows: "5:3" is reversed'),
    ({"attention": "mean", "attention_top_k": 99}, "parameters.attention_top_k: 99 is more than"),
    ({"attention": "mean", "attention_datatype": "INT8"},
     'parameters.attention_datatype: expected one of "FP32", "FP16", "BF16", got "INT8"'),
    ({"attention_rows": "0:1"}, "parameters.attention_rows: given, but no attention is asked for"),
    ({"attention": "mean", "attention_top_k": 1e30}, "parameters.attention_top_k: 1e+30 is too large"),
    ({"attention": "mean", "attention_heads": 1e30}, "parameters.attention_heads: 1e+30 is too large"),
]


@pytest.mark.parametrize("extra,says", NATIVE_REFUSALS)
def test_native_refusals_name_field_and_value(d, extra, says):
    g, seq = BY_NAME["select_e32_h4"][0], BY_NAME["select_e32_h4"][0]["sequences"][2]
    body = golden_body(seq, g["name"])
    del body["attention"]
    body.update(extra)
    r = d.post("/v1/attention", body)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert says in r.json()["error"], r.json()["error"]


@pytest.mark.parametrize("params,says", V2_REFUSALS)
def test_v2_refusals_name_field_and_value(d, params, says):
    g = BY_NAME["select_e32_h4"][0]
    seq = g["sequences"][2]
    body = v2_request(g, seq, {"attention": "mean"})
    body["parameters"] = params
    r = d.post("/v2/models/%s/infer" % g["name"], body)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert says in r.json()["error"], r.json()["error"]


def test_413_only_when_the_selection_is_over(daemons):
    """limits.max_attention_floats bounds what comes back: the whole
    matrices of the long sequence (4 x 136 x 136) are over 2000 floats, one
    head of 10 rows (1360) or top-3 of every head and row (1632) are not."""
    g, seq = long_case()
    m = BY_NAME[g["name"]][1]
    dd = daemons({"models": [m.config()], "limits": {"max_attention_floats": 2000}})
    name = g["name"]
    base = golden_body(seq, name)
    for extra, status, says in [
        ({"attention": "heads"}, 413, "attention answer of 73984 floats, the limit is 2000"),
        ({"attention": "mean"}, 413, "18496 floats"),
        ({"attention": "heads", "attention_heads": [2], "attention_rows": [120, 130]}, 200, None),
        ({"attention": "heads", "attention_top_k": 3}, 200, None),
        ({"attention": "mean", "attention_rows": [100, 115]}, 413, "2040 floats"),
        ({"attention": "heads", "attention_heads": [0, 1], "attention_rows": [0, 8]}, 413,
         "2176 floats"),
    ]:
        r = dd.post("/v1/attention", dict(base, **extra))
        assert r.status_code == status, (extra, r.status_code, r.text[:300])
        if says:
            assert says in r.json()["error"], r.json()["error"]


def test_long_sequence_one_head_ten_rows(daemons):
    """8192 rows of 512 (the default model, H = 8): its whole matrices are
    413; one head of 10 rows is served. Under causal its first rows see only
    the first keys, so they equal the same rows of a 10-row request. A
    sanitizer build sends 2048 rows (whole matrices of 8 x 2048 x 2048
    floats still pass limits.max_attention_floats, 16M): 8192 rows there
    take minutes a forward, with nothing more to find; its daemon and client
    wait 10 minutes (a bound on waiting, not a measure)."""
    san = support.sanitized_build()
    n = 2048 if san else 8192
    dd = daemons({"server": {"request_timeout_ms": 600_000}} if san else None)
    wait = 600.0 if san else support.HTTP_TIMEOUT
    rng = np.random.default_rng(11)
    q = rng.standard_normal((n, 512)).astype(np.float32)
    big = {"query": b64_tensor(q), "causal": True, "attention": "heads"}
    r = dd.post("/v1/attention", big, timeout=wait)
    assert r.status_code == 413, r.text[:300]
    r = dd.post("/v1/attention", dict(big, attention_heads=[5], attention_rows=[0, 10],
                                      encoding="base64"), timeout=wait)
    assert r.status_code == 200, r.text[:300]
    att = r.json()["attention"]
    assert att["shape"] == [1, 10, n]
    a = decode(att)
    assert np.abs(a[0, :, 10:]).max() == 0  # causal: keys past the rows are hidden
    small = dd.post("/v1/attention", {"query": q[:10].tolist(), "causal": True,
                                      "attention": "heads"})
    assert small.status_code == 200, small.text[:300]
    want = np.asarray(small.json()["attention"])[5]
    assert rel_err(a[0, :, :10], want) <= TOL
    r = dd.post("/v1/attention", dict(big, causal=False, attention_heads=[0],
                                      attention_rows=[n - 10, n], attention_top_k=4),
                timeout=wait)
    assert r.status_code == 200, r.text[:300]
    v = np.asarray(r.json()["attention"]["values"])
    assert v.shape == (1, 10, 4) and np.all(v > 0) and np.all(np.diff(v, axis=-1) <= 0)
