"""The ecosystem's own tools against the real daemon: promtool lints
/metrics, openapi-spec-validator validates /openapi.json, and
openapi-python-client generates a client from it that then talks to the
daemon, key and all. (tritonclient has its own suite, test_v2_client.py.)"""
import importlib
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import support
from support import rel_err

GOLDENS = {g["name"]: (g, m) for g, m in support.load_goldens()}
MODEL = "self_e16_h1"
KEY = "ecosystem-key-5"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def d(daemons):
    """The golden model, and the same weights as a bf16 model (so that both
    series of the compute histogram, by precision, have samples)."""
    bf16 = dict(GOLDENS[MODEL][1].config(), name=MODEL + "_bf16", precision="bf16")
    return daemons({"models": [GOLDENS[MODEL][1].config(), bf16]}, env={"ATTND_API_KEY": KEY})


def traffic(d):
    """One request of each kind, so that every metric family has samples."""
    g, _ = GOLDENS[MODEL]
    s = g["sequences"][0]
    auth = {"Authorization": "Bearer " + KEY}
    for model in (MODEL, MODEL + "_bf16"):
        r = d.post("/v1/attention", {"model": model, "query": s["query"]}, headers=auth)
        assert r.status_code == 200, r.text[:200]
    d.post("/v1/attention", {"model": MODEL, "query": [[1.0]]}, headers=auth)  # a 400
    d.get("/v1/models")  # a 401


def test_promtool_lints_metrics(d):
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: tests/deps.sh installs Debian's prometheus package"
    traffic(d)
    text = d.get("/metrics").text
    p = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and not p.stdout.strip() and not p.stderr.strip(), (
        "promtool: %s %s" % (p.stdout, p.stderr))


def test_openapi_spec_validator(d, tmp_path):
    doc = tmp_path / "openapi.json"
    doc.write_bytes(d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY}).content)
    p = subprocess.run([str(VENV_BIN / "openapi-spec-validator"), str(doc)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "OK" in p.stdout, p.stdout


def test_generated_client_with_auth(d, tmp_path):
    """openapi-python-client reads the served document and writes a client
    with every operation; its AuthenticatedClient sends the bearer key the
    document declares, and numbers come back right."""
    doc = tmp_path / "openapi.json"
    doc.write_bytes(d.get("/openapi.json", headers={"Authorization": "Bearer " + KEY}).content)
    cfg = tmp_path / "gen.yaml"
    cfg.write_text("post_hooks: []\nproject_name_override: attnd-client\n"
                   "package_name_override: attnd_client\n")
    p = subprocess.run([str(VENV_BIN / "openapi-python-client"), "generate", "--path", str(doc),
                        "--config", str(cfg), "--overwrite"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Warning" not in out and "WARNING" not in out, "parts of the document were skipped:\n" + out
    sys.path.insert(0, str(tmp_path / "attnd-client"))
    try:
        client_mod = importlib.import_module("attnd_client")
        attention = importlib.import_module("attnd_client.api.native.post_v1_attention")
        models = importlib.import_module("attnd_client.models")
        health = importlib.import_module("attnd_client.api.operations.get_health")
        g, _ = GOLDENS[MODEL]
        s = g["sequences"][0]
        body = models.AttentionRequest(query=s["query"], model=MODEL)
        keyed = client_mod.AuthenticatedClient(base_url=d.url, token=KEY)
        r = attention.sync_detailed(client=keyed, body=body)
        assert r.status_code == 200, r.content[:300]
        assert isinstance(r.parsed, models.AttentionResponse), r.parsed
        assert rel_err(np.asarray(r.parsed.output), s["output"]) <= 1e-5
        anon = client_mod.Client(base_url=d.url)
        r = attention.sync_detailed(client=anon, body=body)
        assert r.status_code == 401
        assert isinstance(r.parsed, models.Error) and "API key" in r.parsed.error, r.parsed
        assert health.sync_detailed(client=anon).status_code == 200  # an open route
    finally:
        sys.path.remove(str(tmp_path / "attnd-client"))
        for name in [n for n in sys.modules if n == "attnd_client" or n.startswith("attnd_client.")]:
            del sys.modules[name]
