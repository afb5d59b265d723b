"""Abuse: what one client, or many, can do to the daemon over
plain TCP on 127.0.0.1, and what the daemon must still do afterwards.

Every case is bounded in connections, bytes and seconds, and ends with the
daemon alive and answering a known request exactly (`assert_serving`).
"Within seconds" is a generous bounded wait that fails the test if the
answer never comes; nothing here measures a latency.
"""
import http.client
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


def slow_reader(port, request, rate, sink, rcvbuf=16384, chunk=4096, seconds=None):
    """Sends request, then reads the answer at about `rate` bytes/s (or, with
    `seconds`, at the rate that takes that long for its Content-Length)
    into sink (a dict: head, body bytes, error, when the last byte came),
    until EOF or the whole body; as fast as it can once sink["hurry"] is
    set."""
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
        if seconds and want:
            rate = want / seconds
        got = len(body)
        t0 = time.monotonic()
        while want is None or got < want:
            c = s.recv(chunk)
            if not c:
                break
            got += len(c)
            sink["got"] = got
            ahead = got / rate - (time.monotonic() - t0)
            if ahead > 0 and not sink.get("hurry"):
                time.sleep(ahead)
        sink["got"] = got
        sink["t_end"] = time.monotonic()
    except OSError as e:
        sink["error"] = repr(e)
    finally:
        s.close()
        sink["done"] = True


def big_answer_request(rows, width=512, attention="none"):
    body = json.dumps({"query": support.b64_tensor(
        np.random.default_rng(5).standard_normal((rows, width)).astype(np.float32)),
        "attention": attention})
    return (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"X-Request-Id: slow-reader\r\nContent-Length: %d\r\n\r\n" % len(body)) + body.encode()


# ---------------------------------------------------------------- drain

def drain_with_slow_reader(fresh_daemons, grace, request, env=None, **read):
    d = fresh_daemons(None, env=dict(env or {}, ATTND_DRAIN_GRACE_S=str(grace)))
    sink = {}
    t = threading.Thread(target=slow_reader, args=(d.port, request), kwargs=dict(read, sink=sink))
    t.start()
    assert support.wait_until(lambda: sink.get("got", 0) > 0 or sink.get("done"), 60), sink
    assert sink.get("head", b"").startswith(b"HTTP/1.1 200"), sink.get("head")
    sink["t_signal"] = time.monotonic()
    d.send_signal(signal.SIGTERM)
    rc = d.wait_exit(grace + 60)
    # the daemon is gone: what it sent is in the socket buffers, read it at once
    sink["hurry"] = True
    t.join(120)
    return d, rc, sink


def test_drain_keeps_sending_to_a_slow_reader(fresh_daemons):
    """SIGTERM while a client reads a 33 MB answer over 15 s, with a request
    timeout of 1 s: it gets every byte, exit code 0, and the access log says
    the answer went out whole. (attnd once cut such a reader at about the
    request timeout + 10 s, and logged it as complete.)"""
    d, rc, sink = drain_with_slow_reader(
        fresh_daemons, 60, big_answer_request(512, attention="heads"),
        env={"ATTND_REQUEST_TIMEOUT_MS": "1000"}, rate=None, seconds=15)
    assert sink["want"] and sink["want"] > 20e6, sink  # more than the socket buffers hold
    assert sink["got"] == sink["want"], sink
    # by the reader's own pace, the last byte came after the old cut
    assert sink["t_end"] - sink["t_signal"] > 1 + 10, sink
    assert rc == 0, "exit code %s\n%s" % (rc, d.logs())
    line = [ln for ln in d.stdout().splitlines() if "id=slow-reader" in ln]
    assert line and "end=ok" in line[-1], line


def test_drain_deadline_cuts_and_says_so(fresh_daemons):
    """A reader too slow for the grace period: its answer is cut at the
    deadline, the log names the request and the exit code is 5."""
    d, rc, sink = drain_with_slow_reader(fresh_daemons, 2, big_answer_request(1024), rate=1e5)
    assert sink["want"] and sink.get("got", 0) < sink["want"], sink
    assert rc == 5, "exit code %s, expected 5 (drain deadline passed)\n%s" % (rc, d.logs())
    out = d.stdout()
    assert re.search(r"slow-reader.*cut short at the drain deadline", out), out[-3000:]
    line = [ln for ln in out.splitlines() if "id=slow-reader" in ln and "status=" in ln]
    assert line and "end=ok" not in line[-1] and "end=drain_deadline" in line[-1], line


def test_reset_while_the_answer_goes_out_is_client_gone(fresh_daemons):
    """A client that resets its connection while a large answer goes out
    (RST, its receive buffer small) is logged end=client_gone, as docs/api.md
    defines it, not end=error; the daemon serves on."""
    d = fresh_daemons(None)
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", d.port))
    s.sendall(big_answer_request(2048, attention="mean").replace(b"slow-reader", b"reset-reader"))
    assert s.recv(100)
    time.sleep(0.3)  # the daemon blocks on the full socket
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()  # RST
    assert support.wait_until(lambda: "id=reset-reader" in d.stdout(), 10), d.stdout()[-2000:]
    line = [ln for ln in d.stdout().splitlines() if "id=reset-reader" in ln][-1]
    assert "end=client_gone" in line, line
    assert d.get("/health").status_code == 200


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
    # and the log says so, in one line every 10 s at most
    assert support.wait_until(lambda: "closed by the guard" in d.stdout(), 15), d.logs()
    line = [ln for ln in d.stdout().splitlines() if "closed by the guard" in ln][0]
    assert re.search(r"[1-9]\d* (past the (header|body) deadline|evicted)", line), line


def guard_counts(d):
    """What the guard's warning lines add up to: (past a deadline, evicted)."""
    deadline = evicted = 0
    for m in re.finditer(r"closed by the guard in the last \S+ s: (\d+) past the header "
                         r"deadline, (\d+) past the body deadline, (\d+) evicted", d.stdout()):
        deadline += int(m.group(1)) + int(m.group(2))
        evicted += int(m.group(3))
    return deadline, evicted


@pytest.mark.parametrize("body", [False, True], ids=["header", "body"])
def test_slowloris_evicted_before_any_deadline(fresh_daemons, body):
    """The same tricklers with deadlines of two minutes, which no part of
    this test reaches: each probe must still be answered within 5 s, so
    only the slot reserve, which evicts the slow client that has waited
    longest, can let it in. The log counts the evictions and no deadline."""
    d = fresh_daemons(small_config(max_connections=64, header_timeout_ms=120000,
                                   body_timeout_ms=120000))
    body_req, ref = known_request()
    with Tricklers(d.port, 96, every=0.5, seconds=40, body=body) as t:
        assert support.wait_until(lambda: t.opened >= 90, 20), t.opened
        # 96 opened where 60 fit beside the reserve of 4: the oldest were evicted
        assert support.wait_until(lambda: t.closed_by_server >= 96 - 64, 10), \
            "%d of %d tricklers closed" % (t.closed_by_server, t.opened)
        for _ in range(4):
            r = requests.get(d.url + "/health", timeout=5)
            assert r.status_code == 200, r.text
            r = requests.post(d.url + "/v1/attention", data=json.dumps(body_req), timeout=5)
            assert r.status_code == 200, r.text
            assert support.rel_err(np.array(r.json()["output"]), ref) <= 1e-5
        held = t.opened - t.closed_by_server
        assert held >= 40, "only %d tricklers still held: a deadline closed them" % held
    assert support.wait_until(lambda: guard_counts(d)[1] > 0, 25), d.logs()
    deadline, evicted = guard_counts(d)
    assert deadline == 0, "a deadline passed: %d closed" % deadline
    assert evicted >= 96 - 64, evicted
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


# ---------------------------------------------------------------- odd HTTP

def read_responses(port, data, timeout=5.0, shut=False):
    """Sends data on one connection and returns the raw bytes that come back
    until the server closes or `timeout` passes. The client reads while it
    sends, so a server that refuses early is heard."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = []

    def reader():
        try:
            while True:
                c = s.recv(65536)
                if not c:
                    return
                out.append(c)
        except OSError:
            return
    t = threading.Thread(target=reader)
    t.start()
    try:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
    t.join(timeout + 5)
    s.close()
    return b"".join(out)


def split_responses(blob):
    """Well-formed HTTP/1.1 responses in blob: [(status, headers, body)].
    Fails on anything that is not one."""
    out = []
    while blob:
        head, sep, rest = blob.partition(b"\r\n\r\n")
        assert sep, "a response without the end of its header lines: %r" % blob[:300]
        lines = head.split(b"\r\n")
        m = re.match(rb"HTTP/1\.[01] (\d{3}) [^\r\n]*$", lines[0])
        assert m, "not a status line: %r" % lines[0][:200]
        headers = {}
        for ln in lines[1:]:
            k, colon, v = ln.partition(b":")
            assert colon and k and not k.strip() != k, "bad header line %r" % ln[:200]
            headers[k.decode().lower()] = v.strip().decode("latin-1")
        assert "content-length" in headers, "no Content-Length: %r" % head[:300]
        n = int(headers["content-length"])
        assert len(rest) >= n, "body cut short: %d of %d bytes" % (len(rest), n)
        out.append((int(m.group(1)), headers, rest[:n]))
        blob = rest[n:]
    return out


def assert_json_error(status, headers, body, want=None):
    assert headers.get("content-type", "").startswith("application/json"), headers
    doc = json.loads(body)
    assert isinstance(doc, dict) and list(doc) == ["error"] and doc["error"].strip(), doc
    assert headers.get("x-request-id"), headers
    if want is not None:
        assert status in want, "status %d, expected one of %s: %s" % (status, want, doc)
    return doc["error"]


ODD_HTTP = [
    ("header_without_colon", b"GET /health HTTP/1.1\r\nHost 127.0.0.1\r\n\r\n", {400}),
    ("http_0_9", b"GET /health\r\n\r\n", {400, 505}),
    ("http_2_0_text", b"GET /health HTTP/2.0\r\nHost: t\r\n\r\n", {505}),
    ("http_9_9", b"GET /health HTTP/9.9\r\nHost: t\r\n\r\n", {505}),
    ("content_length_negative",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: -5\r\n\r\n", {400}),
    ("content_length_not_a_number",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: abc\r\n\r\n", {400}),
    ("content_length_huge",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 99999999999999999999999\r\n\r\n",
     {413}),
    ("content_length_2_63",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 9223372036854775808\r\n\r\n",
     {413}),
    ("content_length_u64_max",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 18446744073709551615\r\n\r\n",
     {413}),
    ("content_length_leading_zeros",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 00000000000000000000000004"
     b"\r\n\r\n{}  ", {400}),
    ("content_length_over_limit",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 1099511627776\r\n\r\n", {413}),
    ("chunk_size_not_hex",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\n", {400}),
    ("chunk_size_huge",
     b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"FFFFFFFFFFFFFFFFFFFFFF\r\n", {413}),
    ("url_100k", b"GET /" + b"a" * 100000 + b" HTTP/1.1\r\nHost: t\r\n\r\n", {414, 431}),
    ("header_line_1m", b"GET /health HTTP/1.1\r\nHost: t\r\nX-Big: " + b"b" * (1 << 20)
     + b"\r\n\r\n", {431}),
    ("many_headers", b"GET /health HTTP/1.1\r\nHost: t\r\n" + b"X-H: 1\r\n" * 20000 + b"\r\n",
     {431}),
    ("unknown_method", b"BREW /health HTTP/1.1\r\nHost: t\r\n\r\n", {405}),
    ("absurd_url", b"GET /%00%ff/../..//v1/./models%2F HTTP/1.1\r\nHost: t\r\n\r\n", {404}),
]

# No request line at all (no method and target): closed at once without an
# answer, on purpose (docs/api.md, "Bytes that are not HTTP").
NOT_HTTP = [
    ("not_http", b"GARBAGE\r\n\r\n"),
    ("tls_hello", b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + bytes(range(32)) + b"\r\n\r\n"),
]


@pytest.fixture(scope="module")
def odd(daemons):
    return daemons(small_config(body_timeout_ms=2000))


@pytest.mark.parametrize("case", ODD_HTTP, ids=[c[0] for c in ODD_HTTP])
def test_odd_http_gets_a_json_error(odd, case):
    """Malformed or odd HTTP: one well-formed response whose body is attnd's
    {"error": ...}, whether attnd or libmicrohttpd refused it."""
    _, data, want = case
    resps = split_responses(read_responses(odd.port, data))
    assert len(resps) == 1, resps
    assert_json_error(*resps[0], want=want)
    assert odd.get("/health").status_code == 200
    # one access line for it, under the id and status it was answered with,
    # and a count in /metrics (SPEC 4), refused by libmicrohttpd or not
    status, headers = resps[0][0], resps[0][1]
    line = re.compile(r" status=%d .*id=%s " % (status, re.escape(headers["x-request-id"])))
    assert support.wait_until(lambda: line.search(odd.stdout()), 10), odd.logs()
    assert re.search(r'^attnd_requests_total\{route="[^"]+",status="%d"\} [1-9]' % status,
                     odd.get("/metrics").text, re.M)


def test_a_bad_chunk_is_logged_under_its_request(odd):
    """A chunked body that libmicrohttpd refuses after the header lines: the
    answer echoes the request's X-Request-Id, and its access line names its
    method, path and status (never a 499 as if the client had left)."""
    data = (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nX-Request-Id: chunk-7f3a\r\n"
            b"Transfer-Encoding: chunked\r\n\r\nZZ\r\n")
    resps = split_responses(read_responses(odd.port, data))
    assert len(resps) == 1, resps
    assert_json_error(*resps[0], want={400})
    assert resps[0][1]["x-request-id"] == "chunk-7f3a"
    line = re.compile(r"method=POST path=/v1/attention status=400 .*id=chunk-7f3a .*end=refused")
    assert support.wait_until(lambda: line.search(odd.stdout()), 10), odd.logs()


def sent_then_closed(port, data, timeout):
    """Sends data and reads until the server closes; returns what came, or
    None when the connection was still open after timeout seconds."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    got = b""
    try:
        while True:
            c = s.recv(65536)
            if not c:
                return got
            got += c
    except ConnectionResetError:
        return got
    except socket.timeout:
        return None
    finally:
        s.close()


@pytest.mark.parametrize("case", NOT_HTTP, ids=[c[0] for c in NOT_HTTP])
def test_not_http_is_closed_without_an_answer(odd, case):
    """Bytes that are no request line: the daemon closes the connection and
    sends nothing, not even a partial answer; at once, not at the header
    deadline (30 s here), which no part of this test waits for."""
    got = sent_then_closed(odd.port, case[1], timeout=10)
    assert got is not None, "still open after 10 s: it was left to the header deadline"
    assert got == b"", got[:300]
    assert odd.get("/health").status_code == 200


def test_nul_first_line_waits_for_the_header_deadline(fresh_daemons):
    """A first line that starts with a NUL byte reads as an empty line (HTTP
    lets empty lines come before a request), so the connection waits for
    its request line like any slow client: it is closed at the header
    deadline, without an answer, and the guard counts it there."""
    d = fresh_daemons(small_config(header_timeout_ms=1000))
    for _ in range(3):
        got = sent_then_closed(d.port, b"\x00\xff\xfe\x16\x03\x01\r\n\r\n", timeout=20)
        assert got == b"", got
    # three, beside the start-up probe's kept-alive connection, if it is counted too
    assert support.wait_until(lambda: guard_counts(d)[0] >= 3, 25), d.logs()
    assert guard_counts(d)[1] == 0, d.logs()
    assert_serving(d)


def test_pipelined_requests_answered_in_order(odd):
    data = b"".join(b"GET %s HTTP/1.1\r\nHost: t\r\nX-Request-Id: pipe-%d\r\n\r\n" % (p, i)
                    for i, p in enumerate([b"/health", b"/nope", b"/v1/models", b"/health"]))
    resps = split_responses(read_responses(odd.port, data, timeout=3))
    assert [r[0] for r in resps] == [200, 404, 200, 200], [r[0] for r in resps]
    assert [r[1]["x-request-id"] for r in resps] == ["pipe-%d" % i for i in range(4)]
    assert_json_error(*resps[1])


def test_content_length_shorter_than_the_body(odd):
    """The bytes after the declared body are read as the next request: the
    first gets its answer, the rest a JSON error (or, not being a request
    line at all, the connection is closed)."""
    body, _ = known_request()
    raw = json.dumps(body).encode()
    data = (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(raw)
            + raw + b"}}}garbage\r\n\r\n")
    resps = split_responses(read_responses(odd.port, data, timeout=3))
    assert resps[0][0] == 200, resps[0]
    assert len(resps) <= 2, resps
    for r in resps[1:]:
        assert_json_error(*r, want={400, 404, 405})
    data = (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % len(raw)
            + raw + b"} / HTTP/1.1\r\nHost: t\r\n\r\n")
    resps = split_responses(read_responses(odd.port, data, timeout=3))
    assert [r[0] for r in resps][:1] == [200] and len(resps) == 2, resps
    assert_json_error(*resps[1], want={404, 405})


def test_content_length_longer_than_the_body(odd):
    """A body that never arrives whole: the connection is closed at the body
    deadline, without an answer, and nothing else is disturbed."""
    data = b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 500\r\n\r\n{\"query\": [[1"
    t0 = time.monotonic()
    blob = read_responses(odd.port, data, timeout=20)
    assert blob == b"", blob[:300]
    assert time.monotonic() - t0 < 19, "the connection was not closed at the body deadline"
    assert_serving(odd)


# ---------------------------------------------------------------- JSON bombs

def b64_query(rows, width=16):
    return support.b64_tensor(np.ones((rows, width), dtype=np.float32))


# 2^28 * 2^27 * 2^9 = 2^64: every dimension passes its own check, the
# product wraps to 0 (the binary part it must match is empty); and three
# dimensions whose product passes 2^63 (signed overflow in a naive product)
WRAP = [268435456, 134217728, 512]
HUGE = [1000000000, 1000000000, 1000000000]


def json_bombs(width=16):
    """(name, body bytes, words the message must hold, any of which names the
    field; "ok" for a body that must be answered) for a native body whose
    rows are `width` wide."""
    zeros = b", 0" * (width - 1)
    return [
        ("deep_nesting_query", b'{"query": ' + b"[" * 100000 + b"]" * 100000 + b"}", ["query"]),
        ("deep_nesting_top", b"[" * 200000 + b"]" * 200000, []),
        ("deep_object", b'{"a":' * 50000 + b"1" + b"}" * 50000, []),
        ("number_1e999", b'{"query": [[1e999' + zeros + b"]]}", ["query"]),
        ("number_10k_digits", b'{"query": [[' + b"9" * 10000 + zeros + b"]]}", ["query"]),
        # a valid number however long: answered
        ("number_10k_fraction", b'{"query": [[0.' + b"1" * 10000 + zeros + b"]]}", "ok"),
        ("duplicate_keys", b'{"query": [[0' + zeros + b']], "query": [[1' + zeros + b"]]}",
         ["query"]),
        ("invalid_utf8", b'{"model": "\xff\xfe\xc0\x80", "query": [[0' + zeros + b"]]}", None),
        ("nul_in_string", b'{"model": "self\\u0000e16_h1", "query": [[0' + zeros + b"]]}",
         ["model"]),
        ("raw_nul_byte", b'{"query": [[0\x00' + zeros + b"]]}", None),
        ("b64_bad_padding", json.dumps({"query": {"shape": [1, width], "dtype": "float32",
                                                  "b64": "AAAA" * width + "A="}}).encode(),
         ["query"]),
        ("b64_bad_alphabet", json.dumps({"query": {"shape": [1, width], "dtype": "float32",
                                                   "b64": "!!!!" * width}}).encode(), ["query"]),
        ("b64_wrong_length", json.dumps({"query": {"shape": [2, width], "dtype": "float32",
                                                   "b64": b64_query(1, width)["b64"]}}).encode(),
         ["query"]),
        ("shape_overflow_b64", json.dumps({"query": {"shape": WRAP, "dtype": "float32",
                                                     "b64": ""}}).encode(),
         ["query.shape: too large"]),
        ("shape_overflow_huge", json.dumps({"query": {"shape": HUGE, "dtype": "float32",
                                                      "b64": "AAAA"}}).encode(),
         ["query.shape: too large"]),
        ("shape_negative", json.dumps({"query": {"shape": [-1, width], "dtype": "float32",
                                                 "b64": ""}}).encode(), ["query"]),
        ("huge_array_of_empties", b'{"query": [' + b"[]," * 200000 + b"[]]}", ["query"]),
        ("string_escapes", b'{"query": "' + b"\\ud800" * 20000 + b'"}', ["query"]),
    ]


JSON_BOMBS = json_bombs()


def v2_bombs(width=16):
    """The bombs as Open Inference Protocol bodies, where they fit one: the
    tensor in an input's data or shape, the strings in its name. (name,
    body, Inference-Header-Content-Length or None, words, as above)."""
    zeros = b", 0" * (width - 1)

    def one(data=b"[0" + zeros + b"]", shape=b"[1, %d]" % width, name=b'"query"', extra=b""):
        return (b'{"inputs": [{"name": ' + name + b', "shape": ' + shape +
                b', "datatype": "FP32", "data": ' + data + b"}]" + extra + b"}")

    binary = json.dumps({"inputs": [{"name": "query", "shape": WRAP, "datatype": "FP32",
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    return [
        ("deep_nesting_data", one(data=b"[" * 100000 + b"]" * 100000), None, ["inputs[0]"]),
        ("deep_nesting_top", b"[" * 200000 + b"]" * 200000, None, []),
        ("deep_parameters", one(extra=b', "parameters": ' + b'{"a":' * 50000 + b"1"
                                + b"}" * 50000), None, ["parameters"]),
        ("number_1e999", one(data=b"[1e999" + zeros + b"]"), None, ["inputs[0]"]),
        ("number_10k_digits", one(data=b"[" + b"9" * 10000 + zeros + b"]"), None, ["inputs[0]"]),
        ("number_10k_fraction", one(data=b"[0." + b"1" * 10000 + zeros + b"]"), None, "ok"),
        ("duplicate_keys", one(extra=b', "inputs": []'), None, ["inputs"]),
        ("duplicate_parameters", one(extra=b', "parameters": {"causal": true, "causal": true}'),
         None, ["parameters.causal"]),
        ("invalid_utf8", one(name=b'"\xff\xfe\xc0\x80"'), None, None),
        ("nul_in_string", one(name=b'"que\\u0000ry"'), None, ["inputs[0].name"]),
        ("raw_nul_byte", one(data=b"[0\x00" + zeros + b"]"), None, None),
        ("shape_overflow_json", one(shape=json.dumps(HUGE).encode(), data=b"[0]"), None,
         ["inputs[0] (query).shape: too large"]),
        ("shape_overflow_binary", binary, len(binary), ["inputs[0] (query).shape: too large"]),
        ("shape_negative", one(shape=b"[-1, %d]" % width), None, ["inputs[0].shape[0]"]),
        ("huge_array_of_empties", one(data=b"[" + b"[]," * 200000 + b"[]]"), None, ["inputs[0]"]),
        ("string_escapes", one(name=b'"' + b"\\ud800" * 20000 + b'"'), None, ["inputs[0].name"]),
    ]


V2_BOMBS = v2_bombs()


@pytest.fixture(scope="module")
def bombs(daemons):
    return daemons(small_config(max_body_bytes=4 << 20))


def assert_bomb_refused(d, r, words):
    """A 4xx (never a 500) with attnd's error body; the message names the
    field where one is to blame. Wording past that is not pinned."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    msg = check_error_body(r, r.status_code)
    if words:
        assert any(w in msg for w in words), "%r names none of %s" % (msg, words)
    assert d.alive()


@pytest.mark.parametrize("case", JSON_BOMBS, ids=[c[0] for c in JSON_BOMBS])
def test_json_bombs_get_4xx(bombs, case):
    """Each bomb to /v1/attention gets a 4xx with attnd's error body."""
    _, body, words = case
    r = requests.post(bombs.url + "/v1/attention", data=body, timeout=60,
                      headers={"Content-Type": "application/json"})
    if words == "ok":
        assert r.status_code == 200, r.text[:300]
        return
    assert_bomb_refused(bombs, r, words)


@pytest.mark.parametrize("case", V2_BOMBS, ids=[c[0] for c in V2_BOMBS])
def test_json_bombs_v2_get_4xx(bombs, case):
    """The same bombs as v2 infer bodies, JSON or with the binary data
    extension."""
    _, body, json_len, words = case
    headers = {"Content-Type": "application/json"}
    if json_len is not None:
        headers["Inference-Header-Content-Length"] = str(json_len)
    r = requests.post(bombs.url + "/v2/models/%s/infer" % SMALL, data=body, timeout=60,
                      headers=headers)
    if words == "ok":
        assert r.status_code == 200, r.text[:300]
        return
    assert_bomb_refused(bombs, r, words)


DEC = "gqa_half"  # a decoder model: E = 64, grouped key/value heads, rotary positions


@pytest.fixture(scope="module")
def session_bombs(daemons):
    dec = support.GOLDEN_DIR / "decoder"
    g = json.loads((dec / (DEC + ".json")).read_text())
    cfg = dict(g["config"], weights=str(dec / g["config"]["weights"]))
    return daemons({"server": {"max_body_bytes": 4 << 20}, "models": [cfg]})


def session_gauge(d):
    return sum(v for n, _, v in support.parse_prometheus(d.get("/metrics").text)[1]
               if n == "attnd_sessions")


SESSION_BOMBS = json_bombs(64)


@pytest.mark.parametrize("case", SESSION_BOMBS, ids=[c[0] for c in SESSION_BOMBS])
def test_json_bombs_session_open_get_4xx(session_bombs, case):
    """The bombs as bodies of POST /v1/sessions against a decoder model: a
    4xx, and no session is left open by one."""
    d = session_bombs
    _, body, words = case
    r = requests.post(d.url + "/v1/sessions", data=body, timeout=60,
                      headers={"Content-Type": "application/json"})
    if words == "ok":
        assert r.status_code == 201, r.text[:300]
        assert d.request("DELETE", "/v1/sessions/" + r.json()["session"]).status_code == 204
    else:
        assert_bomb_refused(d, r, words)
    assert session_gauge(d) == 0


def test_body_far_over_the_limit_refused_before_it_is_read(bombs):
    """A declared 1 GiB body is refused with 413 at once: the answer comes
    while the client has sent only its header lines."""
    s = socket.create_connection(("127.0.0.1", bombs.port), timeout=10)
    s.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
              b"Content-Length: 1073741824\r\n\r\n")
    blob = b""
    while b"\r\n\r\n" not in blob:
        c = s.recv(65536)
        if not c:
            break
        blob += c
    s.close()
    assert blob.startswith(b"HTTP/1.1 413"), blob[:200]


def test_zz_bombs_left_the_daemon_serving(bombs, session_bombs):
    assert_serving(bombs)
    g = json.loads((support.GOLDEN_DIR / "decoder" / (DEC + ".json")).read_text())
    q = g["sequences"][0]["query"]
    r = session_bombs.post("/v1/sessions", {"query": q[:3]})
    assert r.status_code == 201, r.text[:300]
    assert support.rel_err(np.float32(r.json()["output"]), g["sequences"][0]["output"][:3]) <= 1e-5


# ---------------------------------------------------------------- isolation

def garbage(i):
    g = [b"{", b"[]", b'{"query": 5}', b'{"query": [[1, 2], [3]]}', b'{"query": [["a"]]}',
         b'{"query": [[NaN]]}', b'{"model": "nope", "query": [[0]]}', b"\xff" * 50,
         b'{"query": [[1e39' + b", 0" * 15 + b"]]}",
         b'{"query": [[3e38' + b", 3e38" * 15 + b']], "attention": "heads"}',
         b'{"query": [[0' + b", 0" * 15 + b']], "attn_mask": [[1e38]], "causal": 7}',
         b'{"query": {"shape": [1, 16], "dtype": "float16", "b64": ""}}',
         JSON_BOMBS[0][1][:5000]]
    return g[i % len(g)]


def test_isolation_garbage_never_changes_an_answer_nor_gets_500(fresh_daemons):
    """Valid requests with known answers, sent alone and then interleaved
    from several threads with garbage: bit-identical answers, whatever
    shared their batch (docs/performance.md, "Batch invariance"), and every
    garbage body a 4xx, never a 500."""
    # Threads 0 and 2 send the valid requests, one at a time each. A batch
    # of two starts as soon as both are queued and a lone request waits up
    # to 200 ms for the other, so batches form whatever the build's speed
    # (an ASan build on a busy machine once formed none by chance alone).
    cfg = small_config()
    cfg["batching"] = {"max_batch_requests": 2, "max_queue_delay_us": 200000}
    d = fresh_daemons(cfg)
    g, _ = GOLDENS[SMALL]
    bodies = [support.golden_body(s, SMALL) for s in g["sequences"]]
    alone = [d.post("/v1/attention", b).json()["output"] for b in bodies]
    n = 120 if SAN else 400
    errors, mismatch, batched = [], [], []

    def worker(k):
        sess = requests.Session()
        for i in range(k, n, 4):
            if i % 2:
                r = sess.post(d.url + "/v1/attention", data=garbage(i), timeout=60)
                if not 400 <= r.status_code < 500:
                    errors.append((i, r.status_code, r.text[:200]))
            else:
                j = (i // 2) % len(bodies)
                r = sess.post(d.url + "/v1/attention", data=json.dumps(bodies[j]), timeout=60)
                if r.status_code != 200:
                    errors.append((i, r.status_code, r.text[:200]))
                    continue
                doc = r.json()
                # the text of float32s read back exactly: equal lists, equal bits
                if doc["output"] != alone[j]:
                    diff = support.rel_err(np.array(doc["output"]), np.array(alone[j]))
                    mismatch.append((j, doc["usage"].get("batch"), diff))
                batched.append(doc["usage"].get("batch", 1))
    ts = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(300)
    assert not errors, errors[:10]
    assert not mismatch, "answers not bit-identical (body, batch, rel. error): %s" % mismatch[:10]
    print("batch sizes of the valid answers: %s" % sorted(set(batched)))
    assert max(batched) >= 2, "no valid request shared a batch: invariance was not exercised"
    for j, b in enumerate(bodies):
        ref = np.array(g["sequences"][j]["output"])
        assert support.rel_err(np.array(d.post("/v1/attention", b).json()["output"]), ref) <= 1e-5


# ---------------------------------------------------------------- memory

def vm_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError("no %s for pid %d" % (field, pid))


def test_declared_body_sizes_commit_no_memory(fresh_daemons):
    """200 connections each declare a 60 MB body and send one byte: the
    daemon's memory follows the bytes that arrived, not the declarations
    (that used to be 16 MiB reserved each)."""
    d = fresh_daemons(small_config())
    before = vm_kb(d.proc.pid, "VmSize")
    socks = []
    for _ in range(200):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=5)
        s.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 60000000\r\n\r\n{")
        socks.append(s)
    d.get("/health")  # every connection's header lines have been read by now
    time.sleep(0.5)
    grown_mb = (vm_kb(d.proc.pid, "VmSize") - before) / 1024
    for s in socks:
        s.close()
    # 200 x (64 KiB reserve + libmicrohttpd's 32 KiB per connection) is 19 MB
    assert grown_mb < 200, "virtual memory grew by %.0f MB for 200 one-byte bodies" % grown_mb
    assert_serving(d)


def test_body_budget_429_with_retry_after(fresh_daemons):
    """server.max_buffered_body_bytes bounds the bodies held at once: a
    body that does not fit is refused with 429 + Retry-After, small ones
    still pass, and the budget comes back when the holder leaves."""
    d = fresh_daemons(small_config(max_body_bytes=4 << 20, max_buffered_body_bytes=1 << 20,
                                   body_timeout_ms=60000))
    hog = socket.create_connection(("127.0.0.1", d.port), timeout=10)
    hog.sendall(b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n"
                + b" " * 900000)
    time.sleep(0.5)
    assert_serving(d)  # a small body still fits
    r = d.post("/v1/attention", data=b" " * 300000,
               headers={"Content-Type": "application/json"})
    msg = check_error_body(r, 429)
    assert r.headers.get("Retry-After"), r.headers
    assert "max_buffered_body_bytes" in msg, msg
    # a chunked body (no declaration) is refused when its bytes pass the budget
    r = requests.post(d.url + "/v1/attention", data=iter([b" " * 100000] * 3), timeout=30,
                      headers={"Content-Type": "application/json"})
    check_error_body(r, 429)
    hog.close()
    # the holder left: its bytes are given back
    assert support.wait_until(
        lambda: d.post("/v1/attention", data=b" " * 300000).status_code == 400, 10)
    assert_serving(d)


# ---------------------------------------------------------------- limits

LIM_E, LIM_H = 128, 4
LIM_BODY = 8 << 20
LIM_TOKENS = 4096
LIM_ATT = 1 << 21
# What a request may cost on top of what it was admitted with: allocator
# slack, the threads' stacks and tiles, BLAS buffers (docs/config.md,
# "Memory"). AddressSanitizer keeps freed memory in quarantine (256 MiB by
# default), so its builds get that much more.
OVERHEAD = (16 << 20) + ((320 << 20) if SAN else 0)
# What reading a refused request may cost beyond its body and its numbers:
# the reader's growing arrays and allocator slack (ASan: its quarantine).
REFUSED_SLACK = (2 << 20) + ((320 << 20) if SAN else 0)


@pytest.fixture(scope="module")
def lim_model(tmp_path_factory):
    m = support.Model.random("lim", LIM_E, LIM_H, seed=23)
    m.save(tmp_path_factory.mktemp("lim") / "lim.safetensors")
    return m


def admitted_bytes(body_len, L, S, att_floats, answer_len):
    """What one request at the limits is admitted with, bytes: its body, its
    decoded query and key (4 bytes a float), the core's scratch for its
    tokens (the (T, 3E) projections, the (T, E) context and output), its
    attention floats and its answer."""
    T = L + S
    return body_len + 4 * (L + S) * LIM_E + 4 * T * 5 * LIM_E + 4 * att_floats + answer_len


LIMIT_CASES = [
    # name, L (query rows), S (key rows, 0 = self), attention, padding bytes
    ("body_bytes", 64, 0, "none", LIM_BODY - 200000),
    ("tokens", LIM_TOKENS // 2, LIM_TOKENS // 2, "none", 0),
    ("attention_mean", 1448, 1448, "mean", 0),
    ("attention_heads", 724, 724, "heads", 0),
]


@pytest.mark.parametrize("case", LIMIT_CASES, ids=[c[0] for c in LIMIT_CASES])
def test_request_at_each_limit_stays_within_what_was_admitted(fresh_daemons, lim_model, case):
    """One request just past each documented limit is refused with 413
    before the memory it asks for is spent: the daemon's peak RSS grows by
    less than what the request would cost (at most what it took to read it,
    and nothing for a declared body over the limit). Then a request at the
    limit is answered, and the peak grows by at most what that request was
    admitted with, plus a fixed overhead."""
    name, L, S, attention, pad = case
    d = fresh_daemons({"models": [lim_model.config()],
                       "server": {"max_body_bytes": LIM_BODY},
                       "limits": {"max_tokens_per_request": LIM_TOKENS,
                                  "max_attention_floats": LIM_ATT},
                       "workers": {"threads": 1}, "batching": {"max_batch_requests": 1}})
    rng = np.random.default_rng(4)
    q = rng.standard_normal((L, LIM_E)).astype(np.float32)
    body = {"query": support.b64_tensor(q), "attention": attention, "encoding": "base64"}
    if S:
        body["key"] = support.b64_tensor(rng.standard_normal((S, LIM_E)).astype(np.float32))
    raw = json.dumps(body).encode()
    raw = raw[:-1] + b" " * max(0, pad - len(raw)) + b"}"
    assert len(raw) <= LIM_BODY
    # one past the limit: (its body, query rows, key rows, attention floats)
    if name == "body_bytes":
        over = raw[:-1] + b" " * (LIM_BODY - len(raw) + 1) + b"}"
        oL, oS = L, 0
    elif name == "tokens":
        over_body = dict(body, query=support.b64_tensor(np.zeros((L + 1, LIM_E), np.float32)))
        over, oL, oS = json.dumps(over_body).encode(), L + 1, S
    else:
        over_body = dict(body, query=support.b64_tensor(np.zeros((L + 1, LIM_E), np.float32)),
                         key=support.b64_tensor(np.zeros((S + 1, LIM_E), np.float32)))
        over, oL, oS = json.dumps(over_body).encode(), L + 1, S + 1
    o_att = {"none": 0, "mean": oL * max(oS, oL), "heads": LIM_H * oL * max(oS, oL)}[attention]
    warm = d.post("/v1/attention", {"query": support.b64_tensor(q[:8])})
    assert warm.status_code == 200

    before = support.vm_hwm_bytes(d.proc.pid)
    r = d.post("/v1/attention", data=over, headers={"Content-Type": "application/json"})
    check_error_body(r, 413)
    grew = support.vm_hwm_bytes(d.proc.pid) - before
    # a declared body over the limit is never read; any other is read and
    # decoded (4 bytes a number) and refused before its compute
    read = 0 if name == "body_bytes" else len(over) + 4 * (oL + oS) * LIM_E
    cost = admitted_bytes(len(over), oL, oS, o_att, 0)
    bound = read + REFUSED_SLACK
    if not SAN:  # the check can tell a refusal from a request served (not with ASan's slack)
        assert bound < cost, (bound, cost)
    print("%s past the limit: peak RSS grew %.1f MiB, bound %.1f MiB, served it would cost "
          "%.1f MiB" % (name, grew / 2 ** 20, bound / 2 ** 20, cost / 2 ** 20))
    assert grew <= bound, "%s: a refused request grew the peak RSS by %.1f MiB (bound %.1f)" % (
        name, grew / 2 ** 20, bound / 2 ** 20)

    before = support.vm_hwm_bytes(d.proc.pid)
    r = d.post("/v1/attention", data=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text[:300]
    grew = support.vm_hwm_bytes(d.proc.pid) - before
    att = {"none": 0, "mean": L * max(S, L), "heads": LIM_H * L * max(S, L)}[attention]
    assert att <= LIM_ATT
    bound = admitted_bytes(len(raw), L, S, att, len(r.content)) + OVERHEAD
    print("%s: peak RSS grew %.1f MiB, bound %.1f MiB" % (name, grew / 2 ** 20, bound / 2 ** 20))
    assert grew <= bound, "%s: peak RSS grew %.1f MiB, more than the %.1f MiB admitted" % (
        name, grew / 2 ** 20, bound / 2 ** 20)
    assert_serving_model(d, lim_model)


def assert_serving_model(d, m):
    q = np.random.default_rng(9).standard_normal((3, m.E)).astype(np.float32)
    r = d.post("/v1/attention", {"query": support.tolist32(q)})
    assert r.status_code == 200, r.text[:300]
    ref, _ = m.forward(q)
    assert support.rel_err(np.array(r.json()["output"]), ref) <= 1e-5


def queue_depth(d):
    text = d.get("/metrics", timeout=10).text
    return sum(v for n, _, v in support.parse_prometheus(text)[1] if n == "attnd_queue_depth")


def test_full_queue_refused_before_the_body_is_read(fresh_daemons, tmp_path):
    """With the model's queue full, a request declaring a large body gets 429
    with Retry-After as soon as its header lines are in: its body is never
    read nor decoded. The queue is held full by a request that waits there
    for company (batches of 2, a 10 s delay), not by compute, so no CPU is
    fast enough to empty it before the test looks; SIGTERM then ends the
    wait (a draining daemon waits for no company) and it is answered."""
    m = support.Model.random("slow", 512, 8, seed=31)
    m.save(tmp_path / "slow.safetensors")
    d = fresh_daemons({"models": [m.config()],
                       "server": {"max_body_bytes": 64 << 20, "request_timeout_ms": 300000},
                       "batching": {"max_batch_requests": 2, "max_queue_delay_us": 10000000,
                                    "max_queue_requests": 1}})
    body = json.dumps({"query": np.random.default_rng(2).standard_normal((4, 512)).tolist()})
    results = []

    def send():
        try:
            results.append(requests.post(d.url + "/v1/attention", data=body, timeout=60,
                                         headers={"Content-Type": "application/json"}).status_code)
        except requests.RequestException as e:
            results.append(repr(e))
    t = threading.Thread(target=send)
    t.start()
    try:
        assert support.wait_until(lambda: queue_depth(d) >= 1, 30), "the queue never filled"
        s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
        s.sendall(b"POST /v1/models/slow/attention HTTP/1.1\r\nHost: t\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            c = s.recv(65536)
            if not c:
                break
            head += c
        s.close()
        assert head.startswith(b"HTTP/1.1 429"), head[:300]
        assert re.search(rb"(?im)^retry-after:", head), head[:300]
        assert queue_depth(d) == 1, "the waiting request left the queue before the refusal was checked"
    finally:
        code = d.stop()
        t.join(60)
    assert results == [200], results
    assert code == 0


# ---------------------------------------------------------------- lingering

def send_whole_then_read(port, body, out):
    """One client as Python's http.client is: it sends its whole body, and
    only then reads. Appends (status, Retry-After) or the exception's name."""
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        c.request("POST", "/v1/attention", body=body,
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        r.read()
        out.append((r.status, r.getheader("Retry-After")))
        c.close()
    except Exception as e:  # noqa: BLE001 - the kind of failure is the finding
        out.append(type(e).__name__)


def burst(port, body, n):
    out, go = [], threading.Barrier(n)

    def one():
        go.wait(30)
        send_whole_then_read(port, body, out)
    ts = [threading.Thread(target=one) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    return out


def padded_body(mb):
    """A valid small request for the golden model, padded with JSON
    whitespace to `mb` MiB: what it costs to send, not to compute."""
    body, _ = known_request()
    text = json.dumps(body).encode()
    return text[:-1] + b" " * ((mb << 20) - len(text)) + b"}"


# Refusals at the header lines, each with what makes it: a model's queue
# held full (two requests waiting for company in batches of 3), the body
# budget smaller than one body, a body limit smaller than one body.
EARLY_REFUSALS = [
    ("queue_full", {"server": {"request_timeout_ms": 300000},
                    "batching": {"max_batch_requests": 3, "max_queue_delay_us": 10000000,
                                 "max_queue_requests": 2}}, {200, 429}),
    ("body_budget", {"server": {"max_buffered_body_bytes": 1 << 20}}, {429}),
    ("too_large", {"server": {"max_body_bytes": 1 << 20}}, {413}),
]


@pytest.mark.parametrize("case", EARLY_REFUSALS, ids=[c[0] for c in EARLY_REFUSALS])
def test_early_refusal_heard_by_clients_that_send_before_reading(fresh_daemons, case):
    """40 clients at once, each as Python's http.client (send the whole
    5 MiB body, then read), against a daemon that refuses them at their
    header lines: each one reads a status line (429 with Retry-After, or
    413), none gets a broken pipe or a reset. Closing with the body unread
    resets the connection under a client still sending; attnd reads and
    drops the rest of the body first (docs/config.md, "Connections")."""
    _, sections, want = case
    cfg = small_config()
    for k, v in sections.items():
        cfg.setdefault(k, {}).update(v)
    d = fresh_daemons(cfg)
    held, hs = [], []
    if "batching" in sections:
        small = json.dumps(known_request()[0]).encode()
        hs = [threading.Thread(target=send_whole_then_read, args=(d.port, small, held))
              for _ in range(2)]
        for t in hs:
            t.start()
        assert support.wait_until(lambda: queue_depth(d) >= 2, 30), "the queue never filled"
    try:
        out = burst(d.port, padded_body(5), 40)
    finally:
        code = d.stop()  # a draining daemon waits for no company: the held two are answered
        for t in hs:
            t.join(60)
    assert code == 0
    assert held == [(200, None)] * len(hs), held
    failed = [r for r in out if not isinstance(r, tuple)]
    assert not failed, "%d of 40 clients got no answer: %s" % (len(failed), sorted(set(failed)))
    assert {s for s, _ in out} <= want, out
    assert all(ra for s, ra in out if s == 429), "a 429 without Retry-After: %s" % out
    if want != {200, 429}:
        return
    assert sum(s == 429 for s, _ in out) >= 30, "the queue was not full for the burst: %s" % out
    assert re.search(r"status=429 .* end=ok", d.stdout()), d.stdout()[-2000:]


def test_refused_body_is_read_only_within_the_linger_bounds(fresh_daemons):
    """After a refusal at the header lines, the body is read for a bounded
    time only: a client that stops sending is cut within seconds (the
    60 s body deadline never comes into it), logged status=408
    end=linger_timeout; a client that asks `Expect: 100-continue` gets its
    429 at once, with no 100 Continue; one that declares more than the
    linger reads gets it at once too; the daemon serves on."""
    d = fresh_daemons(small_config(max_buffered_body_bytes=1 << 20, body_timeout_ms=60000))
    head = (b"POST /v1/attention HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n")
    slow = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    slow.sendall(head % (4 << 20) + b"\r\n" + b" " * 100000)
    assert closed_by_server(slow, 20), "a stalled refused body held its connection 20 s"
    slow.close()
    assert support.wait_until(lambda: "end=linger_timeout" in d.stdout(), 10), d.stdout()[-2000:]
    assert re.search(r"status=408 .*end=linger_timeout", d.stdout()), d.stdout()[-2000:]
    for extra in (b"Expect: 100-continue\r\n", b""):
        size = (4 << 20) if extra else (32 << 20)  # past the 16 MiB the linger reads
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall(head % size + extra + b"\r\n")
        blob = b""
        while b"\r\n\r\n" not in blob:
            c = s.recv(65536)
            if not c:
                break
            blob += c
        s.close()
        assert blob.startswith(b"HTTP/1.1 429"), blob[:200]
        assert re.search(rb"(?im)^retry-after:", blob), blob[:300]
    assert_serving(d)
