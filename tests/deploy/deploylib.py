"""Helpers shared by the deployment tests (tests/deploy/*.py).

They start processes on 127.0.0.1 only, write small models as safetensors,
and compare attnd answers. Nothing here asserts; the callers do, through
Checks, which counts and prints every check and ends with the summary line.
"""

import json
import math
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "config"))
from safetensors_header import safetensors_bytes  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ports import free_port  # noqa: E402,F401

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class Checks:
    """Counts checks; a failed one is printed and counted, and the run goes on
    unless fatal=True. finish() prints "N passed, M failed" and returns the
    exit code."""

    def __init__(self, name):
        self.name = name
        self.passed = 0
        self.failed = 0

    def check(self, ok, what, detail="", fatal=False):
        if ok:
            self.passed += 1
            print(f"ok   {what}", flush=True)
        else:
            self.failed += 1
            print(f"FAIL {what}" + (f": {detail}" if detail else ""), flush=True)
            if fatal:
                self.finish()
                sys.exit(1)
        return ok

    def finish(self):
        print(f"{self.name}: {self.passed} passed, {self.failed} failed", flush=True)
        return 0 if self.failed == 0 and self.passed > 0 else 1


def http(method, url, body=None, timeout=30, headers=None):
    """Returns (status, parsed JSON or text, headers); status 0 when the
    connection failed. body: JSON-able, or bytes sent as they are."""
    data = None
    hdrs = dict(headers or {})
    if body is not None:  # bytes go as they are
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        hdrs.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status, rh = r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        raw, status, rh = e.read(), e.code, dict(e.headers)
    except (urllib.error.URLError, OSError):
        return 0, None, {}
    try:
        return status, json.loads(raw), rh
    except ValueError:
        return status, raw.decode(errors="replace"), rh


def wait_status(url, want=200, timeout=30.0, proc=None):
    """Polls url until it answers `want`; False on timeout or if proc died."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            return False
        status, _, _ = http("GET", url, timeout=2)
        if status == want:
            return True
        time.sleep(0.1)
    return False


def attnd_bin():
    return os.environ.get("ATTND_BIN", os.path.join(ROOT, "build", "attnd"))


def start_attnd(port, args=(), env=None, log=None):
    """Starts build/attnd on 127.0.0.1:port; returns the Popen once /health
    answers 200, or raises RuntimeError with the log's tail."""
    # as a fresh user's shell: no OPENBLAS_CORETYPE preset by the test machine
    e = {k: v for k, v in os.environ.items()
         if (not k.startswith("ATTND_") or k == "ATTND_BIN") and k != "OPENBLAS_CORETYPE"}
    e["ATTND_GRPC_PORT"] = "-1"  # gRPC on a free port: replicas never meet on 8081
    e.update(env or {})
    e["ATTND_HOST"] = "127.0.0.1"
    e["ATTND_PORT"] = str(port)
    out = log if log is not None else subprocess.DEVNULL
    p = subprocess.Popen([attnd_bin(), *args], env=e, stdout=out, stderr=subprocess.STDOUT)
    if not wait_status(f"http://127.0.0.1:{port}/health", 200, 30, p):
        p.kill()
        p.wait()
        raise RuntimeError(f"attnd on port {port} did not become healthy (exit {p.returncode})")
    return p


def stop(p, sig_timeout=40):
    """SIGTERM, wait; returns the exit code (SIGKILL after sig_timeout)."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(sig_timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def write_safetensors(path, tensors):
    """Writes {name: float32 ndarray} as a .safetensors file."""
    entries = [(name, "F32", a.shape, np.ascontiguousarray(a, dtype="<f4").tobytes())
               for name, a in tensors.items()]
    with open(path, "wb") as f:
        f.write(safetensors_bytes(entries))


def write_model(folder, weights_name, embed_dim, num_heads, seed):
    """Writes torch-named MultiheadAttention weights (kdim = vdim = E) drawn
    from a seeded uniform distribution into folder/weights_name."""
    rng = np.random.default_rng(seed)
    e = embed_dim
    bound = 1.0 / math.sqrt(e)
    t = {
        "in_proj_weight": rng.uniform(-bound, bound, (3 * e, e)),
        "in_proj_bias": rng.uniform(-bound, bound, (3 * e,)),
        "out_proj.weight": rng.uniform(-bound, bound, (e, e)),
        "out_proj.bias": rng.uniform(-bound, bound, (e,)),
    }
    write_safetensors(os.path.join(folder, weights_name), t)


def write_model_dir(folder, name, embed_dim, num_heads, seed, server=None):
    """A folder as the image expects on /models: config.json naming one model
    and its weights by a relative path."""
    os.makedirs(folder, exist_ok=True)
    write_model(folder, f"{name}.safetensors", embed_dim, num_heads, seed)
    cfg = {"models": [{"name": name, "embed_dim": embed_dim, "num_heads": num_heads,
                       "weights": f"{name}.safetensors"}]}
    if server:
        cfg["server"] = server
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    os.chmod(folder, 0o755)
    for fn in os.listdir(folder):
        os.chmod(os.path.join(folder, fn), 0o644)


def query(length, width, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((length, width)).astype(np.float32).tolist()


def rel_err(a, b):
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.shape != b.shape:
        return math.inf
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / (n if n > 0 else 1.0))


def output_ok(out, length, width):
    """(ok, why): out is length x width finite numbers."""
    a = np.asarray(out, dtype=np.float64) if isinstance(out, list) else None
    if a is None or a.shape != (length, width):
        return False, f"shape {None if a is None else a.shape}, want {(length, width)}"
    if not np.isfinite(a).all():
        return False, "non-finite values"
    return True, ""
