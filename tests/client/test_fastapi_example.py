"""docs/examples/fastapi_app.py, run as the docs say (uvicorn, ATTND_URL)
in front of a real daemon: its answers are the daemon's, computed here
again with attnd.Client; attnd's 400 reaches the caller with its sentence,
a model the daemon does not serve is the backend's 502, and with the
daemon gone the backend answers 503 with Retry-After. FastAPI and
uvicorn are those pinned in bench/requirements.txt."""
import os
import signal
import subprocess
import sys

import numpy as np
import requests

import attnd
import support

APP_DIR = support.REPO / "docs" / "examples"


def start_backend(procs, attnd_url, workdir, **env):
    """uvicorn serving the example (its process appended to procs, which the
    test stops); returns its URL once it answers."""
    port = support.free_port()
    env = dict(os.environ, ATTND_URL=attnd_url, **env)
    log = open(workdir / ("uvicorn%d.log" % port), "wb")
    p = subprocess.Popen([sys.executable, "-m", "uvicorn", "fastapi_app:app", "--app-dir",
                          str(APP_DIR), "--host", "127.0.0.1", "--port", str(port)],
                         env=env, stdout=log, stderr=subprocess.STDOUT)
    procs.append(p)
    url = "http://127.0.0.1:%d" % port

    def up():
        assert p.poll() is None, log.name
        try:
            return requests.get(url + "/openapi.json", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False
    assert support.wait_until(up, 60), open(log.name).read()
    return url


def test_fastapi_backend(fresh_daemons, tmp_path):
    d = fresh_daemons()
    procs = []
    try:
        url = start_backend(procs, d.url, tmp_path)
        url2 = start_backend(procs, d.url, tmp_path, ATTND_MODEL="nope")
        rows = np.random.default_rng(2).standard_normal((5, 512)).round(4)
        r = requests.post(url + "/contextualize", json={"rows": rows.tolist()}, timeout=60)
        assert r.status_code == 200, r.text
        got = r.json()
        with attnd.Client(d.url) as c:
            want = c.attention(rows, attention="mean")
        assert np.allclose(got["rows"], want.output, rtol=1e-6, atol=1e-7)
        assert np.allclose(got["pooled"], want.output.mean(axis=0), rtol=1e-5, atol=1e-7)
        assert np.allclose(got["salience"], want.attention.mean(axis=0), rtol=1e-6)
        assert abs(sum(got["salience"]) - 1) < 1e-5 and got["attnd_request_id"]

        r = requests.post(url + "/contextualize", json={"rows": [[0.5] * 511]}, timeout=60)
        assert r.status_code == 400 and "query" in r.json()["detail"], r.text
        r = requests.post(url + "/contextualize", json={"rows": [[0.5], [0.5, 1]]}, timeout=60)
        assert r.status_code == 422 and "rectangular" in r.text, r.text
        r = requests.post(url2 + "/contextualize", json={"rows": rows.tolist()}, timeout=60)
        assert r.status_code == 502 and "unknown model 'nope'" in r.text, r.text

        assert d.stop() == 0
        r = requests.post(url + "/contextualize", json={"rows": rows.tolist()}, timeout=60)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1", r.text
    finally:
        for backend in procs:
            backend.send_signal(signal.SIGTERM)
            backend.wait(30)
