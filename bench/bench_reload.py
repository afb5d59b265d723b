#!/usr/bin/env python3
"""bench_reload.py - what a reload costs the requests around it. It starts
build/attnd on a free port of 127.0.0.1 with model_control "explicit" and
two models: "small" (E=512, 8 heads, the load) and "big" (E=2048, 16 heads,
fp32: 64 MiB of weights, the one reloaded). A steady open-loop load of
(16, 512) base64 requests to "small" at a fixed rate (100 a second by
default, over a pool of 8 kept-alive connections; each request's latency
counts from the moment it was due, so a stall is not hidden by requests
that were never sent) runs for one phase without reloads, then for one
phase in which "big" is reloaded every second through
POST /v2/repository/models/big/load with parameters.config, alternating two
weights files. It prints, per phase, the requests, the errors and the p50,
p99 and max latency, the ratio of the p99s (the goal: with reloads within
1.5x of without), and the load calls' median and p90 time.

    .venv/bin/python bench/bench_reload.py [--attnd build/attnd] [--rate 100]
        [--seconds 20] [--reload-every 1.0] [--big-embed 2048] [--json FILE]

`make bench-reload` runs it (docs/performance.md, "Reloading a layer under
load"). Numbers only; never part of the tests.
"""
import argparse
import base64
import http.client
import json
import math
import os
import queue
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config"))
from safetensors_header import safetensors_bytes  # noqa: E402

SMALL_E, SMALL_H, SMALL_L = 512, 8, 16


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_layer(path, E, seed):
    """An nn.MultiheadAttention layer's four tensors (torch's names), drawn
    in float32 with torch's scales, as a safetensors file."""
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(E)
    t = {"in_proj_weight": rng.standard_normal((3 * E, E), dtype=np.float32) * s,
         "in_proj_bias": np.zeros(3 * E, dtype=np.float32),
         "out_proj.weight": rng.standard_normal((E, E), dtype=np.float32) * s,
         "out_proj.bias": np.zeros(E, dtype=np.float32)}
    entries = [(k, "F32", v.shape, np.ascontiguousarray(v, dtype="<f4").tobytes())
               for k, v in t.items()]
    with open(path, "wb") as f:
        f.write(safetensors_bytes(entries))


def start(binary, config_path, log):
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ATTND_") and k != "OPENBLAS_CORETYPE"}
    p = subprocess.Popen([binary, "--host", "127.0.0.1", "--port", str(port),
                          "--grpc-port", "0", "--config", config_path], stdout=log, stderr=subprocess.STDOUT,
                         env=env)
    deadline = time.monotonic() + 120
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
    sys.exit("attnd was not healthy within 120 s")


def metric(port, name):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    for line in c.getresponse().read().decode().splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.split()[-1])
    return None


class Load:
    """An open loop: request i is due at t0 + i / rate, whatever became of
    the ones before; `connections` threads send the due requests, each on
    its own kept-alive connection. A request's latency runs from when it was
    due to when its answer was read."""

    def __init__(self, port, body, rate, connections):
        self.port, self.body, self.rate = port, body, rate
        self.due = queue.Queue()
        self.lock = threading.Lock()
        self.results = []  # (due, latency s, ok, what)
        self.workers = [threading.Thread(target=self.work, daemon=True)
                        for _ in range(connections)]
        for w in self.workers:
            w.start()

    def work(self):
        conn = None
        while True:
            due = self.due.get()
            if due is None:
                return
            ok, what = False, ""
            try:
                if conn is None:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                conn.request("POST", "/v1/attention", body=self.body,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                ok = r.status == 200
                what = "" if ok else "%d %s" % (r.status, data[:120])
            except (OSError, http.client.HTTPException) as e:
                what = repr(e)
                conn = None
            done = time.monotonic()
            with self.lock:
                self.results.append((due, done - due, ok, what))

    def run(self, seconds):
        """Sends `seconds` of requests at the rate; returns the index of the
        first result of the phase (results arrive until the next phase)."""
        with self.lock:
            first = len(self.results)
        t0 = time.monotonic()
        n = int(seconds * self.rate)
        for i in range(n):
            due = t0 + i / self.rate
            pause = due - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            self.due.put(due)
        return first, n

    def wait(self, count, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.results) >= count:
                    return
            time.sleep(0.01)
        sys.exit("requests still unanswered after %d s" % timeout)

    def stop(self):
        for _ in self.workers:
            self.due.put(None)


class Reloader:
    """Every `every` seconds, one load of "big" with parameters.config,
    alternating two weights files; a load still running at its tick delays
    the next one (counted as late)."""

    def __init__(self, port, entries, every):
        self.port, self.entries, self.every = port, entries, every
        self.stop_at = None
        self.times, self.failures, self.late, self.versions = [], [], 0, []
        self.thread = threading.Thread(target=self.run, daemon=True)

    def start(self, seconds):
        self.stop_at = time.monotonic() + seconds
        self.thread.start()

    def run(self):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        k = 0
        t0 = time.monotonic()
        while True:
            tick = t0 + (k + 1) * self.every
            if tick >= self.stop_at:
                return
            pause = tick - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            else:
                self.late += 1
            body = json.dumps({"parameters": {"config": json.dumps(self.entries[k % 2])}})
            t = time.monotonic()
            try:
                conn.request("POST", "/v2/repository/models/big/load", body=body,
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                data = r.read()
                if r.status == 200:
                    self.times.append(time.monotonic() - t)
                    self.versions.append(json.loads(data)["version"])
                else:
                    self.failures.append("%d %s" % (r.status, data[:200]))
            except (OSError, http.client.HTTPException) as e:
                self.failures.append(repr(e))
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
            k += 1


def pct(xs, p):
    """The p-th percentile (nearest rank) of xs."""
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, math.ceil(p / 100.0 * len(xs)) - 1))]


def summary(results):
    lat = [r[1] * 1e3 for r in results if r[2]]
    errors = [r[3] for r in results if not r[2]]
    return {"requests": len(results), "errors": len(errors), "error_kinds": sorted(set(errors))[:3],
            "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat) if lat else float("nan")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attnd", default="build/attnd")
    ap.add_argument("--rate", type=float, default=100.0, help="requests a second")
    ap.add_argument("--seconds", type=float, default=20.0, help="of each phase")
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of load before phase 1")
    ap.add_argument("--reload-every", type=float, default=1.0, help="seconds")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--big-embed", type=int, default=2048)
    ap.add_argument("--big-heads", type=int, default=16)
    ap.add_argument("--json", help="append one JSON line of results (bench/compare.py style)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_reload.") as tmp:
        write_layer(os.path.join(tmp, "small.safetensors"), SMALL_E, 1)
        for i, name in enumerate(("bigA.safetensors", "bigB.safetensors")):
            write_layer(os.path.join(tmp, name), a.big_embed, 10 + i)
        big = {"embed_dim": a.big_embed, "num_heads": a.big_heads}
        cfg = {"server": {"model_control": "explicit", "model_dir": tmp},
               "models": [{"name": "small", "embed_dim": SMALL_E, "num_heads": SMALL_H,
                           "weights": "small.safetensors"},
                          dict(big, name="big", weights="bigA.safetensors")]}
        config_path = os.path.join(tmp, "attnd.json")
        with open(config_path, "w") as f:
            json.dump(cfg, f)
        q = np.random.default_rng(0).standard_normal((SMALL_L, SMALL_E)).astype(np.float32)
        body = json.dumps({"model": "small", "encoding": "base64",
                           "query": {"shape": [SMALL_L, SMALL_E], "dtype": "float32",
                                     "b64": base64.b64encode(q.tobytes()).decode()}}).encode()
        with tempfile.TemporaryFile() as log:
            p, port = start(a.attnd, config_path, log)
            try:
                threads = metric(port, "attnd_compute_threads")
                big_bytes = metric(port, "attnd_model_weights_bytes")
                load = Load(port, body, a.rate, a.connections)
                first, n = load.run(a.warmup)
                load.wait(first + n)
                first, n = load.run(a.seconds)
                load.wait(first + n)
                steady = summary(load.results[first:first + n])
                rel = Reloader(port, [dict(big, weights="bigA.safetensors"),
                                      dict(big, weights="bigB.safetensors")], a.reload_every)
                rel.start(a.seconds)
                first, n = load.run(a.seconds)
                rel.thread.join(600)
                load.wait(first + n)
                reloading = summary(load.results[first:first + n])
                load.stop()
            finally:
                p.terminate()
                p.wait()
    report(a, threads, big_bytes, steady, reloading, rel)


def report(a, threads, held, steady, reloading, rel):
    print("a steady load of (%d, %d) base64 requests to a %d-head E=%d model at %g/s "
          "(open loop, %d connections), %g s a phase; attnd with %s compute threads; "
          "weights held at start: %s MiB" % (SMALL_L, SMALL_E, SMALL_H, SMALL_E, a.rate,
                                             a.connections, a.seconds,
                                             "?" if threads is None else "%d" % threads,
                                             "?" if held is None else "%.0f" % (held / 2**20)))
    print("%-46s %8s %7s %9s %9s %9s" % ("phase", "requests", "errors", "p50 ms", "p99 ms",
                                        "max ms"))
    what = "reload of E=%d fp32 every %g s" % (a.big_embed, a.reload_every)
    for name, s in (("steady, no reloads", steady), (what, reloading)):
        print("%-46s %8d %7d %9.2f %9.2f %9.2f" % (name, s["requests"], s["errors"], s["p50"],
                                                  s["p99"], s["max"]))
        for e in s["error_kinds"]:
            print("    error: %s" % e)
    ratio = reloading["p99"] / steady["p99"] if steady["p99"] > 0 else float("nan")
    print("p99 with reloads / p99 without: %.2fx (goal: at most 1.5x)" % ratio)
    ms = [t * 1e3 for t in rel.times]
    print("load calls: %d answered 200, %d failed, %d started late; time median %.1f ms, "
          "p90 %.1f ms, max %.1f ms; versions %s..%s" % (
              len(ms), len(rel.failures), rel.late,
              statistics.median(ms) if ms else float("nan"), pct(ms, 90),
              max(ms) if ms else float("nan"),
              rel.versions[0] if rel.versions else "-", rel.versions[-1] if rel.versions else "-"))
    for f in rel.failures[:3]:
        print("    load failed: %s" % f)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps({"impl": "attnd-reload", "rate": a.rate, "seconds": a.seconds,
                                "big_embed": a.big_embed, "steady": steady,
                                "reloading": reloading, "p99_ratio": round(ratio, 4),
                                "load_ms_median": statistics.median(ms) if ms else None,
                                "load_ms_p90": pct(ms, 90) if ms else None,
                                "load_failures": len(rel.failures)}) + "\n")


if __name__ == "__main__":
    main()
