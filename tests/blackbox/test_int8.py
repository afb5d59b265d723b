"""int8 models over HTTP (SPEC section 8, its last paragraph): a daemon that
serves the goldens of tests/gen_golden_int8.py as int8 models ("precision":
"int8"), and the same weights as fp32 ("<name>_fp32") and bf16
("<name>_bf16") models:

- GET /v1/models and GET /v2/models/{name}: precision, effective_precision,
  weights_bytes (an int8 model's at most 0.3 of its fp32 twin's), the int8
  kernels (also in attnd_build_info);
- the goldens through /v1/attention: within 3e-2 of float64 and within 1e-3
  of the int8 formula, outputs and attention matrices; v2 infer the same bits;
- /metrics: attnd_compute_seconds counts an int8 model's batches as int8;
- selections of an int8 model: the bits of its own whole matrix, sliced;
- sessions: steps equal to the whole sequence bit for bit;
- session state files: precision int8, keys and values as the cache holds
  them (BF16 where the model attends in bf16), restored bit for bit on
  another daemon, refused (409) by a daemon that computes the model otherwise;
- workers.int8_kernels: each path the CPU has, and "none": the model
  computes in bf16 (its answers the bf16 twin's bits) and the start-up log
  says so in one line.
"""
import json
import os
import struct

import numpy as np
import pytest

import support
from support import check_error_body, golden_body, parse_prometheus, rel_err

LOOSE, TIGHT = 3e-2, 1e-3  # SPEC section 8; tests/test_int8_forward.c says why 1e-3
INT8_DIR = support.GOLDEN_DIR / "int8"
GOLDENS = [json.loads(p.read_text()) for p in sorted(INT8_DIR.glob("*.json"))]
SEQS = [pytest.param(g["name"], i, id="%s-%d" % (g["name"], i))
        for g in GOLDENS for i in range(len(g["sequences"]))]
STEPPED = "gqa_rope_d32"  # grouped heads with rotary positions, attention bf16
PATHS = ["none", "avx-vnni", "avx512-vnni", "amx-int8"]


def entry(g, precision):
    c = dict(g["config"], weights=str(INT8_DIR / g["config"]["weights"]), precision=precision)
    if precision != "int8":
        c["name"] = g["name"] + "_" + precision
    return c


def config(models=("int8", "fp32", "bf16")):
    return {"models": [entry(g, p) for p in models for g in GOLDENS]}


@pytest.fixture(scope="module")
def d(daemons):
    return daemons(config())


@pytest.fixture(scope="module")
def compute(d):
    """The daemon's compute block: its int8 and bf16 kernels."""
    return d.get("/v1/models").json()["compute"]


def golden(name):
    return next(g for g in GOLDENS if g["name"] == name)


def f32(a):
    return np.asarray(a, dtype=np.float32)


def formula_holds(compute, g):
    """The int8 formula's numbers are this daemon's: int8 kernels, and the
    attention in bf16 where the golden's is."""
    return compute["int8_kernels"] != "none" and (
        not g["attention_bf16"] or compute["bf16_kernels"] != "none")


def test_goldens_present():
    assert len(GOLDENS) >= 5 and len(SEQS) >= 15, "run /usr/bin/python3 tests/gen_golden_int8.py"


def test_models_show_precision(d, compute):
    kernels = compute["int8_kernels"]
    assert kernels in PATHS, kernels
    models = {m["name"]: m for m in d.get("/v1/models").json()["models"]}
    fallback = "fp32" if compute["bf16_kernels"] == "none" else "bf16"
    for g in GOLDENS:
        m8, m32 = models[g["name"]], models[g["name"] + "_fp32"]
        assert m8["precision"] == "int8"
        assert m8["effective_precision"] == ("int8" if kernels != "none" else fallback)
        if kernels != "none":  # int8 weights and a scale per output channel
            assert m8["weights_bytes"] <= 0.3 * m32["weights_bytes"], (m8, m32)
        assert m8["attention_precision"] == support.bf16_attention(g["config"],
                                                                   compute["bf16_kernels"])
        assert m32["attention_precision"] == "fp32"
        v2 = d.get("/v2/models/" + g["name"]).json()
        assert v2["precision"] == "int8"
        assert v2["effective_precision"] == m8["effective_precision"]
        assert v2["attention_precision"] == m8["attention_precision"]
    _, samples = parse_prometheus(d.get("/metrics").text)
    info = [labels for n, labels, _ in samples if n == "attnd_build_info"]
    assert len(info) == 1 and info[0]["int8_kernels"] == kernels, info


def test_openapi_lists_int8(d):
    import jsonschema
    doc = d.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    item = schemas["ModelsResponse"]["properties"]["models"]["items"]
    assert item["properties"]["precision"]["enum"] == ["fp32", "bf16", "int8"]
    kernels = schemas["ModelsResponse"]["properties"]["compute"]["properties"]["int8_kernels"]
    assert kernels["enum"] == PATHS[::-1], kernels
    jsonschema.Draft4Validator({"$ref": "#/components/schemas/ModelsResponse",
                                "components": doc["components"]}).validate(
        d.get("/v1/models").json())


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
def test_golden(d, compute, name, i):
    """Within 3e-2 of the exact layer; within 1e-3 of the int8 formula where
    the daemon computes it. JSON and base64 give the same numbers."""
    g = golden(name)
    s = g["sequences"][i]
    out, att = answer(d, name, s)
    assert rel_err(out, s["output"]) <= LOOSE
    if formula_holds(compute, g):
        assert rel_err(out, s["output_int8"]) <= TIGHT
    if s["attention"] != "none":
        assert rel_err(att, s["attn_weights"]) <= LOOSE
        if formula_holds(compute, g):
            assert rel_err(att, s["attn_weights_int8"]) <= TIGHT
    out_json, _ = answer(d, name, s, b64=False)
    assert out_json.tobytes() == out.tobytes()


def test_golden_through_v2(d):
    """An int8 model through v2 infer: the same bits as the native route."""
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


def test_selection_is_the_whole_matrix_sliced(d):
    """An int8 model's selected heads and rows: the bits of its whole matrix."""
    s = golden(STEPPED)["sequences"][0]  # 36 rows, causal, heads
    body = golden_body(s, model_name=STEPPED, b64_inputs=True, encoding="base64")
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    heads = support.from_b64_tensor(r.json()["attention"])
    body.update(attention_heads=[6, 1, 3], attention_rows=[5, 31])
    r = d.post("/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    part = support.from_b64_tensor(r.json()["attention"])
    assert part.tobytes() == heads[[6, 1, 3], 5:31].tobytes()


def test_metrics_label_int8(d, compute):
    _, samples = parse_prometheus(d.get("/metrics").text)
    before = {labels["precision"]: v for n, labels, v in samples
              if n == "attnd_compute_seconds_count"}
    assert set(before) == {"fp32", "bf16", "int8"}, before
    for _ in range(3):
        answer(d, "mha_e64_h2", golden("mha_e64_h2")["sequences"][0])
    _, samples = parse_prometheus(d.get("/metrics").text)
    after = {labels["precision"]: v for n, labels, v in samples
             if n == "attnd_compute_seconds_count"}
    if compute["int8_kernels"] != "none":
        assert after["int8"] - before["int8"] == 3, (before, after)


def test_session_steps_equal_whole_sequence(d):
    """An int8 model's session: a prefix, then steps of 1, 2, 1 and 12 rows;
    every answer the bits of the same rows of the whole causal sequence."""
    q = f32(golden(STEPPED)["sequences"][3]["query"])[:40]
    whole = d.post("/v1/attention", {"model": STEPPED, "query": support.b64_tensor(q),
                                     "causal": True, "encoding": "base64"})
    assert whole.status_code == 200, whole.text[:300]
    want = support.from_b64_tensor(whole.json()["output"])
    r = d.post("/v1/sessions", {"model": STEPPED, "query": support.b64_tensor(q[:24]),
                                "encoding": "base64"})
    assert r.status_code == 201, r.text[:300]
    sid = r.json()["session"]
    got, at = [support.from_b64_tensor(r.json()["output"])], 24
    for n in (1, 2, 1, 12):
        r = d.post("/v1/sessions/%s/attention" % sid,
                   {"query": support.b64_tensor(q[at:at + n]), "encoding": "base64"})
        assert r.status_code == 200, r.text[:300]
        got.append(support.from_b64_tensor(r.json()["output"]))
        at += n
    assert np.concatenate(got).tobytes() == want.tobytes()
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def read_state(data):
    """A state file read with struct, json and numpy: metadata, dtypes, tensors."""
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


def step_bits(d, sid, q):
    r = d.post("/v1/sessions/%s/attention" % sid, {"query": support.b64_tensor(q),
                                                   "attention": "heads", "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    return a["cached_tokens"], a["output"]["b64"], a["attention"]["b64"]


def test_session_state_int8(d, daemons, fresh_daemons, compute):
    """An int8 session's state file says int8, its keys and values BF16 (the
    cache of a model attending in bf16), within 3e-2 of the fp32 twin's;
    restored on a second daemon it gives the uninterrupted session's bits;
    a daemon whose int8 kernels are "none" refuses it (409)."""
    if compute["int8_kernels"] == "none":
        pytest.skip("no int8 kernels on this CPU: its int8 models compute in bf16 or fp32")
    g = golden(STEPPED)
    q = f32(g["sequences"][3]["query"])[:40]
    r = d.post("/v1/sessions", {"model": STEPPED, "query": support.b64_tensor(q[:35])})
    assert r.status_code == 201, r.text[:300]
    sid = r.json()["session"]
    r = d.post("/v1/sessions", {"model": STEPPED + "_fp32", "query": support.b64_tensor(q[:35])})
    twin = r.json()["session"]
    r = d.get("/v1/sessions/%s/state" % sid)
    assert r.status_code == 200, r.text[:300]
    meta, dtypes, t = read_state(r.content)
    cache = "BF16" if compute["bf16_kernels"] != "none" else "F32"
    assert meta["precision"] == "int8" and meta["length"] == "35", meta
    assert dtypes["keys"] == dtypes["values"] == cache, dtypes
    assert t["keys"].shape == (35, g["num_kv_heads"], g["head_dim"])
    _, _, t32 = read_state(d.get("/v1/sessions/%s/state" % twin).content)
    for name in ("keys", "values"):
        assert rel_err(t[name], t32[name]) <= LOOSE, name
    b = daemons(config())
    moved = "%032x" % int.from_bytes(os.urandom(16), "big")
    r2 = b.post("/v1/sessions", data=r.content, headers={
        "Content-Type": "application/octet-stream", "X-Session-Id": moved})
    assert r2.status_code == 201, r2.text[:300]
    assert b.get("/v1/sessions/%s/state" % moved).content == r.content
    for lo, hi in ((35, 36), (36, 40)):
        assert step_bits(b, moved, q[lo:hi]) == step_bits(d, sid, q[lo:hi])
    d0 = fresh_daemons(config(), env={"ATTND_INT8_KERNELS": "none"})
    check_error_body(d0.post("/v1/sessions", data=r.content, headers={
        "Content-Type": "application/octet-stream"}), 409)
    for x, s in ((d, sid), (d, twin), (b, moved)):
        assert x.request("DELETE", "/v1/sessions/" + s).status_code == 204


def test_kernels_none_computes_in_bf16(fresh_daemons):
    """workers.int8_kernels none (ATTND_INT8_KERNELS), as on a CPU without
    VNNI or AMX-INT8: the int8 models load, compute as their bf16 twins (the
    same bits), and one log line says so each."""
    d0 = fresh_daemons(config(), env={"ATTND_INT8_KERNELS": "none"})
    j = d0.get("/v1/models").json()
    assert j["compute"]["int8_kernels"] == "none"
    fallback = "fp32" if j["compute"]["bf16_kernels"] == "none" else "bf16"
    logs = d0.stdout() + d0.stderr()
    for g in GOLDENS:
        m = next(m for m in j["models"] if m["name"] == g["name"])
        assert m["precision"] == "int8" and m["effective_precision"] == fallback
        lines = [ln for ln in logs.splitlines()
                 if "model %s:" % g["name"] in ln and "computes in " + fallback in ln]
        assert len(lines) == 1 and " warn " in lines[0], logs[-3000:]
        assert "precision int8 asked for" in lines[0], lines
        s = g["sequences"][0]
        assert answer(d0, g["name"], s)[0].tobytes() == \
            answer(d0, g["name"] + "_bf16", s)[0].tobytes()


@pytest.mark.parametrize("path", PATHS[1:])
def test_each_path_the_cpu_has(fresh_daemons, compute, path):
    """Each int8 path the CPU has, chosen with ATTND_INT8_KERNELS: said at
    start-up, the goldens within their bounds, and the bits of every other
    path (they sum the same int32 and scale back alike)."""
    best = compute["int8_kernels"]
    if PATHS.index(path) > PATHS.index(best):
        pytest.skip("%s is not on this CPU (its best: %s): not run" % (path, best))
    d1 = fresh_daemons(config(models=("int8",)), env={"ATTND_INT8_KERNELS": path})
    assert d1.get("/v1/models").json()["compute"]["int8_kernels"] == path
    logs = d1.stdout()
    for g in GOLDENS:
        assert "model %s: precision int8 on %s kernels" % (g["name"], path) in logs, logs[-3000:]
        for s in g["sequences"]:
            out, att = answer(d1, g["name"], s)
            assert rel_err(out, s["output"]) <= LOOSE
            if formula_holds(compute, g):
                assert rel_err(out, s["output_int8"]) <= TIGHT
