"""Life of the daemon (SPEC sections 4 and 5): drain on SIGTERM and SIGINT,
overload (429 + Retry-After), deadlines (504, dropped before compute),
X-Request-Id and Server-Timing, /metrics as Prometheus text, CORS, and a
client that leaves while its request is queued."""
import json
import re
import signal
import socket
import threading
import time

import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

import support
from support import b64_tensor, check_error_body, from_b64_tensor, rel_err

GOLDENS = {g["name"]: (g, m) for g, m in support.load_goldens()}
SMALL = "self_e16_h1"
BIG_E, BIG_H = 512, 8
# Long requests: long enough to keep a worker busy for a good fraction of a
# second in an optimised build; sanitizer builds compute several times slower.
SAN = support.sanitized_build()
LONG = 2048 if SAN else 6144     # about 0.6 s optimised
MEDIUM = 1024 if SAN else 2048
OVERLOAD = 1024 if SAN else 3072


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A model wide enough that a long request takes a while to compute."""
    m = support.Model.random("big", BIG_E, BIG_H, seed=11)
    m.save(tmp_path_factory.mktemp("big") / "big.safetensors")
    return m


def big_config(big, **sections):
    """Limits set wide enough for the long requests below, whatever the defaults."""
    cfg = {"models": [big.config()],
           "server": {"max_body_bytes": 64 << 20, "request_timeout_ms": 120000},
           "limits": {"max_tokens_per_request": 16384}}
    for k, v in sections.items():
        cfg[k] = dict(cfg.get(k, {}), **v)
    return cfg


def big_query(L, seed=3):
    return np.random.default_rng(seed).standard_normal((L, BIG_E)).astype(np.float32)


def send_async(url, body, results, i, timeout=120.0, headers=None):
    def run():
        try:
            r = requests.post(url, data=body, timeout=timeout,
                              headers=dict({"Content-Type": "application/json"}, **(headers or {})))
            results[i] = (r.status_code, r.headers, r.content, time.monotonic())
        except requests.RequestException as e:
            results[i] = (None, None, repr(e).encode(), time.monotonic())
    t = threading.Thread(target=run)
    t.start()
    return t


def metric_value(text, *words, typ=None):
    """Sum of the samples of the families whose name has every word."""
    types, samples = support.parse_prometheus(text)
    names = [n for n in types if all(w in n for w in words) and (typ is None or types[n] == typ)]
    assert names, "no metric named with %s (type %s) in %s" % (words, typ, sorted(types))
    name = sorted(names, key=len)[0]
    suffix = "_total" if types[name] == "counter" and not name.endswith("_total") else ""
    vals = [v for n, _, v in samples if n in (name, name + suffix)]
    return sum(vals)


def queue_depth(d):
    try:
        return metric_value(d.get("/metrics", timeout=5).text, "queue", "depth", typ="gauge")
    except (AssertionError, requests.RequestException):
        return -1


def batch_sum(d):
    h = support.histograms(d.get("/metrics").text)
    assert "attnd_batch_size" in h, sorted(h)
    return h["attnd_batch_size"]["sum"]


def wait_admitted(d, queued, results, timeout=20.0):
    """Waits until `queued` requests wait behind the one being computed
    (queue depth gauge), or every request has been answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        qd = queue_depth(d)
        if qd < 0:  # no gauge (reported by test_metrics_prometheus_text)
            time.sleep(1.0)
            return
        if qd >= queued or all(results):
            return
        time.sleep(0.02)


# ---------------------------------------------------------------- drain

def drain(fresh_daemons, big, sig, n):
    d = fresh_daemons(big_config(big, workers={"threads": 1},
                                 batching={"max_batch_requests": 1}))
    q = big_query(MEDIUM)
    rows = np.arange(0, MEDIUM, 257)
    ref = reference_rows(big, q, rows)
    body = json.dumps({"query": b64_tensor(q), "encoding": "base64"})
    results = [None] * n
    threads = [send_async(d.url + "/v1/attention", body, results, i) for i in range(n)]
    wait_admitted(d, n - 2, results)
    assert not all(results), "every request was answered before the signal: nothing to drain"
    sig_time = time.monotonic()
    d.send_signal(sig)
    time.sleep(0.2)
    still_running = d.alive()
    probes = []
    if still_running:
        for path in ("/health", "/v1/models"):
            try:
                probes.append((path, requests.get(d.url + path, timeout=5).status_code))
            except requests.ConnectionError:
                probes.append((path, "refused"))
            except requests.Timeout:
                probes.append((path, "no answer within 5 s (connection left hanging)"))
    for t in threads:
        t.join(180)
    rc = d.wait_exit(60)
    assert rc == 0, "exit code %s after signal %d\n%s" % (rc, sig, d.logs())
    for path, st in probes:
        assert st in ("refused", 503), "%s answered %s while draining" % (path, st)
    late = 0
    for i, res in enumerate(results):
        assert res is not None and res[0] == 200, "request %d: %r" % (i, res and res[:3:2])
        out = from_b64_tensor(json.loads(res[2])["output"])
        assert out.shape == (MEDIUM, BIG_E)
        assert rel_err(out[rows], ref) <= 1e-5
        late += res[3] > sig_time
    assert late >= 1, "no request was still in flight at the signal"
    assert not d.sanitizer_reports(), d.logs()
    return late


def test_drain_on_sigterm(fresh_daemons, big):
    drain(fresh_daemons, big, signal.SIGTERM, 6)


def test_drain_on_sigint(fresh_daemons, big):
    drain(fresh_daemons, big, signal.SIGINT, 4)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGQUIT, signal.SIGPWR,
                                 signal.SIGRTMIN + 3, signal.SIGRTMIN + 4],
                         ids=["TERM", "QUIT", "PWR", "RTMIN+3", "RTMIN+4"])
def test_idle_stop_signal_exits_zero(fresh_daemons, sig):
    """Each stop signal of docs/config.md's table drains and exits 0, and
    the log names it."""
    d = fresh_daemons({"models": [GOLDENS[SMALL][1].config()]})
    assert d.get("/health").status_code == 200
    assert d.get("/v2/health/live").status_code == 200
    assert d.get("/v2/health/ready").status_code == 200
    d.check_clean_exit(sig)
    name = signal.Signals(sig).name if sig < signal.SIGRTMIN else "SIGRTMIN+%d" % (
        sig - signal.SIGRTMIN)
    assert "%s: draining" % name in d.logs(), d.logs()


def test_503_starting_while_the_models_load(fresh_daemons, tmp_path):
    """The HTTP port opens before the models load (SPEC 4: /health is 503
    while starting): /health and /v2/health/ready answer 503 "starting",
    /v2/health/live 200, and every other route 503 with Retry-After, until
    the models are in; then 200. Three layers of width 2048 (64 MiB each)
    take a few hundred ms to load."""
    wide = support.Model.random("wide", 2048, 16, seed=5)
    path = tmp_path / "wide.safetensors"
    wide.save(path)
    cfg = {"models": [dict(wide.config(), name="w%d" % i, weights=str(path)) for i in range(3)]}
    d = fresh_daemons(cfg, wait=False)
    seen, during = [], None
    deadline = time.monotonic() + 60 * support.SLOW
    while time.monotonic() < deadline:
        try:
            r = requests.get(d.url + "/health", timeout=5)
        except requests.ConnectionError:
            assert d.proc.poll() is None, d.logs()
            time.sleep(0.002)
            continue
        seen.append(r.status_code)
        if r.status_code == 503 and during is None:
            assert r.json() == {"error": "starting"}, r.text
            during = (requests.get(d.url + "/v2/health/ready"), requests.get(d.url + "/v2/health/live"),
                      requests.post(d.url + "/v1/attention", json={"query": [[0.0] * 2048]}),
                      requests.get(d.url + "/v1/models"))
        if r.status_code == 200:
            break
    assert seen and seen[-1] == 200, (seen, d.logs())
    assert seen[0] == 503 and set(seen) == {503, 200}, seen
    ready, live, compute, models = during
    assert ready.status_code == 503 and live.status_code == 200, (ready.text, live.text)
    for r in (compute, models):
        check_error_body(r, 503)
        assert "starting" in r.json()["error"] and r.headers.get("Retry-After") == "1", r.text
    r = d.post("/v1/attention", {"model": "w0", "query": [[0.0] * 2048]})
    assert r.status_code == 200, r.text[:300]


# ---------------------------------------------------------------- overload, deadline

def test_overload_429_with_retry_after(fresh_daemons, big):
    d = fresh_daemons(big_config(big, workers={"threads": 1},
                                 batching={"max_batch_requests": 1, "max_queue_requests": 1}))
    q = big_query(OVERLOAD, seed=4)
    rows = np.arange(0, OVERLOAD, 385)
    ref = reference_rows(big, q, rows)
    body = json.dumps({"query": b64_tensor(q), "encoding": "base64"})
    n = 12
    results = [None] * n
    threads = [send_async(d.url + "/v1/attention", body, results, i) for i in range(n)]
    for t in threads:
        t.join(180)
    statuses = [r[0] for r in results]
    assert statuses.count(429) >= 1, statuses
    assert statuses.count(200) >= 1, statuses
    assert set(statuses) <= {200, 429}, statuses
    for st, headers, content, _ in results:
        if st == 429:
            assert headers.get("X-Request-Id") and headers.get("Server-Timing"), headers
            ra = headers.get("Retry-After")
            assert ra is not None, "429 without Retry-After"
            assert re.fullmatch(r"\d+", ra.strip()), "Retry-After %r is not delta-seconds" % ra
            body = json.loads(content)
            assert list(body) == ["error"] and body["error"]
        else:
            out = from_b64_tensor(json.loads(content)["output"])
            assert out.shape == (OVERLOAD, BIG_E)
            assert rel_err(out[rows], ref) <= 1e-5
    # a counter may be bumped just after its answer went out: poll briefly
    assert support.wait_until(
        lambda: metric_value(d.get("/metrics").text, "rejected") >= statuses.count(429), 5), \
        "rejected counter below the %d answers 429" % statuses.count(429)
    # and it serves again once the crowd is gone
    r = d.post("/v1/attention", {"query": support.tolist32(q[:3])})
    assert r.status_code == 200


def server_timing_of(headers):
    return parse_server_timing(headers.get("Server-Timing", ""))


def test_deadline_504_and_dropped_before_compute(fresh_daemons, big):
    """Past request_timeout_ms a request gets 504; one still queued then is
    dropped before compute. A long request (far over the 100 ms timeout)
    keeps the single worker busy; small probes go one at a time until one
    waits in the queue (504); then six small requests queue behind the long
    one: all 504, none computed (attnd_batch_size counts computed requests)."""
    d = fresh_daemons(big_config(big, workers={"threads": 1},
                                 server={"request_timeout_ms": 100},
                                 batching={"max_batch_requests": 1}))
    before = batch_sum(d)
    names = support.parse_prometheus(d.get("/metrics").text)[0]
    word = "timed" if any("timed" in x for x in names) else "timeout"
    t0 = metric_value(d.get("/metrics").text, word)
    long_res = [None]
    threads = [send_async(d.url + "/v1/attention",
                          json.dumps({"query": b64_tensor(big_query(LONG, seed=5))}), long_res, 0)]
    small = json.dumps({"query": b64_tensor(big_query(16, seed=6))})
    probes = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = d.post("/v1/attention", data=small, headers={"Content-Type": "application/json"})
        probes.append(r.status_code)
        assert r.status_code in (200, 504), r.text[:200]
        if r.status_code == 504:
            break
    assert probes and probes[-1] == 504, "no probe ever waited behind the long request"
    n = 6
    results = [None] * n
    threads += [send_async(d.url + "/v1/attention", small, results, i) for i in range(n)]
    for t in threads:
        t.join(180)
    for st, headers, content, _ in long_res + results:
        assert st == 504, (st, content[:200])
        body = json.loads(content)
        assert list(body) == ["error"] and body["error"], body
        assert headers.get("X-Request-Id") and headers.get("Server-Timing"), headers
    for st, headers, content, _ in results:
        timing = server_timing_of(headers)
        assert not timing.get("compute"), "a request dropped in the queue reports compute: %s" \
            % headers.get("Server-Timing")
    n200, n504 = probes.count(200), probes.count(504)
    # the long request may still be computing: wait for it, then a bit more so
    # that a wrongly kept request would have been computed too
    support.wait_until(lambda: batch_sum(d) - before >= n200 + 1, 30, 0.05)
    time.sleep(0.5)
    computed = batch_sum(d) - before
    assert n200 <= computed <= n200 + 1, \
        "%g requests computed; expected the %d probes answered 200 and the long one" % (
            computed, n200)
    want = n504 + n + 1
    # a counter may be bumped just after its answer went out: poll briefly
    assert support.wait_until(
        lambda: metric_value(d.get("/metrics").text, word) - t0 >= want, 5), \
        "timed-out counter grew by less than the %d answers 504" % want
    assert d.get("/health").status_code == 200


def running(d):
    return metric_value(d.get("/metrics").text, "requests_running")


def test_own_deadlines_504_and_dropped(fresh_daemons, big):
    """A request's own deadline, shorter than the server's (here 120 s):
    timeout_ms in a native body, parameters.timeout_ms in v2, the
    Request-Timeout-Ms header (the smaller of it and the body's holds), and
    timeout_ms on a session step. While a long request computes, each of
    them waits in the queue past its own deadline: 504 naming where the
    deadline came from, never computed, counted as timed out; the session
    keeps none of the dropped step's rows."""
    d = fresh_daemons(big_config(big, workers={"threads": 1},
                                 batching={"max_batch_requests": 1}))
    sid = d.post("/v1/sessions", {"query": support.tolist32(big_query(2, seed=8))}).json()
    assert sid["cached_tokens"] == 2, sid
    t0, before = metric_value(d.get("/metrics").text, "timeouts"), batch_sum(d)
    long_res = [None]
    threads = [send_async(d.url + "/v1/attention",
                          json.dumps({"query": b64_tensor(big_query(LONG, seed=5))}), long_res, 0)]
    assert support.wait_until(lambda: running(d) >= 1, 30, 0.005), "the long request never ran"
    row = support.tolist32(big_query(1, seed=9))
    v2 = {"inputs": [{"name": "query", "shape": [1, 1, BIG_E], "datatype": "FP32",
                      "data": row[0]}], "parameters": {"timeout_ms": 30}}
    cases = [("/v1/attention", {"query": row, "timeout_ms": 30}, {}, "(timeout_ms)"),
             ("/v2/models/big/infer", v2, {}, "(parameters.timeout_ms)"),
             ("/v1/attention", {"query": row, "timeout_ms": 100000},
              {"Request-Timeout-Ms": "30"}, "(Request-Timeout-Ms)"),
             ("/v1/sessions/%s/attention" % sid["session"], {"query": row, "timeout_ms": 30}, {},
              "(timeout_ms)")]
    results = [None] * len(cases)
    threads += [send_async(d.url + path, json.dumps(body), results, i, headers=h)
                for i, (path, body, h, _) in enumerate(cases)]
    for t in threads:
        t.join(180)
    assert long_res[0][0] == 200, long_res[0][2][:200]
    for (path, _, _, where), (st, headers, content, _) in zip(cases, results):
        assert st == 504, (path, st, content[:200])
        msg = json.loads(content)["error"]
        assert msg.startswith("request not done within 30 ms %s" % where), msg
        assert not server_timing_of(headers).get("compute"), headers.get("Server-Timing")
    time.sleep(0.3)  # a request wrongly kept would be computed by now
    assert batch_sum(d) - before == 1, "only the long request may have been computed"
    assert support.wait_until(
        lambda: metric_value(d.get("/metrics").text, "timeouts") - t0 >= len(cases), 5)
    r = d.post("/v1/sessions/%s/attention" % sid["session"], {"query": row})
    assert r.status_code == 200 and r.json()["cached_tokens"] == 3, r.text[:200]


@pytest.mark.parametrize("where,value", [
    ("body", 0), ("body", -5), ("body", 1.5), ("body", "100"), ("body", True),
    ("header", "0"), ("header", "-1"), ("header", "abc"), ("header", "1.5"), ("header", "+5"),
    ("v2", 0), ("v2", "100"), ("step", 0),
])
def test_bad_deadlines_refused_naming_the_field(daemons, big, where, value):
    """Zero, negative, fractional and non-numeric deadlines are 400s that
    name the field (null is the field left out: test_errors.py)."""
    d = daemons(big_config(big))
    row = [[0.5] * BIG_E]
    path, body, headers, field = "/v1/attention", {"query": row}, {}, "timeout_ms"
    if where == "body":
        body["timeout_ms"] = value
    elif where == "header":
        headers, field = {"Request-Timeout-Ms": value}, "Request-Timeout-Ms"
    elif where == "v2":
        path, field = "/v2/models/big/infer", "parameters.timeout_ms"
        body = {"inputs": [{"name": "query", "shape": [1, 1, BIG_E], "datatype": "FP32",
                            "data": row[0]}], "parameters": {"timeout_ms": value}}
    else:
        sid = d.post("/v1/sessions", {}).json()["session"]
        path, body = "/v1/sessions/%s/attention" % sid, {"query": row, "timeout_ms": value}
    msg = check_error_body(d.post(path, body, headers=headers), 400)
    assert msg.startswith(field + ": expected a whole number of milliseconds, 1 or more"), msg


# ---------------------------------------------------------------- headers

@pytest.fixture(scope="module")
def small(daemons):
    return daemons({"models": [GOLDENS[SMALL][1].config(), GOLDENS["self_e64_h8"][1].config()]})


def small_body(name=SMALL):
    g, _ = GOLDENS[name]
    return support.golden_body(g["sequences"][0], name)


REQS = [
    ("GET", "/health", None, 200),
    ("GET", "/v1/models", None, 200),
    ("POST", "/v1/attention", "ok", 200),
    ("POST", "/v1/attention", {"model": SMALL, "query": [[1.0]]}, 400),
    ("GET", "/nope", None, 404),
    ("GET", "/v1/attention", None, 405),
    ("GET", "/metrics", None, 200),
    ("GET", "/v2", None, 200),
]


@pytest.mark.parametrize("method,path,body,status", REQS,
                         ids=["%s %s %d" % (m, p, s) for m, p, _, s in REQS])
def test_request_id_echoed_and_made(small, method, path, body, status):
    if body == "ok":
        body = small_body()
    kw = {} if body is None else {"data": json.dumps(body),
                                  "headers": {"Content-Type": "application/json"}}
    rid = "req-%s-42" % path.strip("/").replace("/", "-")
    h = dict(kw.get("headers", {}), **{"X-Request-Id": rid})
    r = small.request(method, path, **dict(kw, headers=h))
    assert r.status_code == status, r.text[:200]
    assert r.headers.get("X-Request-Id") == rid
    ids = set()
    for _ in range(2):
        r = small.request(method, path, **kw)
        assert r.status_code == status
        got = r.headers.get("X-Request-Id")
        assert got and got.strip() == got and len(got) <= 128, got
        ids.add(got)
    assert len(ids) == 2, "two requests got the same made-up id %s" % ids
    st = r.headers.get("Server-Timing")
    assert st, "no Server-Timing header"
    timing = parse_server_timing(st)
    assert "total" in timing, st
    if path == "/v1/attention" and status == 200:
        for k in ("queue", "compute", "total"):
            assert k in timing and timing[k] is not None and timing[k] >= 0, st


@pytest.mark.parametrize("rid,echoed", [
    ("7d1c2b7e-4f0a-4d4c-9f5e-2f1f5c2a9b10", True),
    ("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8", True),
    ("abc/123+xyz==", True),
    ("x" * 128, True),
    ("x" * 129, False),
    ("has space", False),
    ('quo"te', False),
])
def test_request_id_echoed_as_sent(small, rid, echoed):
    """Any sane id a client or proxy sends comes back as it was sent, and
    in the access log; one that is not (too long, a space, a quote) is
    replaced by a made one."""
    r = small.get("/v1/models", headers={"X-Request-Id": rid})
    assert r.status_code == 200
    got = r.headers["X-Request-Id"]
    assert (got == rid) == echoed, got
    if echoed:
        assert support.wait_until(lambda: ("id=%s" % rid) in small.logs(), 5), small.logs(3000)


def parse_server_timing(value):
    out = {}
    for part in value.split(","):
        items = [x.strip() for x in part.split(";")]
        assert re.fullmatch(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+", items[0]), "bad metric %r" % part
        dur = None
        for p in items[1:]:
            k, _, v = p.partition("=")
            if k.strip() == "dur":
                dur = float(v.strip().strip('"'))
        out[items[0]] = dur
    return out


def test_json_content_type_everywhere(small):
    for method, path in (("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v2"),
                         ("GET", "/openapi.json"), ("GET", "/nope")):
        r = small.request(method, path)
        ct = r.headers.get("Content-Type", "")
        assert ct.startswith("application/json"), (path, ct)
        r.json()


def test_access_log_line_per_request(small):
    rid = "log-probe-%d" % time.monotonic_ns()
    r_ok = small.post("/v1/attention", small_body(), headers={"X-Request-Id": rid})
    assert r_ok.status_code == 200
    r = small.get("/v1/models/nope-log-probe/attention")
    assert r.status_code in (404, 405)

    def lines():
        return [ln for ln in small.stdout().splitlines()
                if "/v1/attention" in ln or "nope-log-probe" in ln]
    # Each line is written once its answer is sent, so wait for both.
    assert support.wait_until(lambda: any("nope-log-probe" in ln for ln in lines())
                              and any(rid in ln for ln in lines()), 5), \
        "no access log line on stdout:\n" + small.stdout()[-2000:]
    ok = [ln for ln in lines() if "POST" in ln and "/v1/attention" in ln and "200" in ln
          and rid in ln]
    assert ok, "no access log line with method, path, status 200 and the request id"
    assert re.search(r"(?<!\d)%d(?!\d)" % len(r_ok.content), ok[-1]), \
        "the access log line does not give the response bytes (%d): %s" % (len(r_ok.content),
                                                                          ok[-1])
    probe = [ln for ln in lines() if "nope-log-probe" in ln]
    assert len(probe) == 1, "expected one line for one request: %s" % probe


# ---------------------------------------------------------------- metrics

def test_metrics_prometheus_text(small):
    for _ in range(3):
        assert small.post("/v1/attention", small_body()).status_code == 200
    r = small.get("/metrics")
    assert r.status_code == 200
    assert r.headers.get("Content-Type", "").startswith("text/plain"), r.headers
    text = r.text
    # a real parser reads it
    fams = list(text_string_to_metric_families(text))
    assert fams
    types, samples = support.parse_prometheus(text)
    hist = [n for n, t in types.items() if t == "histogram"]
    for name in hist:
        series = {}
        for n, labels, v in samples:
            if n in (name + "_bucket", name + "_sum", name + "_count"):
                key = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
                s = series.setdefault(key, {"buckets": [], "sum": None, "count": None})
                if n.endswith("_bucket"):
                    assert "le" in labels, "bucket without le: %s" % name
                    s["buckets"].append((float(labels["le"].replace("+Inf", "inf")), v))
                elif n.endswith("_sum"):
                    s["sum"] = v
                else:
                    s["count"] = v
        assert series, "histogram %s has no samples" % name
        for key, s in series.items():
            assert s["sum"] is not None and s["count"] is not None, (name, key)
            b = s["buckets"]
            assert len(b) >= 3, "%s%s has %d buckets" % (name, key, len(b))
            les = [le for le, _ in b]
            assert les == sorted(les) and les[-1] == float("inf"), (name, les)
            counts = [c for _, c in b]
            assert all(x <= y for x, y in zip(counts, counts[1:])), (name, "not cumulative")
            assert counts[-1] == s["count"], (name, "+Inf bucket != _count")

    def has_hist(*alts):
        return any(all(w in n for w in alt) for alt in alts for n in hist)
    assert has_hist(("latency",), ("request", "duration"), ("request", "seconds")), hist
    assert has_hist(("queue",)), hist
    assert has_hist(("compute",)), hist
    assert has_hist(("batch", "size")), hist
    assert has_hist(("batch", "tokens")), hist
    gauges = [n for n, t in types.items() if t == "gauge"]
    assert any("queue" in n for n in gauges), "no queue depth gauge: %s" % gauges
    counters = [n for n, t in types.items() if t == "counter"]
    assert any("tokens" in n for n in counters), "no tokens counter: %s" % counters
    assert any("reject" in n for n in counters), "no rejected counter: %s" % counters
    assert any("timed" in n or "timeout" in n for n in counters), \
        "no timed-out counter: %s" % counters


def request_count(text, route, status):
    """Requests by route and status, from whichever counter carries both."""
    types, samples = support.parse_prometheus(text)
    total = 0.0
    for n, labels, v in samples:
        base = n[:-6] if n.endswith("_total") else n
        if types.get(base, types.get(n)) != "counter" or "request" not in n:
            continue
        vals = list(labels.values())
        if any(x == str(status) for x in vals) and any(route == x for x in vals):
            total += v
    return total


def test_metrics_count_requests_by_route_and_status(small):
    t0 = small.get("/metrics").text
    for _ in range(3):
        assert small.post("/v1/attention", small_body()).status_code == 200
    for _ in range(2):
        assert small.post("/v1/attention", {"model": SMALL, "query": [[1.0]]}).status_code == 400
    def grown():
        t = small.get("/metrics").text
        return (request_count(t, "/v1/attention", 200) - request_count(t0, "/v1/attention", 200),
                request_count(t, "/v1/attention", 400) - request_count(t0, "/v1/attention", 400))
    # a counter may be bumped just after its answer went out: poll briefly
    support.wait_until(lambda: grown() == (3, 2), 5)
    assert grown() == (3, 2), "requests{route=/v1/attention,status=200/400} grew by %s, " \
        "expected (3, 2)" % (grown(),)
    t1 = small.get("/metrics").text
    h0, h1 = support.histograms(t0), support.histograms(t1)
    name, _ = support.find_histogram(h1, "batch", "size")
    assert h1[name]["count"] - h0[name]["count"] >= 1
    assert h1[name]["sum"] - h0[name]["sum"] == 3


# ---------------------------------------------------------------- CORS

ORIGIN = "http://app.example.test"


@pytest.fixture(scope="module")
def cors(daemons):
    return daemons({"server": {"cors_origins": [ORIGIN]},
                    "models": [GOLDENS[SMALL][1].config()]})


def preflight(d, origin, path="/v1/attention"):
    return d.request("OPTIONS", path, headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type, authorization"})


def test_cors_preflight_allowed_origin(cors):
    for path in ("/v1/attention", "/v2/models/%s/infer" % SMALL):
        r = preflight(cors, ORIGIN, path)
        assert r.status_code in (200, 204), (r.status_code, r.text[:200])
        assert r.headers.get("Access-Control-Allow-Origin") in (ORIGIN, "*")
        methods = r.headers.get("Access-Control-Allow-Methods", "").upper()
        assert "POST" in methods, methods
        allowed = r.headers.get("Access-Control-Allow-Headers", "").lower()
        assert "content-type" in allowed and "authorization" in allowed, allowed
    r = cors.post("/v1/attention", small_body(), headers={"Origin": ORIGIN})
    assert r.status_code == 200
    assert r.headers.get("Access-Control-Allow-Origin") in (ORIGIN, "*")


def test_cors_other_origin_refused(cors):
    r = preflight(cors, "http://evil.example.test")
    assert "Access-Control-Allow-Origin" not in r.headers
    r = cors.post("/v1/attention", small_body(), headers={"Origin": "http://evil.example.test"})
    assert r.status_code == 200
    assert "Access-Control-Allow-Origin" not in r.headers


def test_cors_preflight_with_api_key(daemons):
    """Browsers send preflights without credentials: with an API key set, the
    preflight still passes and the real request still needs the key."""
    d = daemons({"server": {"cors_origins": [ORIGIN]}, "models": [GOLDENS[SMALL][1].config()]},
                env={"ATTND_API_KEY": "cors-key-1"})
    r = preflight(d, ORIGIN)
    assert r.status_code in (200, 204), (r.status_code, r.text[:200])
    assert r.headers.get("Access-Control-Allow-Origin") in (ORIGIN, "*")
    r = d.post("/v1/attention", small_body(), headers={"Origin": ORIGIN})
    check_error_body(r, 401)
    assert r.headers.get("Access-Control-Allow-Origin") in (ORIGIN, "*"), \
        "a 401 without CORS headers is unreadable by the page"
    r = d.post("/v1/attention", small_body(), headers={"Origin": ORIGIN,
                                                       "Authorization": "Bearer cors-key-1"})
    assert r.status_code == 200


def test_cors_off_by_default(small):
    r = preflight(small, ORIGIN)
    assert "Access-Control-Allow-Origin" not in r.headers
    assert r.status_code not in (200, 204), "preflight accepted with CORS off"
    r = small.post("/v1/attention", small_body(), headers={"Origin": ORIGIN})
    assert r.status_code == 200
    assert "Access-Control-Allow-Origin" not in r.headers


# ---------------------------------------------------------------- disconnects

def test_client_leaving_while_queued(fresh_daemons, big):
    d = fresh_daemons(big_config(big, workers={"threads": 1},
                                 batching={"max_batch_requests": 1}))
    before = batch_sum(d)
    q = big_query(LONG, seed=9)
    body = json.dumps({"query": b64_tensor(q)})
    results = [None] * 2
    threads = [send_async(d.url + "/v1/attention", body, results, i) for i in range(2)]
    wait_admitted(d, 1, results)
    # four clients queue a request and leave at once
    small_q = json.dumps({"query": b64_tensor(big_query(256, seed=10))}).encode()
    req = (b"POST /v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\n\r\n" % len(small_q)) + small_q
    for _ in range(4):
        s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
        s.sendall(req)
        s.close()
    in_flight = not all(results)
    for t in threads:
        t.join(180)
    assert in_flight, "the long requests ended before the clients left: nothing was queued"
    assert [r[0] for r in results] == [200, 200], [(r[0], r[2][:100]) for r in results]
    q3 = big_query(3, seed=12)
    r = d.post("/v1/attention", {"query": support.tolist32(q3)})
    assert r.status_code == 200
    assert rel_err(r.json()["output"], big.forward(q3)[0]) <= 1e-5
    computed = batch_sum(d) - before
    assert computed == 3, "%g requests computed; the 4 whose clients left should be dropped" \
        % computed
    assert d.alive()


# ---------------------------------------------------------------- threads and memory

def test_http_threads_free_while_computing(fresh_daemons, big):
    """Waiting requests hold no HTTP thread: with one HTTP thread and long
    requests queued, other routes still answer before the long ones end."""
    d = fresh_daemons(big_config(big, workers={"threads": 1}, server={"http_threads": 1},
                                 batching={"max_batch_requests": 1}))
    body = json.dumps({"query": b64_tensor(big_query(MEDIUM, seed=13))})
    n = 4
    results = [None] * n
    threads = [send_async(d.url + "/v1/attention", body, results, i) for i in range(n)]
    wait_admitted(d, n - 2, results)
    answered = []
    for path in ("/health", "/v1/models", "/metrics", "/v2/health/ready") * 3:
        r = requests.get(d.url + path, timeout=60)
        answered.append((path, r.status_code, all(results)))
    for t in threads:
        t.join(180)
    assert all(st == 200 for _, st, _ in answered), answered
    assert not answered[-1][2], "the long requests ended before the other routes answered"
    assert [r[0] for r in results] == [200] * n


def test_long_sequence_without_attention_matrix_fits(fresh_daemons, tmp_path):
    """Without attention weights the core never holds an L x S matrix per
    head (SPEC 5): a 4096-token self-attention with 2 heads raises the peak
    memory by far less than one head's 4096 x 4096 float32 matrix (64 MiB)."""
    m = support.Model.random("long", 32, 2, seed=61)
    m.save(tmp_path / "long.safetensors")
    d = fresh_daemons({"models": [m.config()], "server": {"max_body_bytes": 64 << 20},
                       "limits": {"max_tokens_per_request": 16384}})
    rng = np.random.default_rng(8)
    L = 4096
    q = rng.standard_normal((L, 32)).astype(np.float32)
    warm = d.post("/v1/attention", {"query": b64_tensor(q[:64]), "encoding": "base64"})
    assert warm.status_code == 200
    before = support.vm_hwm_bytes(d.proc.pid)
    r = d.post("/v1/attention", {"query": b64_tensor(q), "encoding": "base64"})
    assert r.status_code == 200, r.text[:300]
    grew = support.vm_hwm_bytes(d.proc.pid) - before
    print("peak memory grew by %.1f MiB" % (grew / 2 ** 20))
    assert grew < 32 << 20, "peak memory grew by %.1f MiB for one request" % (grew / 2 ** 20)
    out = from_b64_tensor(r.json()["output"])
    rows = rng.choice(L, 4, replace=False)
    # check a few rows against the reference (the full reference is slow in numpy)
    ref = reference_rows(m, q, rows)
    assert rel_err(out[rows], ref) <= 1e-5


def reference_rows(m, q, rows):
    """Output rows of self-attention for selected query rows (float64)."""
    x = q.astype(np.float64)
    sd = {k: v.astype(np.float64) for k, v in m.sd.items()}
    E, H = m.E, m.H
    D = E // H
    wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    bq, bk, bv = np.split(sd["in_proj_bias"], 3)
    qp, kp, vp = x[rows] @ wq.T + bq, x @ wk.T + bk, x @ wv.T + bv
    ctx = np.zeros((len(rows), E))
    for h in range(H):
        sl = slice(h * D, (h + 1) * D)
        s = qp[:, sl] @ kp[:, sl].T / np.sqrt(D)
        s = np.exp(s - s.max(axis=1, keepdims=True))
        ctx[:, sl] = (s / s.sum(axis=1, keepdims=True)) @ vp[:, sl]
    return ctx @ sd["out_proj.weight"].T + sd["out_proj.bias"]


def test_client_leaving_while_computed(fresh_daemons, big):
    """A client that leaves while its request is being computed: the answer
    has nowhere to go, and the daemon carries on (no SIGPIPE, no leak)."""
    d = fresh_daemons(big_config(big, workers={"threads": 1}))
    body = json.dumps({"query": b64_tensor(big_query(LONG, seed=21))}).encode()
    req = (b"POST /v1/attention HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
           b"\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
    before = batch_sum(d)
    s = socket.create_connection(("127.0.0.1", d.port), timeout=30)
    s.sendall(req)
    time.sleep(0.3)  # well into the compute of about 0.6 s (longer when sanitized)
    s.close()
    # let the compute end (its answer finds the socket closed)
    support.wait_until(lambda: batch_sum(d) - before >= 1, 10, 0.05)
    q3 = big_query(3, seed=22)
    r = d.post("/v1/attention", {"query": support.tolist32(q3)})
    assert r.status_code == 200
    assert rel_err(r.json()["output"], big.forward(q3)[0]) <= 1e-5
    assert d.alive()
