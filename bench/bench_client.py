#!/usr/bin/env python3
"""bench_client.py - what the Python client (clients/python) adds to a round
trip: the median time of attnd.Client.attention against raw HTTP doing the
same work by hand, on the same daemon, with the same body.

    ATTND_BIN=build/attnd .venv-client/bin/python bench/bench_client.py [options]

(make bench-client). It starts the daemon on a free port of 127.0.0.1 with
two layers whose weights it draws and writes (config/safetensors_header.py):
"large" (E=1024, H=16) and "small" (E=512, H=8). Two requests:

    large: query (1, 512, 1024), self-attention, output only
    small: query (4, 512)

Each round sends the request once through attnd.Client (argument checks,
httpx, decoding into numpy) and once by hand: base64 of the query, the
same JSON body (json.dumps), a POST on a kept-alive http.client
connection, json.loads and base64 into a numpy array. The two alternate,
after warm-up rounds, so that both see the same machine; medians, the
10th and 90th percentiles, the difference of the medians and their ratio
are printed, and how the difference stands against the targets (at most
10 % more on the large request, at most 1 ms more on the small one).

The JavaScript client (clients/js) is timed the same way on the same
daemon, by bench/bench_client.mjs under node: its Client.attention against
raw fetch with the same body (rows "large (JS)", "small (JS)"; its raw
column is fetch, the Python rows' is http.client). make bench-client
installs the package from its npm pack tarball (ATTND_JS_PROJECT); with no
node on the PATH, or --no-js, those rows are left out.
Prints a table; asserts nothing.
"""
import argparse
import base64
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "config"))
from safetensors_header import safetensors_bytes  # noqa: E402

import attnd  # noqa: E402

CASES = [  # name, model, E, H, query shape, rounds option, target
    ("large", "large", 1024, 16, (1, 512, 1024), "large_rounds", ("ratio", 1.10)),
    ("small", "small", 512, 8, (4, 512), "small_rounds", ("ms", 1.0)),
]


def write_layer(path, E, seed):
    """An nn.MultiheadAttention-shaped layer (torch names), weights of unit
    scale over sqrt(E), as float32 safetensors."""
    rng = np.random.default_rng(seed)
    t = {"in_proj_weight": rng.standard_normal((3 * E, E)) / np.sqrt(E),
         "in_proj_bias": rng.standard_normal(3 * E) * 0.1,
         "out_proj.weight": rng.standard_normal((E, E)) / np.sqrt(E),
         "out_proj.bias": rng.standard_normal(E) * 0.1}
    entries = [(n, "F32", a.shape, np.ascontiguousarray(a, "<f4").tobytes()) for n, a in t.items()]
    path.write_bytes(safetensors_bytes(entries))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(binary, tmp, threads):
    models = []
    for i, (_, name, E, H, _, _, _) in enumerate(CASES):
        write_layer(tmp / (name + ".safetensors"), E, i)
        models.append({"name": name, "embed_dim": E, "num_heads": H,
                       "weights": name + ".safetensors"})
    (tmp / "config.json").write_text(json.dumps({"models": models}))
    port = free_port()
    args = [binary, "--config", str(tmp / "config.json"), "--host", "127.0.0.1",
            "--port", str(port), "--grpc-port", "0"]
    if threads:
        args += ["--workers", str(threads)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTND_")}
    p = subprocess.Popen(args, stdout=open(tmp / "attnd.log", "wb"), stderr=subprocess.STDOUT,
                         env=env)
    url = "http://127.0.0.1:%d" % port
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            sys.exit("attnd exited: %s" % (tmp / "attnd.log").read_text()[-2000:])
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return p, port, url
        except OSError:
            time.sleep(0.05)
    p.kill()
    sys.exit("attnd was not healthy within 60 s")


class Raw:
    """The same request by hand: http.client on one kept-alive connection."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def attention(self, q, model):
        body = json.dumps({"query": {"shape": list(q.shape), "dtype": "float32",
                                     "b64": base64.b64encode(q.tobytes()).decode()},
                           "model": model, "encoding": "base64"}).encode()
        self.conn.request("POST", "/v1/attention", body=body,
                          headers={"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit("raw request: %d %s" % (r.status, data[:300]))
        o = json.loads(data)["output"]
        return np.frombuffer(base64.b64decode(o["b64"]), "<f4").reshape(o["shape"])


def measure(client, raw, q, model, rounds, warmup):
    """Alternating rounds; returns (client times, raw times) in ms."""
    tc, tr = [], []
    for i in range(warmup + rounds):
        t0 = time.perf_counter()
        a = client.attention(q, model=model).output
        t1 = time.perf_counter()
        b = raw.attention(q, model)
        t2 = time.perf_counter()
        if i == 0 and not np.array_equal(a, b):
            raise SystemExit("the client's answer differs from the raw one")
        if i >= warmup:
            tc.append((t1 - t0) * 1e3)
            tr.append((t2 - t1) * 1e3)
    return np.array(tc), np.array(tr)


def measure_js(url, a):
    """The JavaScript client's rows: bench_client.mjs under node against
    the same daemon, the same cases and rounds."""
    import shutil
    node = shutil.which("node")
    if node is None:
        print("node: not on the PATH, the JavaScript client's rows are left out")
        return []
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()
    print("JavaScript client: node %s, from %s" % (
        version, os.environ.get("ATTND_JS_PROJECT", "clients/js (no ATTND_JS_PROJECT)")))
    args = [node, str(REPO / "bench" / "bench_client.mjs"), "--url", url,
            "--warmup", str(a.warmup)]
    for name, model, _, _, shape, opt, _ in CASES:
        args += ["--case", "%s,%s,%s,%d" % (name, model, "x".join(map(str, shape)),
                                            getattr(a, opt))]
    out = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit("bench_client.mjs failed:\n" + out.stderr[-2000:])
    rows = []
    for line, (name, _, _, H, shape, _, target) in zip(out.stdout.splitlines(), CASES):
        r = json.loads(line)
        tc, tr = np.array(r["client"]), np.array(r["raw"])
        rows.append((name + " (JS)", shape, H, len(tc), tc, tr, target))
    return rows


def cpu_name():
    """The CPU's name, family and model, and the vector features that matter."""
    info = {}
    try:
        for line in open("/proc/cpuinfo"):
            k, _, v = line.partition(":")
            info.setdefault(k.strip(), v.strip())
    except OSError:
        return platform.processor() or "unknown"
    flags = set(info.get("flags", "").split())
    feats = [f for f in ("avx512f", "avx512_bf16", "amx_bf16", "avx2", "fma") if f in flags]
    return "%s (family %s, model %s; %s)" % (info.get("model name", "unknown"),
                                             info.get("cpu family", "?"), info.get("model", "?"),
                                             " ".join(feats) or "no AVX")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--large-rounds", type=int, default=30)
    ap.add_argument("--small-rounds", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="daemon's compute threads (0: all)")
    ap.add_argument("--no-js", action="store_true", help="leave out the JavaScript client's rows")
    a = ap.parse_args()
    binary = os.environ.get("ATTND_BIN", str(REPO / "build" / "attnd"))
    import httpx
    print("CPU: %s, %d CPUs, load average %.2f; python %s, numpy %s, httpx %s, attnd client %s"
          % (cpu_name(), os.cpu_count(), os.getloadavg()[0], platform.python_version(),
             np.__version__, httpx.__version__, attnd.__version__))
    with tempfile.TemporaryDirectory() as tmp:
        p, port, url = start_daemon(binary, Path(tmp), a.threads)
        try:
            rows = []
            with attnd.Client(url) as client:
                raw = Raw(port)
                for name, model, _, H, shape, opt, target in CASES:
                    q = np.random.default_rng(1).standard_normal(shape, dtype=np.float32)
                    tc, tr = measure(client, raw, q, model, getattr(a, opt), a.warmup)
                    rows.append((name, shape, H, len(tc), tc, tr, target))
            if not a.no_js:
                rows += measure_js(url, a)
        finally:
            p.send_signal(signal.SIGTERM)
            p.wait(60)
    print()
    print("| request | query | H | rounds | client ms (p10-p90) | raw ms (p10-p90) "
          "| client - raw ms | client / raw | target | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, shape, H, n, tc, tr, (kind, limit) in rows:
        mc, mr = np.median(tc), np.median(tr)
        diff, ratio = mc - mr, mc / mr
        ok = ratio <= limit if kind == "ratio" else diff <= limit
        want = ("client / raw <= %.2f" % limit if kind == "ratio"
                else "client - raw <= %g ms" % limit)
        print("| %s | %s | %d | %d | %.3f (%.3f-%.3f) | %.3f (%.3f-%.3f) | %+.3f | %.3f | %s | %s |"
              % (name, "x".join(map(str, shape)), H, n, mc, np.percentile(tc, 10),
                 np.percentile(tc, 90), mr, np.percentile(tr, 10), np.percentile(tr, 90),
                 diff, ratio, want, "met" if ok else "missed"))


if __name__ == "__main__":
    main()
