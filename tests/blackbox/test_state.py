"""A KV-cache session's state as data (SPEC section 11), against the real
daemon: GET /v1/sessions/{id}/state answers a safetensors file read back
here with plain numpy (keys, values, positions; string metadata with the
model, the weights' fingerprint, the length and the precision); POST
/v1/sessions with that file restores the session on another daemon serving
the same model, and the steps after it equal the uninterrupted session's
bit for bit; files for other weights or models, taken ids, and truncated,
corrupt or lying files are refused with their status, the daemon healthy
after; the API key guards both routes; and sessions.save_dir keeps every
session across a restart (files 0600 in a folder 0700 that another user
may not own or enter, loaded once and removed)."""
import base64
import json
import os
import re
import signal
import struct

import numpy as np
import pytest

import support
from support import check_error_body

DEC_DIR = support.GOLDEN_DIR / "decoder"
GOLDENS = {g["name"]: g for g in (json.loads(p.read_text())
                                  for p in sorted(DEC_DIR.glob("*.json")))}
OCTET = {"Content-Type": "application/octet-stream"}
KEY = "state-key-5d1e"


def entry(name, **extra):
    c = dict(GOLDENS[name]["config"])
    c["weights"] = str(DEC_DIR / c["weights"])
    c.update(extra)
    return c


def config(names=None, **sections):
    cfg = {"models": [entry(n) for n in (names or sorted(GOLDENS))]}
    cfg.update(sections)
    return cfg


def read_state(data):
    """A safetensors file read with nothing but struct, json and numpy: its
    header, its metadata and its tensors."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__")
    body = data[8 + n:]
    dtypes = {"F32": "<f4", "I32": "<i4"}
    tensors = {}
    for name, t in header.items():
        a, b = t["data_offsets"]
        tensors[name] = np.frombuffer(body[a:b], dtype=dtypes[t["dtype"]]).reshape(t["shape"])
    return meta, tensors


def rows(name, n, seed=0):
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_normal((n, GOLDENS[name]["embed_dim"])), 3).tolist()


def open_session(d, name, prefix, **kw):
    r = d.post("/v1/sessions", {"model": name, "query": prefix}, **kw)
    assert r.status_code == 201, r.text[:300]
    return r.json()["session"]


def step_b64(d, sid, q, **kw):
    """One step's output and attention as base64 text: its exact bits."""
    r = d.post("/v1/sessions/%s/attention" % sid,
               {"query": q, "attention": "heads", "encoding": "base64"}, **kw)
    assert r.status_code == 200, r.text[:300]
    a = r.json()
    return a["cached_tokens"], a["output"]["b64"], a["attention"]["b64"]


def restore(d, data, sid=None, **kw):
    headers = dict(kw.pop("headers", {}), **({"X-Session-Id": sid} if sid else {}))
    headers.update(OCTET)  # whatever the caller's dict held
    return d.post("/v1/sessions", data=data, headers=headers, **kw)


@pytest.fixture(scope="module")
def pair(daemons):
    """Two daemons serving the same models: what one exports, the other
    restores (two replicas)."""
    return daemons(config()), daemons(config())


@pytest.mark.parametrize("name", sorted(GOLDENS))
def test_state_file_and_restored_steps_bit_for_bit(pair, name):
    """The file holds the session's tokens as the format says; restored on
    the other daemon, the session's next steps give the very bits the
    uninterrupted session gives, its attention matrices included."""
    a, b = pair
    g = GOLDENS[name]
    q = rows(name, 9, seed=len(name))
    sid = open_session(a, name, q[:4])
    step_b64(a, sid, q[4:5])
    r = a.get("/v1/sessions/%s/state" % sid)
    assert r.status_code == 200, r.text[:300]
    assert r.headers["Content-Type"] == "application/octet-stream"
    meta, t = read_state(r.content)
    assert meta["format"] == "attnd-session-state" and meta["format_version"] == "1"
    assert meta["model"] == name and meta["length"] == "5" and meta["precision"] == "fp32"
    assert re.fullmatch(r"fnv1a64:[0-9a-f]{16}", meta["fingerprint"]), meta
    assert all(isinstance(v, str) for v in meta.values()), meta
    G = g["config"].get("num_kv_heads", g["config"]["num_heads"])
    assert t["keys"].shape == t["values"].shape and t["keys"].shape[:2] == (5, G), t["keys"].shape
    assert t["positions"].tolist() == [0, 1, 2, 3, 4]
    assert np.isfinite(t["keys"]).all() and np.isfinite(t["values"]).all()
    assert np.abs(t["values"]).max() > 0
    moved = "%032x" % int.from_bytes(os.urandom(16), "big")
    r = restore(b, r.content, moved)
    assert r.status_code == 201, r.text[:300]
    assert r.json() == {"session": moved, "model": name, "cached_tokens": 5}
    for i in range(5, 9):
        assert step_b64(a, sid, q[i:i + 1]) == step_b64(b, moved, q[i:i + 1]), "step %d" % i
    # the state of the moved session is the same file, token for token
    ma, ta = read_state(a.get("/v1/sessions/%s/state" % sid).content)
    mb, tb = read_state(b.get("/v1/sessions/%s/state" % moved).content)
    assert ma == mb and all(np.array_equal(ta[k], tb[k]) for k in ta)
    for d, s in ((a, sid), (b, moved)):
        assert d.request("DELETE", "/v1/sessions/" + s).status_code == 204
    check_error_body(a.get("/v1/sessions/%s/state" % sid), 404)


def test_restore_ids(pair):
    """Without X-Session-Id the restored session gets a new id; a free one
    is kept; a taken one is not: the copy gets a new id (SPEC section 11:
    "the id in X-Session-Id kept if free"); the answer's X-Session-Id
    header and its body name the id either way. One that is not 128
    random bits is 400 and says so."""
    a, b = pair
    name = "gqa_half"
    sid = open_session(a, name, rows(name, 3))
    data = a.get("/v1/sessions/%s/state" % sid).content
    r = restore(b, data)
    assert r.status_code == 201 and re.fullmatch(r"[0-9a-f]{32}", r.json()["session"]), r.text
    new = r.json()["session"]
    assert new != sid and r.headers["X-Session-Id"] == new
    r = restore(b, data, sid)
    assert r.status_code == 201 and r.json()["session"] == sid == r.headers["X-Session-Id"], r.text
    r = restore(b, data, new)
    assert r.status_code == 201, r.text
    copy = r.json()["session"]
    assert copy not in (sid, new) and r.headers["X-Session-Id"] == copy
    assert r.json()["cached_tokens"] == 3
    for weak in ("1234", "0" * 32, "ab" * 16, "0123456789ABCDEF0123456789ABCDEF"):
        msg = check_error_body(restore(b, data, weak), 400)
        assert msg.startswith("X-Session-Id: ") and "128 random bits" in msg, msg
    for d, s in ((a, sid), (b, sid), (b, new), (b, copy)):
        assert d.request("DELETE", "/v1/sessions/" + s).status_code == 204


def test_state_for_other_weights_or_models(daemons, pair):
    """A file of another model, or of the same name with other weights or
    hyper-parameters (another fingerprint), is refused with 409 naming both.
    Under make valgrind neither refusal reads a byte nothing set: the one of
    other weights finds the model by name, and once scanned the error of
    that look-up, never written (issue 34)."""
    a, _ = pair
    name = "gqa_half"
    sid = open_session(a, name, rows(name, 3))
    data = a.get("/v1/sessions/%s/state" % sid).content
    other = daemons({"models": [entry("llama3_head_dim")]})
    msg = check_error_body(restore(other, data), 409)
    assert "model 'gqa_half', which this server does not serve" in msg, msg
    theta = dict(GOLDENS[name]["config"]["rope"], theta=5000.0)
    changed = daemons({"models": [entry(name, rope=theta)]})
    msg = check_error_body(restore(changed, data), 409)
    fp = read_state(data)[0]["fingerprint"]
    assert ("fingerprint %s is not that of model 'gqa_half'" % fp) in msg, msg
    for d in (other, changed):  # here, not only at the module's end
        assert not d.sanitizer_reports(), d.logs(20000)
    assert a.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def lying_files(data):
    """(what, bytes, words of the 400) for files that are truncated, corrupt
    or lie about what they hold."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]

    def remade(h, b=body):
        text = json.dumps(h, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        return struct.pack("<Q", len(text)) + text + b

    longer = json.loads(json.dumps(header))
    longer["__metadata__"]["length"] = "4"
    wide = json.loads(json.dumps(header))
    for k in ("keys", "values"):  # (3, G, D) claimed as (3, 1, G*D): same bytes, wrong shape
        s = wide[k]["shape"]
        wide[k]["shape"] = [s[0], 1, s[1] * s[2]]
    nan = bytearray(body)
    nan[0:4] = struct.pack("<f", float("nan"))
    return [
        ("empty", b"", ["session state"]),
        ("truncated", data[:len(data) - 7], ["session state"]),
        ("header cut", data[:40], ["session state"]),
        ("not safetensors", b"\x00" * 64, ["session state"]),
        ("JSON body", json.dumps({"query": [[0.1]]}).encode(), ["session state"]),
        ("length lies", remade(longer), ["length"]),
        ("shape lies", remade(wide), ["fingerprint claims"]),
        ("NaN", remade(header, bytes(nan)), ["NaN"]),
    ]


def test_malformed_states_refused_daemon_healthy(pair):
    a, b = pair
    name = "gqa_half"
    sid = open_session(a, name, rows(name, 3))
    data = a.get("/v1/sessions/%s/state" % sid).content
    for what, bad, words in lying_files(data):
        msg = check_error_body(restore(b, bad), 400)
        for w in words:
            assert w in msg, (what, msg)
    assert b.get("/health").status_code == 200
    r = restore(b, data)  # the true file still restores
    assert r.status_code == 201, r.text[:300]
    assert b.request("DELETE", "/v1/sessions/" + r.json()["session"]).status_code == 204
    assert a.request("DELETE", "/v1/sessions/" + sid).status_code == 204


def test_state_routes_need_the_key(daemons):
    """With an API key set, reading and restoring a state need it (as every
    route but health, metrics and the viewer's page)."""
    d = daemons(config(["gqa_half"]), env={"ATTND_API_KEY": KEY})
    auth = {"Authorization": "Bearer " + KEY}
    sid = open_session(d, "gqa_half", rows("gqa_half", 2), headers=dict(auth))
    check_error_body(d.get("/v1/sessions/%s/state" % sid), 401)
    check_error_body(d.get("/v1/sessions/%s/state" % sid,
                           headers={"Authorization": "Bearer nope"}), 401)
    r = d.get("/v1/sessions/%s/state" % sid, headers=auth)
    assert r.status_code == 200
    check_error_body(restore(d, r.content), 401)
    r = restore(d, r.content, headers=auth)
    assert r.status_code == 201, r.text[:300]
    for s in (sid, r.json()["session"]):
        assert d.request("DELETE", "/v1/sessions/" + s, headers=auth).status_code == 204


def test_head_and_unknown_sessions(pair):
    a, _ = pair
    sid = open_session(a, "gqa_half", rows("gqa_half", 2))
    r = a.request("HEAD", "/v1/sessions/%s/state" % sid)
    assert r.status_code == 200 and r.content == b""
    assert int(r.headers["Content-Length"]) == len(a.get("/v1/sessions/%s/state" % sid).content)
    msg = check_error_body(a.get("/v1/sessions/%s/state" % ("ab12" * 8)), 404)
    assert "no such session" in msg
    assert a.request("DELETE", "/v1/sessions/" + sid).status_code == 204


# ---------------------------------------------------------------- save_dir

def test_save_dir_keeps_sessions_across_a_restart(fresh_daemons, tmp_path):
    """SIGTERM saves every session (0600 files in a 0700 folder the daemon
    makes); the next start loads them, removes the files, and each session
    steps on as if never stopped, bit for bit; a file it cannot load is
    renamed .refused and a .part file (a save cut short) removed."""
    save = tmp_path / "saved"
    cfg = config(["gqa_half", "mqa_interleaved"], sessions={"save_dir": str(save)})
    ref = fresh_daemons(config(["gqa_half", "mqa_interleaved"]))
    d = fresh_daemons(cfg)
    assert (save.stat().st_mode & 0o777) == 0o700
    qs = {n: rows(n, 8, seed=3) for n in ("gqa_half", "mqa_interleaved")}
    pairs = []
    for k, n in enumerate(["gqa_half", "mqa_interleaved", "gqa_half"]):
        pairs.append((n, open_session(ref, n, qs[n][:3 + k]), open_session(d, n, qs[n][:3 + k])))
    assert d.stop() == 0
    files = sorted(save.iterdir())
    assert [f.name for f in files] == sorted(s + ".safetensors" for _, _, s in pairs)
    assert all((f.stat().st_mode & 0o777) == 0o600 for f in files)
    assert "3 sessions saved" in d.stdout()
    (save / ("ab" * 16 + ".safetensors")).write_bytes(b"not a state")
    (save / ("cd" * 15 + "ef.safetensors.part")).write_bytes(b"cut short")
    d2 = fresh_daemons(cfg)
    assert "3 sessions loaded, 1 refused" in d2.stdout(), d2.stdout()[-2000:]
    assert sorted(f.name for f in save.iterdir()) == ["ab" * 16 + ".safetensors.refused"]
    for k, (n, rs, ds) in enumerate(pairs):
        for i in range(3 + k, 8):
            assert step_b64(ref, rs, qs[n][i:i + 1]) == step_b64(d2, ds, qs[n][i:i + 1])
    assert d2.stop() == 0
    assert "3 sessions saved" in d2.stdout()
    d3 = fresh_daemons(cfg)  # saved again, loaded again: never twice from one file
    assert "3 sessions loaded, 0 refused" in d3.stdout(), d3.stdout()[-2000:]


def test_save_dir_in_a_0777_volume(fresh_daemons, tmp_path):
    """As Kubernetes mounts an emptyDir (mode 0777) and docs/deploy.md and
    docker/k8s/deployment.yaml set it up: save_dir a subfolder of the volume
    that does not exist yet. attnd makes it 0700 and starts, and a session
    saved there on SIGTERM steps on after the restart, bit for bit."""
    volume = tmp_path / "volume"
    volume.mkdir()
    os.chmod(volume, 0o777)
    save = volume / "sessions"
    cfg = config(["gqa_half"], sessions={"save_dir": str(save)})
    ref = fresh_daemons(config(["gqa_half"]))
    d = fresh_daemons(cfg)
    assert (save.stat().st_mode & 0o7777) == 0o700
    q = rows("gqa_half", 6, seed=5)
    rs, ds = open_session(ref, "gqa_half", q[:4]), open_session(d, "gqa_half", q[:4])
    assert d.stop() == 0
    assert [f.name for f in save.iterdir()] == [ds + ".safetensors"]
    d2 = fresh_daemons(cfg)
    for i in range(4, 6):
        assert step_b64(ref, rs, q[i:i + 1]) == step_b64(d2, ds, q[i:i + 1])


@pytest.mark.parametrize("case", ["group", "others", "owner", "file", "emptydir"])
def test_save_dir_refused_when_not_private(fresh_daemons, tmp_path, case):
    """A save_dir another user owns, that its group or others may enter (an
    emptyDir volume's own folder is 0777), or that is no folder: attnd
    refuses to start (exit 2) and says why."""
    save = tmp_path / "saved"
    if case == "file":
        save.write_text("x")
    else:
        save.mkdir(mode=0o700)
        os.chmod(save, {"group": 0o750, "others": 0o701, "owner": 0o700, "emptydir": 0o777}[case])
        if case == "owner":
            if os.geteuid() != 0:
                pytest.skip("giving a folder to another user needs root")
            os.chown(save, 65534, 65534)
    d = fresh_daemons(config(["gqa_half"], sessions={"save_dir": str(save)}), wait=False)
    assert d.wait_exit(60) == 2, d.logs()
    err = d.stderr()
    words = {"group": "open to its group or others", "others": "open to its group or others",
             "emptydir": "open to its group or others", "owner": "owned by another user",
             "file": "is not a folder"}[case]
    assert "sessions.save_dir" in err and words in err and str(save) in err, err
