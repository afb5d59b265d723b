"""/openapi.json: an OpenAPI 3 description of every route of SPEC section 4,
kept true by schemathesis generating requests against the running daemon."""
import os
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import requests

import support

GOLDENS = {g["name"]: m for g, m in support.load_goldens()}
MODEL = "self_e16_h1"
CROSS = "cross_e48_h4_k40_v24"

# (method, path) of every route the SPEC lists; {} stands for any parameter name
ROUTES = [
    ("post", "/v1/attention"),
    ("post", "/v1/models/{}/attention"),
    ("get", "/v1/models"),
    ("get", "/v2/health/live"),
    ("get", "/v2/health/ready"),
    ("get", "/v2"),
    ("get", "/v2/models/{}"),
    ("get", "/v2/models/{}/ready"),
    ("post", "/v2/models/{}/infer"),
    ("get", "/health"),
    ("get", "/metrics"),
    ("get", "/openapi.json"),
    ("get", "/ui"),
    ("get", "/ui/{}"),
    ("post", "/v1/sessions"),
    ("post", "/v1/sessions/{}/attention"),
    ("delete", "/v1/sessions/{}"),
    ("get", "/v1/sessions/{}/state"),
]


KEY = "openapi-test-key-31"


@pytest.fixture(scope="module")
def d(daemons):
    """With an API key, so that schemathesis also checks that every route the
    document marks as needing bearerAuth refuses a wrong key, and that the
    open ones (security: []) answer without one."""
    return daemons({"models": [GOLDENS[MODEL].config()]}, env={"ATTND_API_KEY": KEY})


@pytest.fixture(scope="module")
def d_open(daemons):
    """Without a key, two models: one of cross attention (kdim, vdim apart
    from embed_dim), so that /v1/attention keeps the schema of any model."""
    return daemons({"server": {"api_key_env": ""},
                    "models": [GOLDENS[MODEL].config(), GOLDENS[CROSS].config()]})


def _auth(key):
    return {"Authorization": "Bearer " + key} if key else {}


def test_openapi_lists_every_route(d):
    r = d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY})
    assert r.status_code == 200
    assert r.headers.get("Content-Type", "").startswith("application/json")
    doc = r.json()
    assert str(doc.get("openapi", "")).startswith("3."), doc.get("openapi")
    assert doc.get("info", {}).get("title") and doc["info"].get("version")
    paths = {re.sub(r"\{[^}]*\}", "{}", p): ops for p, ops in doc.get("paths", {}).items()}
    missing = [(m, p) for m, p in ROUTES if p not in paths or m not in paths[p]]
    assert not missing, "routes missing from /openapi.json: %s" % missing
    for m, p in ROUTES:
        op = paths[p][m]
        assert op.get("responses"), "%s %s documents no responses" % (m, p)
    for p in ("/v1/attention", "/v1/models/{}/attention", "/v2/models/{}/infer"):
        op = paths[p]["post"]
        assert "application/json" in op.get("requestBody", {}).get("content", {}), p
        codes = set(op["responses"])
        assert {"200", "400", "413"} <= codes, (p, sorted(codes))


def test_security_marks_the_keyed_routes(d):
    """A global bearerAuth requirement, lifted (security: []) exactly on the
    routes the daemon answers without the key, which a generated client then
    knows about."""
    doc = d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY}).json()
    assert doc.get("security") == [{"bearerAuth": []}], doc.get("security")
    scheme = doc["components"]["securitySchemes"]["bearerAuth"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer", scheme
    for path, ops in doc["paths"].items():
        url = d.url + path.replace("{name}", MODEL).replace("{version}", "1")
        for method, op in ops.items():
            r = requests.request(method.upper(), url, timeout=support.HTTP_TIMEOUT,
                                 data=b"{}" if method == "post" else None)
            if op.get("security") == []:
                assert r.status_code != 401, (method, path, r.status_code)
            else:
                assert "security" not in op, (method, path, op.get("security"))
                assert r.status_code == 401, (method, path, r.status_code)
                assert "401" in op["responses"], (method, path)


def _ops(doc):
    return [(m, p, op) for p, ops in doc["paths"].items() for m, op in ops.items()]


def test_document_follows_the_key(d, d_open):
    """With a key: the global bearer requirement, its scheme, a 401 on every
    route that needs it. Without: none of them anywhere, so a client
    generated from it sends no key and a gateway asks for none; and the
    daemon without a key indeed answers every route without one."""
    keyed = d.get("/openapi.json", headers=_auth(KEY)).json()
    assert keyed["security"] == [{"bearerAuth": []}]
    assert "bearerAuth" in keyed["components"]["securitySchemes"]
    assert "E401" in keyed["components"]["responses"]
    assert all("401" in op["responses"] for m, p, op in _ops(keyed) if "security" not in op)
    assert {p for m, p, op in _ops(keyed) if op.get("security") == []} == {
        "/health", "/metrics", "/ui", "/ui/{name}", "/v2/health/live", "/v2/health/ready"}
    r = d.get("/openapi.json")
    assert r.status_code == 401, r.status_code  # the document itself needs the key
    doc = d_open.get("/openapi.json").json()
    assert "security" not in doc and "securitySchemes" not in doc["components"], doc.get("security")
    assert "E401" not in doc["components"]["responses"]
    for m, p, op in _ops(doc):
        assert "security" not in op and "401" not in op["responses"], (m, p)
    for p in ("/v1/models", "/openapi.json", "/v2/models/%s" % MODEL):
        assert d_open.get(p).status_code == 200, p


def _query_schema(doc, path):
    body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
    return doc["components"]["schemas"][body["$ref"].split("/")[-1]]


def _row_widths(query_schema):
    """The widths (minItems, maxItems of a row) of the nested array forms."""
    a, b = query_schema["anyOf"][0], query_schema["anyOf"][1]
    return [(x["minItems"], x["maxItems"]) for x in (a["items"], b["items"]["items"])]


def test_document_follows_the_models(d, d_open):
    """One path per model serving, with its widths: query rows of embed_dim,
    key of kdim, value of vdim, heads below num_heads; its v2 inputs and
    their datatypes. /v1/attention (its model in the body, or the one
    model serving) keeps the schema of any model."""
    doc = d_open.get("/openapi.json").json()
    for name in (MODEL, CROSS):
        m = GOLDENS[name]
        s = _query_schema(doc, "/v1/models/%s/attention" % name)
        p = s["properties"]
        assert p["model"]["enum"] == [name]
        assert _row_widths(p["query"]) == [(m.E, m.E)] * 2, name
        assert _row_widths(p["key"]) == [(m.kdim, m.kdim)] * 2, name
        assert _row_widths(p["value"]) == [(m.vdim, m.vdim)] * 2, name
        assert p["attention_heads"]["items"]["maximum"] == m.H - 1
        cross = m.kdim != m.E or m.vdim != m.E
        assert set(s["required"]) == ({"query", "key", "value"} if cross else {"query"}), name
        v2 = _query_schema(doc, "/v2/models/%s/infer" % name)
        alts = v2["properties"]["inputs"]["items"]["anyOf"]
        types = {}
        for a in alts:
            types.setdefault(a["properties"]["name"]["enum"][0], set()).update(
                a["properties"]["datatype"]["enum"])
        assert types == {"query": {"FP32", "FP16", "FP64"}, "key": {"FP32", "FP16", "FP64"},
                         "value": {"FP32", "FP16", "FP64"}, "key_padding_mask": {"BOOL"},
                         "attn_mask": {"BOOL", "FP32", "FP16", "FP64"}}, types
    generic = doc["paths"]["/v1/attention"]["post"]["requestBody"]["content"]["application/json"]
    assert generic["schema"] == {"$ref": "#/components/schemas/AttentionRequest"}
    one = d.get("/openapi.json", headers=_auth(KEY)).json()
    assert "/v1/models/%s/attention" % MODEL in one["paths"]
    assert "/v1/models/%s/attention" % CROSS not in one["paths"]


def test_query_widths_agree_with_the_server(d_open):
    """Queries drawn from a model's own query schema (its L×E form) are
    answered 200 by that model; rows one wider or narrower are invalid by
    the schema and refused with 400. The numbers drawn stay within +-1e3:
    whether larger ones overflow the result depends on the weights, and
    B×L×E's sequences must have one length, rules the schema cannot say
    (docs/api.md)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis_jsonschema import from_schema
    doc = d_open.get("/openapi.json").json()
    for name in (MODEL, CROSS):
        q = _query_schema(doc, "/v1/models/%s/attention" % name)["properties"]["query"]
        arrays = {"anyOf": q["anyOf"][:2]}
        v = __import__("jsonschema").Draft4Validator(arrays)
        drawn = json.loads(json.dumps(arrays["anyOf"][0]))
        assert drawn["items"]["items"]["maximum"] == -drawn["items"]["items"]["minimum"] > 3.4e38
        drawn["items"]["items"].update(minimum=-1e3, maximum=1e3)
        seen = []
        m = GOLDENS[name]
        kv = {} if m.kdim == m.vdim == m.E else {"key": [[0.5] * m.kdim] * 3,
                                                  "value": [[0.5] * m.vdim] * 3}

        @settings(max_examples=15, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(from_schema(drawn))
        def answered(query):
            seen.append(query)
            r = d_open.post("/v1/models/%s/attention" % name, dict(kv, query=query))
            assert r.status_code == 200, (name, r.status_code, r.text[:200])

        answered()
        assert seen, name
        w = GOLDENS[name].E
        for bad in ([[0.0] * (w + 1)], [[0.0] * (w - 1)], [[0.0]]):
            assert not v.is_valid(bad), (name, len(bad[0]))
            r = d_open.post("/v1/models/%s/attention" % name, dict(kv, query=bad))
            assert r.status_code == 400, (name, len(bad[0]), r.status_code)


def test_document_follows_a_load_and_an_unload(daemons, tmp_path):
    """model_control explicit: a model loaded through the repository gets
    its path in the next document, with its widths; once unloaded it is
    gone from it."""
    m = GOLDENS[CROSS]
    folder = tmp_path / "models"
    folder.mkdir()
    shutil.copy(m.path, folder / "w.safetensors")
    dd = daemons({"server": {"api_key_env": "", "model_control": "explicit",
                             "model_dir": str(folder)},
                  "models": [GOLDENS[MODEL].config()]})
    path = "/v1/models/late/attention"
    assert path not in dd.get("/openapi.json").json()["paths"]
    cfg = m.config(name="late", weights=str(folder / "w.safetensors"))
    r = dd.post("/v2/repository/models/late/load", {"parameters": {"config": json.dumps(cfg)}})
    assert r.status_code == 200, r.text
    doc = dd.get("/openapi.json").json()
    assert path in doc["paths"] and "/v2/models/late/infer" in doc["paths"]
    assert _row_widths(_query_schema(doc, path)["properties"]["key"]) == [(m.kdim, m.kdim)] * 2
    assert dd.post("/v2/repository/models/late/unload", {}).status_code == 200
    doc = dd.get("/openapi.json").json()
    assert path not in doc["paths"] and "AttentionRequest_late" not in doc["components"]["schemas"]


def test_links(d):
    """A session's open links to its step, state and close (its id from the
    answer's session); the v2 metadata to infer (the answer's name)."""
    doc = d.get("/openapi.json", headers=_auth(KEY)).json()
    links = doc["paths"]["/v1/sessions"]["post"]["responses"]["201"]["links"]
    want = {"step": ("/v1/sessions/{name}/attention", "post"),
            "state": ("/v1/sessions/{name}/state", "get"),
            "close": ("/v1/sessions/{name}", "delete")}
    assert set(links) == set(want)
    for k, (p, m) in want.items():
        ref = links[k]["operationRef"]
        assert ref == "#/paths/" + p.replace("/", "~1") + "/" + m, ref
        assert links[k]["parameters"] == {"name": "$response.body#/session"}
    meta = doc["paths"]["/v2/models/{name}"]["get"]["responses"]["200"]["links"]["infer"]
    assert meta["operationRef"] == "#/paths/~1v2~1models~1{name}~1infer/post"
    assert meta["parameters"] == {"name": "$response.body#/name"}
    # the ids flow as the links say: the open's session is the step's {name}
    q = [[0.1] * 16] * 2
    r = d.post("/v1/sessions", {"query": q}, headers=_auth(KEY))
    assert r.status_code == 201, r.text
    sid = r.json()["session"]
    assert d.get("/v1/sessions/%s/state" % sid, headers=_auth(KEY)).status_code in (200, 409)
    assert d.request("DELETE", "/v1/sessions/%s" % sid, headers=_auth(KEY)).status_code in (200, 204)


# Operations whose bodies the schema cannot fully describe (docs/api.md,
# "What the document cannot say"): rules across fields, such as the rows of
# key and value agreeing, a mask's shape matching the sequences, a v2
# input's data counting the product of its shape, a session's own state.
# The daemon refuses some bodies valid by the schema there with 400 (or
# 409 for a session's state), so schemathesis's positive_data_acceptance
# check leaves exactly these out; every other check runs on them.
REFUSED = ["POST /v1/attention", "POST /v1/models/{name}/attention",
           "POST /v2/models/{name}/infer", "POST /v2/models/{name}/versions/{version}/infer",
           "POST /v1/sessions", "POST /v1/sessions/{name}/attention"]
# ...and the same per-model paths, one per model serving
REFUSED_PER_MODEL = ["POST /v1/models/%s/attention", "POST /v2/models/%s/infer"]
# the other ends of the links from and to REFUSED's operations: run again
# beside them, so that schemathesis follows the links (open -> step, state,
# close; metadata -> infer)
LINKED = ["GET /v1/sessions/{name}/state", "DELETE /v1/sessions/{name}", "GET /v2/models/{name}",
          "GET /v2/models/{name}/versions/{version}"]


def _schemathesis(d, tmp_path, key, names, positive):
    """One run of the schemathesis CLI over the operations named (include:
    names given; else every one but REFUSED's), every check, a fixed seed,
    a bounded number of examples; its output, asserted clean."""
    st = Path(sys.executable).parent / "st"
    assert st.exists(), "schemathesis CLI missing from the venv (tests/requirements.txt)"
    max_examples = "8" if support.sanitized_build() else "20"
    cmd = [str(st), "run", d.url + "/openapi.json", "--base-url", d.url,
           "--checks", "all", "--hypothesis-max-examples", max_examples,
           "--hypothesis-seed", "33", "--hypothesis-derandomize",
           "--request-timeout", "20000", "--workers", "1", "--no-color"]
    if key:
        cmd += ["-H", "Authorization: Bearer " + key]
    if positive:
        cmd += ["--experimental", "positive_data_acceptance"]
    for n in names["include"]:
        cmd += ["--include-name", n]
    for n in names["exclude"]:
        cmd += ["--exclude-name", n]
    # st_hooks: generated deadlines shorter than a minute are raised to one
    env = dict(os.environ, SCHEMATHESIS_TELEMETRY="false", NO_COLOR="1",
               SCHEMATHESIS_HOOKS="st_hooks",
               PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, "schemathesis found problems:\n" + out[-12000:]
    return out


@pytest.mark.parametrize("mode", ["key", "no key"])
def test_schemathesis_all_checks(d, d_open, mode, tmp_path):
    """Every check of schemathesis (positive_data_acceptance included, but
    on REFUSED's operations) against a daemon with a key and against one
    without, each served its own document."""
    dd, key = (d, KEY) if mode == "key" else (d_open, None)
    doc = dd.get("/openapi.json", headers=_auth(key)).json()
    models = [m["name"] for m in dd.get("/v1/models", headers=_auth(key)).json()["models"]]
    refused = REFUSED + [r % m for m in models for r in REFUSED_PER_MODEL]
    known = {"%s %s" % (m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert set(refused) <= known, sorted(set(refused) - known)
    out = _schemathesis(dd, tmp_path, key, {"include": [], "exclude": refused}, True)
    out += _schemathesis(dd, tmp_path, key, {"include": refused + LINKED, "exclude": []}, False)
    links = re.findall(r"Collected API links: (\d+)", out)
    assert links and int(links[-1]) >= 7, "schemathesis read no links: " + out[:2000]
    for m, path in ROUTES:
        shown = re.sub(r"\{\}", "{", path).split("{")[0]
        assert "%s %s" % (m.upper(), shown) in out, "schemathesis did not test %s %s:\n%s" % (
            m.upper(), path, out[-4000:])
    for m in models:
        assert "POST /v1/models/%s/attention" % m in out, out[-4000:]
    assert dd.alive()


def _schema_validator(doc, name):
    """A JSON Schema validator of one component schema of the served
    document (its $refs resolved within it)."""
    import jsonschema
    schema = {"$ref": "#/components/schemas/" + name, "components": doc["components"]}
    return jsonschema.Draft4Validator(schema)  # OpenAPI 3.0's schemas are draft 4's dialect


def _leaf_item_types(schema, doc, seen=()):
    """The types of the innermost array items a schema admits, its
    alternatives and $refs followed; tensor objects counted as "object"."""
    if "$ref" in schema:
        ref = schema["$ref"].split("/")[-1]
        return set() if ref in seen else _leaf_item_types(doc["components"]["schemas"][ref],
                                                           doc, seen + (ref,))
    out = set()
    for alt in schema.get("anyOf", []) + schema.get("oneOf", []):
        out |= _leaf_item_types(alt, doc, seen)
    if schema.get("type") == "array":
        out |= _leaf_item_types(schema.get("items", {}), doc, seen)
    elif "type" in schema:
        out.add(schema["type"])
    elif not out:
        out.add("any")  # no type and no alternatives: anything goes
    return out


def test_key_padding_mask_schema_is_boolean_only(d):
    """The schema of key_padding_mask admits what the server takes (S or B×S
    booleans, a bool tensor object) and nothing else: no 0/1 numbers, no
    float tensor object, no untyped items."""
    doc = d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY}).json()
    body = doc["paths"]["/v1/attention"]["post"]["requestBody"]["content"]["application/json"]
    schemas = doc["components"]["schemas"]
    ref = body["schema"].get("$ref", "").split("/")[-1]
    kpm = schemas[ref]["properties"]["key_padding_mask"]
    assert kpm == {"$ref": "#/components/schemas/KeyPaddingMask"}, kpm
    assert _leaf_item_types(schemas["KeyPaddingMask"], doc) == {"boolean", "object"}
    v = _schema_validator(doc, "KeyPaddingMask")
    good = [[False, True], [[False, True], [True, False]],
            {"shape": [2], "dtype": "bool", "b64": "AAE="}]
    bad = [[0, 1], [[0, 1]], [1.0, 0.0], [True, 0], ["true"], [None], [[[True]]], [], True,
           {"shape": [2], "dtype": "float32", "b64": "AAAAAAAAgD8="},
           {"shape": [2], "b64": "AAE="},
           {"shape": [2], "dtype": "bool", "b64": "AAE=", "extra": 1}]
    for x in good:
        assert v.is_valid(x), "KeyPaddingMask refuses %r" % (x,)
    for x in bad:
        assert not v.is_valid(x), "KeyPaddingMask admits %r" % (x,)
    # the server agrees with the schema on each of them (B = 2 sequences of 2)
    q = [[[0.1] * 16] * 2] * 2
    for x, ok in [(g, True) for g in good] + [(b, False) for b in bad]:
        r = d.post("/v1/attention", {"query": q, "key_padding_mask": x},
                   headers={"Authorization": "Bearer " + KEY})
        assert (r.status_code == 200) == ok, (x, r.status_code, r.text[:200])


def test_selection_schema_matches_the_server(d):
    """The attention selection (docs/api.md): the request schemas of
    /v1/attention, sessions and v2 parameters name its fields; what the
    schema admits the server takes and what it refuses the server refuses
    (the model has 1 head); every answer, top-k and 16-bit dtypes included,
    is valid against the response schema."""
    doc = d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY}).json()
    schemas = doc["components"]["schemas"]
    fields = {"attention_heads", "attention_rows", "attention_top_k", "attention_dtype"}
    for name in ("AttentionRequest", "SessionRequest"):
        assert fields <= set(schemas[name]["properties"]), name
    v2 = schemas["V2InferRequest"]["properties"]
    assert {"attention_heads", "attention_rows", "attention_top_k", "attention_datatype"} <= set(
        v2["parameters"]["properties"])
    assert {"attention_topk_indices", "attention_topk_values"} <= set(
        v2["outputs"]["items"]["properties"]["name"]["enum"])
    req_v = _schema_validator(doc, "AttentionRequest")
    res_v = _schema_validator(doc, "AttentionResponse")
    q = [[0.1 * j for j in range(16)], [0.2] * 16, [-0.1 * j for j in range(16)]]
    good = [{"attention_heads": [0]}, {"attention_rows": [1, 3]}, {"attention_top_k": 3},
            {"attention_top_k": 2, "attention_dtype": "float16", "encoding": "base64"},
            {"attention_dtype": "bfloat16", "encoding": "base64"},
            {"attention_dtype": "bfloat16", "attention_rows": [0, 1]}]
    bad = [{"attention_heads": []}, {"attention_heads": [0, 0]}, {"attention_heads": [-1]},
           {"attention_rows": [1]}, {"attention_rows": [0, 1, 2]}, {"attention_rows": [-1, 1]},
           {"attention_top_k": 0}, {"attention_dtype": "float64"}, {"attention_heads": "0"}]
    auth = {"Authorization": "Bearer " + KEY}
    for sel, ok in [(g, True) for g in good] + [(b, False) for b in bad]:
        body = dict({"query": q, "attention": "heads"}, **sel)
        assert req_v.is_valid(body) == ok, ("the schema", sel)
        r = d.post("/v1/attention", body, headers=auth)
        assert (r.status_code == 200) == ok, (sel, r.status_code, r.text[:200])
        if ok:
            errs = [e.message for e in res_v.iter_errors(r.json())]
            assert not errs, (sel, errs, r.text[:300])


def test_v2_health_bodies_match_their_schemas(d):
    """The v2 health routes document the Open Inference Protocol's bodies
    (200) and their 503 (ready false, beside "error"); what the daemon
    answers is valid against them. The 503 bodies themselves are seen
    while draining in test_kserve_client.py."""
    doc = d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY}).json()
    auth = {"Authorization": "Bearer " + KEY}
    for path, name, refused in (("/v2/health/live", "V2Live", None),
                                ("/v2/health/ready", "V2Ready", "V2NotReady503"),
                                ("/v2/models/{name}/ready", "V2ModelReady", "V2NotReady503"),
                                ("/v2/models/{name}/versions/{version}/ready", "V2ModelReady",
                                 "V2NotReady503")):
        responses = doc["paths"][path]["get"]["responses"]
        ok = responses["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": "#/components/schemas/" + name}, (path, ok)
        if refused:
            assert responses["503"] == {"$ref": "#/components/responses/" + refused}, path
        r = d.get(path.replace("{name}", MODEL).replace("{version}", "1"), headers=auth)
        assert r.status_code == 200, (path, r.status_code, r.text)
        errs = [e.message for e in _schema_validator(doc, name).iter_errors(r.json())]
        assert not errs, (path, errs, r.text)
    not_ready = _schema_validator(doc, "V2NotReady")
    for body in ({"ready": False, "error": "draining"},
                 {"name": MODEL, "ready": False, "error": "starting"}):
        assert not_ready.is_valid(body), body
    for body in ({"error": "draining"}, {"ready": False}, {"ready": True, "error": "x", "y": 1}):
        assert not not_ready.is_valid(body), body
