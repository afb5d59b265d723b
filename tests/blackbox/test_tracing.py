"""Traces (SPEC section 11) against the real daemon: W3C Trace Context on
every route (the caller's traceparent continued with the request's own
span id in the answer and in the access log, text and JSON; a malformed or
repeated one ignored and a new trace started), and OTLP/HTTP JSON export to
a real OpenTelemetry Collector (build/otelcol/otelcol from `make otelcol`,
ATTND_OTELCOL): its file exporter's output holds each request's span with
the client's span as parent, its name, kind and attributes, and its queue
and compute children; a collector that is down or hangs costs the requests
nothing and its spans are counted as failed or dropped in /metrics."""
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

import support
from support import parse_prometheus

TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-(0[01])")
CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
WAIT_S = 60  # the longest a wait for the collector's file lasts before it fails
OTELCOL = Path(os.environ.get("ATTND_OTELCOL", str(support.REPO / "build/otelcol/otelcol")))
QUERY = {"query": [[0.25] * 512, [-0.5] * 512]}


def answer_trace(r):
    m = TRACEPARENT.fullmatch(r.headers.get("traceparent", ""))
    assert m, "no valid traceparent in the answer: %r" % r.headers.get("traceparent")
    return m.group(1), m.group(2), m.group(3)


def caller(trace=CALLER_TRACE, span=CALLER_SPAN, flags="01", state=None):
    h = {"traceparent": "00-%s-%s-%s" % (trace, span, flags)}
    if state is not None:
        h["tracestate"] = state
    return h


def access_lines(d, rid):
    """The access log lines of request id rid (waits for the line: it is
    written when the request completes)."""
    until = time.monotonic() + 10
    while time.monotonic() < until:
        lines = [ln for ln in d.stdout().splitlines() if rid in ln and "path=" in ln or
                 ('"id":"%s"' % rid) in ln]
        if lines:
            return lines
        time.sleep(0.05)
    raise AssertionError("no access line for %s:\n%s" % (rid, d.stdout()[-3000:]))


@pytest.fixture(scope="module")
def d(daemons):
    return daemons()


@pytest.mark.parametrize("method,path,body,status", [
    ("POST", "/v1/attention", QUERY, 200),
    ("GET", "/health", None, 200),
    ("GET", "/metrics", None, 200),
    ("GET", "/v2/health/live", None, 200),
    ("GET", "/no/such/route", None, 404),
    ("DELETE", "/v1/attention", None, 405),
    ("POST", "/v1/attention", {"query": [[1, 2], [3]]}, 400),
])
def test_traceparent_continued_on_every_route(d, method, path, body, status):
    """The answer's traceparent keeps the caller's trace id and flags, with
    a span id of the request's own; the access log line carries both ids.
    Each case has its own request id: the access line is written after the
    answer is sent, so a shared id could find an earlier case's line."""
    rid = "trace-%s%s-%d" % (method.lower(), path.replace("/", "-"), status)
    r = d.request(method, path, json=body, headers=dict(caller(), **{"X-Request-Id": rid}))
    assert r.status_code == status, r.text[:200]
    trace, span, flags = answer_trace(r)
    assert trace == CALLER_TRACE and flags == "01"
    assert span != CALLER_SPAN and span != "0" * 16
    line = access_lines(d, rid)[-1]
    assert "trace_id=%s span_id=%s" % (trace, span) in line, line


def test_unsampled_flag_kept(d):
    r = d.get("/health", headers=caller(flags="00"))
    assert answer_trace(r)[0] == CALLER_TRACE and answer_trace(r)[2] == "00"


@pytest.mark.parametrize("bad", [
    "00-%s-%s-01" % (CALLER_TRACE.upper(), CALLER_SPAN),    # uppercase hex
    "00-%s-%s-01" % ("0" * 32, CALLER_SPAN),                # all-zero trace id
    "00-%s-%s-01" % (CALLER_TRACE, "0" * 16),               # all-zero parent id
    "ff-%s-%s-01" % (CALLER_TRACE, CALLER_SPAN),            # version ff
    "00-%s-%s-01" % (CALLER_TRACE[:-1], CALLER_SPAN),       # short trace id
    "00-%s-%s-01-extra" % (CALLER_TRACE, CALLER_SPAN),      # version 00 has nothing after
    "garbage",
])
def test_malformed_traceparent_starts_a_new_trace(d, bad):
    r = d.post("/v1/attention", QUERY, headers={"traceparent": bad})
    assert r.status_code == 200
    trace, span, flags = answer_trace(r)
    assert trace != CALLER_TRACE and trace != "0" * 32 and flags == "01"


def test_traceparent_given_twice_starts_a_new_trace(d):
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=support.HTTP_TIMEOUT)
    c.putrequest("GET", "/health")
    c.putheader("traceparent", "00-%s-%s-01" % (CALLER_TRACE, CALLER_SPAN))
    c.putheader("traceparent", "00-%s-%s-01" % (CALLER_TRACE, "1" * 16))
    c.endheaders()
    r = c.getresponse()
    r.read()
    m = TRACEPARENT.fullmatch(r.getheader("traceparent") or "")
    assert r.status == 200 and m and m.group(1) != CALLER_TRACE
    c.close()


def test_whitespace_around_header_values_is_not_the_value(d):
    """HTTP does not count the spaces and tabs around a field value as the
    value (RFC 9110, 5.5): a traceparent or a Request-Timeout-Ms that a
    proxy sent with trailing blanks is read as without them."""
    tp = "00-%s-%s-01" % (CALLER_TRACE, CALLER_SPAN)
    for pad in (" ", "\t ", "  "):
        with socket.create_connection(("127.0.0.1", d.port), timeout=support.HTTP_TIMEOUT) as s:
            s.sendall(("GET /health HTTP/1.1\r\nHost: x\r\ntraceparent: %s%s\r\n"
                       "Request-Timeout-Ms: 5000%s\r\nConnection: close\r\n\r\n"
                       % (tp, pad, pad)).encode())
            got = b""
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                got += chunk
        head = got.split(b"\r\n\r\n")[0].decode()
        assert head.startswith("HTTP/1.1 200"), head
        m = re.search(r"(?im)^traceparent: (\S+)", head)
        assert m and TRACEPARENT.fullmatch(m.group(1)).group(1) == CALLER_TRACE, head
    r = d.post("/v1/attention", QUERY, headers={"Request-Timeout-Ms": "5000 "})
    assert r.status_code == 200, r.text[:300]


def test_no_traceparent_gets_a_new_trace_each(d):
    ids = {answer_trace(d.get("/health"))[0] for _ in range(5)}
    assert len(ids) == 5


def test_json_access_log_carries_the_ids(daemons):
    j = daemons(args=["--log-format", "json"])
    r = j.get("/health", headers=dict(caller(), **{"X-Request-Id": "json-trace-1"}))
    trace, span, _ = answer_trace(r)
    line = access_lines(j, "json-trace-1")[-1]
    rec = json.loads(line)
    assert rec["trace_id"] == trace == CALLER_TRACE and rec["span_id"] == span, rec


def test_trace_metrics_present_without_export(d):
    """With no collector set, the span counters are there, at 0."""
    _, samples = parse_prometheus(d.get("/metrics").text)
    got = {n: v for n, _, v in samples if n.startswith("attnd_trace_")}
    assert got == {"attnd_trace_spans_exported_total": 0, "attnd_trace_spans_dropped_total": 0,
                   "attnd_trace_spans_failed_total": 0, "attnd_trace_export_batches_total": 0,
                   "attnd_trace_spans_queued": 0}, got


# ---------------------------------------------------------------- the collector

class Collector:
    """The OpenTelemetry Collector of `make otelcol`: its OTLP/HTTP receiver
    on a free port of 127.0.0.1, its file exporter writing what it received
    as JSON lines."""

    def __init__(self, workdir):
        assert OTELCOL.exists(), "%s is missing: run make otelcol" % OTELCOL
        self.dir = Path(workdir)
        self.port = support.free_port()
        self.out = self.dir / "spans.jsonl"
        self.url = "http://127.0.0.1:%d/v1/traces" % self.port
        cfg = self.dir / "otelcol.yaml"
        cfg.write_text(
            "receivers:\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:%d\n"
            "exporters:\n  file:\n    path: %s\n    flush_interval: 100ms\n"
            "service:\n  telemetry:\n    metrics:\n      level: none\n    logs:\n"
            "      level: warn\n  pipelines:\n    traces:\n      receivers: [otlp]\n"
            "      exporters: [file]\n" % (self.port, self.out))
        self.log = open(self.dir / "otelcol.log", "wb")
        self.proc = subprocess.Popen([str(OTELCOL), "--config=file:%s" % cfg], stdout=self.log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        until = time.monotonic() + WAIT_S
        while True:
            assert self.proc.poll() is None, (self.dir / "otelcol.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < until, "the collector did not listen"
                time.sleep(0.05)

    def spans(self):
        """Every span received, by span id: (span, resource attributes)."""
        out = {}
        if not self.out.exists():
            return out
        for line in self.out.read_text().splitlines():
            try:
                doc = json.loads(line)
            except ValueError:
                continue  # a line still being written
            for rs in doc.get("resourceSpans", []):
                res = attrs(rs.get("resource", {}))
                for ss in rs.get("scopeSpans", []):
                    for sp in ss.get("spans", []):
                        out[sp["spanId"]] = (sp, res)
        return out

    def wait_for(self, pred, what):
        until = time.monotonic() + WAIT_S
        while time.monotonic() < until:
            found = pred(self.spans())
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError("the collector never received %s; it has %d spans"
                             % (what, len(self.spans())))

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def attrs(obj):
    """OTLP attributes as a plain dict: strings as str, ints as int."""
    out = {}
    for a in obj.get("attributes", []):
        v = a["value"]
        out[a["key"]] = int(v["intValue"]) if "intValue" in v else v.get("stringValue")
    return out


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    c = Collector(tmp_path_factory.mktemp("otelcol"))
    yield c
    c.stop()


def test_spans_reach_a_real_collector(daemons, collector):
    """Each request's span reaches the collector with the client's span as
    parent, the name of its route, kind SERVER, its attributes; the queue
    and compute children hang under it; an error's span says so."""
    d = daemons({"tracing": {"otlp_endpoint": collector.url, "queue_spans": 256}})
    r = d.post("/v1/attention", QUERY, headers=dict(caller(), **{"X-Request-Id": "otlp-1"}))
    assert r.status_code == 200
    _, span, _ = answer_trace(r)
    bad_trace = "%032x" % 0xabc
    r2 = d.post("/v1/models/nope/attention", QUERY, headers=caller(trace=bad_trace))
    assert r2.status_code == 404
    _, span2, _ = answer_trace(r2)

    def mine(spans):
        kids = [s for s, _ in spans.values() if s.get("parentSpanId") == span]
        return (spans[span], kids) if span in spans and len(kids) == 2 and span2 in spans \
            else None
    (sp, res), kids = collector.wait_for(mine, "the request span and its two children")
    assert sp["traceId"] == CALLER_TRACE and sp["parentSpanId"] == CALLER_SPAN
    assert sp["name"] == "POST /v1/attention" and sp["kind"] == 2
    a = attrs(sp)
    assert a["http.request.method"] == "POST" and a["url.path"] == "/v1/attention"
    assert a["http.route"] == "/v1/attention" and a["http.response.status_code"] == 200
    assert a["attnd.model"] == "default" and a["attnd.request_id"] == "otlp-1"
    assert a["attnd.batch_size"] >= 1 and a["attnd.compute_us"] >= 0
    assert res["service.name"] == "attnd" and res["service.version"]
    assert int(sp["startTimeUnixNano"]) <= int(sp["endTimeUnixNano"])
    by_name = {k["name"]: k for k in kids}
    assert set(by_name) == {"queue", "compute"}
    for k in kids:
        assert k["traceId"] == CALLER_TRACE and k["kind"] == 1
        assert int(sp["startTimeUnixNano"]) <= int(k["startTimeUnixNano"])
        assert int(k["endTimeUnixNano"]) <= int(sp["endTimeUnixNano"])
    assert attrs(by_name["compute"])["attnd.model"] == "default"
    assert int(by_name["queue"]["endTimeUnixNano"]) <= int(by_name["compute"]["endTimeUnixNano"])
    sp2, _ = collector.spans()[span2]
    assert sp2["traceId"] == bad_trace and sp2["name"] == "POST /v1/models/{name}/attention"
    assert attrs(sp2)["http.response.status_code"] == 404
    _, samples = parse_prometheus(d.get("/metrics").text)
    got = {n: v for n, _, v in samples if n.startswith("attnd_trace_")}
    assert got["attnd_trace_spans_exported_total"] >= 4 and got["attnd_trace_spans_failed_total"] \
        == 0, got


def test_session_routes_traced_by_template(daemons, collector):
    """A session step's span is named by its route's template, not its id."""
    dec = support.GOLDEN_DIR / "decoder"
    g = json.loads((dec / "gqa_half.json").read_text())
    cfg = dict(g["config"], weights=str(dec / g["config"]["weights"]))
    d = daemons({"models": [cfg], "tracing": {"otlp_endpoint": collector.url}})
    E = g["embed_dim"]
    sid = d.post("/v1/sessions", {"query": [[0.1] * E]}).json()["session"]
    r = d.post("/v1/sessions/%s/attention" % sid, {"query": [[0.2] * E]}, headers=caller())
    _, span, _ = answer_trace(r)
    sp, _ = collector.wait_for(lambda s: s.get(span), "the session step's span")
    assert sp["name"] == "POST /v1/sessions/{id}/attention", sp["name"]
    assert attrs(sp)["url.path"] == "/v1/sessions/%s/attention" % sid


def test_collector_down_costs_requests_nothing(daemons):
    """A collector that refuses connections: every request is answered, its
    spans counted as failed, the failure logged (once, not per request)."""
    port = support.free_port()  # nothing listens there
    d = daemons({"tracing": {"otlp_endpoint": "http://127.0.0.1:%d/v1/traces" % port}})
    for _ in range(20):
        assert d.post("/v1/attention", QUERY).status_code == 200
    until = time.monotonic() + WAIT_S
    while time.monotonic() < until:
        _, samples = parse_prometheus(d.get("/metrics").text)
        got = {n: v for n, _, v in samples if n.startswith("attnd_trace_")}
        if got["attnd_trace_spans_failed_total"] >= 60:
            break
        time.sleep(0.1)
    assert got["attnd_trace_spans_failed_total"] >= 60 and \
        got["attnd_trace_spans_exported_total"] == 0, got
    failures = [ln for ln in d.stdout().splitlines() if "otlp: export to" in ln]
    assert len(failures) == 1, failures


def test_hung_collector_drops_what_overflows(daemons, tmp_path):
    """A collector that takes the connection and never answers holds the
    exporter's thread; requests are still all answered, and the spans that
    find the queue (16 spans) full are dropped and counted."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])  # read nothing, answer nothing
            except OSError:
                pass
    t = threading.Thread(target=accept)
    t.start()
    try:
        url = "http://127.0.0.1:%d/v1/traces" % srv.getsockname()[1]
        d = daemons({"tracing": {"otlp_endpoint": url, "queue_spans": 16}})
        for _ in range(40):
            assert d.post("/v1/attention", QUERY).status_code == 200
        _, samples = parse_prometheus(d.get("/metrics").text)
        got = {n: v for n, _, v in samples if n.startswith("attnd_trace_")}
        assert got["attnd_trace_spans_dropped_total"] > 0, got
        assert got["attnd_trace_spans_exported_total"] == 0, got
        assert d.stop() == 0  # the exporter's shutdown is bounded: the drain still ends
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        srv.close()
