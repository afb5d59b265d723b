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


# ---------------------------------------------------------------- slow clients

class Tricklers:
    """n connections that each send one more byte of a request every
    `every` seconds (header lines, or a body that never ends), from one
    thread, for at most `seconds`."""

    def __init__(self, port, n, every, seconds, body=False):
        self.port, self.n, self.every, self.seconds, self.body = port, n, every, seconds, body
        self.closed_by_server = 0
        self.opened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)

    def payload(self):
        if self.body:
            head = (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 1000000\r\n\r\n{\"query\": [[")
            return head + b"0, " * 400000
        return b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"X-Slow: " + b"a" * 100000

    def run(self):
        socks = []
        data = self.payload()
        t_end = time.monotonic() + self.seconds
        for _ in range(self.n):
            try:
                s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
                s.setblocking(False)
                # the body trickler sends its header lines at once
                sent = data.index(b"\r\n\r\n") + 4 if self.body else 0
                if sent:
                    s.sendall(data[:sent])
                socks.append([s, sent])
                self.opened += 1
            except OSError:
                pass
        while not self.stop.is_set() and time.monotonic() < t_end and socks:
            for item in list(socks):
                s, pos = item
                try:
                    s.send(data[pos:pos + 1])
                    item[1] += 1
                    if s.recv(1, socket.MSG_PEEK) == b"":
                        raise ConnectionResetError
                except BlockingIOError:
                    pass
                except OSError:
                    self.closed_by_server += 1
                    socks.remove(item)
                    s.close()
            self.stop.wait(self.every)
        for s, _ in socks:
            s.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(60)


def probe_while(d, seconds, rounds):
    """/health and a known request, `rounds` times over `seconds`; each must
    be answered (a generous bounded wait, not a measured latency)."""
    body, ref = known_request()
    for _ in range(rounds):
        r = d.get("/health", timeout=10)
        assert r.status_code == 200, r.text
        r = d.post("/v1/attention", body, timeout=10)
        assert r.status_code == 200, r.text
        assert support.rel_err(np.array(r.json()["output"]), ref) <= 1e-5
        time.sleep(seconds / rounds)


@pytest.mark.parametrize("body", [False, True], ids=["header", "body"])
def test_slowloris_cannot_take_every_slot(fresh_daemons, body):
    """More tricklers than max_connections: real clients are still answered,
    and the tricklers are closed by their whole-phase deadline."""
    d = fresh_daemons(small_config(max_connections=64, header_timeout_ms=3000,
                                   body_timeout_ms=3000))
    with Tricklers(d.port, 96, every=0.5, seconds=20, body=body) as t:
        assert support.wait_until(lambda: t.opened >= 90, 20), t.opened
        probe_while(d, 6, 4)
        # the header (or body) deadline of 3 s closes them, trickle or not
        assert support.wait_until(lambda: t.closed_by_server >= 90, 15), \
            "only %d of %d trickling connections were closed" % (t.closed_by_server, t.opened)
    assert_serving(d)


def closed_by_server(sock, timeout):
    """True when the server closes sock within timeout seconds."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
        return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def test_half_requests_and_idle_keepalive_are_closed_at_the_header_deadline(fresh_daemons):
    """Connections that send part of a request line and stop, and a kept-alive
    connection that goes idle after an answer, are closed at the header
    deadline; the descriptors come back to their baseline."""
    d = fresh_daemons(small_config(header_timeout_ms=1000))
    base = fd_count(d)
    socks = []
    for i in range(50):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        s.sendall(b"GET /hea")
        socks.append(s)
    idle = socket.create_connection(("127.0.0.1", d.port), timeout=5)
    idle.sendall(b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n")
    assert idle.recv(65536).startswith(b"HTTP/1.1 200")
    for s in socks + [idle]:
        assert closed_by_server(s, 15), "a connection outlived the 1 s header deadline"
        s.close()
    assert support.wait_until(lambda: fd_count(d) <= base, 10), \
        "%d fds held, baseline %d" % (fd_count(d), base)
    assert_serving(d)


# ---------------------------------------------------------------- floods

def flood(port, n):
    """n connect/close cycles of five kinds: bare, a partial request line, a
    whole GET, a partial POST body, and a reset (RST)."""
    kinds = [b"", b"GET /hea",
             b"GET /health HTTP/1.1\r\nHost: t\r\n\r\n",
             b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 1000\r\n\r\n{\"query\"",
             None]
    for i in range(n):
        k = kinds[i % len(kinds)]
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
            if k is None:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            elif k:
                s.sendall(k)
            s.close()
        except OSError:
            pass


def test_connect_close_flood(fresh_daemons):
    """Thousands of short connections: /health answers throughout and the
    daemon's descriptors come back to their baseline within seconds."""
    d = fresh_daemons(small_config())
    base = fd_count(d)
    n = 1500 if SAN else 5000
    errors = []
    done = threading.Event()

    def health_loop():
        while not done.is_set():
            try:
                r = d.get("/health", timeout=10)
                if r.status_code != 200:
                    errors.append(r.status_code)
            except requests.RequestException as e:
                errors.append(repr(e))
            time.sleep(0.05)
    t = threading.Thread(target=health_loop)
    t.start()
    try:
        flood(d.port, n)
    finally:
        done.set()
        t.join(30)
    assert not errors, "/health failed during the flood: %s" % errors[:5]
    assert support.wait_until(lambda: fd_count(d) <= base + 2, 10), \
        "%d fds held after the flood, baseline %d" % (fd_count(d), base)
    assert_serving(d)
