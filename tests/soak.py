"""soak.py - `make soak`: steady mixed load against the real daemon on
127.0.0.1 for SOAK_SECONDS (600 by default), then SIGTERM.

Four client threads send, in turn, valid native requests (JSON and base64,
with and without attention matrices), valid KServe v2 requests, and bad ones
(ragged, non-numbers, unknown model, truncated JSON, over the token limit),
plus a connection that closes half-way through its body. Every valid answer
is checked against the same request's first answer, bit for bit; every bad
one must be a 4xx. The daemon's RSS, descriptors and threads are printed at
the start, at the end of warm-up, every minute and at the end. Warm-up ends
once a quarter of the run has passed (two minutes at most) and 10,000
requests were served, or at half the run, whichever comes first: in a run
here RSS still rose by 1 MB between the first and the second minute
(20.3 -> 21.4 MB, while a parallel build slowed the clients), then stayed
within 1 % for eight minutes. Fails (exit 1) when RSS grew by more than 5 %
(SOAK_MAX_GROWTH) from the end of warm-up to the end, when the descriptors
or threads grew, when an answer was wrong or a 5xx came back, when the
daemon did not exit 0, or when fewer requests than SOAK_MIN_REQUESTS were
served (40 a second of the run by default, a tenth of them of each kind), so
that load that never arrived cannot pass for a quiet daemon.

Bounded in time and connections; traffic goes to 127.0.0.1 only.
"""
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, str(Path(__file__).resolve().parent / "blackbox"))
import support  # noqa: E402

SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
WARMUP = min(120.0, SECONDS / 4)
# Warm-up also needs this much work done: on a busy machine the first minute
# may serve too few requests for the allocator to reach its steady state.
WARMUP_REQUESTS = 10000
# Allowed RSS growth after warm-up; make asan sets it loose, since there the
# run is about leaks and AddressSanitizer's quarantine fills for minutes.
GROWTH = float(os.environ.get("SOAK_MAX_GROWTH", "0.05"))
# Requests the run must serve at least (valid, invalid and half bodies
# together), a tenth of them of each kind; a run here serves about 240 a
# second, and under AddressSanitizer about a third of that.
MIN_REQUESTS = int(os.environ.get("SOAK_MIN_REQUESTS", str(int(40 * SECONDS))))


def status_of(pid):
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            out[k] = v.strip()
    return {"rss_kb": int(out["VmRSS"].split()[0]), "threads": int(out["Threads"]),
            "fds": len(os.listdir("/proc/%d/fd" % pid))}


def requests_mix(E):
    rng = np.random.default_rng(7)
    q = rng.standard_normal((24, E)).astype(np.float32)
    k = rng.standard_normal((31, E)).astype(np.float32)
    good = [
        ("/v1/attention", {"query": support.tolist32(q)}),
        ("/v1/attention", {"query": support.b64_tensor(q), "key": support.b64_tensor(k),
                           "attention": "mean", "encoding": "base64"}),
        ("/v1/attention", {"query": support.tolist32(q[:5]), "causal": True,
                           "attention": "heads"}),
        ("/v2/models/default/infer", {"inputs": [{"name": "query", "shape": [1, 24, E],
                                                  "datatype": "FP32",
                                                  "data": q.ravel().tolist()}]}),
    ]
    bad = [
        ("/v1/attention", b'{"query": [[1, 2], [3]]}'),
        ("/v1/attention", b'{"query": [["x"]]}'),
        ("/v1/attention", json.dumps({"model": "nope", "query": support.tolist32(q[:1])}).encode()),
        ("/v1/attention", json.dumps({"query": support.tolist32(q)}).encode()[:2000]),
        ("/v1/attention", json.dumps({"query": {"shape": [20000, E], "dtype": "float32",
                                                "b64": "AAAA"}}).encode()),
        ("/v2/models/default/infer", b'{"inputs": [{"name": "query", "shape": [1, 2]}]}'),
    ]
    return good, bad


def half_body(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n{\"query\"")
    s.close()


def client(d, good, refs, bad, stop, problems, counts, k):
    sess = requests.Session()
    i = k
    while not stop.is_set():
        i += 1
        try:
            if i % 7 == 0:
                half_body(d.port)
                counts["half"] += 1
                continue
            if i % 3 == 0:
                path, body = bad[i % len(bad)]
                r = sess.post(d.url + path, data=body, timeout=60)
                if not 400 <= r.status_code < 500:
                    problems.append("bad body got %d: %s" % (r.status_code, r.text[:200]))
                counts["bad"] += 1
                continue
            j = i % len(good)
            path, body = good[j]
            r = sess.post(d.url + path, json=body, timeout=60)
            if r.status_code != 200:
                problems.append("good body %d got %d: %s" % (j, r.status_code, r.text[:200]))
            elif r.content != refs[j] and not same_numbers(r.json(), json.loads(refs[j])):
                problems.append("good body %d: a different answer" % j)
            counts["good"] += 1
        except requests.RequestException as e:
            problems.append(repr(e))


def numbers(doc):
    if "outputs" in doc:
        return [np.asarray(o["data"], dtype=np.float64) for o in doc["outputs"]]
    out = []
    for key in ("output", "attention"):
        v = doc.get(key)
        if v is not None:
            out.append(support.from_b64_tensor(v) if isinstance(v, dict)
                       else np.asarray(v, dtype=np.float64))
    return out


def same_numbers(a, b):
    """The same numbers bit for bit, whatever shared the batch
    (docs/performance.md, "Batch invariance"); only usage may differ."""
    na, nb = numbers(a), numbers(b)
    return len(na) == len(nb) and all(np.array_equal(x, y) for x, y in zip(na, nb))


def main():
    work = Path(os.environ.get("SOAK_DIR", "/tmp/attnd-soak"))
    d = support.Daemon(work, config=None, env={"ATTND_DRAIN_GRACE_S": "60"})
    d.start()
    good, bad = requests_mix(512)
    refs = []
    for path, body in good:
        r = d.post(path, json=body)
        assert r.status_code == 200, r.text[:300]
        refs.append(r.content)
    stop = threading.Event()
    problems = []
    counts = {"good": 0, "bad": 0, "half": 0}
    threads = [threading.Thread(target=client, args=(d, good, refs, bad, stop, problems, counts, k))
               for k in range(4)]
    t0 = time.monotonic()
    start = status_of(d.proc.pid)
    print("soak: %.0f s of mixed load on %s (warm-up %.0f s)" % (SECONDS, d.url, WARMUP))
    print("start   rss %6d kB  fds %4d  threads %3d" % (start["rss_kb"], start["fds"],
                                                       start["threads"]), flush=True)
    for t in threads:
        t.start()
    warm = None
    next_print = t0 + 60
    while time.monotonic() - t0 < SECONDS and d.alive():
        time.sleep(1)
        now = time.monotonic()
        done = sum(counts.values())
        if warm is None and now - t0 >= WARMUP and (done >= WARMUP_REQUESTS
                                                    or now - t0 >= SECONDS / 2):
            warm = status_of(d.proc.pid)
            print("%5.0f s rss %6d kB  fds %4d  threads %3d  (end of warm-up, %d requests)"
                  % (now - t0, warm["rss_kb"], warm["fds"], warm["threads"], done), flush=True)
        if now >= next_print:
            st = status_of(d.proc.pid)
            print("%5.0f s rss %6d kB  fds %4d  threads %3d  requests %s"
                  % (now - t0, st["rss_kb"], st["fds"], st["threads"], counts), flush=True)
            next_print += 60
    stop.set()
    for t in threads:
        t.join(120)
    alive = d.alive()
    end = status_of(d.proc.pid) if alive else None
    rc = d.stop(signal.SIGTERM, timeout=120)
    fail = []
    if not alive:
        fail.append("the daemon died:\n" + d.logs())
    else:
        print("end     rss %6d kB  fds %4d  threads %3d  requests %s"
              % (end["rss_kb"], end["fds"], end["threads"], counts))
        growth = (end["rss_kb"] - warm["rss_kb"]) / warm["rss_kb"]
        print("rss growth after warm-up: %+.1f %% (limit %.0f %%)" % (100 * growth, 100 * GROWTH))
        if growth > GROWTH:
            fail.append("RSS grew by %.1f %% after warm-up" % (100 * growth))
        if end["fds"] > warm["fds"] + 4 or end["threads"] > warm["threads"]:
            fail.append("descriptors or threads grew: %s -> %s" % (warm, end))
    if rc != 0:
        fail.append("exit code %s on SIGTERM" % rc)
    if problems:
        fail.append("%d wrong answers or errors, first: %s" % (len(problems), problems[:3]))
    served = sum(counts.values())
    print("served %d requests (at least %d: %d of each kind)" % (served, MIN_REQUESTS,
                                                                 MIN_REQUESTS // 10))
    if served < MIN_REQUESTS or min(counts.values()) < MIN_REQUESTS // 10:
        fail.append("only %s requests served, at least %d wanted" % (counts, MIN_REQUESTS))
    marks = d.sanitizer_reports()
    if marks:
        fail.append("sanitizer reports: %s" % marks)
    print("soak: %s" % ("FAILED: " + "; ".join(fail) if fail else "ok"))
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
