"""Bad input (SPEC section 4, "What bad input gets"): every row of the table,
each error body exactly {"error": "<sentence>"}, 400s naming the field and
the index; the API key; then a bounded loop of malformed bodies. After all of
it the daemon still answers a golden request correctly."""
import base64
import json
import random
import re
import socket
import time

import numpy as np
import pytest
import requests

import support
from support import b64_tensor, check_error_body, golden_body, rel_err

GOLDENS = {g["name"]: (g, m) for g, m in support.load_goldens()}
M = "self_e64_h8"            # E=64, H=8, self-attention
C = "cross_e48_h4_k40_v24"   # E=48, H=4, kdim=40, vdim=24
E, H = 64, 8
CE, CK, CV = 48, 40, 24
MAX_BODY = 65536
MAX_TOKENS = 64
MAX_ATT = 4096
API_KEY = "s3cret-key-value-7f1c"


def rows(L, width, seed=0):
    rng = np.random.default_rng(seed)
    return support.tolist32(rng.standard_normal((L, width)))


@pytest.fixture(scope="module")
def d(daemons):
    cfg = {"server": {"max_body_bytes": MAX_BODY},
           "limits": {"max_tokens_per_request": MAX_TOKENS, "max_attention_floats": MAX_ATT},
           "models": [GOLDENS[M][1].config(), GOLDENS[C][1].config()]}
    return daemons(cfg)


def check_golden(d):
    """The daemon still answers the golden sequences of both models exactly."""
    for name in (M, C):
        g, _ = GOLDENS[name]
        for s in g["sequences"]:
            r = d.post("/v1/attention", golden_body(s, name))
            assert r.status_code == 200, r.text[:300]
            assert rel_err(r.json()["output"], s["output"]) <= 1e-5


class Either:
    """Any one of several ways of naming a place, e.g. a flat index 70 or
    the pair (1, 6) of a 2 x 64 tensor."""

    def __init__(self, *alternatives):
        self.alternatives = alternatives


def mentions(msg, *words):
    low = msg.lower()
    for w in words:
        if isinstance(w, Either):
            errs = []
            for alt in w.alternatives:
                try:
                    mentions(msg, *(alt if isinstance(alt, tuple) else (alt,)))
                    break
                except AssertionError as e:
                    errs.append(str(e))
            else:
                raise AssertionError(" / ".join(errs))
        elif isinstance(w, int):
            assert re.search(r"(?<![0-9])%d(?![0-9])" % w, msg), \
                "error %r does not name the index %d" % (msg, w)
        else:
            assert w.lower() in low, "error %r does not name %r" % (msg, w)


def with_elem(L, width, r, c, value, seed=0):
    q = rows(L, width, seed)
    q[r][c] = value
    return q


# (id, body (dict, or raw bytes), words the message must name)
BAD_400 = [
    ("invalid_json", b'{"model": "self_e64_h8", "query": [[1.0, 2.0', ()),
    ("not_json", b"hello there", ()),
    ("empty_body", b"", ()),
    ("trailing_garbage", json.dumps({"model": M, "query": rows(2, E)}).encode() + b" }x", ()),
    ("nan_literal", b'{"model": "self_e64_h8", "query": [[NaN' + b", 0.5" * (E - 1) + b"]]}", ()),
    ("body_is_array", b"[1, 2, 3]", ()),
    ("body_is_number", b"42", ()),
    ("missing_query", {"model": M}, ("query",)),
    ("query_ragged", {"model": M, "query": rows(3, E)[:2] + [rows(1, E - 1)[0]]}, ("query", 2)),
    ("query_wrong_width", {"model": M, "query": rows(3, E + 1)}, ("query[0]: 65 numbers",
                                                                 "embed_dim 64")),
    ("query_wrong_width_batched", {"model": M, "query": [rows(3, E + 1)] * 2},
     ("query[0][0]: 65 numbers",)),
    ("query_empty", {"model": M, "query": []}, ("query",)),
    ("query_empty_row", {"model": M, "query": [[]]}, ("query",)),
    ("query_rank1", {"model": M, "query": rows(1, E)[0]}, ("query",)),
    ("query_rank4", {"model": M, "query": [[rows(2, E)]]}, ("query",)),
    ("query_huge_is_inf", {"model": M, "query": with_elem(4, E, 2, 5, 1e39)}, ("query", 2, 5)),
    ("query_huge_neg", {"model": M, "query": with_elem(4, E, 3, 7, -1e39)}, ("query", 3, 7)),
    ("query_nan_string", {"model": M, "query": with_elem(3, E, 1, 3, "NaN")}, ("query", 1, 3)),
    ("query_inf_string", {"model": M, "query": with_elem(3, E, 2, 9, "Infinity")},
     ("query", 2, 9)),
    ("query_string_elem", {"model": M, "query": with_elem(3, E, 1, 4, "abc")}, ("query", 1, 4)),
    ("query_null_elem", {"model": M, "query": with_elem(3, E, 2, 6, None)}, ("query", 2, 6)),
    ("query_bool_elem", {"model": M, "query": with_elem(3, E, 1, 8, True)}, ("query", 1, 8)),
    ("query_object_elem", {"model": M, "query": with_elem(3, E, 2, 3, {})}, ("query", 2, 3)),
    ("query_is_string", {"model": M, "query": "0.1 0.2"}, ("query",)),
    ("query_is_number", {"model": M, "query": 5}, ("query",)),
    ("query_batch_ragged", {"model": M, "query": [rows(3, E), rows(2, E)]}, ("query", 1)),
    ("key_wrong_width", {"model": C, "query": rows(2, CE), "key": rows(3, CK + 1),
                         "value": rows(3, CV)}, ("key[0]: 41 numbers", "kdim 40")),
    ("value_wrong_width", {"model": C, "query": rows(2, CE), "key": rows(3, CK),
                           "value": rows(3, CV - 1)}, ("value[0]: 23 numbers", "vdim 24")),
    ("value_length_mismatch", {"model": C, "query": rows(2, CE), "key": rows(5, CK),
                               "value": rows(4, CV)}, ("value: 4 rows where key has 5",)),
    ("value_length_mismatch_batched", {"model": C, "query": [rows(2, CE)], "key": [rows(5, CK)],
                                       "value": [rows(4, CV)]}, ("value[0]: 4 rows",)),
    ("key_ragged", {"model": C, "query": rows(2, CE),
                    "key": rows(3, CK) + [rows(1, CK - 2)[0]], "value": rows(4, CV)},
     ("key", 3)),
    ("key_empty", {"model": C, "query": rows(2, CE), "key": [], "value": []}, ("key",)),
    ("key_huge", {"model": C, "query": rows(2, CE), "key": with_elem(3, CK, 1, 2, 1e39),
                  "value": rows(3, CV)}, ("key", 1, 2)),
    ("value_nan_string", {"model": C, "query": rows(2, CE), "key": rows(3, CK),
                          "value": with_elem(3, CV, 2, 1, "nan")}, ("value", 2, 1)),
    ("value_missing_widths_differ", {"model": C, "query": rows(2, CE), "key": rows(3, CK)},
     ("value",)),
    ("key_rank_differs", {"model": M, "query": rows(2, E), "key": [rows(2, E)]}, ("key",)),
    ("batch_key_count", {"model": M, "query": [rows(2, E), rows(2, E)],
                         "key": [rows(2, E)] * 3}, ("key: batch of 3",)),
    ("batch_key_count_b64", {"model": M, "query": [rows(2, E), rows(2, E)],
                             "key": b64_tensor(np.ones((3, 2, E)))}, ("key.shape[0]: batch of 3",)),
    ("causal_string", {"model": M, "query": rows(2, E), "causal": "yes"}, ("causal",)),
    ("causal_number", {"model": M, "query": rows(2, E), "causal": 1}, ("causal",)),
    ("attention_unknown", {"model": M, "query": rows(2, E), "attention": "all"}, ("attention",)),
    ("attention_bool", {"model": M, "query": rows(2, E), "attention": True}, ("attention",)),
    ("encoding_unknown", {"model": M, "query": rows(2, E), "encoding": "hex"}, ("encoding",)),
    ("model_number", {"model": 5, "query": rows(2, E)}, ("model",)),
    ("model_missing_two_loaded", {"query": rows(2, E)}, ("model",)),
    ("kpm_wrong_length", {"model": M, "query": rows(3, E), "key_padding_mask": [False] * 4},
     ("key_padding_mask",)),
    ("kpm_numbers", {"model": M, "query": rows(3, E), "key_padding_mask": [0, 1, 0]},
     ("key_padding_mask",)),
    ("kpm_string", {"model": M, "query": rows(3, E), "key_padding_mask": "none"},
     ("key_padding_mask",)),
    ("kpm_elem_string", {"model": M, "query": rows(3, E), "key_padding_mask": [False, "x", True]},
     ("key_padding_mask", 1)),
    ("attn_mask_wrong_shape", {"model": M, "query": rows(3, E),
                               "attn_mask": [[False] * 4] * 3}, ("attn_mask",)),
    ("attn_mask_ragged", {"model": M, "query": rows(3, E),
                          "attn_mask": [[False] * 3, [False] * 3, [False] * 2]},
     ("attn_mask", 2)),
    ("attn_mask_mixed", {"model": M, "query": rows(2, E),
                         "attn_mask": [[False, 0.5], [0.1, True]]}, ("attn_mask",)),
    ("attn_mask_nan", {"model": M, "query": rows(2, E),
                       "attn_mask": [[0.0, 0.5], [0.1, "NaN"]]}, ("attn_mask", 1)),
    ("b64_bad_chars", {"model": M, "query": {"shape": [2, E], "dtype": "float32",
                                             "b64": "!!!not base64!!!"}}, ("query",)),
    ("b64_length_mismatch", {"model": M, "query": dict(b64_tensor(np.ones((2, E))),
                                                       shape=[3, E])}, ("query",)),
    ("b64_short_by_one_float", {"model": M, "query": dict(
        b64_tensor(np.ones(2 * E - 1)), shape=[2, E])}, ("query",)),
    ("b64_wrong_width", {"model": M, "query": b64_tensor(np.ones((2, E + 2)))},
     ("query.shape[1]: rows of 66 numbers",)),
    ("b64_dtype_unknown", {"model": M, "query": dict(b64_tensor(np.ones((2, E))),
                                                     dtype="complex64")}, ("query",)),
    ("b64_shape_negative", {"model": M, "query": dict(b64_tensor(np.ones((2, E))),
                                                      shape=[-2, -E])}, ("query",)),
    ("b64_shape_not_list", {"model": M, "query": dict(b64_tensor(np.ones((2, E))),
                                                      shape="2x64")}, ("query",)),
    ("b64_missing", {"model": M, "query": {"shape": [2, E], "dtype": "float32"}}, ("query",)),
    ("b64_empty_tensor", {"model": M, "query": {"shape": [0, E], "dtype": "float32", "b64": ""}},
     ("query",)),
    ("b64_nan", {"model": M, "query": b64_tensor(np.where(np.arange(2 * E) == 70, np.nan,
                                                          1.0).reshape(2, E))}, ("query",)),
    ("b64_inf", {"model": M, "query": b64_tensor(np.where(np.arange(2 * E) == 3, np.inf,
                                                          1.0).reshape(2, E))}, ("query",)),
    # errors that say what to fix
    ("nan_literal_says_why", b'{"model": "self_e64_h8", "query": [[0.5, NaN' + b", 0.5" * (E - 2)
     + b"]]}", ("query", 0, 1, "NaN", "non-finite")),
    ("infinity_literal_says_why", b'{"model": "self_e64_h8", "query": [[-Infinity' +
     b", 0.5" * (E - 1) + b"]]}", ("query", "-Infinity is not a JSON number",
                                    "JSON has no NaN or Infinity")),
    ("multipart_body", b'--b\r\nContent-Disposition: form-data; name="query"\r\n\r\n[[1]]\r\n'
     b"--b--\r\n", ("must be JSON", "multipart")),
    ("form_body", b"model=self_e64_h8&query=0.5", ("must be JSON", "form")),
    ("b64_urlsafe", {"model": M, "query": {"shape": [2, E], "dtype": "float32",
                                           "b64": base64.urlsafe_b64encode(
                                               (b"\xfb\xff\xbf" * 171)[:8 * E]).decode()}},
     ("query.b64", "URL-safe", "character")),
    ("b64_space", {"model": M, "query": {"shape": [1, 2], "b64": "AACAPwAA AEA="}},
     ("query.b64", "character 8", "space")),
    ("model_missing_lists_names", {"query": rows(2, E)}, ("model", M, C)),
    ("duplicate_key", b'{"model": "self_e64_h8", "model": "self_e64_h8", "query": [[0.5]]}',
     ("model", "twice")),
]


def post_raw(d, path, body, headers=None):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json"}
    h.update(headers or {})
    return requests.post(d.url + path, data=data, headers=h, timeout=support.HTTP_TIMEOUT)


@pytest.mark.parametrize("case", BAD_400, ids=[c[0] for c in BAD_400])
def test_bad_request_400(d, case):
    _, body, words = case
    r = post_raw(d, "/v1/attention", body)
    msg = check_error_body(r, 400)
    mentions(msg, *words)
    assert "X-Request-Id" in r.headers


def test_invalid_json_names_position(d):
    """For a body that is not JSON, the index is the position of the fault."""
    r = post_raw(d, "/v1/attention", b'{"model": "self_e64_h8", "query": [[1.0, 2.0,, 3.0]]}')
    msg = check_error_body(r, 400)
    assert re.search(r"\d", msg), "no position in %r" % msg


def v2(query=None, extra=None, **kw):
    ins = []
    if query is not None:
        ins.append({"name": "query", "shape": [len(query), len(query[0])], "datatype": "FP32",
                    "data": [x for row in query for x in row]})
    ins += extra or []
    body = {"inputs": ins}
    body.update(kw)
    return body


BAD_V2 = [
    ("invalid_json", b'{"inputs": [', ()),
    ("no_inputs", {"parameters": {}}, ("inputs",)),
    ("inputs_not_list", {"inputs": {"name": "query"}}, ("inputs",)),
    ("no_query", v2(None, [{"name": "key", "shape": [2, E], "datatype": "FP32",
                            "data": [0.0] * (2 * E)}]), ("query",)),
    ("shape_data_mismatch", {"inputs": [{"name": "query", "shape": [3, E], "datatype": "FP32",
                                         "data": [0.5] * (2 * E)}]}, ("query",)),
    ("wrong_width", {"inputs": [{"name": "query", "shape": [2, E + 1], "datatype": "FP32",
                                 "data": [0.5] * (2 * (E + 1))}]},
     ("inputs[0] (query).shape[1]: rows of 65 numbers",)),
    ("wrong_datatype", {"inputs": [{"name": "query", "shape": [2, E], "datatype": "BYTES",
                                    "data": ["a"] * (2 * E)}]}, ("query",)),
    ("huge_is_inf", {"inputs": [{"name": "query", "shape": [2, E], "datatype": "FP32",
                                 "data": [0.5] * 70 + [1e39] + [0.5] * (2 * E - 71)}]},
     ("query", Either(70, (1, 6)))),
    ("string_elem", {"inputs": [{"name": "query", "shape": [2, E], "datatype": "FP32",
                                 "data": [0.5] * 5 + ["x"] + [0.5] * (2 * E - 6)}]},
     ("query", Either(5, (0, 5)))),
    ("booleans_for_fp32", {"inputs": [{"name": "query", "shape": [2, E], "datatype": "FP32",
                                       "data": [True] * (2 * E)}]},
     ("inputs[0] (query).data[0]: not a number",)),
    ("nested_booleans_for_fp32", {"inputs": [{"name": "query", "shape": [2, E],
                                              "datatype": "FP32", "data": [[True] * E] * 2}]},
     ("inputs[0] (query).data[0][0]: not a number",)),
    ("numbers_for_bool", v2(rows(2, E), [{"name": "key_padding_mask", "shape": [2],
                                          "datatype": "BOOL", "data": [1, 0]}]),
     ("inputs[1] (key_padding_mask).data[0]: not a boolean",)),
    ("unknown_input", v2(rows(2, E), [{"name": "keys", "shape": [2, E], "datatype": "FP32",
                                       "data": [0.0] * (2 * E)}]), ("keys",)),
    ("bad_attention_param", v2(rows(2, E), parameters={"attention": "everything"}),
     ("attention",)),
    ("bad_causal_param", v2(rows(2, E), parameters={"causal": "maybe"}), ("causal",)),
    ("kpm_wrong_type", v2(rows(2, E), [{"name": "key_padding_mask", "shape": [2],
                                        "datatype": "FP32", "data": [0.0, 1.0]}]),
     ("key_padding_mask",)),
    ("unknown_output", v2(rows(2, E), outputs=[{"name": "logits"}]), ("logits",)),
    ("attention_output_but_none", v2(rows(2, E), outputs=[{"name": "attention"}],
                                     parameters={"attention": "none"}), ("attention", "none")),
    ("duplicate_parameter", b'{"inputs": [{"name": "query", "shape": [1, 64], "datatype": "FP32",'
     b' "data": [' + b", ".join([b"0.5"] * E) + b']}], "parameters": {"causal": true, "causal": '
     b'false}}', ("parameters.causal", "twice")),
    ("input_path_named", v2(rows(2, E), [{"name": "key", "shape": [2, -E], "datatype": "FP32",
                                          "data": [0.0] * (2 * E)}]), ("inputs[1].shape[1]",)),
]


@pytest.mark.parametrize("case", BAD_V2, ids=[c[0] for c in BAD_V2])
def test_bad_v2_request_400(d, case):
    _, body, words = case
    r = post_raw(d, "/v2/models/%s/infer" % M, body)
    msg = check_error_body(r, 400)
    mentions(msg, *words)


NOT_FOUND = [
    ("GET", "/nope", None),
    ("POST", "/v1/nothing", {"query": rows(1, E)}),
    ("GET", "/v1/models/%s/nope" % M, None),
    ("POST", "/v1/models/nope/attention", {"query": rows(2, E)}),
    ("POST", "/v1/attention", {"model": "nope", "query": rows(2, E)}),
    ("GET", "/v2/models/nope", None),
    ("GET", "/v2/models/nope/ready", None),
    ("GET", "/v2/models/nope/versions/1", None),
    ("GET", "/v2/models/nope/versions/1/ready", None),
    ("POST", "/v2/models/nope/infer", v2(rows(2, E))),
    ("POST", "/v2/models/nope/versions/1/infer", v2(rows(2, E))),
    ("GET", "/v2/nope", None),
    ("GET", "/v1", None),
    # a percent-encoded NUL must not cut the path short into another route
    ("POST", "/v1/attention%00/x", {"model": M, "query": rows(2, E)}),
    ("GET", "/health%00x", None),
    ("GET", "/v2/models/%s%%00x/ready" % M, None),
    ("POST", "/v1/models/%s%%00x/attention" % M, {"query": rows(2, E)}),
    ("POST", "/v2/models/%s/versions/1%%00/infer" % M, v2(rows(2, E))),
]


@pytest.mark.parametrize("method,path,body", NOT_FOUND,
                         ids=["%s %s" % (m, p) for m, p, _ in NOT_FOUND])
def test_not_found_404(d, method, path, body):
    kw = {} if body is None else {"data": json.dumps(body),
                                  "headers": {"Content-Type": "application/json"}}
    r = d.request(method, path, **kw)
    msg = check_error_body(r, 404)
    if "/models/nope" in path or (body and body.get("model") == "nope"):
        # every model path names the unknown model and lists the loaded ones
        assert "nope" in msg, "the error should name the unknown model: %r" % msg
        assert M in msg and C in msg, msg


WRONG_METHOD = [
    ("GET", "/v1/attention", "POST"),
    ("PUT", "/v1/attention", "POST"),
    ("DELETE", "/v1/attention", "POST"),
    ("GET", "/v1/models/%s/attention" % M, "POST"),
    ("POST", "/health", "GET"),
    ("POST", "/metrics", "GET"),
    ("DELETE", "/v1/models", "GET"),
    ("POST", "/openapi.json", "GET"),
    ("POST", "/v2", "GET"),
    ("POST", "/v2/health/live", "GET"),
    ("PUT", "/v2/health/ready", "GET"),
    ("POST", "/v2/models/%s" % M, "GET"),
    ("POST", "/v2/models/%s/ready" % M, "GET"),
    ("GET", "/v2/models/%s/infer" % M, "POST"),
]


@pytest.mark.parametrize("method,path,allowed", WRONG_METHOD,
                         ids=["%s %s" % (m, p) for m, p, _ in WRONG_METHOD])
def test_wrong_method_405(d, method, path, allowed):
    r = d.request(method, path, data=b"{}" if method in ("POST", "PUT") else None)
    check_error_body(r, 405)
    # RFC 9110 15.5.6: a 405 carries Allow with the route's methods
    allow = r.headers.get("Allow", "")
    assert allow.upper().find(allowed) >= 0, "Allow header %r lacks %s" % (allow, allowed)


# ---------------------------------------------------------------- 413

def test_body_over_limit_413(d):
    body = '{"model": "%s", "query": [%s]}' % (
        M, ",".join("[" + ",".join(["0.1" + "0" * 40 + "1"] * E) + "]" for _ in range(30)))
    assert len(body) > MAX_BODY and 30 * 2 <= MAX_TOKENS
    r = post_raw(d, "/v1/attention", body.encode())
    check_error_body(r, 413)
    # the same request under the body limit is fine
    small = {"model": M, "query": rows(30, E)}
    assert len(json.dumps(small)) < MAX_BODY
    r = post_raw(d, "/v1/attention", small)
    assert r.status_code == 200, r.text[:300]


def test_chunked_body_over_limit_413(d):
    piece = ("[" + ",".join(["0.125"] * E) + "],").encode()

    def gen():
        yield b'{"model": "%s", "query": [' % M.encode()
        for _ in range(MAX_BODY // len(piece) + 50):
            yield piece
        yield b"[" + b",".join([b"0.125"] * E) + b"]]}"
    try:
        r = requests.post(d.url + "/v1/attention", data=gen(), timeout=support.HTTP_TIMEOUT,
                          headers={"Content-Type": "application/json"})
    except requests.ConnectionError as e:
        raise AssertionError("connection dropped instead of a 413 answer: %r" % e)
    check_error_body(r, 413)


TOO_BIG = [
    ("tokens_self", "/v1/attention", {"model": M, "query": rows(70, E)}),
    ("tokens_batch", "/v1/attention", {"model": M, "query": [rows(25, E)] * 3}),
    ("tokens_query_plus_key", "/v1/attention",
     {"model": C, "query": rows(10, CE), "key": rows(60, CK), "value": rows(60, CV)}),
    ("tokens_v2", "/v2/models/%s/infer" % M, v2(rows(70, E))),
    ("attention_heads", "/v1/attention", {"model": M, "query": rows(24, E),
                                          "attention": "heads"}),
    ("attention_v2", "/v2/models/%s/infer" % M, v2(rows(24, E),
                                                   parameters={"attention": "heads"})),
]


@pytest.mark.parametrize("case", TOO_BIG, ids=[c[0] for c in TOO_BIG])
def test_request_over_limits_413(d, case):
    _, path, body = case
    r = post_raw(d, path, body)
    check_error_body(r, 413)


FITS = [
    ("attention_mean_24", {"model": M, "query": rows(24, E), "attention": "mean"}),
    ("attention_none_30", {"model": M, "query": rows(30, E)}),
    ("attention_heads_at_limit", {"model": M, "query": [rows(16, E)] * 2, "attention": "heads"}),
    ("tokens_at_limit", {"model": C, "query": rows(10, CE),
                         "key": b64_tensor(np.array(rows(54, CK))),
                         "value": b64_tensor(np.array(rows(54, CV)))}),
]


@pytest.mark.parametrize("case", FITS, ids=[c[0] for c in FITS])
def test_request_at_limits_200(d, case):
    """Just under or at each limit is served (the limits are inclusive)."""
    _, body = case
    r = post_raw(d, "/v1/attention", body)
    assert r.status_code == 200, r.text[:300]


# ---------------------------------------------------------------- API key

PROTECTED = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/attention", {"model": M, "query": rows(2, E)}),
    ("POST", "/v1/models/%s/attention" % M, {"query": rows(2, E)}),
    ("GET", "/v2", None),
    ("GET", "/v2/models/%s" % M, None),
    ("GET", "/v2/models/%s/ready" % M, None),
    ("POST", "/v2/models/%s/infer" % M, v2(rows(2, E))),
    ("GET", "/openapi.json", None),
]
OPEN = ["/health", "/v2/health/live", "/v2/health/ready", "/metrics"]
BAD_AUTH = [None, "Bearer wrong", "Bearer " + API_KEY + "x", "Bearer " + API_KEY[:-1],
            "Bearer", "Bearer ", "Basic " + API_KEY, API_KEY, "Bearer  " + API_KEY + " extra"]


@pytest.fixture(scope="module")
def keyed(daemons):
    cfg = {"models": [GOLDENS[M][1].config(), GOLDENS[C][1].config()]}
    return daemons(cfg, env={"ATTND_API_KEY": API_KEY})


@pytest.mark.parametrize("method,path,body", PROTECTED,
                         ids=["%s %s" % (m, p) for m, p, _ in PROTECTED])
def test_api_key_required(keyed, method, path, body):
    kw = {} if body is None else {"data": json.dumps(body)}
    for auth in BAD_AUTH:
        h = {"Content-Type": "application/json"}
        if auth is not None:
            h["Authorization"] = auth
        r = keyed.request(method, path, headers=h, **kw)
        check_error_body(r, 401)
        assert "WWW-Authenticate" in r.headers, "401 without WWW-Authenticate (RFC 9110 11.6.1)"
    r = keyed.request(method, path, headers={"Content-Type": "application/json",
                                             "Authorization": "Bearer " + API_KEY}, **kw)
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("path", OPEN)
def test_api_key_open_routes(keyed, path):
    r = keyed.get(path)
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_api_key_not_logged(keyed, daemons, log_format):
    if log_format == "json":
        keyed = daemons({"models": [GOLDENS[M][1].config()]},
                        env={"ATTND_API_KEY": API_KEY, "ATTND_LOG_FORMAT": "json"})
    r = keyed.post("/v1/attention", {"model": M, "query": rows(2, E)},
                   headers={"Authorization": "Bearer " + API_KEY})
    assert r.status_code == 200
    r = keyed.get("/v1/models", headers={"Authorization": "Bearer " + API_KEY + "x"})
    assert r.status_code == 401
    assert support.wait_until(lambda: "/v1/models" in keyed.stdout(), 5), \
        "no access log line on stdout"
    if log_format == "json":  # the lines are JSON, so this format was the one checked
        got = [json.loads(l) for l in keyed.stdout().splitlines() if l.strip()]
        assert any(o.get("path") == "/v1/models" and o.get("status") == 401 for o in got), got
    for text in (keyed.stdout(), keyed.stderr()):
        assert API_KEY not in text, "the API key appears in the daemon's output"


def test_header_values_end_without_their_blanks(keyed):
    """Spaces and tabs that end a header's value are not part of it (RFC
    9110, 5.5): the key, the request id and the v2 binary header length
    sent with trailing blanks, as a proxy may pass them, read as without."""
    body = json.dumps({"model": M, "query": rows(2, E)}).encode()
    resp = support.raw_http(keyed.port, b"POST /v1/attention HTTP/1.1\r\nHost: x\r\n"
                            b"Authorization: Bearer " + API_KEY.encode() + b" \t\r\n"
                            b"X-Request-Id: abc-1 \r\nContent-Type: application/json\r\n"
                            b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    head = resp.split(b"\r\n\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 200"), resp[:300]
    assert re.search(rb"(?im)^x-request-id: abc-1\r?$", head), head
    q = np.arange(2 * E, dtype=np.float32) / (2 * E)
    hdr = json.dumps({"inputs": [{"name": "query", "shape": [2, E], "datatype": "FP32",
                                  "parameters": {"binary_data_size": q.nbytes}}]}).encode()
    v2 = hdr + q.tobytes()
    resp = support.raw_http(keyed.port, b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\n"
                            b"Authorization: Bearer %s\r\nInference-Header-Content-Length: %d "
                            b"\r\nContent-Type: application/octet-stream\r\nContent-Length: %d"
                            b"\r\nConnection: close\r\n\r\n" % (M.encode(), API_KEY.encode(),
                                                             len(hdr), len(v2)) + v2)
    assert resp.startswith(b"HTTP/1.1 200"), resp[:300]


@pytest.mark.parametrize("te", [b"gzip, chunked", b"identity", b"chunked "],
                         ids=["gzip_chunked", "identity", "chunked_blank"])
def test_unreadable_transfer_encoding_refused_at_once(keyed, te):
    """A body whose end cannot be found (a Transfer-Encoding other than
    chunked, as sent) is a 400 at once and the connection closed, not a
    connection held until the body deadline (RFC 9112, 6.1 and 6.3)."""
    t0 = time.monotonic()
    resp = support.raw_http(keyed.port, b"POST /v1/attention HTTP/1.1\r\nHost: x\r\n"
                            b"Transfer-Encoding: " + te + b"\r\n\r\n1d\r\n"
                            b'{"query":[[1,2,3,4,5,6,7,8]]}\r\n0\r\n\r\n', timeout=20)
    assert time.monotonic() - t0 < 10 * support.SLOW, "answered only at the body deadline"
    head, _, body = resp.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), resp[:300]
    assert b"Transfer-Encoding" in body and re.search(rb"(?im)^connection: close", head), resp


def test_two_content_lengths_refused(keyed):
    """Two Content-Lengths that disagree are one 400 and the connection
    closed: what follows is never read as a request of its own."""
    smuggled = b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n"
    resp = support.raw_http(keyed.port, b"POST /v1/attention HTTP/1.1\r\nHost: x\r\n"
                            b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n" % len(smuggled)
                            + smuggled, timeout=5)
    assert resp.count(b"HTTP/1.1 ") == 1 and resp.startswith(b"HTTP/1.1 400"), resp[:400]
    assert b"Content-Length" in resp.partition(b"\r\n\r\n")[2], resp


@pytest.mark.parametrize("raw", ["trim-key-1\n", "trim-key-1\r\n", " \ttrim-key-1 \n"],
                         ids=["lf", "crlf", "spaces_tab"])
def test_api_key_blanks_around_trimmed(daemons, raw):
    """A key from a file or a Kubernetes secret often ends in a newline no
    client can send: the blanks around the variable's value are not part of
    the key."""
    k = daemons({"models": [GOLDENS[M][1].config()]}, env={"ATTND_API_KEY": raw})
    r = k.get("/v1/models", headers={"Authorization": "Bearer trim-key-1"})
    assert r.status_code == 200, r.text[:300]
    check_error_body(k.get("/v1/models"), 401)
    check_error_body(k.get("/v1/models", headers={"Authorization": "Bearer trim-key-"}), 401)


def test_api_key_only_blanks_is_no_key(daemons):
    """A value of blanks alone is no key, as an empty one is."""
    k = daemons({"models": [GOLDENS[M][1].config()]}, env={"ATTND_API_KEY": " \n"})
    assert k.get("/v1/models").status_code == 200
    assert "api key: none" in k.stdout() + k.stderr()


def test_api_key_env_name_from_config(daemons):
    cfg = {"server": {"api_key_env": "ATTND_TEST_OTHER_KEY"},
           "models": [GOLDENS[M][1].config()]}
    k = daemons(cfg, env={"ATTND_TEST_OTHER_KEY": "other-key-1"})
    body = {"query": rows(2, E)}
    check_error_body(k.post("/v1/attention", body), 401)
    r = k.post("/v1/attention", body, headers={"Authorization": "Bearer other-key-1"})
    assert r.status_code == 200, r.text[:300]
    assert k.get("/health").status_code == 200


def find_key(obj, key):
    """Every value of `key` anywhere in a JSON document."""
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                out.append(v)
            out += find_key(v, key)
    elif isinstance(obj, list):
        for v in obj:
            out += find_key(v, key)
    return out


def test_models_listing_shows_limits(d):
    """GET /v1/models: the loaded models, their hyper-parameters and limits."""
    r = d.get("/v1/models")
    assert r.status_code == 200
    body = r.json()
    assert find_key(body, "max_tokens_per_request") and all(
        v == MAX_TOKENS for v in find_key(body, "max_tokens_per_request")), body
    assert find_key(body, "max_attention_floats") and all(
        v == MAX_ATT for v in find_key(body, "max_attention_floats")), body
    names = find_key(body, "name")
    assert M in names and C in names, names


def test_no_api_key_means_open(d):
    r = d.get("/v1/models")
    assert r.status_code == 200


# ---------------------------------------------------------------- garbage

def random_json(rng, depth=0):
    c = rng.randrange(9 if depth < 4 else 5)
    if c == 0:
        return rng.choice([None, True, False])
    if c == 1:
        return rng.choice([0, -1, 1, 2 ** 31, -2 ** 63, 1e39, -1e39, 1e-46, 3.5])
    if c == 2:
        return rng.choice(["", "x", "NaN", "inf", "\u00e9\u4e2d", "\\u0000", "a" * 300])
    if c == 3:
        return rng.random() * 10 - 5
    if c == 4:
        return rng.choice(["none", "mean", "heads", "base64", "json", M, C])
    if c in (5, 6):
        n = rng.randrange(0, 6)
        return [random_json(rng, depth + 1) for _ in range(n)]
    if c == 7:
        return {"shape": random_json(rng, depth + 1), "dtype": rng.choice(["float32", "x"]),
                "b64": rng.choice(["", "AAAA", "AAAAAA==", "////", "%%%"])}
    keys = ["query", "key", "value", "model", "causal", "attention", "encoding",
            "key_padding_mask", "attn_mask", "inputs", "outputs", "parameters", "name",
            "shape", "datatype", "data"]
    return {rng.choice(keys): random_json(rng, depth + 1) for _ in range(rng.randrange(1, 5))}


def garbage_bodies(n, seed=1234):
    rng = random.Random(seed)
    base = [json.dumps({"model": M, "query": rows(3, E, 5), "attention": "mean"}),
            json.dumps({"model": C, "query": rows(2, CE), "key": rows(3, CK),
                        "value": rows(3, CV), "key_padding_mask": [False, True, False]}),
            json.dumps(v2(rows(2, E), parameters={"attention": "heads"}))]
    out = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            out.append(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 400))))
        elif kind in (1, 2):
            s = bytearray(rng.choice(base).encode())
            for _ in range(rng.randrange(1, 6)):
                op = rng.randrange(3)
                p = rng.randrange(len(s))
                if op == 0:
                    s[p] = rng.choice(b'[]{},:"0123456789.eE-+ntfa\\\x00\xff')
                elif op == 1:
                    del s[p:p + rng.randrange(1, 20)]
                else:
                    s[p:p] = rng.choice([b"[", b"]]", b",", b'"', b"1e999", b"-", b"{}"])
            out.append(bytes(s))
        elif kind == 3:
            out.append(json.dumps(random_json(rng)).encode())
        else:
            d = json.loads(rng.choice(base))
            d[rng.choice(list(d.keys()))] = random_json(rng)
            out.append(json.dumps(d).encode())
    # deep nesting and long flat arrays
    out.append(b"[" * 100000 + b"]" * 100000)
    out.append(b'{"model": "self_e64_h8", "query": ' + b"[" * 5000 + b"1" + b"]" * 5000 + b"}")
    out.append(b'{"query": [' + b"1," * 30000 + b"1]}")
    out.append(b'{"query": "' + b"\\u" * 1000 + b'"}')
    return out


def test_garbage_bodies(d):
    bodies = garbage_bodies(300)
    paths = ["/v1/attention", "/v1/models/%s/attention" % M, "/v2/models/%s/infer" % M]
    bad = []
    for i, body in enumerate(bodies):
        path = paths[i % 3]
        r = post_raw(d, path, body)
        if r.status_code == 200:
            continue
        if r.status_code not in (400, 404, 413):
            bad.append((path, body[:200], r.status_code, r.text[:200]))
            continue
        check_error_body(r, r.status_code)
    assert not bad, "unexpected statuses:\n%s" % "\n".join(map(repr, bad[:10]))
    assert d.alive()
    check_golden(d)


RAW = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n",
    b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n",
    b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
    b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n{}",
    b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n{}",
    b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"query\":",
    b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n",
    b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 100000 + b"\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"X-H: 1\r\n" * 2000 + b"\r\n",
    b"\x00\xff\xfe\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /v1/models/%00/attention HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /health HTTP/1.1\r\nHost: x\r\nX-Request-Id: " + b"\x01\x7f" * 50 + b"\r\n\r\n",
    b"POST /v1/attention HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n",
]


def test_raw_socket_garbage(d):
    for data in RAW:
        resp = support.raw_http(d.port, data, timeout=1.5)
        if resp:
            status = resp.split(b"\r\n", 1)[0]
            # 505 (HTTP version not supported) is the right answer to HTTP/9.9
            assert not re.match(rb"HTTP/1\.[01] 50[0-4]", status), (data[:80], status)
    assert d.alive()
    assert d.get("/health").status_code == 200


# Shapes whose element counts wrap 64 bits. The first is the 280-byte
# request that once killed the daemon: with the binary data extension, its
# product wrapped to 0 and matched an empty binary part.
WRAPPING_SHAPES = [
    ("query_binary", [{"name": "query", "shape": [268435456, 134217728, 512], "datatype": "FP32",
                       "parameters": {"binary_data_size": 0}}], True, "inputs[0]"),
    ("attn_mask_binary", [{"name": "query", "shape": [1, E], "datatype": "FP32", "data": [0.5] * E},
                          {"name": "attn_mask", "shape": [268435456, 134217728, 512],
                           "datatype": "FP32", "parameters": {"binary_data_size": 0}}], True,
     "inputs[1]"),
    ("kpm_binary", [{"name": "query", "shape": [1, E], "datatype": "FP32", "data": [0.5] * E},
                    {"name": "key_padding_mask", "shape": [1 << 20, 1 << 22, 1 << 22],
                     "datatype": "BOOL", "parameters": {"binary_data_size": 0}}], True,
     "inputs[1]"),
    ("query_json", [{"name": "query", "shape": [1000000000, 1000000000, 1000000000],
                     "datatype": "FP32", "data": [1.0]}], False, "inputs[0]"),
]


@pytest.mark.parametrize("case", WRAPPING_SHAPES, ids=[c[0] for c in WRAPPING_SHAPES])
def test_wrapping_shape_products_413(d, case):
    _, inputs, binary, where = case
    body = json.dumps({"inputs": inputs}).encode()
    headers = {"Inference-Header-Content-Length": str(len(body))} if binary else {}
    r = post_raw(d, "/v2/models/%s/infer" % M, body, headers)
    msg = check_error_body(r, 413)
    mentions(msg, where, "too large")
    assert d.alive()
    assert d.get("/health").status_code == 200


def binary_v2_body(L=2):
    """A valid binary-extension body: its JSON part, then L×E float32."""
    js = json.dumps({"inputs": [{"name": "query", "shape": [1, L, E], "datatype": "FP32",
                                 "parameters": {"binary_data_size": 4 * L * E}}]}).encode()
    return js, js + np.asarray(rows(L, E), dtype="<f4").tobytes()


def test_compressed_body_refused_saying_so(d):
    """A body sent with Content-Encoding gzip or deflate (tritonclient's
    request compression) is not read as JSON: a 400 that names the header
    and says to send it uncompressed; identity is read as usual."""
    import gzip
    body = json.dumps({"model": M, "query": rows(2, E)}).encode()
    for enc in ("gzip", "deflate", "br"):
        r = post_raw(d, "/v1/attention", gzip.compress(body), {"Content-Encoding": enc})
        msg = check_error_body(r, 400)
        assert msg.startswith("Content-Encoding: '%s'" % enc) and "uncompressed" in msg, msg
    r = post_raw(d, "/v2/models/%s/infer" % M, gzip.compress(body), {"Content-Encoding": "gzip"})
    assert "uncompressed" in check_error_body(r, 400)
    r = post_raw(d, "/v1/attention", body, {"Content-Encoding": "identity"})
    assert r.status_code == 200, r.text[:300]


def test_null_is_a_field_left_out(d):
    """An optional field given as null (what Jackson and Go's encoding/json
    write for a field that is not set) is as if it were left out, in a
    native body and a v2 one alike; a required one given as null is still
    missing, and named."""
    q = rows(3, E, seed=5)
    base = d.post("/v1/attention", {"model": M, "query": q, "encoding": "base64"})
    assert base.status_code == 200, base.text[:300]
    nulls = {k: None for k in ("key", "value", "key_padding_mask", "attn_mask", "positions",
                               "causal", "attention", "timeout_ms", "attention_heads",
                               "attention_rows", "attention_top_k", "attention_dtype")}
    r = d.post("/v1/attention", dict(nulls, model=M, query=q, encoding="base64"))
    assert r.status_code == 200, r.text[:300]
    assert r.json()["output"] == base.json()["output"] and "attention" not in r.json()
    # key given, value null: value defaults to key (SPEC 1)
    k = rows(5, E, seed=6)
    a = d.post("/v1/attention", {"model": M, "query": q, "key": k, "encoding": "base64"})
    b = d.post("/v1/attention", {"model": M, "query": q, "key": k, "value": None,
                                 "encoding": None})
    assert a.status_code == b.status_code == 200, (a.text[:200], b.text[:200])
    got = np.frombuffer(base64.b64decode(a.json()["output"]["b64"]), "<f4").reshape(3, E)
    assert np.array_equal(np.array(b.json()["output"], dtype=np.float32), got)
    msg = check_error_body(d.post("/v1/attention", {"model": M, "query": None}), 400)
    assert "query" in msg, msg
    # v2: top-level and parameters
    body = {"id": None, "outputs": None, "parameters": {"attention": None, "timeout_ms": None},
            "inputs": [{"name": "query", "shape": [3, E], "datatype": "FP32",
                        "data": np.asarray(q, dtype=np.float32).reshape(-1).tolist()}]}
    r = d.post("/v2/models/%s/infer" % M, body)
    assert r.status_code == 200, r.text[:300]
    out = np.array(r.json()["outputs"][0]["data"], dtype=np.float32)
    self_out = np.frombuffer(base64.b64decode(base.json()["output"]["b64"]), "<f4")
    assert np.array_equal(out, self_out)
    base_v2 = d.post("/v2/models/%s/infer" % M, {"inputs": body["inputs"]})
    assert base_v2.json()["outputs"][0]["data"] == r.json()["outputs"][0]["data"]


def test_v2_binary_float_mask_takes_minus_infinity(d):
    """-inf in a float attn_mask hides a key (torch's usual float mask), in
    the v2 binary data extension as in a native tensor object: the same
    bits; +inf and NaN stay refused, named with their index."""
    L = 3
    q = np.asarray(rows(L, E, seed=8), dtype="<f4")
    mask = np.zeros((L, L), dtype="<f4")
    mask[0, 1] = mask[0, 2] = mask[2, 0] = -np.inf
    mask[1, 2] = 0.25
    native = d.post("/v1/attention", {"model": M, "query": b64_tensor(q),
                                      "attn_mask": b64_tensor(mask), "encoding": "base64"})
    assert native.status_code == 200, native.text[:300]
    want = base64.b64decode(native.json()["output"]["b64"])

    def v2_binary(m):
        js = json.dumps({"inputs": [
            {"name": "query", "shape": [1, L, E], "datatype": "FP32",
             "parameters": {"binary_data_size": q.nbytes}},
            {"name": "attn_mask", "shape": [L, L], "datatype": "FP32",
             "parameters": {"binary_data_size": m.nbytes}}],
            "outputs": [{"name": "output", "parameters": {"binary_data": True}}]}).encode()
        return post_raw(d, "/v2/models/%s/infer" % M, js + q.tobytes() + m.tobytes(),
                        {"Inference-Header-Content-Length": str(len(js))})

    r = v2_binary(mask)
    assert r.status_code == 200, r.text[:300]
    n = int(r.headers["Inference-Header-Content-Length"])
    assert r.content[n:] == want
    for bad, word in ((np.inf, "infinity"), (np.nan, "NaN")):
        m = mask.copy()
        m[1, 0] = bad
        msg = check_error_body(v2_binary(m), 400)
        mentions(msg, "attn_mask", 1, 0, word)


def test_bad_inference_header_content_length_400(d):
    """Inference-Header-Content-Length is a size from 1 to the body's length,
    digits only: anything else is a 400 that names the header."""
    js, body = binary_v2_body()
    r = post_raw(d, "/v2/models/%s/infer" % M, body,
                 {"Inference-Header-Content-Length": str(len(js))})
    assert r.status_code == 200, r.text[:300]
    for bad in ("-1", "0", "abc", "18446744073709551616", str(len(body) + 1), "+%d" % len(js),
                "%d x" % len(js), "0x%x" % len(js), ""):
        r = post_raw(d, "/v2/models/%s/infer" % M, body, {"Inference-Header-Content-Length": bad})
        msg = check_error_body(r, 400)
        assert msg.startswith("Inference-Header-Content-Length: "), (bad, msg)
    # the JSON part's length, but not where the JSON ends: the body's fault, named
    r = post_raw(d, "/v2/models/%s/infer" % M, body,
                 {"Inference-Header-Content-Length": str(len(js) - 1)})
    check_error_body(r, 400)
    assert d.get("/health").status_code == 200


# ---------------------------------------------------------------- HTTP details

def test_overflow_in_compute_never_leaks_nan(d):
    """Finite inputs whose products overflow float32: whatever the status, no
    NaN or Inf leaves the server (SPEC 1)."""
    q = np.full((3, E), 3e37, dtype=np.float32)
    q[1] = -3e37
    for enc in ("base64", "json"):
        r = post_raw(d, "/v1/attention", {"model": M, "query": b64_tensor(q), "encoding": enc,
                                          "attention": "heads"})
        if r.status_code == 200:
            body = r.json()
            for k in ("output", "attention"):
                a = from_b64_or_list(body[k])
                assert np.isfinite(a).all(), "%s carries NaN/Inf" % k
        else:
            # SPEC 4: "anything else: 500, and the daemon keeps serving"
            msg = check_error_body(r, r.status_code)
            assert r.status_code in (400, 422, 500), (r.status_code, msg)
    assert d.get("/health").status_code == 200


def from_b64_or_list(x):
    return support.from_b64_tensor(x) if isinstance(x, dict) else np.asarray(x, dtype=np.float64)


def test_curl_default_content_type(d):
    """curl -d sends application/x-www-form-urlencoded; the body is still JSON."""
    body = json.dumps({"model": M, "query": rows(2, E)})
    r = requests.post(d.url + "/v1/attention", data=body, timeout=support.HTTP_TIMEOUT,
                      headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text[:300]


def test_chunked_body_within_limit(d):
    body = json.dumps({"model": M, "query": rows(3, E)}).encode()
    r = requests.post(d.url + "/v1/attention", data=iter([body[:100], body[100:]]),
                      headers={"Content-Type": "application/json"}, timeout=support.HTTP_TIMEOUT)
    assert r.status_code == 200, r.text[:300]


def test_json_string_escapes_in_model_name(d):
    body = ('{"model": "self_e64\\u005fh8", "query": %s}' % json.dumps(rows(2, E))).encode()
    r = post_raw(d, "/v1/attention", body)
    assert r.status_code == 200, r.text[:300]


@pytest.mark.parametrize("path", ["/health", "/metrics", "/v1/models", "/v2/health/live"])
def test_head_on_get_routes(d, path):
    r = d.request("HEAD", path)
    assert r.status_code == 200
    assert r.content == b""


def test_expect_100_continue(d):
    """curl sends Expect: 100-continue for large bodies: a body over the limit
    is refused with 413 before it is sent; one within it gets 100 Continue."""
    head = (b"POST /v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            b"\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n")
    resp = support.raw_http(d.port, head % (MAX_BODY * 4), timeout=5)
    assert resp.startswith(b"HTTP/1.1 413"), resp[:200]
    body = json.dumps({"model": M, "query": rows(2, E)}).encode()
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    try:
        s.sendall(head % len(body))
        first = s.recv(4096)
        assert first.startswith(b"HTTP/1.1 100"), first[:200]
        s.sendall(body)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < int(
                re.search(rb"(?i)content-length:\s*(\d+)", data).group(1)):
            c = s.recv(65536)
            if not c:
                break
            data += c
        assert data.startswith(b"HTTP/1.1 200"), data[:200]
    finally:
        s.close()


def test_keep_alive_across_errors(d):
    """One connection: good, bad, unknown, good... every answer right."""
    g, _ = GOLDENS[M]
    seq = g["sequences"][0]
    with requests.Session() as s:
        for i in range(30):
            kind = i % 3
            if kind == 0:
                r = s.post(d.url + "/v1/attention", data=json.dumps(golden_body(seq, M)),
                           headers={"Content-Type": "application/json"}, timeout=30)
                assert r.status_code == 200, r.text[:200]
                assert rel_err(r.json()["output"], seq["output"]) <= 1e-5
            elif kind == 1:
                r = s.post(d.url + "/v1/attention", data=b'{"model": "self_e64_h8", "query": [[1',
                           headers={"Content-Type": "application/json"}, timeout=30)
                check_error_body(r, 400)
            else:
                check_error_body(s.get(d.url + "/nope", timeout=30), 404)


def test_http10_clients(d):
    """HTTP/1.0 clients (nginx talks HTTP/1.0 to upstreams by default) are
    answered, with the connection closed after the answer."""
    resp = support.raw_http(d.port, b"GET /health HTTP/1.0\r\n\r\n", timeout=5)
    assert re.match(rb"HTTP/1\.[01] 200", resp), resp[:200]
    body = json.dumps({"model": M, "query": rows(2, E)}).encode()
    req = (b"POST /v1/attention HTTP/1.0\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\n\r\n" % len(body)) + body
    s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    try:
        s.sendall(req)
        data = b""
        while True:
            c = s.recv(65536)
            if not c:
                break  # closed by the server, as HTTP/1.0 without keep-alive wants
            data += c
    finally:
        s.close()
    head, _, payload = data.partition(b"\r\n\r\n")
    assert re.match(rb"HTTP/1\.[01] 200", head), head[:200]
    assert len(json.loads(payload)["output"]) == 2


def test_zz_still_serves_correctly(d):
    """Runs last: after every bad input above, golden answers are unchanged."""
    assert d.alive()
    check_golden(d)


def test_wrapped_base64_is_read(d):
    """Line-wrapped base64 (base64.encodebytes, the base64 tool, MIME) is
    read as the same numbers."""
    g, _ = GOLDENS[M]
    s = next(s for s in g["sequences"] if s["key"] is None and s["attn_mask"] is None
             and s["key_padding_mask"] is None)
    q = np.asarray(s["query"], "<f4")
    wrapped = base64.encodebytes(q.tobytes()).decode()
    assert "\n" in wrapped[:-1]
    body = {"model": M, "causal": bool(s["causal"]),
            "query": {"shape": list(q.shape), "dtype": "float32", "b64": wrapped}}
    r = post_raw(d, "/v1/attention", body)
    assert r.status_code == 200, r.text[:300]
    assert rel_err(r.json()["output"], s["output"]) <= 1e-5
