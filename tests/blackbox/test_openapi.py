"""/openapi.json: an OpenAPI 3 description of every route of SPEC section 4,
kept true by schemathesis generating requests against the running daemon."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

import support

GOLDENS = {g["name"]: m for g, m in support.load_goldens()}
MODEL = "self_e16_h1"

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


def test_schemathesis_all_checks(d, tmp_path):
    st = Path(sys.executable).parent / "st"
    assert st.exists(), "schemathesis CLI missing from the venv (tests/requirements.txt)"
    max_examples = "10" if support.sanitized_build() else "25"
    cmd = [str(st), "run", d.url + "/openapi.json", "--base-url", d.url,
           "--checks", "all", "--hypothesis-max-examples", max_examples,
           "--hypothesis-derandomize",
           "--request-timeout", "20000", "--workers", "1", "--no-color",
           "-H", "Authorization: Bearer " + KEY]
    env = dict(os.environ, SCHEMATHESIS_TELEMETRY="false", NO_COLOR="1")
    p = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 0, "schemathesis found problems:\n" + out[-12000:]
    for m, path in ROUTES:
        shown = re.sub(r"\{\}", "{", path).split("{")[0]
        assert "%s %s" % (m.upper(), shown) in out, "schemathesis did not test %s %s:\n%s" % (
            m.upper(), path, out[-4000:])
    assert d.alive()


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
