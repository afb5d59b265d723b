#!/usr/bin/env python3
"""make_seeds.py - writes the seed corpora of the request-path fuzz targets
under tests/fuzz/seeds/<target>/: real request bodies for the fuzz models
(fuzz_server.h: "small" E=4 H=2; "cross" E=4 kdim=3 vdim=2), session
bodies (fuzz_session), route and header lines (fuzz_routes), the shapes
whose element counts wrap 64 bits, and the odd corners (NaN literals,
wrapped base64, duplicate keys, deep nesting), and the model repository's
bodies and paths (fuzz_repo). Run from anywhere; the files
are checked in, so run it only to change them:
    python3 tests/fuzz/make_seeds.py
Seed files this script does not write are past findings of the fuzzers,
kept so that every run replays them first (fuzz_config and
fuzz_safetensors have only those, and real files).
"""
import base64
import json
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "config"))
from safetensors_header import safetensors_bytes  # noqa: E402

SEEDS = Path(__file__).resolve().parent / "seeds"


def b64f(vals):
    return base64.b64encode(struct.pack("<%df" % len(vals), *vals)).decode()


def rows(L, w, start=0.0):
    return [[round(start + 0.1 * (i * w + j) - 0.7, 3) for j in range(w)] for i in range(L)]


def flat(L, w):
    return [x for r in rows(L, w) for x in r]


def put(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data if isinstance(data, bytes) else data.encode())


WRAP = [268435456, 134217728, 512]          # 2^28 * 2^27 * 2^9: the product wraps to 0
HUGE = [1000000000, 1000000000, 1000000000]  # signed overflow in the product


def native():
    t = "fuzz_native"
    put(t, "self.json", json.dumps({"model": "small", "query": rows(3, 4),
                                    "attention": "heads", "causal": True,
                                    "key_padding_mask": [False, True, False]}))
    put(t, "cross.json", json.dumps({"model": "cross", "query": [rows(2, 4), rows(2, 4, 1)],
                                     "key": [rows(3, 3), rows(3, 3, 2)],
                                     "value": [rows(3, 2), rows(3, 2, 3)],
                                     "attn_mask": [[0.5, -1, 0], [0, 0, 1.5]],
                                     "encoding": "base64", "attention": "mean"}))
    put(t, "b64.json", json.dumps({"model": "small", "query": {
        "shape": [2, 4], "dtype": "float32", "b64": b64f(flat(2, 4))},
        "attn_mask": {"shape": [2, 2], "dtype": "bool", "b64": base64.b64encode(
            bytes([0, 1, 0, 0])).decode()}}))
    put(t, "wrapped_b64.json", json.dumps({"model": "small", "query": {
        "shape": [4, 4], "dtype": "float32", "b64": base64.encodebytes(
            struct.pack("<16f", *flat(4, 4))).decode()}}))
    put(t, "mask3.json", json.dumps({"model": "small", "query": [rows(2, 4)] * 2,
                                     "attn_mask": [[[True, False], [False, False]]] * 2,
                                     "key_padding_mask": [[False, False], [True, False]]}))
    put(t, "wrap_shape.json", json.dumps({"model": "small", "query": {
        "shape": WRAP, "dtype": "float32", "b64": ""}}))
    put(t, "huge_shape.json", json.dumps({"model": "small", "query": {
        "shape": HUGE, "b64": "AAAA"}}))
    put(t, "nan.json", '{"model": "small", "query": [[NaN, 1, 2, Infinity]]}')
    put(t, "numbers.json", '{"query": [[1e39, -0, 0.1e-45, 3.4028235677973366e38],'
                           ' [1.00000005960464477539062500000001, 16777217, 1e-46, -1E+2]]}')
    put(t, "dup.json", '{"model": "small", "model": "small", "query": [[1,2,3,4]],'
                       ' "causal": null, "attention": "none"}')
    put(t, "typo.json", '{"model": "small", "query": [[1,2,3,4]], "atention": "mean"}')
    put(t, "form.txt", "model=small&query=1,2,3,4")
    put(t, "multipart.txt", '--xyz\r\nContent-Disposition: form-data; name="query"\r\n\r\n'
                            '[[1,2,3,4]]\r\n--xyz--\r\n')
    put(t, "escapes.json", '{"m\\u006fdel": "sm\\u0061ll", "query": [[1,2,3,4]]}')
    # selections of the attention matrices (SPEC section 9)
    put(t, "select.json", json.dumps({"model": "small", "query": rows(3, 4), "attention": "heads",
                                      "attention_heads": [1, 0], "attention_rows": [1, 3],
                                      "attention_top_k": 2, "attention_dtype": "float16"}))
    put(t, "select_b64.json", json.dumps({"model": "cross", "query": [rows(2, 4)] * 2,
                                          "key": [rows(3, 3)] * 2, "attention": "mean",
                                          "attention_heads": [1], "attention_dtype": "bfloat16",
                                          "encoding": "base64"}))
    put(t, "select_bad.json", json.dumps({"model": "small", "query": rows(2, 4),
                                          "attention": "mean", "attention_heads": [0, 0, 2],
                                          "attention_rows": [2, 1], "attention_top_k": 0}))
    put(t, "select_none.json", json.dumps({"query": rows(2, 4), "attention_top_k": 1}))


def v2_input(name, shape, dt, data=None, size=None):
    d = {"name": name, "shape": shape, "datatype": dt}
    if size is not None:
        d["parameters"] = {"binary_data_size": size}
    else:
        d["data"] = data
    return d


def v2():
    t = "fuzz_v2"
    put(t, "self.json", json.dumps({"id": "r1", "parameters": {"causal": True, "attention": "mean"},
                                    "inputs": [v2_input("query", [1, 3, 4], "FP32", flat(3, 4)),
                                               v2_input("key_padding_mask", [1, 3], "BOOL",
                                                        [False, True, False])],
                                    "outputs": [{"name": "output"}, {"name": "attention"}]}))
    put(t, "cross.json", json.dumps({"inputs": [v2_input("query", [2, 4], "FP32", rows(2, 4)),
                                                v2_input("key", [3, 3], "FP32", flat(3, 3)),
                                                v2_input("value", [3, 2], "FP64", flat(3, 2)),
                                                v2_input("attn_mask", [2, 3], "FP32", [0] * 6)],
                                     "parameters": {"attention": "heads", "other": [1, {}]}}))
    put(t, "outputs_attention.json", json.dumps({
        "inputs": [v2_input("query", [2, 4], "FP32", flat(2, 4))],
        "outputs": [{"name": "attention", "parameters": {"binary_data": False}}]}))
    for i, shape in enumerate((WRAP, HUGE, [1, 4294967296])):
        put(t, "wrap%d.json" % i, json.dumps({"inputs": [v2_input("query", shape, "FP32", [1])]}))
    put(t, "wrap_mask.json", json.dumps({"inputs": [v2_input("query", [1, 4], "FP32", [1, 2, 3, 4]),
                                                    v2_input("key_padding_mask", WRAP, "BOOL",
                                                             size=0)]}))
    put(t, "dup_params.json", '{"parameters": {"causal": true, "causal": false}, "inputs":'
                              ' [{"name": "query", "shape": [1, 4], "datatype": "FP32",'
                              ' "data": [1, 2, 3, 4]}]}')
    put(t, "select.json", json.dumps({
        "inputs": [v2_input("query", [1, 3, 4], "FP32", flat(3, 4))],
        "parameters": {"attention": "heads", "attention_heads": "1,0", "attention_rows": "1:3",
                       "attention_top_k": 2, "attention_datatype": "FP16"},
        "outputs": [{"name": "attention_topk_indices"}, {"name": "attention_topk_values"}]}))
    put(t, "select_mean.json", json.dumps({
        "inputs": [v2_input("query", [2, 4], "FP32", flat(2, 4))],
        "parameters": {"attention_heads": 1, "attention_datatype": "BF16"},
        "outputs": [{"name": "output"}, {"name": "attention"}]}))
    put(t, "select_bad.json", json.dumps({
        "inputs": [v2_input("query", [2, 4], "FP32", flat(2, 4))],
        "parameters": {"attention": "mean", "attention_heads": "0,,1", "attention_rows": "2-1"}}))


def v2_binary():
    t = "fuzz_v2_binary"
    js = json.dumps({"inputs": [v2_input("query", [2, 4], "FP32", size=32),
                                v2_input("key_padding_mask", [2], "BOOL", size=2)],
                     "outputs": [{"name": "output", "parameters": {"binary_data": True}}]})
    put(t, "self.bin", js.encode() + b"\0" + struct.pack("<8f", *flat(2, 4)) + bytes([0, 1]))
    js = json.dumps({"inputs": [v2_input("query", [1, 4], "FP32", size=16),
                                v2_input("key", [2, 3], "FP32", flat(2, 3)),
                                v2_input("attn_mask", [1, 2], "FP32", size=8)],
                     "parameters": {"binary_data_output": True, "attention": "mean"}})
    put(t, "cross.bin", js.encode() + b"\0" + struct.pack("<6f", *flat(1, 4), 0.5, -1))
    js = json.dumps({"inputs": [v2_input("query", [1, 3, 4], "FP32", size=48)],
                     "parameters": {"binary_data_output": True, "attention": "heads",
                                    "attention_top_k": 2, "attention_datatype": "BF16",
                                    "attention_rows": "0:2"}})
    put(t, "select_topk.bin", js.encode() + b"\0" + struct.pack("<12f", *flat(3, 4)))
    js = json.dumps({"inputs": [v2_input("query", [2, 4], "FP32", size=32)],
                     "outputs": [{"name": "attention", "parameters": {"binary_data": True}}],
                     "parameters": {"attention_heads": "1", "attention_datatype": "FP16"}})
    put(t, "select_fp16.bin", js.encode() + b"\0" + struct.pack("<8f", *flat(2, 4)))
    for i, (name, shape, dt) in enumerate((("query", WRAP, "FP32"), ("attn_mask", WRAP, "FP32"),
                                           ("key_padding_mask", WRAP, "BOOL"))):
        ins = [] if name == "query" else [v2_input("query", [1, 4], "FP32", [1, 2, 3, 4])]
        ins.append(v2_input(name, shape, dt, size=0))
        put(t, "wrap%d.bin" % i, json.dumps({"inputs": ins}).encode() + b"\0")


# protobuf's wire format, enough for ModelInferRequest (fuzz_grpc): varints,
# length-delimited fields, packed repeated numbers.
def pb_varint(n):
    out = b""
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        out += bytes([b | (0x80 if n else 0)])
        if not n:
            return out


def pb_bytes(field, data):
    data = data.encode() if isinstance(data, str) else data
    return pb_varint(field << 3 | 2) + pb_varint(len(data)) + data


def pb_int(field, v):
    return pb_varint(field << 3) + pb_varint(v)


def pb_param(key, value):
    """A map<string, InferParameter> entry."""
    if isinstance(value, bool):
        p = pb_int(1, int(value))
    elif isinstance(value, int):
        p = pb_int(2, value)
    else:
        p = pb_bytes(3, value)
    return pb_bytes(1, key) + pb_bytes(2, p)


def pb_input(name, dt, shape, contents=None):
    m = pb_bytes(1, name) + pb_bytes(2, dt)
    m += pb_bytes(3, b"".join(pb_varint(d) for d in shape))
    if contents is not None:  # InferTensorContents: fp32_contents (6) or bool_contents (1)
        field, packed = contents
        m += pb_bytes(5, pb_bytes(field, packed))
    return m


def grpc():
    t = "fuzz_grpc"
    q = struct.pack("<8f", *flat(2, 4))
    m = (pb_bytes(1, "small") + pb_bytes(3, "r1") + pb_bytes(4, pb_param("attention", "mean"))
         + pb_bytes(4, pb_param("causal", True))
         + pb_bytes(5, pb_input("query", "FP32", [1, 2, 4])) + pb_bytes(7, q))
    put(t, "raw.bin", m)
    m = (pb_bytes(1, "small") + pb_bytes(5, pb_input("query", "FP32", [2, 4], (6, q)))
         + pb_bytes(5, pb_input("key_padding_mask", "BOOL", [2], (1, bytes([0, 1])))))
    put(t, "contents.bin", m)
    m = (pb_bytes(1, "cross") + pb_bytes(4, pb_param("attention_top_k", 1))
         + pb_bytes(4, pb_param("attention", "heads"))
         + pb_bytes(5, pb_input("query", "FP32", [1, 4])) + pb_bytes(7, struct.pack("<4f", *flat(1, 4)))
         + pb_bytes(5, pb_input("key", "FP32", [2, 3])) + pb_bytes(7, struct.pack("<6f", *flat(2, 3)))
         + pb_bytes(5, pb_input("value", "FP32", [2, 2])) + pb_bytes(7, struct.pack("<4f", *flat(2, 2)))
         + pb_bytes(6, pb_bytes(1, "attention_topk_values")))
    put(t, "cross_topk.bin", m)
    put(t, "close.bin", pb_bytes(1, "small") + pb_bytes(4, pb_param("session_id", "0" * 32))
        + pb_bytes(4, pb_param("session_close", True)))
    # a plain session step, as a stream merges them (server/grpc/merge.c)
    put(t, "step.bin", pb_bytes(1, "small") + pb_bytes(3, "s1")
        + pb_bytes(4, pb_param("session_id", "0" * 32)) + pb_bytes(4, pb_param("timeout_ms", 500))
        + pb_bytes(5, pb_input("query", "FP32", [1, 2, 4])) + pb_bytes(7, q)
        + pb_bytes(6, pb_bytes(1, "output")))
    put(t, "wrap.bin", pb_bytes(1, "small") + pb_bytes(5, pb_input("query", "FP32", WRAP))
        + pb_bytes(7, b""))


def tensor():
    t = "fuzz_tensor"
    put(t, "rows.json", json.dumps(rows(3, 4)))
    put(t, "batch.json", json.dumps([rows(2, 3), rows(2, 3, 1)]))
    put(t, "bools.json", "[[true, false], [false, true]]")
    put(t, "b64.json", json.dumps({"shape": [2, 3], "dtype": "float32", "b64": b64f(flat(2, 3))}))
    put(t, "b64_bool.json", json.dumps({"shape": [4], "dtype": "bool", "b64": "AQABAA=="}))
    put(t, "b64_wrapped.json", json.dumps({"shape": [8, 4], "b64": base64.encodebytes(
        struct.pack("<32f", *flat(8, 4))).decode()}))
    put(t, "b64_urlsafe.json", json.dumps({"shape": [3], "b64": "-_-_-_-_-_-_-_-_"}))
    put(t, "b64_neg_inf.json", json.dumps({"shape": [2], "b64": b64f([float("-inf"), 1])}))
    put(t, "wrap.json", json.dumps({"shape": WRAP, "b64": ""}))
    put(t, "ragged.json", "[[1, 2], [3]]")
    put(t, "numbers.json", "[1e-45, 1.4e-45, 7e-46, 3.40282356e38, 0.30000001192092896, "
                           "123456789012345678901234567890, -0.0e+0]")


def json_docs():
    t = "fuzz_json"
    put(t, "object.json", '{"a": [1, 2.5e-3, -0, true, false, null], "b": {"c": "d\\u00e9\\n"}}')
    put(t, "surrogates.json", '["\\ud83d\\ude00", "\\u20ac", "\u00e9\u4e2d"]')
    put(t, "numbers.json", "[0, -1, 1e308, 1e-400, 123456789012345678901234, 9007199254740993,"
                           " 0.1, 1E+2, 4.9e-324]")
    put(t, "dup.json", '{"k": 1, "k": 2}')
    put(t, "deep.json", "[" * 70 + "]" * 70)
    put(t, "scalar.json", '"just a string"')
    put(t, "bad_escape.json", '["\\x"]')
    put(t, "nan.json", "[NaN, Infinity]")


def routes():
    """Lines: method, URL (as it arrives), Inference-Header-Content-Length,
    X-Request-Id, Authorization, Content-Length, Origin (fuzz_routes.c)."""
    t = "fuzz_routes"
    put(t, "native", "POST\n/v1/attention\n\nabc-1\nBearer k3y\n")
    put(t, "v2_infer", "POST\n/v2/models/s16/versions/1/infer\n96\nreq.7:x\nbearer   k3y\n")
    put(t, "head", "HEAD\n/metrics?x=1\n-1\n" + "a" * 65 + "\nBasic a3k=\n")
    put(t, "escaped", "GET\n/v2/models/m%2Fx/ready\n18446744073709551616\n\nBearer k3y \n")
    put(t, "options", "OPTIONS\n/v1/models/a%00b/attention\n007\nid with space\n")
    put(t, "odd", "DELETE\n//v2//models/x/\n1\n\n")
    put(t, "sessions", "POST\n/v1/sessions/0123456789abcdef0123456789abcdef/attention\n"
                       "18446744073709551615\nsess:1\nBearer k3y\n")
    put(t, "declared", "POST\n/v1/attention\n\nbody-1\nBearer k3y\n1048576\n"
                       "http://app.example\n")
    put(t, "declared_over", "POST\n/v2/models/x/infer\n5\n\nBearer k3y\n1048577\nhttp://other\n")
    put(t, "declared_bad", "PUT\n/v1/sessions\n\n\nBearer k3y\n-1\n*\n")
    put(t, "preflight", "OPTIONS\n/v1/attention\n\n\n\n\nhttp://app.example\n")
    put(t, "open_route", "GET\n/health\n\n\n\n18446744073709551616\n\n")


def session():
    """Bodies of POST /v1/sessions, of a step, and of a v2 infer that opens or
    steps a session (fuzz_session.c; its table holds SID)."""
    t = "fuzz_session"
    put(t, "empty", "")
    put(t, "model.json", json.dumps({"model": "small"}))
    put(t, "model_null.json", '{"model": null}')
    put(t, "prefix.json", json.dumps({"model": "small", "query": rows(3, 4),
                                      "attention": "heads"}))
    put(t, "prefix_b64.json", json.dumps({"query": {"shape": [2, 4], "dtype": "float32",
                                                    "b64": b64f(flat(2, 4))},
                                          "encoding": "base64", "attention": "mean"}))
    put(t, "step.json", json.dumps({"query": rows(1, 4)}))
    put(t, "batch.json", json.dumps({"model": "small", "query": [rows(1, 4), rows(1, 4, 1)]}))
    put(t, "key.json", json.dumps({"model": "small", "query": rows(2, 4), "key": rows(2, 4)}))
    put(t, "positions.json", json.dumps({"query": rows(2, 4), "positions": [5, 6]}))
    put(t, "no_prefix_extra.json", json.dumps({"model": "small", "attention": "mean"}))
    put(t, "cross.json", json.dumps({"model": "cross", "query": rows(2, 4)}))
    put(t, "wrap_shape.json", json.dumps({"model": "small", "query": {
        "shape": WRAP, "dtype": "float32", "b64": ""}}))
    put(t, "huge_shape.json", json.dumps({"query": {"shape": HUGE, "b64": "AAAA"}}))
    put(t, "overflow.json", json.dumps({"query": [[3e38] * 4] * 2}))
    put(t, "dup.json", '{"model": "small", "model": "small"}')
    put(t, "dup_query.json", '{"query": [[1,2,3,4]], "query": [[1,2,3,4]]}')
    put(t, "bad_literal.json", '{"model": "small", "causal": tru`}')
    put(t, "trailing.json", '{"model": "small"} {}')
    sid = "0123456789abcdef0123456789abcdef"
    q = {"name": "query", "shape": [1, 2, 4], "datatype": "FP32", "data": flat(2, 4)}
    put(t, "v2_open.json", json.dumps({"inputs": [q], "parameters": {"session_open": True}}))
    put(t, "v2_step.json", json.dumps({"inputs": [q], "parameters": {"session_id": sid,
                                                                     "attention": "mean"}}))
    put(t, "v2_both.json", json.dumps({"inputs": [q], "parameters": {"session_id": sid,
                                                                     "session_open": True}}))
    put(t, "v2_unknown.json", json.dumps({"inputs": [q], "parameters": {"session_id": "f" * 32}}))
    put(t, "v2_plain.json", json.dumps({"inputs": [q]}))
    put(t, "step_select.json", json.dumps({"query": rows(2, 4), "attention": "heads",
                                           "attention_heads": [1], "attention_rows": [1, 2],
                                           "attention_top_k": 3, "attention_dtype": "float16"}))
    put(t, "step_select_over.json", json.dumps({"query": rows(1, 4), "attention": "mean",
                                                "attention_top_k": 4}))
    put(t, "v2_step_select.json", json.dumps({"inputs": [q], "parameters": {
        "session_id": sid, "attention": "mean", "attention_top_k": 4, "attention_rows": "0:1",
        "attention_datatype": "BF16"}}))


def state_file(length, G=2, D=3, precision="fp32", meta=None, positions=None, vals=None):
    """A session state file (server/session/state.h) of `length` tokens."""
    dt, fmt = ("BF16", "<%dH") if precision == "bf16" else ("F32", "<%df")
    n = length * G * D
    if vals is None:
        vals = [((i % 7) - 3) * 0.25 for i in range(2 * n)]
    if precision == "bf16":
        vals = [struct.unpack("<I", struct.pack("<f", v))[0] >> 16 for v in vals]
    m = {"format": "attnd-session-state", "format_version": "1", "model": "small",
         "fingerprint": "fnv1a64:0123456789abcdef", "length": str(length),
         "precision": precision}
    m.update(meta or {})
    pos = list(range(length)) if positions is None else positions
    return safetensors_bytes([
        ("keys", dt, [length, G, D], struct.pack(fmt % n, *vals[:n])),
        ("values", dt, [length, G, D], struct.pack(fmt % n, *vals[n:])),
        ("positions", "I32", [length], struct.pack("<%di" % length, *pos))], m)


def state():
    """Session state files (fuzz_state.c): valid ones and one of each refusal."""
    t = "fuzz_state"
    put(t, "fp32", state_file(3))
    put(t, "bf16", state_file(2, 1, 4, "bf16"))
    put(t, "empty_session", state_file(0))
    put(t, "one_token", state_file(1, 1, 1))
    put(t, "positions_shifted", state_file(2, positions=[1, 2]))
    put(t, "nan", state_file(1, 1, 1, vals=[float("nan"), 0.0]))
    put(t, "inf_bf16", state_file(1, 1, 1, "bf16", vals=[0.0, float("-inf")]))
    put(t, "length_lies", state_file(2, meta={"length": "3"}))
    put(t, "length_zero_lead", state_file(2, meta={"length": "02"}))
    put(t, "precision_lies", state_file(2, meta={"precision": "bf16"}))
    put(t, "other_version", state_file(1, meta={"format_version": "2"}))
    put(t, "meta_number", state_file(1, meta={"length": 1}))
    put(t, "truncated", state_file(3)[:-5])
    put(t, "header_lies", struct.pack("<Q", 1 << 40) + state_file(1)[8:])


def repo():
    """Bodies of the model repository routes and paths (fuzz_repo.c): the
    first byte picks the reader (0 index, 1 unload, 2 load in the fuzzer's
    model folder, 3 load with no folder, 4 a path confined to the folder)."""
    t = "fuzz_repo"
    entry = {"embed_dim": 4, "num_heads": 2, "weights": "w.safetensors"}
    decoder = {"name": "enc", "embed_dim": 64, "num_heads": 8, "num_kv_heads": 2,
               "layout": "llama", "precision": "bf16", "max_positions": 128,
               "rope": {"theta": 500000, "scaling": {"type": "linear", "factor": 2}},
               "tensors": {"q_weight": "wq"}, "weights": "sub/x.safetensors"}

    def load(sel, name, cfg):
        put(t, name, bytes([sel]) + json.dumps({"parameters": {"config": json.dumps(cfg)}})
            .encode())

    put(t, "index_empty", b"\0")
    put(t, "index_ready", b"\0" + b'{"ready": true}')
    put(t, "index_bad", b"\0" + b'{"ready": 1, "x": []}')
    put(t, "unload_plain", b"\1{}")
    put(t, "unload_dependents", b"\1" + b'{"parameters": {"unload_dependents": false}}')
    put(t, "unload_bad", b"\1" + b'{"parameters": {"force": true}}')
    put(t, "load_empty", b"\2")
    put(t, "load_no_entry", b"\2" + b'{"parameters": {}}')
    load(2, "load_entry", entry)
    load(2, "load_decoder", decoder)
    load(2, "load_link_in", dict(entry, weights="in"))
    load(2, "load_link_out", dict(entry, weights="out.safetensors"))
    load(2, "load_dotdot", dict(entry, weights="../w.safetensors"))
    load(2, "load_up", dict(entry, weights="up/w.safetensors"))
    load(2, "load_absolute", dict(entry, weights="/etc/passwd"))
    load(2, "load_other_name", dict(entry, name="dec"))
    load(2, "load_bad_entry", dict(entry, num_heads=3, dropout=0.1))
    load(3, "load_no_folder", entry)
    put(t, "load_file_param", b"\2" + b'{"parameters": {"file:1/model.onnx": "AAAA"}}')
    put(t, "load_config_object", b"\2" + b'{"parameters": {"config": {"embed_dim": 4}}}')
    for i, path in enumerate(("w.safetensors", "./sub//x.safetensors", "in", "out.safetensors",
                              "up/x", "sub/../w.safetensors", "..", "/tmp", ".", "")):
        put(t, "path%d" % i, b"\4" + path.encode())


if __name__ == "__main__":
    native()
    v2()
    v2_binary()
    grpc()
    tensor()
    json_docs()
    routes()
    session()
    state()
    repo()
