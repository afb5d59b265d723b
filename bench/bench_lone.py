#!/usr/bin/env python3
"""bench_lone.py - a lone request after a pause, through the daemon: what a
web backend with sparse traffic gets. It starts build/attnd on a free port
of 127.0.0.1 with its embedded default model (E=512, 8 heads) and every
CPU's threads (its attnd_compute_threads gauge labels the cells), and
sends one (1, 128, 512) base64 request at a time on a kept-alive
connection, sleeping each pause before each request: 30
requests per pause, 10 from a second up, after one warm-up request.
Median usage.compute_us (the forward) and the Server-Timing total (the
request inside the daemon) per pause.

    .venv-bench/bin/python bench/bench_lone.py [--attnd build/attnd]
        [--pauses 0,10,1000] [--json FILE]

make bench runs it right after `bench_core --pauses`, which times the
core's lone forward after the same pauses with no daemon around it;
compare.py puts both beside bench_core's back-to-back forward
(docs/performance.md, "A lone request after a pause"). Numbers only; never
part of the tests.
"""
import argparse
import base64
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

SHAPE = (1, 128, 512, 8)  # B, L, E, H: bench_shapes.h's first, the default model's width


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(binary, log):
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ATTND_") and k != "OPENBLAS_CORETYPE"}
    p = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port), "--grpc-port", "0"],
                         stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if p.poll() is not None:
            log.seek(0)
            sys.exit("attnd exited: %s" % log.read()[-2000:].decode(errors="replace"))
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            pass
        time.sleep(0.05)  # not listening yet, or not ready
    p.kill()
    sys.exit("attnd was not healthy within 60 s")


def server_total_ms(header):
    """The total of a Server-Timing header ("...,total;dur=1.23"), in ms."""
    for part in header.split(","):
        name, _, rest = part.strip().partition(";")
        if name == "total" and "dur=" in rest:
            return float(rest.split("dur=")[1].split(";")[0])
    raise SystemExit("no total in Server-Timing: %r" % header)


def pool_threads(conn):
    """The daemon's compute threads, from its attnd_compute_threads gauge."""
    conn.request("GET", "/metrics")
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith("attnd_compute_threads "):
            return int(float(line.split()[1]))
    raise SystemExit("no attnd_compute_threads in /metrics")


def lone(conn, body, pause_ms, n):
    """n requests, each after pause_ms: (compute ms, server total ms) lists."""
    compute, total = [], []
    for _ in range(n):
        if pause_ms:
            time.sleep(pause_ms / 1e3)
        conn.request("POST", "/v1/attention", body=body,
                     headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit("request: %d %s" % (r.status, data[:300]))
        compute.append(json.loads(data)["usage"]["compute_us"] / 1e3)
        total.append(server_total_ms(r.getheader("Server-Timing", "")))
    return compute, total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnd", default="build/attnd")
    ap.add_argument("--pauses", default="0,10,1000", help="ms, comma separated")
    ap.add_argument("--json", help="append one JSON line per pause (bench/compare.py)")
    a = ap.parse_args()
    pauses = [float(p) for p in a.pauses.split(",")]
    B, L, E, H = SHAPE
    q = np.random.default_rng(0).standard_normal((L, E)).astype(np.float32)
    body = json.dumps({"query": {"shape": [L, E], "dtype": "float32",
                                 "b64": base64.b64encode(q.tobytes()).decode()},
                       "encoding": "base64"}).encode()
    with tempfile.TemporaryFile() as log:
        p, port = start(a.attnd, log)
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            lone(conn, body, 0, 1)  # warm-up: the connection, the first forward
            threads = pool_threads(conn)
            print("a lone request after a pause, through attnd (default model, (%d, %d) base64 "
                  "query, %d threads); median ms (min, max) over N:" % (L, E, threads))
            print("%4s %5s %5s %3s | %9s %4s %9s %9s %9s %12s" %
                  ("B", "L", "E", "H", "pause ms", "N", "compute", "min", "max", "server total"))
            for pause in pauses:
                n = 10 if pause >= 1000 else 30
                compute, total = lone(conn, body, pause, n)
                med = statistics.median(compute)
                print("%4d %5d %5d %3d | %9g %4d %9.2f %9.2f %9.2f %12.2f" %
                      (B, L, E, H, pause, n, med, min(compute), max(compute),
                       statistics.median(total)), flush=True)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps({"impl": "attnd-lone", "shape": list(SHAPE),
                                            "threads": threads, "pause_ms": pause,
                                            "ms": round(med, 4),
                                            "total_ms": round(statistics.median(total), 4)})
                                + "\n")
        finally:
            p.terminate()
            p.wait()


if __name__ == "__main__":
    main()
