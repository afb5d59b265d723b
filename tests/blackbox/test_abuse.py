"""Abuse (issue 13): what one client, or many, can do to the daemon over
plain TCP on 127.0.0.1, and what the daemon must still do afterwards.

Every case is bounded in connections, bytes and seconds, and ends with the
daemon alive and answering a known request exactly (`assert_serving`).
"Within seconds" is a generous bounded wait that fails the test if the
answer never comes; nothing here measures a latency.
"""
import json
import os
import re
import signal
import socket
import struct
import threading
import time

import numpy as np
import pytest
import requests

import support
from support import check_error_body, raw_http

GOLDENS = {g["name"]: (g, m) for g, m in support.load_goldens()}
SMALL = "self_e16_h1"
SAN = support.sanitized_build()


def small_config(**server):
    cfg = {"models": [GOLDENS[SMALL][1].config()]}
    if server:
        cfg["server"] = server
    return cfg


def known_request():
    """A golden request and its torch output."""
    g, _ = GOLDENS[SMALL]
    seq = g["sequences"][0]
    return support.golden_body(seq, model_name=SMALL), np.array(seq["output"])


def assert_serving(d, timeout=30.0):
    """The daemon runs, /health is 200 and a known request gets its answer."""
    assert d.alive(), "attnd died:\n" + d.logs()
    body, ref = known_request()
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            r = d.post("/v1/attention", body, timeout=10)
            if r.status_code == 200:
                out = np.array(r.json()["output"])
                assert support.rel_err(out, ref) <= 1e-5
                return
            last = r.status_code
        except requests.RequestException as e:
            last = repr(e)
        time.sleep(0.1)
    raise AssertionError("no answer to a known request within %.0f s (last: %s)\n%s"
                         % (timeout, last, d.logs()))


def fd_count(d):
    return len(os.listdir("/proc/%d/fd" % d.proc.pid))


def slow_reader(port, request, rate, sink, rcvbuf=16384, chunk=4096):
    """Sends request, then reads the answer at about `rate` bytes/s into
    sink (a dict: head, body bytes, error), until EOF or the whole body."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.settimeout(30)
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(request)
        buf = b""
        while b"\r\n\r\n" not in buf:
            c = s.recv(chunk)
            if not c:
                break
            buf += c
        head, _, body = buf.partition(b"\r\n\r\n")
        sink["head"] = head
        m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
        want = int(m.group(1)) if m else None
        sink["want"] = want
        got = len(body)
        t0 = time.monotonic()
        while want is None or got < want:
            c = s.recv(chunk)
            if not c:
                break
            got += len(c)
            sink["got"] = got
            ahead = got / rate - (time.monotonic() - t0)
            if ahead > 0:
                time.sleep(ahead)
        sink["got"] = got
    except OSError as e:
        sink["error"] = repr(e)
    finally:
        s.close()
        sink["done"] = True


def big_answer_request(rows, width=512):
    body = json.dumps({"query": support.b64_tensor(
        np.random.default_rng(5).standard_normal((rows, width)).astype(np.float32))})
    return (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: slow-reader\r\nContent-Length: %d\r\n\r\n" % len(body)) + body.encode()


# ---------------------------------------------------------------- drain

def drain_with_slow_reader(fresh_daemons, grace, rate, rows):
    d = fresh_daemons(None, env={"ATTND_DRAIN_GRACE_S": str(grace)})
    sink = {}
    t = threading.Thread(target=slow_reader,
                         args=(d.port, big_answer_request(rows), rate, sink))
    t.start()
    assert support.wait_until(lambda: sink.get("got", 0) > 0 or sink.get("done"), 60), sink
    assert sink.get("head", b"").startswith(b"HTTP/1.1 200"), sink.get("head")
    d.send_signal(signal.SIGTERM)
    rc = d.wait_exit(grace + 60)
    t.join(120)
    return d, rc, sink


def test_drain_keeps_sending_to_a_slow_reader(fresh_daemons):
    """SIGTERM while a client reads a 6 MB answer slowly: it gets every byte."""
    d, rc, sink = drain_with_slow_reader(fresh_daemons, grace=60, rate=2e6, rows=1024)
    assert sink["want"] and sink["got"] == sink["want"], sink
    assert rc == 0, "exit code %s\n%s" % (rc, d.logs())
    line = [ln for ln in d.stdout().splitlines() if "id=slow-reader" in ln]
    assert line and "end=ok" in line[-1], line


def test_drain_deadline_cuts_and_says_so(fresh_daemons):
    """A reader too slow for the grace period: its answer is cut at the
    deadline, the log names the request and the exit code is 5."""
    d, rc, sink = drain_with_slow_reader(fresh_daemons, grace=2, rate=1e5, rows=1024)
    assert sink["want"] and sink.get("got", 0) < sink["want"], sink
    assert rc == 5, "exit code %s, expected 5 (drain deadline passed)\n%s" % (rc, d.logs())
    out = d.stdout()
    assert re.search(r"slow-reader.*cut short at the drain deadline", out), out[-3000:]
    line = [ln for ln in out.splitlines() if "id=slow-reader" in ln and "status=" in ln]
    assert line and "end=ok" not in line[-1] and "end=drain_deadline" in line[-1], line
