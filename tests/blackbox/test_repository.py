"""Models that change while attnd serves (SPEC section 12), against the real
daemon over real HTTP: the KServe v2 model repository routes
(POST /v2/repository/index, .../models/{name}/load and .../unload) with
every status they answer (403 unless server.model_control is "explicit",
401 without the key, 400 naming the field, 404, 405, 503 while draining,
507 past limits.max_model_bytes); weight paths kept inside
server.model_dir (.., absolute paths and symbolic links that leave it); the
version of each load everywhere a model is shown (GET /v1/models,
GET /v2/models/{name}, usage.model_version, the v2 answer's model_version,
/v2/models/{name}/versions/{v}/infer); SIGHUP re-reading the config file
(entries added, removed, changed, a weights file's content changed, a
config that does not parse, a weights file that is broken, other sections
that need a restart) with its log lines and /metrics; a reload under
steady load where every answer is one weight set's, never a mix; requests
admitted before a reload or an unload answered on their version; KV-cache
sessions and their state files across a reload; and the memory of an old
version given back when its last session ends.

Every answer is compared with support.Model.forward, the float64 reference
that test_numerics.py holds to torch.nn.MultiheadAttention's goldens
(test_reference_matches_golden), to 1e-5 relative.
"""
import http.client
import json
import os
import shutil
import signal
import threading
import time

import numpy as np
import pytest
import requests

import support
from support import (b64_tensor, check_error_body, from_b64_tensor, parse_prometheus, rel_err,
                     tolist32, wait_until)

TOL = 1e-5
E, H = 32, 4
KEY = "repo-key-51c0a9"
SAN = support.sanitized_build()
STATES = ("READY", "UNAVAILABLE", "LOADING", "UNLOADING")
MiB = 1 << 20


# ---------------------------------------------------------------- weights and configs

def save(folder, fname, name, seed, E=E, H=H):
    """A random layer saved as folder/fname (float32 safetensors, torch's names)."""
    m = support.Model.random(name, E, H, seed=seed)
    m.save(os.path.join(str(folder), fname))
    return m


def entry(m, weights=None, name=True, **extra):
    """One models[] entry of m; weights as given (relative or absolute), else
    m's own absolute path; name=False leaves the name out."""
    c = {"embed_dim": m.E, "num_heads": m.H, "weights": str(weights or m.path)}
    if name is True:
        c["name"] = m.name
    elif name:
        c["name"] = name
    c.update(extra)
    return c


def explicit(folder, models, **sections):
    cfg = {"server": {"model_control": "explicit", "model_dir": str(folder)}, "models": models}
    for k, v in sections.items():
        cfg[k] = dict(cfg.get(k, {}), **v)
    return cfg


def rows(n, seed, width=E):
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_normal((n, width)), 3).astype(np.float32)


# ---------------------------------------------------------------- the routes

def auth(key):
    return {"Authorization": "Bearer " + key} if key else {}


def repo_index(d, body=None, key=None, data=None):
    kw = {"headers": auth(key)}
    if data is not None:
        kw["data"] = data
    return d.post("/v2/repository/index", body, **kw)


def repo_load(d, name, config=None, body=None, key=None, data=None, **params):
    """POST .../load: with parameters.config (a dict, sent as a JSON string)
    and other parameters, or the body given, or raw data, or nothing."""
    if body is None and config is not None:
        body = {"parameters": dict({"config": json.dumps(config)}, **params)}
    kw = {"headers": auth(key)}
    if data is not None:
        kw["data"] = data
    return d.post("/v2/repository/models/%s/load" % name, body, **kw)


def repo_unload(d, name, body=None, key=None, data=None):
    kw = {"headers": auth(key)}
    if data is not None:
        kw["data"] = data
    return d.post("/v2/repository/models/%s/unload" % name, body, **kw)


def loaded(d, name, m, weights=None, key=None, **extra):
    """Loads m under name through parameters.config; asserts 200 and the
    answer's form; returns the new version as an int."""
    r = repo_load(d, name, entry(m, weights, name=name, **extra), key=key)
    assert r.status_code == 200, "load %s: %d %s" % (name, r.status_code, r.text[:400])
    return check_load_answer(r, name)


def check_load_answer(r, name):
    a = r.json()
    assert a.get("name") == name, a
    v = a.get("version")
    assert isinstance(v, str) and v.isdigit() and int(v) >= 1, "version %r is not \"N\"" % (v,)
    return int(v)


def index(d, body=None, key=None):
    """The repository index, checked for form: a JSON array sorted by name
    of {name, version (a string, when present), state, reason}."""
    r = repo_index(d, body, key=key)
    assert r.status_code == 200, r.text[:400]
    assert r.headers.get("Content-Type", "").startswith("application/json")
    a = r.json()
    assert isinstance(a, list), a
    names = [e["name"] for e in a]
    assert names == sorted(names), "index not sorted by name: %s" % names
    assert len(set(names)) == len(names), "a model listed twice: %s" % names
    for e in a:
        assert set(e) <= {"name", "version", "state", "reason"}, e
        assert e["state"] in STATES, e
        if "version" in e:
            assert isinstance(e["version"], str) and e["version"].isdigit(), e
        if "reason" in e:
            assert isinstance(e["reason"], str), e
    return a


def index_entry(d, name, key=None):
    return next((e for e in index(d, key=key) if e["name"] == name), None)


# ---------------------------------------------------------------- answers

def attend(d, name, q, causal=None, key=None, session=None):
    body = {"model": name, "query": tolist32(q)}
    if causal is not None:
        body["causal"] = causal
    return (session or requests).post(d.url + "/v1/attention", json=body, headers=auth(key),
                                      timeout=support.HTTP_TIMEOUT)


def answer(d, name, q, causal=None):
    """(output, usage.model_version) of a native request that must succeed."""
    r = attend(d, name, q, causal)
    assert r.status_code == 200, "%s: %d %s" % (name, r.status_code, r.text[:300])
    a = r.json()
    v = a["usage"].get("model_version")
    assert isinstance(v, int) and not isinstance(v, bool), "usage.model_version %r" % (v,)
    return np.array(a["output"], dtype=np.float64), v


def v2_body(q):
    return {"inputs": [{"name": "query", "shape": [1, q.shape[0], q.shape[1]], "datatype": "FP32",
                        "data": np.asarray(q, dtype=np.float32).reshape(-1).tolist()}]}


def v2_answer(r, L, width=E):
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    v = a.get("model_version")
    assert isinstance(v, str) and v.isdigit(), "model_version %r" % (v,)
    out = np.array(a["outputs"][0]["data"], dtype=np.float64).reshape(L, width)
    return out, int(v)


def served(d, name, m, version, causal=False, q=None):
    """name answers with m's weights under version, native and v2."""
    q = rows(5, seed=99) if q is None else q
    want = m.forward(q, causal=causal)[0]
    out, v = answer(d, name, q)
    assert v == version, "%s: usage.model_version %d, expected %d" % (name, v, version)
    err = rel_err(out, want)
    assert err <= TOL, "%s v%d: relative error %.3g against its weights" % (name, version, err)
    if not causal:
        out, v = v2_answer(d.post("/v2/models/%s/infer" % name, v2_body(q)), len(q))
        assert v == version and rel_err(out, want) <= TOL, (v, version)


def v1_models(d, key=None):
    r = d.get("/v1/models", headers=auth(key))
    assert r.status_code == 200, r.text[:300]
    return {m["name"]: m for m in r.json()["models"]}


def v1_version(d, name):
    m = v1_models(d).get(name)
    if m is None:
        return None
    v = m.get("version")
    assert isinstance(v, int) and not isinstance(v, bool), "GET /v1/models: version %r" % (v,)
    return v


def not_served(d, name):
    """Inference on name is 404 saying it is not loaded; it is gone from the
    metadata routes."""
    q = rows(2, seed=5)
    msg = check_error_body(attend(d, name, q), 404)
    assert "not loaded" in msg, msg
    check_error_body(d.post("/v2/models/%s/infer" % name, v2_body(q)), 404)
    check_error_body(d.get("/v2/models/" + name), 404)
    assert name not in v1_models(d)


# ---------------------------------------------------------------- /metrics

def metric(d, name, **labels):
    """Sum of the samples of name whose labels include these; None when none."""
    _, samples = parse_prometheus(d.get("/metrics").text)
    vals = [v for n, lab, v in samples
            if n == name and all(lab.get(k) == str(x) for k, x in labels.items())]
    return sum(vals) if vals else None


def count(d, name, **labels):
    return metric(d, name, **labels) or 0.0


def held(d):
    v = metric(d, "attnd_model_weights_bytes")
    assert v is not None, "no attnd_model_weights_bytes in /metrics"
    return v


def settled_held(d):
    """attnd_model_weights_bytes once two reads 0.2 s apart agree (an old
    version whose last request just ended may still be being freed)."""
    last = held(d)
    for _ in range(15):
        time.sleep(0.2)
        now = held(d)
        if now == last:
            return now
        last = now
    return last


def reloads(d):
    return count(d, "attnd_config_reloads_total")


def hup(d, timeout=20.0):
    """SIGHUP, then waits until attnd_config_reloads_total (ok or failed)
    counts it. Returns the log text written meanwhile."""
    before, out0, err0 = reloads(d), len(d.stdout()), len(d.stderr())
    d.send_signal(signal.SIGHUP)
    assert wait_until(lambda: reloads(d) > before, timeout, 0.05), \
        "attnd_config_reloads_total did not count the SIGHUP within %.0f s\n%s" % (
            timeout, d.logs())
    time.sleep(0.1)  # the reload's own log lines
    assert d.alive(), "SIGHUP ended the daemon:\n" + d.logs()
    return d.stdout()[out0:] + d.stderr()[err0:]


def test_load_from_a_config_file_that_fails(d, folder):
    """A load with no body reads the config file; one that does not read
    is a failed load as a broken weights file is (SPEC section 12): 400
    naming the file, logged, counted, and the reason in the index; the
    version serving keeps serving."""
    text = d.config_path.read_text()
    va = v1_version(d, "a")
    failed0 = count(d, "attnd_model_loads_total", model="a", result="failed")
    try:
        d.config_path.write_text('{"models": [')
        msg = check_error_body(repo_load(d, "a"), 400)
        assert "not valid JSON" in msg, msg
    finally:
        d.config_path.write_text(text)
    assert count(d, "attnd_model_loads_total", model="a", result="failed") == failed0 + 1
    e = index_entry(d, "a")
    assert e["state"] == "READY" and "not valid JSON" in e.get("reason", ""), e
    assert v1_version(d, "a") == va
    assert support.wait_until(lambda: "not valid JSON" in d.logs(), 5), d.logs(3000)
    # a name the file lacks is no load of anything: 404, nothing counted
    check_error_body(repo_load(d, "a_not_in_the_file"), 404)
    assert index_entry(d, "a_not_in_the_file") is None


def write_config(d, cfg):
    d.config_path.write_text(json.dumps(cfg, indent=1))


# ---------------------------------------------------------------- the module's daemon

@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """server.model_dir of the module's daemon."""
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def a1(folder):
    return save(folder, "a1.safetensors", "a", 1)


@pytest.fixture(scope="module")
def d(daemons, folder, a1):
    """model_control explicit, model_dir the module's folder, one model "a"."""
    return daemons(explicit(folder, [entry(a1)]))


# ---------------------------------------------------------------- who may call

def test_routes_refused_unless_explicit(daemons, folder, a1):
    """server.model_control defaults to "none": the three routes are 403
    (with or without a body) and nothing is loaded or unloaded."""
    dd = daemons({"models": [entry(a1)]})
    c1 = save(folder, "none_c1.safetensors", "c", 11)
    for r in (repo_index(dd), repo_index(dd, {}), repo_index(dd, {"ready": True}),
              repo_load(dd, "a"), repo_load(dd, "c", entry(c1, "none_c1.safetensors")),
              repo_unload(dd, "a"), repo_unload(dd, "a", {})):
        check_error_body(r, 403)
    served(dd, "a", a1, 1)
    assert "c" not in v1_models(dd)


def test_routes_need_the_key(daemons, folder, a1):
    """With an API key set, each route is 401 without it or with a wrong
    one, and does nothing; with it, each works."""
    dd = daemons(explicit(folder, [entry(a1)]), env={"ATTND_API_KEY": KEY})
    b1 = save(folder, "key_b1.safetensors", "b", 12)
    for k in (None, "nope"):
        check_error_body(repo_index(dd, key=k), 401)
        check_error_body(repo_load(dd, "b", entry(b1, "key_b1.safetensors", name=False), key=k),
                         401)
        check_error_body(repo_load(dd, "a", key=k), 401)
    assert [e["name"] for e in index(dd, key=KEY)] == ["a"]
    assert loaded(dd, "b", b1, "key_b1.safetensors", key=KEY) == 1
    for k in (None, "nope"):
        check_error_body(repo_unload(dd, "b", key=k), 401)
    assert index_entry(dd, "b", key=KEY)["state"] == "READY"
    r = repo_unload(dd, "b", key=KEY)
    assert r.status_code == 200 and r.json() == {"name": "b"}, r.text[:300]
    assert index_entry(dd, "b", key=KEY)["state"] == "UNAVAILABLE"


def test_bad_config_keys_refused_at_start(fresh_daemons, a1):
    """A bad server.model_control or limits.max_model_bytes: exit 2 naming
    the key."""
    for sect, key, val in (("server", "model_control", "sometimes"),
                           ("server", "model_control", True),
                           ("limits", "max_model_bytes", -1),
                           ("limits", "max_model_bytes", "lots")):
        dd = fresh_daemons({sect: {key: val}, "models": [entry(a1)]}, wait=False)
        assert dd.wait_exit(60) == 2, dd.logs()
        assert "%s.%s" % (sect, key) in dd.stderr(), dd.stderr()[-2000:]


# ---------------------------------------------------------------- index

def test_index_lists_every_model_known(d, folder, a1):
    """READY with the serving version, UNAVAILABLE "unloaded" after an
    unload, UNAVAILABLE with the reason and no version for a model whose
    only load failed; {"ready": true} lists the READY ones; bad bodies are
    400 naming the field; GET is 405."""
    i1 = save(folder, "idx_i1.safetensors", "i_unloaded", 21)
    assert loaded(d, "i_unloaded", i1, "idx_i1.safetensors") == 1
    r = repo_unload(d, "i_unloaded")
    assert r.status_code == 200, r.text[:300]
    broken(i1.path, folder / "idx_broken.safetensors")
    msg = check_error_body(repo_load(d, "i_never", entry(i1, "idx_broken.safetensors",
                                                         name=False)), 400)
    assert "idx_broken.safetensors" in msg, msg
    for body in (None, {}, {"ready": False}):
        full = {e["name"]: e for e in index(d, body)}
        assert {"a", "i_unloaded", "i_never"} <= set(full), full
        assert full["a"]["state"] == "READY" and full["a"]["version"] == str(v1_version(d, "a"))
        assert full["i_unloaded"]["state"] == "UNAVAILABLE", full["i_unloaded"]
        assert full["i_unloaded"]["reason"] == "unloaded", full["i_unloaded"]
        never = full["i_never"]
        assert never["state"] == "UNAVAILABLE" and "version" not in never, never
        assert never.get("reason") and never["reason"] != "unloaded", never
    ready = index(d, {"ready": True})
    assert ready and all(e["state"] == "READY" for e in ready), ready
    names = {e["name"] for e in ready}
    assert "a" in names and "i_unloaded" not in names and "i_never" not in names
    assert names == {e["name"] for e in index(d) if e["state"] == "READY"}
    for data, words in ((b'{"ready": "yes"}', ["ready"]), (b'{"ready": 1}', ["ready"]),
                        (b'{"readiness": true}', ["readiness"]),
                        (b'{"ready": true, "colour": 1}', ["colour"]),
                        (b'[true]', []), (b'{"ready": tru', []), (b'ready', [])):
        msg = check_error_body(repo_index(d, data=data), 400)
        for w in words:
            assert w in msg, (data, msg)
    for path in ("/v2/repository/index", "/v2/repository/models/a/load",
                 "/v2/repository/models/a/unload"):
        check_error_body(d.get(path), 405)


# ---------------------------------------------------------------- load

def test_load_from_the_config_file_as_it_is_now(d, folder, a1):
    """An empty body (or {}) loads the entry of that name in the config file
    as it is on disk now: a model added to the file, and "a" reloaded with
    the file's new weights; a name the file lacks is 404."""
    cfg = json.loads(d.config_path.read_text())
    b1 = save(folder, "disk_b1.safetensors", "b", 31)
    cfg["models"].append(entry(b1))
    write_config(d, cfg)
    assert "b" not in v1_models(d)
    r = repo_load(d, "b")
    assert r.status_code == 200, r.text[:300]
    assert check_load_answer(r, "b") == 1
    served(d, "b", b1, 1)
    va = v1_version(d, "a")
    r = repo_load(d, "a", body={})
    assert r.status_code == 200 and check_load_answer(r, "a") == va + 1, r.text[:300]
    served(d, "a", a1, va + 1)
    a2 = save(folder, "disk_a2.safetensors", "a", 32)
    cfg["models"][0] = entry(a2)
    write_config(d, cfg)
    r = repo_load(d, "a")
    assert r.status_code == 200 and check_load_answer(r, "a") == va + 2, r.text[:300]
    served(d, "a", a2, va + 2)
    msg = check_error_body(repo_load(d, "not_in_the_file"), 404)
    assert "not_in_the_file" in msg, msg
    # back to a1 for the tests after this one
    cfg["models"][0] = entry(a1)
    write_config(d, cfg)
    r = repo_load(d, "a", body={})
    assert r.status_code == 200 and check_load_answer(r, "a") == va + 3
    served(d, "a", a1, va + 3)


def test_versions_shown_everywhere(d, folder):
    """parameters.config with a relative path (inside server.model_dir),
    the name left out or given: each load a new version, shown by GET
    /v1/models, GET /v2/models/{name}, usage.model_version, the v2 answer's
    model_version; /versions/{v}/infer answers for the serving v alone."""
    c1 = save(folder, "ver_c1.safetensors", "c", 41)
    c2 = save(folder, "ver_c2.safetensors", "c", 42)
    q = rows(3, seed=4)
    for want_v, m, fname, name in ((1, c1, "ver_c1.safetensors", False),
                                   (2, c2, "ver_c2.safetensors", "c"),
                                   (3, c2, "ver_c2.safetensors", False),
                                   (4, c1, "ver_c1.safetensors", "c")):
        r = repo_load(d, "c", entry(m, fname, name=name))
        assert r.status_code == 200, r.text[:300]
        assert check_load_answer(r, "c") == want_v
        assert v1_version(d, "c") == want_v
        meta = d.get("/v2/models/c")
        assert meta.status_code == 200 and meta.json()["versions"] == [str(want_v)], meta.text
        served(d, "c", m, want_v, q=q)
        out, v = v2_answer(d.post("/v2/models/c/versions/%d/infer" % want_v, v2_body(q)), 3)
        assert v == want_v and rel_err(out, m.forward(q)[0]) <= TOL
        for other in (want_v - 1, want_v + 1):
            if other >= 1:
                check_error_body(d.post("/v2/models/c/versions/%d/infer" % other, v2_body(q)),
                                 404)
        assert metric(d, "attnd_model_version", model="c") == want_v
        e = index_entry(d, "c")
        assert e["state"] == "READY" and e["version"] == str(want_v), e


def broken(src, dst, keep=None):
    """dst: src cut short (by 100 bytes, or to keep bytes)."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.truncate(keep if keep is not None else os.path.getsize(src) - 100)


def test_load_refusals(d, folder):
    """Bad bodies are 400 naming the field; broken or misshapen weights are
    400 naming the file while the serving version keeps serving (its index
    entry READY with a reason); a model whose only load failed is
    UNAVAILABLE and 404. A failed load takes no version number."""
    r1 = save(folder, "ref_r1.safetensors", "r", 51)
    r2 = save(folder, "ref_r2.safetensors", "r", 52)
    assert loaded(d, "r", r1, "ref_r1.safetensors") == 1
    good = json.dumps(entry(r2, "ref_r2.safetensors", name=False))
    bodies = [
        ({"parameters": {"config": json.dumps(entry(r2, "ref_r2.safetensors", name="other"))}},
         ["name", "other"]),
        ({"parameters": {"config": good, "colour": "blue"}}, ["colour"]),
        ({"parameters": {"config": good}, "colour": "blue"}, ["colour"]),
        ({"parameters": {"config": "{\"embed_dim\": 32,"}}, ["config"]),
        ({"parameters": {"config": "[1, 2]"}}, ["config"]),
        ({"parameters": {"config": 5}}, ["config"]),
        ({"parameters": {"config": json.dumps({"embed_dim": E, "weights": "ref_r2.safetensors"})}},
         ["num_heads"]),
        ({"parameters": {"config": json.dumps(dict(entry(r2, "ref_r2.safetensors", name=False),
                                                   heads=4))}}, ["heads"]),
        ({"parameters": {"config": json.dumps(entry(r2, "ref_r2.safetensors", name=False,
                                                    num_heads=5))}}, ["num_heads"]),
        ({"parameters": "config"}, ["parameters"]),
    ]
    for body, words in bodies:
        msg = check_error_body(repo_load(d, "r", body=body), 400)
        for w in words:
            assert w in msg, (body, msg)
    for data in (b'{"parameters": ', b'config=x', b'[]'):
        check_error_body(repo_load(d, "r", data=data), 400)
    failed0 = count(d, "attnd_model_loads_total", model="r", result="failed")
    broken(r2.path, folder / "ref_broken.safetensors")
    wide = save(folder, "ref_wide.safetensors", "r", 53, E=64)
    for fname in ("ref_broken.safetensors", "ref_wide.safetensors"):
        msg = check_error_body(repo_load(d, "r", entry(wide if "wide" in fname else r2, fname,
                                                       name=False, embed_dim=E)), 400)
        assert fname in msg, msg
        e = index_entry(d, "r")
        assert e["state"] == "READY" and e["version"] == "1", e
        assert e.get("reason"), "the failed load of %s left no reason: %s" % (fname, e)
        served(d, "r", r1, 1)
    assert count(d, "attnd_model_loads_total", model="r", result="failed") == failed0 + 2
    assert loaded(d, "r", r2, "ref_r2.safetensors") == 2
    served(d, "r", r2, 2)
    # never loaded: listed UNAVAILABLE with the reason, 404 everywhere
    msg = check_error_body(repo_load(d, "ghost", entry(r2, "ref_broken.safetensors", name=False)),
                           400)
    assert "ref_broken.safetensors" in msg
    e = index_entry(d, "ghost")
    assert e and e["state"] == "UNAVAILABLE" and e.get("reason") and "version" not in e, e
    check_error_body(attend(d, "ghost", rows(2, 1)), 404)
    check_error_body(d.get("/v2/models/ghost"), 404)


def test_missing_weights_file_is_a_failed_load(d, folder):
    """A weights file that does not exist (inside model_dir) is a failed
    load like a broken one: 400 naming it, counted, the serving version
    READY with the reason; a model whose only load it was is listed
    UNAVAILABLE with the reason."""
    m1 = save(folder, "mis_m1.safetensors", "mis", 55)
    assert loaded(d, "mis", m1, "mis_m1.safetensors") == 1
    failed0 = count(d, "attnd_model_loads_total", model="mis", result="failed")
    msg = check_error_body(repo_load(d, "mis", entry(m1, "mis_missing.safetensors", name=False)),
                           400)
    assert "mis_missing.safetensors" in msg, msg
    served(d, "mis", m1, 1)
    never = check_error_body(repo_load(d, "mis_never", entry(m1, "mis_missing.safetensors",
                                                             name=False)), 400)
    assert "mis_missing.safetensors" in never, never
    problems = []
    e = index_entry(d, "mis")
    if not (e["state"] == "READY" and e["version"] == "1" and e.get("reason")):
        problems.append("the serving model's index entry after the failed load: %s" % e)
    if count(d, "attnd_model_loads_total", model="mis", result="failed") != failed0 + 1:
        problems.append("attnd_model_loads_total{model=\"mis\",result=\"failed\"} %s, "
                        "expected %s" % (metric(d, "attnd_model_loads_total", model="mis",
                                                result="failed"), failed0 + 1))
    e = index_entry(d, "mis_never")
    if not (e and e["state"] == "UNAVAILABLE" and e.get("reason") and "version" not in e):
        problems.append("the never-loaded model's index entry: %s" % e)
    assert not problems, "; ".join(problems)


def test_paths_stay_inside_model_dir(fresh_daemons, tmp_path):
    """model_dir left out: the config file's folder. A path with "..", an
    absolute path elsewhere, a symbolic link (to a file or a folder) that
    leaves it: 400, and nothing changes. A symbolic link that stays inside,
    an absolute path inside and a subfolder are loaded."""
    cdir = fresh_daemons.next_workdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    a1 = save(cdir, "a1.safetensors", "a", 61)
    out = save(outside, "out.safetensors", "e", 62)
    (cdir / "sub").mkdir()
    sub = save(cdir / "sub", "s.safetensors", "e", 63)
    os.symlink(str(outside / "out.safetensors"), str(cdir / "link_out.safetensors"))
    os.symlink(str(outside), str(cdir / "dir_out"))
    os.symlink("a1.safetensors", str(cdir / "link_in.safetensors"))
    dd = fresh_daemons({"server": {"model_control": "explicit"},
                        "models": [entry(a1, "a1.safetensors")]})
    assert dd.config_path.parent == cdir
    before = index(dd)
    for name in ("e", "a"):
        for path in ("../outside/out.safetensors", "sub/../a1.safetensors",
                     "../" + cdir.name + "/a1.safetensors", str(outside / "out.safetensors"),
                     "link_out.safetensors", "dir_out/out.safetensors",
                     str(cdir / "dir_out" / "out.safetensors")):
            check_error_body(repo_load(dd, name, entry(out, path, name=False)), 400)
            assert index(dd) == before, "a refused path changed the index (%s)" % path
    served(dd, "a", a1, 1)
    assert "e" not in v1_models(dd)
    assert loaded(dd, "e", a1, "link_in.safetensors") == 1
    served(dd, "e", a1, 1)
    assert loaded(dd, "e", out, str(cdir / "a1.safetensors")) == 2
    served(dd, "e", a1, 2)
    assert loaded(dd, "e", sub, "sub/s.safetensors") == 3
    served(dd, "e", sub, 3)


def test_max_model_bytes(fresh_daemons, tmp_path):
    """limits.max_model_bytes counts every version held, old ones included:
    a load that would pass it is 507 naming the key and changes nothing;
    once a session's old version is freed, the same load fits."""
    limit = 120000
    a1 = save(tmp_path, "a1.safetensors", "a", 71)
    a2 = save(tmp_path, "a2.safetensors", "a", 72)
    big = save(tmp_path, "big.safetensors", "big", 73, E=128, H=4)
    dd = fresh_daemons(explicit(tmp_path, [entry(a1)], limits={"max_model_bytes": limit}))
    W = held(dd)
    assert 0 < W <= limit // 3, "one E=%d layer holds %d bytes (limit %d)" % (E, W, limit)
    msg = check_error_body(repo_load(dd, "big", entry(big, "big.safetensors", name=False)), 507)
    assert "limits.max_model_bytes" in msg, msg
    assert held(dd) == W and "big" not in v1_models(dd)
    e = index_entry(dd, "big")
    assert e is None or e["state"] != "READY", e
    sid = open_session(dd, "a", rows(3, 1))[0]           # pins version 1
    assert loaded(dd, "a", a2, "a2.safetensors") == 2
    assert held(dd) == 2 * W
    fill = 0
    while held(dd) + W <= limit:                          # fill up to the limit
        assert loaded(dd, "fill%d" % fill, a1, "a1.safetensors") == 1
        fill += 1
    before = held(dd)
    msg = check_error_body(repo_load(dd, "a", entry(a1, "a1.safetensors", name=False)), 507)
    assert "limits.max_model_bytes" in msg, msg
    assert held(dd) == before and v1_version(dd, "a") == 2
    served(dd, "a", a2, 2)
    assert dd.request("DELETE", "/v1/sessions/" + sid).status_code == 204
    assert wait_until(lambda: held(dd) == before - W, 3.0), (held(dd), before, W)
    assert loaded(dd, "a", a1, "a1.safetensors") == 3
    served(dd, "a", a1, 3)


# ---------------------------------------------------------------- unload

def test_unload(d, folder):
    """200 {"name"} (again for a model already unloaded), 404 for a name
    never known, 400 naming a bad field; after it inference is 404 saying
    the model is not loaded, it is gone from GET /v2/models/{name} and
    GET /v1/models; a later load takes the next version."""
    u1 = save(folder, "unl_u1.safetensors", "u", 81)
    assert loaded(d, "u", u1, "unl_u1.safetensors") == 1
    ok0 = count(d, "attnd_model_unloads_total", model="u", result="ok")
    for body, words in (({"parameters": {"unload_dependents": "no"}}, ["unload_dependents"]),
                        ({"parameters": {"colour": 1}}, ["colour"]),
                        ({"force": True}, ["force"]), ({"parameters": 1}, ["parameters"])):
        msg = check_error_body(repo_unload(d, "u", body), 400)
        for w in words:
            assert w in msg, (body, msg)
    check_error_body(repo_unload(d, "u", data=b'{"parameters": '), 400)
    served(d, "u", u1, 1)
    r = repo_unload(d, "u", {"parameters": {"unload_dependents": False}})
    assert r.status_code == 200 and r.json() == {"name": "u"}, r.text[:300]
    not_served(d, "u")
    check_error_body(d.post("/v1/sessions", {"model": "u"}), 404)
    e = index_entry(d, "u")
    assert e["state"] == "UNAVAILABLE" and e["reason"] == "unloaded", e
    assert count(d, "attnd_model_unloads_total", model="u", result="ok") == ok0 + 1
    for body in (None, {}):
        r = repo_unload(d, "u", body)
        assert r.status_code == 200 and r.json() == {"name": "u"}, r.text[:300]
    msg = check_error_body(repo_unload(d, "never_known"), 404)
    assert "never_known" in msg, msg
    assert loaded(d, "u", u1, "unl_u1.safetensors") == 2
    served(d, "u", u1, 2)
    assert index_entry(d, "u")["state"] == "READY"


def test_unloading_while_a_session_holds_it(d, folder):
    """A model unloaded while a session of it is open is UNLOADING until
    the session ends, then UNAVAILABLE "unloaded", its bytes freed."""
    h1 = save(folder, "unl_h1.safetensors", "holder", 82)
    before = settled_held(d)
    assert loaded(d, "holder", h1, "unl_h1.safetensors") == 1
    W = held(d) - before
    assert W > 0
    sid = open_session(d, "holder", rows(2, 3))[0]
    r = repo_unload(d, "holder")
    assert r.status_code == 200, r.text[:300]
    assert index_entry(d, "holder")["state"] == "UNLOADING"
    not_served(d, "holder")
    assert held(d) == before + W
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204
    assert wait_until(lambda: index_entry(d, "holder")["state"] == "UNAVAILABLE", 3.0), \
        index_entry(d, "holder")
    assert index_entry(d, "holder")["reason"] == "unloaded"
    assert wait_until(lambda: held(d) == before, 3.0), (held(d), before)


# ---------------------------------------------------------------- seamless reload

def test_reload_under_steady_load(d, folder):
    """Three clients (two native, one v2) send requests back to back for
    about 5 s while the model is reloaded every 0.35 s, alternating weight
    sets A and B: no request fails, and every answer equals the reference
    of the set its version was loaded with, never the other, never a mix."""
    A = save(folder, "ham_A.safetensors", "ham", 91)
    B = save(folder, "ham_B.safetensors", "ham", 92)
    version_set = {loaded(d, "ham", A, "ham_A.safetensors"): "A"}
    qs = [rows(3 + i % 4, seed=300 + i) for i in range(6)]
    refs = {"A": [A.forward(q)[0] for q in qs], "B": [B.forward(q)[0] for q in qs]}
    assert min(rel_err(a, b) for a, b in zip(refs["A"], refs["B"])) > 1e-2
    stop = threading.Event()
    seen, errors = [], []

    def client(k, v2):
        s = requests.Session()
        i = 0
        while not stop.is_set():
            qi = (i * 5 + k) % len(qs)
            i += 1
            q = qs[qi]
            try:
                if v2:
                    r = s.post(d.url + "/v2/models/ham/infer", json=v2_body(q), timeout=30)
                else:
                    r = attend(d, "ham", q, session=s)
            except requests.RequestException as e:
                errors.append(repr(e))
                continue
            if r.status_code != 200:
                errors.append("%d %s" % (r.status_code, r.text[:200]))
                continue
            try:
                if v2:
                    out, v = v2_answer(r, len(q))
                else:
                    a = r.json()
                    out, v = np.array(a["output"], dtype=np.float64), a["usage"]["model_version"]
            except (AssertionError, ValueError, KeyError, TypeError) as e:
                errors.append("answer not read: %r %s" % (e, r.text[:200]))
                continue
            seen.append((v, qi, out, "v2" if v2 else "native"))

    threads = [threading.Thread(target=client, args=(k, k == 2)) for k in range(3)]
    for t in threads:
        t.start()
    try:
        end = time.monotonic() + 5.0
        prev, w = max(version_set), "B"
        while time.monotonic() < end:
            time.sleep(0.35)
            v = loaded(d, "ham", A if w == "A" else B, "ham_%s.safetensors" % w)
            assert v == prev + 1, "version %d after %d" % (v, prev)
            version_set[v], prev, w = w, v, "A" if w == "B" else "B"
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert not errors, "%d requests failed during reloads: %s" % (len(errors), errors[:5])
    wrong = []
    for v, qi, out, how in seen:
        if v not in version_set:
            wrong.append("%s answer names version %r, never loaded" % (how, v))
            continue
        err = rel_err(out, refs[version_set[v]][qi])
        if err > TOL:
            other = rel_err(out, refs["B" if version_set[v] == "A" else "A"][qi])
            wrong.append("%s answer of version %d (%s): error %.3g against it, %.3g against the "
                         "other" % (how, v, version_set[v], err, other))
    assert not wrong, "%d of %d answers wrong: %s" % (len(wrong), len(seen), wrong[:5])
    by_set = {s: sum(version_set.get(v) == s for v, *_ in seen) for s in "AB"}
    versions = {v for v, *_ in seen}
    print("reload under load: %d answers, %d reloads, %d versions seen, %s"
          % (len(seen), len(version_set) - 1, len(versions), by_set))
    assert len(version_set) >= 8, "only %d reloads in 5 s" % (len(version_set) - 1)
    assert len(versions) >= 4 and min(by_set.values()) >= 10, (versions, by_set)


def slow_config(folder, m):
    """One compute thread, batches of one request: long requests queue."""
    return explicit(folder, [entry(m)], workers={"threads": 1},
                    batching={"max_batch_requests": 1},
                    server={"request_timeout_ms": 120000})


SLOW_E, SLOW_H = 256, 8
SLOW_L = 512 if SAN else 2048


def slow_body(q):
    return json.dumps({"model": "slow", "query": b64_tensor(q), "encoding": "base64"})


def send_async(url, body, results, i):
    def run():
        try:
            r = requests.post(url, data=body, timeout=180,
                              headers={"Content-Type": "application/json"})
            results[i] = (r.status_code, r.text)
        except requests.RequestException as e:
            results[i] = (None, repr(e))
    t = threading.Thread(target=run)
    t.start()
    return t


def admitted(d, results):
    """Requests queued, computing or answered."""
    _, samples = parse_prometheus(d.get("/metrics").text)
    inside = sum(v for n, _, v in samples if n in ("attnd_queue_depth", "attnd_requests_running"))
    return inside + sum(r is not None for r in results)


def in_flight(d, body, n):
    """n requests sent at once; returns (threads, results) once every one
    of them is admitted (queued, computing or answered)."""
    results = [None] * n
    threads = [send_async(d.url + "/v1/attention", body, results, i) for i in range(n)]
    assert wait_until(lambda: admitted(d, results) >= n, 30.0, 0.01), \
        "%d requests sent, %d admitted" % (n, admitted(d, results))
    return threads, results


def check_slow_answers(results, m, q, version):
    idx = np.arange(0, len(q), max(1, len(q) // 8))
    want = m.forward(q[idx], key=q, value=q)[0]
    for i, (status, text) in enumerate(results):
        assert status == 200, "request %d: %s %s" % (i, status, text[:300])
        a = json.loads(text)
        assert a["usage"]["model_version"] == version, (i, a["usage"])
        out = from_b64_tensor(a["output"])
        assert rel_err(out[idx], want) <= TOL, "request %d against version %d" % (i, version)


def test_admitted_requests_finish_on_their_version(daemons, tmp_path):
    """Requests queued when a reload is answered finish on the old version,
    with its weights; those after it get the new. Requests queued when an
    unload is answered are all answered 200; after it the model is 404."""
    A = save(tmp_path, "slowA.safetensors", "slow", 101, E=SLOW_E, H=SLOW_H)
    B = save(tmp_path, "slowB.safetensors", "slow", 102, E=SLOW_E, H=SLOW_H)
    dd = daemons(slow_config(tmp_path, A))
    q = rows(SLOW_L, seed=8, width=SLOW_E)
    body = slow_body(q)
    # The load runs at the lowest CPU priority: on a machine busy with other
    # work it may take longer than the queued requests, and then nothing is
    # in flight when it answers. Each try doubles the requests queued first.
    cur, nxt, version = (A, "slowA.safetensors"), (B, "slowB.safetensors"), 1
    for attempt in range(4):
        n = 6 << attempt
        threads, results = in_flight(dd, body, n)
        assert loaded(dd, "slow", nxt[0], nxt[1]) == version + 1
        pending = sum(r is None for r in results)
        for t in threads:
            t.join(180)
        check_slow_answers(results, cur[0], q, version)
        cur, nxt, version = nxt, cur, version + 1
        if pending >= 1:
            break
    assert pending >= 1, "every request was answered before the reload: nothing was in flight"
    small = rows(4, seed=9, width=SLOW_E)
    out, v = answer(dd, "slow", small)
    assert v == version and rel_err(out, cur[0].forward(small)[0]) <= TOL
    n = 6
    threads, results = in_flight(dd, body, n)
    r = repo_unload(dd, "slow")
    assert r.status_code == 200, r.text[:300]
    pending = sum(r is None for r in results)
    for t in threads:
        t.join(180)
    assert pending >= 1, "every request was answered before the unload: nothing was in flight"
    check_slow_answers(results, cur[0], q, version)
    not_served(dd, "slow")


def test_repository_routes_503_while_draining(fresh_daemons, tmp_path):
    """After SIGTERM the routes answer 503 on connections already open,
    while the admitted requests drain; then exit 0."""
    A = save(tmp_path, "slowA.safetensors", "slow", 101, E=SLOW_E, H=SLOW_H)
    dd = fresh_daemons(slow_config(tmp_path, A))
    conns = []
    for _ in range(3):
        c = http.client.HTTPConnection("127.0.0.1", dd.port, timeout=60)
        c.request("GET", "/health")
        r = c.getresponse()
        r.read()
        assert r.status == 200
        conns.append(c)
    q = rows(SLOW_L, seed=8, width=SLOW_E)
    threads, results = in_flight(dd, slow_body(q), 5)
    dd.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    got = []
    for c, path in zip(conns, ("/v2/repository/index", "/v2/repository/models/slow/load",
                               "/v2/repository/models/slow/unload")):
        try:
            c.request("POST", path, body=b"{}", headers={"Content-Type": "application/json"})
            r = c.getresponse()
            got.append((path, r.status, r.read()[:200]))
        except (OSError, http.client.HTTPException) as e:
            got.append((path, None, repr(e)))
        c.close()
    pending = sum(r is None for r in results)
    for t in threads:
        t.join(180)
    assert dd.wait_exit(120) == 0, dd.logs()
    assert pending >= 1, "the requests were all answered before the routes were asked"
    for path, status, text in got:
        assert status == 503, "%s while draining: %s %s" % (path, status, text)
        assert json.loads(text).get("error"), text
    assert all(r[0] == 200 for r in results), results


# ---------------------------------------------------------------- sessions

def open_session(d, name, prefix):
    r = d.post("/v1/sessions", {"model": name, "query": tolist32(prefix)})
    assert r.status_code == 201, r.text[:300]
    a = r.json()
    return a["session"], a


def step(d, sid, q):
    r = d.post("/v1/sessions/%s/attention" % sid, {"query": tolist32(q)})
    assert r.status_code == 200, r.text[:300]
    return r.json()


def check_rows(a, want, version, what):
    err = rel_err(np.array(a["output"], dtype=np.float64), want)
    assert err <= TOL, "%s: relative error %.3g" % (what, err)
    v = a["usage"]["model_version"]
    assert v == version, "%s: usage.model_version %s, expected %d" % (what, v, version)


def test_sessions_keep_their_version(d, folder):
    """A session opened on version 1 steps on with version 1's weights
    after two reloads, each step equal to the whole causal sequence with
    them; one opened after the first reload uses version 2's; plain
    requests use the newest. Each old version's bytes are held while its
    session lives and freed when it ends."""
    A = save(folder, "ses_A.safetensors", "ses", 111)
    B = save(folder, "ses_B.safetensors", "ses", 112)
    h0 = settled_held(d)
    assert loaded(d, "ses", A, "ses_A.safetensors") == 1
    W = held(d) - h0
    q = rows(12, seed=12)
    want = {"A": A.forward(q, causal=True)[0], "B": B.forward(q, causal=True)[0]}
    s1, a = open_session(d, "ses", q[:4])
    check_rows(a, want["A"][:4], 1, "open on version 1")
    assert loaded(d, "ses", B, "ses_B.safetensors") == 2
    s2, a = open_session(d, "ses", q[:4])
    check_rows(a, want["B"][:4], 2, "open on version 2")
    for i in range(4, 8):
        check_rows(step(d, s1, q[i:i + 1]), want["A"][i:i + 1], 1, "session 1, row %d" % i)
        check_rows(step(d, s2, q[i:i + 1]), want["B"][i:i + 1], 2, "session 2, row %d" % i)
    assert loaded(d, "ses", A, "ses_A.safetensors") == 3
    check_rows(step(d, s1, q[8:10]), want["A"][8:10], 1, "session 1, rows 8-9")
    check_rows(step(d, s2, q[8:12]), want["B"][8:12], 2, "session 2, rows 8-11")
    check_rows(step(d, s1, q[10:12]), want["A"][10:12], 1, "session 1, rows 10-11")
    served(d, "ses", A, 3)
    assert wait_until(lambda: held(d) == h0 + 3 * W, 3.0), \
        "versions 1 and 2 (sessions) and 3 (serving) held: %d, one is %d over %d" % (
            held(d), W, h0)
    e = index_entry(d, "ses")
    assert e["state"] == "READY" and e["version"] == "3", e
    assert d.request("DELETE", "/v1/sessions/" + s1).status_code == 204
    assert wait_until(lambda: held(d) == h0 + 2 * W, 3.0), (held(d), h0, W)
    assert d.request("DELETE", "/v1/sessions/" + s2).status_code == 204
    assert wait_until(lambda: held(d) == h0 + W, 3.0), (held(d), h0, W)


def test_v2_sessions_step_and_close_on_their_version(d, folder):
    """A session opened over v2 (HTTP here; gRPC shares the reader) steps
    and closes by its session_id on the version it was opened on (SPEC
    sections 12 and 13), as the native routes do: after a reload to
    another shape, and after an unload, when the version serving could
    not compute it or none serves."""
    A = save(folder, "v2s_A.safetensors", "v2s", 121)
    B = save(folder, "v2s_B.safetensors", "v2s", 122, H=2)
    assert loaded(d, "v2s", A, "v2s_A.safetensors") == 1
    q = rows(8, seed=21)
    want = A.forward(q, causal=True)[0]

    def infer(rows_, params):
        body = dict(v2_body(rows_) if rows_ is not None else {"inputs": []},
                    parameters=params)
        return d.post("/v2/models/v2s/infer", body)

    r = infer(q[:4], {"session_open": True})
    out, v = v2_answer(r, 4)
    sid = r.json()["parameters"]["session_id"]
    assert v == 1 and rel_err(out, want[:4]) <= TOL
    assert loaded(d, "v2s", B, "v2s_B.safetensors") == 2  # 2 heads: another shape
    out, v = v2_answer(infer(q[4:6], {"session_id": sid}), 2)
    assert v == 1 and rel_err(out, want[4:6]) <= TOL, (v, rel_err(out, want[4:6]))
    r = repo_unload(d, "v2s")
    assert r.status_code == 200, r.text[:300]
    out, v = v2_answer(infer(q[6:7], {"session_id": sid}), 1)
    assert v == 1 and rel_err(out, want[6:7]) <= TOL
    r = infer(None, {"session_id": sid, "session_close": True})
    assert r.status_code == 200, r.text[:300]
    assert r.json()["parameters"].get("session_closed") is True, r.text[:300]
    assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 404
    assert wait_until(lambda: index_entry(d, "v2s")["state"] == "UNAVAILABLE", 3.0), \
        index_entry(d, "v2s")
    # a session id nobody holds: the model as before, 404 for an unloaded one
    check_error_body(infer(q[:1], {"session_id": "0123456789abcdef0123456789abcdef"}), 404)


OCTET = {"Content-Type": "application/octet-stream"}


def test_state_restores_onto_its_version(d, folder):
    """A state exported on version 1 and restored after a reload lands on
    version 1 (held by its sessions) and steps with its weights; once no
    session holds version 1 the same file is refused with 409, as a file of
    other weights is. A state of version 2 restores onto version 2."""
    A = save(folder, "st_A.safetensors", "st", 121)
    B = save(folder, "st_B.safetensors", "st", 122)
    assert loaded(d, "st", A, "st_A.safetensors") == 1
    q = rows(9, seed=13)
    want = {"A": A.forward(q, causal=True)[0], "B": B.forward(q, causal=True)[0]}
    s1, _ = open_session(d, "st", q[:3])
    check_rows(step(d, s1, q[3:4]), want["A"][3:4], 1, "before the reload")
    f1 = d.get("/v1/sessions/%s/state" % s1)
    assert f1.status_code == 200, f1.text[:300]
    assert loaded(d, "st", B, "st_B.safetensors") == 2
    r = d.post("/v1/sessions", data=f1.content, headers=OCTET)
    assert r.status_code == 201 and r.json()["cached_tokens"] == 4, r.text[:300]
    r1 = r.json()["session"]
    check_rows(step(d, r1, q[4:5]), want["A"][4:5], 1, "restored onto version 1")
    assert d.request("DELETE", "/v1/sessions/" + s1).status_code == 204
    r = d.post("/v1/sessions", data=f1.content, headers=OCTET)  # version 1 held by r1
    assert r.status_code == 201, r.text[:300]
    r2 = r.json()["session"]
    check_rows(step(d, r2, q[4:6]), want["A"][4:6], 1, "restored again onto version 1")
    check_rows(step(d, r1, q[5:6]), want["A"][5:6], 1, "first restore, next row")
    before = held(d)
    for sid in (r1, r2):
        assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204
    assert wait_until(lambda: held(d) < before, 3.0), "version 1 not freed"
    check_error_body(d.post("/v1/sessions", data=f1.content, headers=OCTET), 409)
    s3, _ = open_session(d, "st", q[:3])
    f3 = d.get("/v1/sessions/%s/state" % s3)
    assert f3.status_code == 200
    r = d.post("/v1/sessions", data=f3.content, headers=OCTET)
    assert r.status_code == 201, r.text[:300]
    r3 = r.json()["session"]
    check_rows(step(d, r3, q[3:5]), want["B"][3:5], 2, "state of version 2 restored")
    for sid in (s3, r3):
        assert d.request("DELETE", "/v1/sessions/" + sid).status_code == 204


# ---------------------------------------------------------------- SIGHUP

def test_sighup_applies_the_models(fresh_daemons, tmp_path):
    """model_control "none" (the routes 403): SIGHUP loads new entries,
    unloads removed ones, reloads changed ones (a key, the weights path,
    the weights file's content) and keeps the others' versions; another
    section changed is logged as needing a restart and not applied; a
    config that does not parse and a broken weights file change nothing
    and are logged and counted."""
    f = tmp_path
    keep = save(f, "keep.safetensors", "keep", 131)
    chg = save(f, "chg.safetensors", "chg", 132)
    w1 = save(f, "w1.safetensors", "wts", 133)
    w2 = save(f, "w2.safetensors", "wts", 134)
    cnt = save(f, "cnt.safetensors", "cnt", 135)
    cnt2 = support.Model.random("cnt", E, H, seed=136)
    gone = save(f, "gone.safetensors", "gone", 137)
    new = save(f, "new.safetensors", "new", 138)
    cfg = {"server": {"model_control": "none"}, "batching": {"max_queue_requests": 4096},
           "models": [entry(keep), entry(chg), entry(w1, name="wts"), entry(cnt), entry(gone)]}
    dd = fresh_daemons(cfg)
    check_error_body(repo_index(dd), 403)
    for n, m in (("keep", keep), ("chg", chg), ("wts", w1), ("cnt", cnt), ("gone", gone)):
        served(dd, n, m, 1)
    ok0 = count(dd, "attnd_config_reloads_total", result="ok")
    loads0 = {n: count(dd, "attnd_model_loads_total", model=n, result="ok")
              for n in ("keep", "chg", "wts", "new")}

    # 1: a key changed, a path changed, one removed, one added, a section changed
    cfg["models"] = [entry(keep), entry(chg, causal=True), entry(w2, name="wts"), entry(cnt),
                     entry(new)]
    cfg["batching"]["max_queue_requests"] = 100
    write_config(dd, cfg)
    log = hup(dd)
    assert count(dd, "attnd_config_reloads_total", result="ok") == ok0 + 1
    served(dd, "keep", keep, 1)
    served(dd, "chg", chg, 2, causal=True)
    served(dd, "wts", w2, 2)
    served(dd, "cnt", cnt, 1)
    served(dd, "new", new, 1)
    not_served(dd, "gone")
    lines = [ln for ln in log.splitlines() if "needs a restart" in ln]
    assert any("batching.max_queue_requests" in ln for ln in lines), log[-3000:]
    assert v1_models_raw(dd)["batching"]["max_queue_requests"] == 4096
    for n, v in (("keep", 1), ("chg", 2), ("wts", 2), ("cnt", 1), ("new", 1)):
        assert metric(dd, "attnd_model_version", model=n) == v, n
        assert v1_version(dd, n) == v, n
    for n in ("keep", "chg", "wts", "new"):
        want = loads0[n] + (n != "keep")
        assert count(dd, "attnd_model_loads_total", model=n, result="ok") == want, n
    assert count(dd, "attnd_model_unloads_total", model="gone", result="ok") == 1

    # 2: only the content of cnt's weights file changed (rewritten in place)
    cnt2.save(cnt.path)
    hup(dd)
    served(dd, "cnt", cnt2, 2)
    served(dd, "keep", keep, 1)
    served(dd, "wts", w2, 2)
    served(dd, "chg", chg, 2, causal=True)

    # 3: a config that does not parse changes nothing
    failed0 = count(dd, "attnd_config_reloads_total", result="failed")
    dd.config_path.write_text('{"models": [' + json.dumps(entry(keep)) + ', {"name": ')
    log = hup(dd)
    assert count(dd, "attnd_config_reloads_total", result="failed") == failed0 + 1
    assert dd.config_path.name in log, "the failed reload was not logged with its file:\n" + log
    for n, m, v, c in (("keep", keep, 1, False), ("chg", chg, 2, True), ("wts", w2, 2, False),
                       ("cnt", cnt2, 2, False), ("new", new, 1, False)):
        served(dd, n, m, v, causal=c)

    # 4: a broken weights file: that model keeps its version
    broken(w1.path, f / "broken.safetensors", keep=64)
    wfail0 = count(dd, "attnd_model_loads_total", model="wts", result="failed")
    cfg["models"][2] = entry(w1, weights=f / "broken.safetensors", name="wts")
    write_config(dd, cfg)
    log = hup(dd)
    assert count(dd, "attnd_model_loads_total", model="wts", result="failed") == wfail0 + 1
    assert "broken.safetensors" in log, log[-3000:]
    served(dd, "wts", w2, 2)
    served(dd, "keep", keep, 1)

    # 5: the file as the daemon serves it: nothing reloads
    cfg["models"][2] = entry(w2, name="wts")
    write_config(dd, cfg)
    hup(dd)
    for n, m, v, c in (("keep", keep, 1, False), ("chg", chg, 2, True), ("wts", w2, 2, False),
                       ("cnt", cnt2, 2, False), ("new", new, 1, False)):
        served(dd, n, m, v, causal=c)
    assert "gone" not in v1_models(dd)


def v1_models_raw(d):
    r = d.get("/v1/models")
    assert r.status_code == 200
    return r.json()


def test_sighup_with_explicit_control(fresh_daemons, tmp_path):
    """SIGHUP works with model_control "explicit" too: a broken weights file
    leaves the model READY on its version with the reason in the index;
    fixed, the next SIGHUP reloads it and loads a new entry; an empty-body
    load afterwards reads the same file; a config that does not parse
    leaves every model READY with the reason; an entry removed is
    UNAVAILABLE "unloaded"."""
    a1 = save(tmp_path, "a1.safetensors", "a", 141)
    a2 = save(tmp_path, "a2.safetensors", "a", 142)
    n1 = save(tmp_path, "n1.safetensors", "n", 143)
    (tmp_path / "broken.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{\"x\":")
    cfg = explicit(tmp_path, [entry(a1)])
    dd = fresh_daemons(cfg)
    cfg["models"] = [entry(a1, weights=tmp_path / "broken.safetensors")]
    write_config(dd, cfg)
    hup(dd)
    e = index_entry(dd, "a")
    assert e["state"] == "READY" and e["version"] == "1" and e.get("reason"), e
    served(dd, "a", a1, 1)
    assert count(dd, "attnd_model_loads_total", model="a", result="failed") >= 1
    cfg["models"] = [entry(a2), entry(n1)]
    write_config(dd, cfg)
    hup(dd)
    assert {e["name"]: (e["state"], e.get("version")) for e in index(dd)} == \
        {"a": ("READY", "2"), "n": ("READY", "1")}
    served(dd, "a", a2, 2)
    served(dd, "n", n1, 1)
    r = repo_load(dd, "n")
    assert r.status_code == 200 and check_load_answer(r, "n") == 2
    served(dd, "n", n1, 2)
    # a config that does not parse: both keep serving, the index says why
    dd.config_path.write_text("{\"models\": [")
    hup(dd)
    for e in index(dd):
        assert e["state"] == "READY" and e.get("reason"), e
    served(dd, "a", a2, 2)
    served(dd, "n", n1, 2)
    # an entry removed: unloaded, listed UNAVAILABLE "unloaded"
    cfg["models"] = [entry(a2)]
    write_config(dd, cfg)
    hup(dd)
    e = index_entry(dd, "n")
    assert e["state"] == "UNAVAILABLE" and e["reason"] == "unloaded", e
    not_served(dd, "n")
    served(dd, "a", a2, 2)



def test_a_fifo_named_as_weights_is_refused_not_waited_on(fresh_daemons, tmp_path):
    """Weights that are a FIFO (or any file that is not a regular one) are
    refused at once with 400 naming them: a load never waits on one, and
    the HTTP side serves on."""
    a1 = save(tmp_path, "a1.safetensors", "a", 181)
    os.mkfifo(str(tmp_path / "pipe.safetensors"))
    dd = fresh_daemons(explicit(tmp_path, [entry(a1)]))
    for _ in range(3):  # more loads than HTTP threads (2)
        r = repo_load(dd, "a", entry(a1, "pipe.safetensors", name=False))
        assert r.status_code == 400 and "pipe.safetensors" in r.json()["error"], r.text
        assert "regular file" in r.json()["error"], r.text
    served(dd, "a", a1, 1)


def test_sighup_keeps_the_reason_of_a_failed_api_load(fresh_daemons, tmp_path):
    """A model whose last load over the API failed keeps serving its version
    and saying why; a SIGHUP that leaves it as it is keeps the reason, and
    one that reads after a failed reading clears only that reading's."""
    a1 = save(tmp_path, "a1.safetensors", "a", 171)
    broken(a1.path, tmp_path / "a_broken.safetensors")
    cfg = explicit(tmp_path, [entry(a1)])
    dd = fresh_daemons(cfg)
    r = repo_load(dd, "a", entry(a1, "a_broken.safetensors", name=False))
    assert r.status_code == 400, r.text
    why = index_entry(dd, "a").get("reason")
    assert why and "a_broken.safetensors" in why, index_entry(dd, "a")
    hup(dd)
    e = index_entry(dd, "a")
    assert e["state"] == "READY" and e["version"] == "1" and e.get("reason") == why, e
    dd.config_path.write_text("{\"models\": [")
    hup(dd)
    assert "SIGHUP" in index_entry(dd, "a").get("reason", ""), index_entry(dd, "a")
    write_config(dd, cfg)
    hup(dd)
    e = index_entry(dd, "a")
    assert e["state"] == "READY" and e["version"] == "1" and not e.get("reason"), e
    served(dd, "a", a1, 1)


def restart_lines(log):
    return [ln for ln in log.splitlines() if "needs a restart" in ln]


def test_sighup_names_only_the_keys_changed(fresh_daemons, tmp_path):
    """The thread counts left at 0 (auto) run as the CPUs give them, yet a
    SIGHUP over the untouched file (or with no file at all) logs no key as
    needing a restart; a real change of one such key names that key alone."""
    a1 = save(tmp_path, "a1.safetensors", "a", 151)
    cfg = {"models": [entry(a1)]}
    dd = fresh_daemons(cfg)
    log = hup(dd)
    assert restart_lines(log) == [], log[-3000:]
    served(dd, "a", a1, 1)
    bare = fresh_daemons()  # no config file: the embedded default model
    log = hup(bare)
    assert restart_lines(log) == [], log[-3000:]
    for section, key, value in (("server", "http_threads", 1), ("workers", "threads", 1)):
        write_config(dd, dict(cfg, **{section: {key: value}}))
        lines = restart_lines(hup(dd))
        assert len(lines) == 1 and "%s.%s changed" % (section, key) in lines[0], lines
    served(dd, "a", a1, 1)


# ---------------------------------------------------------------- memory

BIG_E, BIG_H = 2048, 16


def save_big(path, seed):
    """An E=2048 fp32 layer (64 MiB of weights), drawn in float32."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(BIG_E)
    sd = {"in_proj_weight": rng.standard_normal((3 * BIG_E, BIG_E), dtype=np.float32) * s,
          "in_proj_bias": rng.standard_normal(3 * BIG_E, dtype=np.float32) * 0.1,
          "out_proj.weight": rng.standard_normal((BIG_E, BIG_E), dtype=np.float32) * s,
          "out_proj.bias": rng.standard_normal(BIG_E, dtype=np.float32) * 0.1}
    support.write_safetensors(path, sd)


def settled_rss(pid):
    """VmRSS once two reads 0.2 s apart are within 2 MiB (memory being
    given back goes in steps), at most 3 s."""
    last = support.vm_rss_bytes(pid)
    for _ in range(15):
        time.sleep(0.2)
        now = support.vm_rss_bytes(pid)
        if abs(now - last) < 2 * MiB:
            return now
        last = now
    return last


def test_old_version_memory_returns(fresh_daemons, tmp_path):
    """An E=2048 layer reloaded three times while a session pins version 1:
    versions 2 and 3 are freed as they are replaced, version 1 when the
    session ends, and the process's RSS drops back by more than 40 MiB, to
    nearer the RSS of one version than that of two."""
    save_big(tmp_path / "big.safetensors", 151)
    big = {"name": "big", "embed_dim": BIG_E, "num_heads": BIG_H,
           "weights": str(tmp_path / "big.safetensors")}
    rel = dict(big, weights="big.safetensors")
    dd = fresh_daemons(explicit(tmp_path, [big]))
    pid = dd.proc.pid
    q = rows(2, seed=1, width=BIG_E)
    assert answer(dd, "big", q)[1] == 1
    W = held(dd)
    assert W >= 60 * MiB, "an E=2048 layer holds %d bytes" % W
    sid, _ = open_session(dd, "big", q)
    rss_one = settled_rss(pid)
    for want in (2, 3, 4):
        r = repo_load(dd, "big", rel)
        assert r.status_code == 200 and check_load_answer(r, "big") == want, r.text[:300]
    assert answer(dd, "big", q)[1] == 4
    assert wait_until(lambda: held(dd) == 2 * W, 3.0), \
        "versions 1 (the session's) and 4 held: %d, one is %d" % (held(dd), W)
    assert step(dd, sid, q[:1])["usage"]["model_version"] == 1
    rss_two = settled_rss(pid)
    assert dd.request("DELETE", "/v1/sessions/" + sid).status_code == 204
    assert wait_until(lambda: held(dd) == W, 3.0), (held(dd), W)
    if SAN:
        return  # a sanitizer's allocator keeps freed memory in quarantine
    wait_until(lambda: support.vm_rss_bytes(pid) < rss_two - 40 * MiB, 3.0, 0.1)
    rss_end = settled_rss(pid)
    print("RSS: %.0f MiB with one version, %.0f with two, %.0f after the session"
          % (rss_one / MiB, rss_two / MiB, rss_end / MiB))
    assert rss_two - rss_end > 40 * MiB, \
        "RSS %.0f MiB -> %.0f MiB after version 1 was freed" % (rss_two / MiB, rss_end / MiB)
    assert rss_end < rss_one + (rss_two - rss_one) / 2, \
        "RSS %.0f MiB at the end, %.0f with one version, %.0f with two: a version kept" % (
            rss_end / MiB, rss_one / MiB, rss_two / MiB)


def test_a_load_makes_nobody_wait(fresh_daemons, tmp_path):
    """While an E=2048 layer's new version loads (a fraction of a second),
    requests to it are answered by the version serving, and the load
    changes nothing until it answers; a model loading for the first time is
    LOADING in the index until it is READY."""
    save_big(tmp_path / "big.safetensors", 161)
    big = {"name": "big", "embed_dim": BIG_E, "num_heads": BIG_H,
           "weights": str(tmp_path / "big.safetensors")}
    rel = dict(big, weights="big.safetensors")
    dd = fresh_daemons(explicit(tmp_path, [big]))
    q = rows(2, seed=1, width=BIG_E)
    assert answer(dd, "big", q)[1] == 1
    done = {}

    def load(name):
        done[name] = repo_load(dd, name, dict(rel, name=name))

    t = threading.Thread(target=load, args=("big",))
    t.start()
    during = []
    while t.is_alive():
        v = answer(dd, "big", q)[1]
        during.append((v, t.is_alive()))
    t.join()
    assert done["big"].status_code == 200 and check_load_answer(done["big"], "big") == 2
    versions = [v for v, _ in during]
    assert versions == sorted(versions) and set(versions) <= {1, 2}, during
    assert any(v == 1 and alive for v, alive in during), \
        "no request was answered by version 1 while the load ran: %s" % during
    assert answer(dd, "big", q)[1] == 2
    t = threading.Thread(target=load, args=("other",))
    t.start()
    states = []
    while t.is_alive():
        e = index_entry(dd, "other")
        states.append(e and (e["state"], e.get("version")))
    t.join()
    assert done["other"].status_code == 200 and check_load_answer(done["other"], "other") == 1
    assert ("LOADING", None) in states, "the first load was never seen LOADING: %s" % states
    assert all(st in (None, ("LOADING", None), ("READY", "1")) for st in states), states
    e = index_entry(dd, "other")
    assert (e["state"], e["version"]) == ("READY", "1"), e
