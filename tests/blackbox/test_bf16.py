"""bf16 models over HTTP (SPEC section 8): a daemon that serves the forward
goldens of tests/gen_golden_bf16_forward.py as bf16 models ("precision":
"bf16") and the same weights as fp32 models ("<name>_fp32"):

- GET /v1/models and GET /v2/models/{name}: precision, effective_precision,
  weights_bytes (a bf16 model's a quarter of its fp32 twin's), the bf16
  kernels (also in attnd_build_info);
- the goldens through /v1/attention and v2 infer: within 1e-2 of float64
  and within 2e-4 of the bf16 formula, outputs and attention matrices;
- the fp32 models' answers bit for bit those of a daemon without bf16
  models;
- /metrics: attnd_compute_seconds counts each batch under the precision
  that computed it;
- selections (attention_heads, _rows, _top_k) of a bf16 model: the bits of
  its own whole matrix, sliced;
- sessions of a bf16 model: steps equal to the whole sequence bit for bit,
  their cache in bf16 pages (attnd_session_bytes), the budgets in real
  bytes (twice an fp32 model's tokens in the same max_session_bytes_each);
- session state files of a bf16 model: bf16 metadata and BF16 tensors,
  restored bit for bit on another daemon;
- workers.bf16_kernels: each path the CPU has, and "none": the model
  computes in fp32 (its answers the fp32 twin's bits) and the start-up log
  says so in one line.
"""
import base64
import json
import os
import struct

import numpy as np
import pytest

import support
from support import check_error_body, golden_body, parse_prometheus, rel_err

LOOSE, TIGHT = 1e-2, 2e-4  # SPEC section 8; tests/test_bf16_forward.c says why 2e-4
FWD_DIR = support.GOLDEN_DIR / "bf16" / "forward"
GOLDENS = [json.loads(p.read_text()) for p in sorted(FWD_DIR.glob("*.json"))]
SEQS = [pytest.param(g["name"], i, id="%s-%d" % (g["name"], i))
        for g in GOLDENS for i in range(len(g["sequences"]))]
STEPPED = "gqa_rope_d32"  # a decoder golden whose attention is bf16, for sessions


def entry(g, precision, **extra):
    c = dict(g["config"], weights=str(FWD_DIR / g["config"]["weights"]), precision=precision)
    if precision == "fp32":
        c["name"] = g["name"] + "_fp32"
    c.update(extra)
    return c


def config(models=("bf16", "fp32"), limits=None):
    cfg = {"models": [entry(g, p) for p in models for g in GOLDENS]}
    if limits:
        cfg["limits"] = limits
    return cfg


@pytest.fixture(scope="module")
def d(daemons):
    return daemons(config())


@pytest.fixture(scope="module")
def kernels(d):
    """The bf16 kernels the daemon runs on ("none" on a CPU without any)."""
    return d.get("/v1/models").json()["compute"]["bf16_kernels"]


def golden(name):
    return next(g for g in GOLDENS if g["name"] == name)


def f32(a):
    return np.asarray(a, dtype=np.float32)


def test_goldens_present():
    assert len(GOLDENS) >= 5 and len(SEQS) >= 20, "run /usr/bin/python3 %s" % (
        "tests/gen_golden_bf16_forward.py")


def test_models_show_precision(d, kernels):
    j = d.get("/v1/models").json()
    assert kernels in ("amx-bf16", "avx512-bf16", "none"), kernels
    # how the avx512-bf16 kernels multiply (the same bits either way); no
    # word on the other kernels
    products = j["compute"]["bf16_products"]
    assert products in (("vdpbf16ps", "fma") if kernels == "avx512-bf16" else ("",)), products
    models = {m["name"]: m for m in j["models"]}
    for g in GOLDENS:
        m16, m32 = models[g["name"]], models[g["name"] + "_fp32"]
        assert m16["precision"] == "bf16" and m32["precision"] == "fp32"
        assert m16["effective_precision"] == ("fp32" if kernels == "none" else "bf16")
        assert m32["effective_precision"] == "fp32"
        if kernels != "none":  # the weights in bf16 alone: a quarter, inputs padded to 32s
            assert m16["weights_bytes"] < 0.4 * m32["weights_bytes"], (m16, m32)
        # the attention and a session's cache: bf16 where the head width has
        # the bf16 attention kernels, else fp32 (the start-up log says so too)
        assert m16["attention_precision"] == support.bf16_attention(g["config"], kernels), m16
        assert m32["attention_precision"] == "fp32"
        for name in (g["name"], g["name"] + "_fp32"):
            v2 = d.get("/v2/models/" + name).json()
            for f in ("precision", "effective_precision", "attention_precision"):
                assert v2[f] == models[name][f], (f, v2, models[name])
    assert {m["attention_precision"] for m in models.values() if m["precision"] == "bf16"} == \
        ({"fp32"} if kernels == "none" else {"bf16", "fp32"}), "goldens of both kinds of widths"
    _, samples = parse_prometheus(d.get("/metrics").text)
    info = [labels for n, labels, _ in samples if n == "attnd_build_info"]
    assert len(info) == 1 and info[0]["bf16_kernels"] == kernels, info


def test_openapi_describes_the_fields(d):
    """/openapi.json requires the precision fields of every model in
    /v1/models and /v2/models/{name}, lists the words both can be, and the
    daemon's answers (bf16 and fp32 models) validate against it."""
    import jsonschema
    doc = d.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    item = schemas["ModelsResponse"]["properties"]["models"]["items"]
    for fields, schema in ((("precision", "effective_precision", "attention_precision",
                             "weights_bytes"), item),
                           (("precision", "effective_precision", "attention_precision"),
                            schemas["V2Model"])):
        assert set(fields) <= set(schema["required"]), schema["required"]
        for f in ("precision", "effective_precision"):
            assert schema["properties"][f]["enum"] == ["fp32", "bf16", "int8"], \
                schema["properties"][f]
        assert schema["properties"]["attention_precision"]["enum"] == ["fp32", "bf16"]
    kernels = schemas["ModelsResponse"]["properties"]["compute"]["properties"]["bf16_kernels"]
    assert kernels["enum"] == ["amx-bf16", "avx512-bf16", "none"], kernels
    products = schemas["ModelsResponse"]["properties"]["compute"]["properties"]["bf16_products"]
    assert products["enum"] == ["vdpbf16ps", "fma", ""], products

    def validator(name):  # OpenAPI 3.0's schemas are draft 4's dialect
        return jsonschema.Draft4Validator({"$ref": "#/components/schemas/" + name,
                                           "components": doc["components"]})
    models = d.get("/v1/models").json()
    validator("ModelsResponse").validate(models)
    assert {m["precision"] for m in models["models"]} == {"fp32", "bf16"}
    for m in models["models"]:
        validator("V2Model").validate(d.get("/v2/models/" + m["name"]).json())


def answer(d, model, s, b64=True):
    """The native answer of golden sequence s from model: output, attention."""
    body = golden_body(s, model_name=model, b64_inputs=b64, encoding="base64" if b64 else None)
    if s["positions"] is not None:
        body["positions"] = s["positions"]
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    if not b64:
        return f32(a["output"]), None if "attention" not in a else f32(a["attention"])
    att = support.from_b64_tensor(a["attention"]) if "attention" in a else None
    return support.from_b64_tensor(a["output"]), att


@pytest.mark.parametrize("name,i", SEQS)
def test_golden(d, kernels, name, i):
    """Within 1e-2 of the exact layer; within 2e-4 of the bf16 formula where
    the model computes in bf16. JSON and base64 give the same numbers."""
    s = golden(name)["sequences"][i]
    out, att = answer(d, name, s)
    assert rel_err(out, s["output"]) <= LOOSE
    if kernels != "none":
        assert rel_err(out, s["output_bf16"]) <= TIGHT
    if s["attention"] != "none":
        assert rel_err(att, s["attn_weights"]) <= LOOSE
        if kernels != "none":
            assert rel_err(att, s["attn_weights_bf16"]) <= TIGHT
    out_json, _ = answer(d, name, s, b64=False)
    assert out_json.tobytes() == out.tobytes()


def test_golden_through_v2(d, kernels):
    """A bf16 model through v2 infer: the same bits as the native route."""
    g = golden("mha_e64_h2")
    s = g["sequences"][1]  # causal, heads
    q = np.array(s["query"], dtype=np.float32)
    body = {"parameters": {"causal": True, "attention": "heads"},
            "inputs": [{"name": "query", "shape": [1] + list(q.shape), "datatype": "FP32",
                        "data": q.ravel().tolist()}]}
    r = d.post("/v2/models/%s/infer" % g["name"], body)
    assert r.status_code == 200, r.text[:300]
    outs = {o["name"]: f32(o["data"]).reshape(o["shape"]) for o in r.json()["outputs"]}
    native, att = answer(d, g["name"], s)
    assert outs["output"][0].tobytes() == native.tobytes()
    assert outs["attention"][0].tobytes() == att.tobytes()
    if kernels != "none":
        assert rel_err(outs["output"][0], s["output_bf16"]) <= TIGHT


def selected(d, name, s, **sel):
    """The attention of golden sequence s from model name with selection
    fields sel, base64: an array, or (indices, values) for top-k."""
    body = golden_body(s, model_name=name, b64_inputs=True, encoding="base64")
    if s["positions"] is not None:
        body["positions"] = s["positions"]
    body.update(sel)
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    a = r.json()["attention"]
    if "attention_top_k" in sel:
        i = a["indices"]
        assert i["dtype"] == "int32", i["dtype"]
        idx = np.frombuffer(base64.b64decode(i["b64"], validate=True), "<i4").reshape(i["shape"])
        return idx, support.from_b64_tensor(a["values"])
    return support.from_b64_tensor(a)


def test_selection_is_the_whole_matrix_sliced(d, kernels):
    """A bf16 model's selection (heads in a given order, rows, top-k, means)
    over HTTP: the bits of the same model's whole matrix at those (head,
    row), its top-k those numbers' largest (ties: the lower key first), a
    mean over every head the whole mean's rows, one over some heads within
    1e-6 of the mean of the whole matrix's rows."""
    name = STEPPED  # 8 heads on 2 key/value heads, attention bf16 where the CPU has kernels
    s = golden(name)["sequences"][0]  # 36 rows, causal, heads
    heads = selected(d, name, s, attention="heads")
    mean = selected(d, name, s, attention="mean")
    assert heads.shape == (8, 36, 36), heads.shape
    part = selected(d, name, s, attention="heads", attention_heads=[6, 1, 3],
                    attention_rows=[5, 31])
    assert part.tobytes() == heads[[6, 1, 3], 5:31].tobytes()
    idx, val = selected(d, name, s, attention="heads", attention_heads=[2],
                        attention_rows=[20, 36], attention_top_k=7)
    rows = heads[2, 20:36].astype(np.float64)
    order = np.lexsort((np.arange(36)[None, :].repeat(16, 0), -rows))[:, :7]  # ties: lower key
    assert idx.shape == (1, 16, 7) and idx.dtype == np.int32, (idx.shape, idx.dtype)
    assert np.array_equal(idx[0], order), (idx[0][:2], order[:2])
    assert val[0].tobytes() == np.take_along_axis(heads[2, 20:36], order, 1).tobytes()
    assert selected(d, name, s, attention="mean", attention_rows=[9, 30]).tobytes() == \
        mean[9:30].tobytes()
    some = selected(d, name, s, attention="mean", attention_heads=[7, 0, 4])
    want = heads[[7, 0, 4]].astype(np.float64).mean(axis=0)
    assert rel_err(some, want) <= 1e-6, rel_err(some, want)
    if kernels != "none":
        assert rel_err(part, np.asarray(s["attn_weights_bf16"])[[6, 1, 3], 5:31]) <= TIGHT


def test_fp32_models_keep_every_bit(d, daemons):
    """The fp32 twins answer with the bits of a daemon that has no bf16
    model, sequence by sequence, and within 1e-5 of float64."""
    alone = daemons(config(models=("fp32",)))
    for g in GOLDENS:
        for s in g["sequences"]:
            with_bf16 = answer(d, g["name"] + "_fp32", s)
            without = answer(alone, g["name"] + "_fp32", s)
            assert with_bf16[0].tobytes() == without[0].tobytes(), g["name"]
            if s["attention"] != "none":
                assert with_bf16[1].tobytes() == without[1].tobytes(), g["name"]
            assert rel_err(with_bf16[0], s["output"]) <= 1e-5


def compute_counts(d):
    _, samples = parse_prometheus(d.get("/metrics").text)
    return {labels["precision"]: v for n, labels, v in samples
            if n == "attnd_compute_seconds_count"}


def test_metrics_label_compute_by_precision(d, kernels):
    s = golden("mha_e64_h2")["sequences"][0]
    before = compute_counts(d)
    assert set(before) == {"fp32", "bf16", "int8"}, before
    for _ in range(3):
        answer(d, "mha_e64_h2", s)
    answer(d, "mha_e64_h2_fp32", s)
    after = compute_counts(d)
    bf16 = "fp32" if kernels == "none" else "bf16"
    assert after[bf16] - before[bf16] == (4 if kernels == "none" else 3), (before, after)
    if kernels != "none":
        assert after["fp32"] - before["fp32"] == 1, (before, after)


def page_bytes(g):
    """Bytes of one page (32 tokens) of a bf16 cache of golden model g."""
    return 32 * 2 * g["num_kv_heads"] * g["head_dim"] * 2


def test_session_steps_equal_whole_sequence(d, kernels):
    """A bf16 model's session: a prefix, then steps of 1, 2, 1 and 12 rows;
    every answer the bits of the same rows of the whole causal sequence, and
    its cache in whole bf16 pages."""
    g = golden(STEPPED)
    s = g["sequences"][3]  # 140 causal rows
    q = f32(s["query"])[:40]
    whole = d.post("/v1/attention", {"model": STEPPED, "query": support.b64_tensor(q),
                                     "causal": True, "encoding": "base64"})
    assert whole.status_code == 200, whole.text[:300]
    want = support.from_b64_tensor(whole.json()["output"])
    r = d.post("/v1/sessions", {"model": STEPPED, "query": support.b64_tensor(q[:24]),
                                "encoding": "base64"})
    assert r.status_code == 201, r.text[:300]
    sid = r.json()["session"]
    got = [support.from_b64_tensor(r.json()["output"])]
    at = 24
    for n in (1, 2, 1, 12):
        r = d.post("/v1/sessions/%s/attention" % sid,
                   {"query": support.b64_tensor(q[at:at + n]), "encoding": "base64"})
        assert r.status_code == 200, r.text[:300]
        assert r.json()["cached_tokens"] == at + n
        got.append(support.from_b64_tensor(r.json()["output"]))
        at += n
    assert np.concatenate(got).tobytes() == want.tobytes()
    assert rel_err(np.concatenate(got), s["output_bf16"][:40]) <= (
        TIGHT if kernels != "none" else LOOSE)
    _, samples = parse_prometheus(d.get("/metrics").text)
    held = [v for n, _, v in samples if n == "attnd_session_bytes"][0]
    per_token = 2 * g["num_kv_heads"] * g["head_dim"] * (4 if kernels == "none" else 2)
    if kernels != "none":  # 40 tokens: two pages (64 tokens) at most, at least two
        assert held == 2 * page_bytes(g), held
    else:
        assert 40 * per_token <= held <= 80 * per_token, held
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_session_budget_counts_real_bytes(daemons, kernels):
    """max_session_bytes_each of two bf16 pages: 64 tokens of the bf16 model,
    32 of its fp32 twin (a token there takes twice the bytes)."""
    if kernels == "none":
        pytest.skip("no bf16 kernels on this CPU: its bf16 models keep fp32 caches")
    g = golden(STEPPED)
    each = 2 * page_bytes(g)
    d2 = daemons(config(limits={"max_session_bytes_each": each}))
    rows = f32(g["sequences"][3]["query"])
    for model, fits in ((STEPPED, 64), (STEPPED + "_fp32", 32)):
        r = d2.post("/v1/sessions", {"model": model, "query": support.b64_tensor(rows[:fits - 1])})
        assert r.status_code == 201, (model, r.text[:300])
        sid = r.json()["session"]
        msg = check_error_body(d2.post("/v1/sessions/%s/attention" % sid,
                                       {"query": support.b64_tensor(rows[fits - 1:fits + 1])}),
                               413)
        assert "max_session_bytes_each" in msg, msg
        # the bf16 cache grows by pages, and the sentence says so
        assert ("held in whole pages of 32 tokens" in msg) == (model == STEPPED), msg
        r = d2.post("/v1/sessions/%s/attention" % sid,
                    {"query": support.b64_tensor(rows[fits - 1:fits])})
        assert r.status_code == 200 and r.json()["cached_tokens"] == fits, (model, r.text[:300])
        assert d2.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_kernels_none_computes_in_fp32(fresh_daemons):
    """workers.bf16_kernels none (ATTND_BF16_KERNELS), as on a CPU with
    neither AVX512-BF16 nor AMX-BF16: the bf16 models load, compute in fp32
    (their answers the fp32 twins' bits), and one log line says so each."""
    d0 = fresh_daemons(config(), env={"ATTND_BF16_KERNELS": "none"})
    j = d0.get("/v1/models").json()
    assert j["compute"]["bf16_kernels"] == "none"
    logs = d0.stdout() + d0.stderr()
    for g in GOLDENS:
        m = next(m for m in j["models"] if m["name"] == g["name"])
        assert m["precision"] == "bf16" and m["effective_precision"] == "fp32"
        lines = [ln for ln in logs.splitlines()
                 if "model %s:" % g["name"] in ln and "computes in fp32" in ln]
        assert len(lines) == 1 and " warn " in lines[0], logs[-3000:]
        assert "precision bf16 asked for" in lines[0], lines
        s = g["sequences"][0]
        assert answer(d0, g["name"], s)[0].tobytes() == answer(d0, g["name"] + "_fp32", s)[
            0].tobytes()


@pytest.mark.parametrize("path", ["amx-bf16", "avx512-bf16"])
def test_each_path_the_cpu_has(fresh_daemons, kernels, path):
    """Each bf16 path the CPU has, chosen with ATTND_BF16_KERNELS: said at
    start-up, and the goldens within their bounds on it."""
    order = ["none", "avx512-bf16", "amx-bf16"]
    if order.index(path) > order.index(kernels):
        pytest.skip("%s is not on this CPU (its best: %s): not run" % (path, kernels))
    d1 = fresh_daemons(config(models=("bf16",)), env={"ATTND_BF16_KERNELS": path})
    compute = d1.get("/v1/models").json()["compute"]
    assert compute["bf16_kernels"] == path
    logs = d1.stdout()
    for g in GOLDENS:
        attn = "bf16" if g["attention_bf16"] else "fp32"
        assert ("model %s: precision bf16 on %s kernels, attention in %s" % (g["name"], path, attn)
                in logs), logs[-3000:]
        products = "; bf16 products on " + compute["bf16_products"]
        assert (products in logs) == (path == "avx512-bf16"), logs[-3000:]
        for s in g["sequences"]:
            out, att = answer(d1, g["name"], s)
            assert rel_err(out, s["output_bf16"]) <= TIGHT
            assert rel_err(out, s["output"]) <= LOOSE
            if att is not None:
                assert rel_err(att, s["attn_weights_bf16"]) <= TIGHT


def read_state(data):
    """A session's state file read with struct, json and numpy: metadata,
    each tensor's dtype, and the tensors (BF16 widened to float32 exactly:
    its bits are a float32's upper half)."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    body = data[8 + n:]
    tensors, dtypes = {}, {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        raw = body[a:b]
        if t["dtype"] == "BF16":
            x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            x = np.frombuffer(raw, {"F32": "<f4", "I32": "<i4"}[t["dtype"]])
        tensors[name], dtypes[name] = x.reshape(t["shape"]), t["dtype"]
    return meta, dtypes, tensors


def session_rows(d, model, q, n_open):
    """A session of model opened with q's first n_open rows; its id."""
    r = d.post("/v1/sessions", {"model": model, "query": support.b64_tensor(q[:n_open])})
    assert r.status_code == 201, r.text[:300]
    return r.json()["session"]


def step_bits(d, sid, q):
    r = d.post("/v1/sessions/%s/attention" % sid, {"query": support.b64_tensor(q),
                                                   "attention": "heads", "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    return a["cached_tokens"], a["output"]["b64"], a["attention"]["b64"]


def test_session_state_bf16(d, daemons, fresh_daemons, kernels):
    """A bf16 session's state file: precision bf16 and BF16 keys and values
    (35 tokens: a whole page and part of the next), token by token the
    fp32 twin's cache within bf16's error (a page's layout unscrambled);
    restored on a second daemon its next steps give the uninterrupted
    session's bits and its state the same bytes; a daemon computing the
    model in fp32 refuses it (other weights as held: 409)."""
    g = golden(STEPPED)
    q = f32(g["sequences"][3]["query"])[:40]
    sid = session_rows(d, STEPPED, q, 35)
    twin = session_rows(d, STEPPED + "_fp32", q, 35)
    r = d.get("/v1/sessions/%s/state" % sid)
    assert r.status_code == 200, r.text[:300]
    meta, dtypes, t = read_state(r.content)
    bf16 = kernels != "none"
    assert meta["precision"] == ("bf16" if bf16 else "fp32") and meta["length"] == "35", meta
    assert dtypes["keys"] == dtypes["values"] == ("BF16" if bf16 else "F32"), dtypes
    G, D = g["num_kv_heads"], g["head_dim"]
    assert t["keys"].shape == t["values"].shape == (35, G, D)
    assert t["positions"].tolist() == list(range(35))
    _, _, t32 = read_state(d.get("/v1/sessions/%s/state" % twin).content)
    for name in ("keys", "values"):
        for i in range(35):  # every token where it belongs, not only the whole
            assert rel_err(t[name][i], t32[name][i]) <= LOOSE, (name, i)
    b = daemons(config())
    moved = "%032x" % int.from_bytes(os.urandom(16), "big")
    r2 = b.post("/v1/sessions", data=r.content, headers={
        "Content-Type": "application/octet-stream", "X-Session-Id": moved})
    assert r2.status_code == 201, r2.text[:300]
    assert r2.json()["cached_tokens"] == 35
    assert b.get("/v1/sessions/%s/state" % moved).content == r.content
    for lo, hi in ((35, 36), (36, 40)):
        assert step_bits(b, moved, q[lo:hi]) == step_bits(d, sid, q[lo:hi])
    if bf16:
        d0 = fresh_daemons(config(), env={"ATTND_BF16_KERNELS": "none"})
        msg = check_error_body(d0.post("/v1/sessions", data=r.content, headers={
            "Content-Type": "application/octet-stream"}), 409)
        assert "fingerprint" in msg, msg
    for x, s in ((d, sid), (d, twin), (b, moved)):
        assert x.request("DELETE", "/v1/sessions/" + s).status_code == 204
