"""Concurrency (SPEC section 5): many clients with different shapes, options
and models at once; each answer equals its own reference, malformed requests
in the crowd change nobody's answer, and the batcher forms real batches
(attnd_batch_size histogram). `make tsan` runs the tests named *concurrency*."""
import json
import signal
import socket
import threading
import time

import numpy as np
import pytest
import requests

import support
from support import b64_tensor, from_b64_tensor, rel_err

TSAN = support.tsan_build()
THREADS = 16 if TSAN else 32
PER_THREAD = 2 if TSAN else 4
TIMEOUT = 120.0
GOLDENS = {g["name"]: m for g, m in support.load_goldens()}
MODELS = ["self_e64_h8", "cross_e48_h4_k40_v24", "self_e30_h3", "nobias_e32_h4"]


@pytest.fixture(scope="module")
def d(daemons):
    cfg = {"batching": {"max_queue_delay_us": 5000, "max_batch_requests": 16},
           "workers": {"threads": 2},
           "models": [GOLDENS[n].config() for n in MODELS]}
    return daemons(cfg)


def make_job(rng, idx):
    """One request with its expected answer."""
    m = GOLDENS[MODELS[idx % len(MODELS)]]
    L = int(rng.integers(1, 25))
    cross = m.kdim != m.E or rng.random() < 0.3
    S = int(rng.integers(1, 25)) if cross else L
    q = rng.standard_normal((L, m.E)).astype(np.float32)
    k = rng.standard_normal((S, m.kdim)).astype(np.float32) if cross else None
    v = rng.standard_normal((S, m.vdim)).astype(np.float32) if cross else None
    causal = bool(rng.random() < 0.3)
    kpm = None
    if rng.random() < 0.4:
        kpm = rng.random(S) < 0.3
        kpm[int(rng.integers(S))] = False
    attention = ["none", "mean", "heads"][int(rng.integers(3))]
    how = ["json", "b64", "v2"][int(rng.integers(3))]
    out, w = m.forward(q, k, v, causal, kpm)
    if attention == "mean":
        w = w.mean(axis=0)
    if how == "v2":
        ins = [{"name": "query", "shape": [L, m.E], "datatype": "FP32",
                "data": support.tolist32(q.reshape(-1))}]
        if cross:
            ins.append({"name": "key", "shape": [S, m.kdim], "datatype": "FP32",
                        "data": support.tolist32(k.reshape(-1))})
            ins.append({"name": "value", "shape": [S, m.vdim], "datatype": "FP32",
                        "data": support.tolist32(v.reshape(-1))})
        if kpm is not None:
            ins.append({"name": "key_padding_mask", "shape": [S], "datatype": "BOOL",
                        "data": kpm.tolist()})
        path = "/v2/models/%s/infer" % m.name
        body = {"inputs": ins, "parameters": {"causal": causal, "attention": attention}}
    else:
        enc = b64_tensor if how == "b64" else support.tolist32
        path = "/v1/attention"
        body = {"model": m.name, "query": enc(q), "causal": causal, "attention": attention}
        if cross:
            body["key"], body["value"] = enc(k), enc(v)
        if kpm is not None:
            body["key_padding_mask"] = kpm.tolist()
        if how == "b64":
            body["encoding"] = "base64"
    att = None if attention == "none" else w
    if how == "v2":  # answers in the ranks the v2 metadata declares
        out = support.v2_ranked(out)
        att = None if att is None else support.v2_ranked(att, attention)
    return {"path": path, "body": json.dumps(body), "how": how, "out": out,
            "att": att, "model": m.name, "tokens": L + S}


def check_answer(job, r):
    if r.status_code != 200:
        return "status %d: %s" % (r.status_code, r.text[:200])
    body = r.json()
    if job["how"] == "v2":
        outs = {o["name"]: np.asarray(o["data"], dtype=np.float64).reshape(o["shape"])
                for o in body["outputs"]}
        out, att = outs.get("output"), outs.get("attention")
    else:
        out, att = body.get("output"), body.get("attention")
        if job["how"] == "b64":
            out = from_b64_tensor(out)
            att = None if att is None else from_b64_tensor(att)
    if out is None:
        return "no output"
    out = np.asarray(out, dtype=np.float64)
    if out.shape != job["out"].shape:
        return "output shape %s, expected %s" % (out.shape, job["out"].shape)
    e = rel_err(out, job["out"])
    if e > 1e-5:
        return "output relative error %.3g (%s)" % (e, job["model"])
    if job["att"] is None:
        if att is not None:
            return "attention returned although not asked"
    else:
        if att is None:
            return "attention missing"
        att = np.asarray(att, dtype=np.float64)
        if att.shape != job["att"].shape:
            return "attention shape %s, expected %s" % (att.shape, job["att"].shape)
        e = rel_err(att, job["att"])
        if e > 1e-5:
            return "attention relative error %.3g" % e
    return None


def run_crowd(d, jobs_per_thread, bad_per_thread=None):
    barrier = threading.Barrier(len(jobs_per_thread))
    failures = []
    lock = threading.Lock()

    def client(t):
        s = requests.Session()
        try:
            barrier.wait(30)
            for i, job in enumerate(jobs_per_thread[t]):
                if bad_per_thread and bad_per_thread[t]:
                    bad = bad_per_thread[t][i % len(bad_per_thread[t])]
                    rb = s.post(d.url + bad[0], data=bad[1], timeout=TIMEOUT,
                                headers={"Content-Type": "application/json"})
                    if rb.status_code not in (400, 404, 413):
                        with lock:
                            failures.append("bad request got %d" % rb.status_code)
                r = s.post(d.url + job["path"], data=job["body"], timeout=TIMEOUT,
                           headers={"Content-Type": "application/json"})
                err = check_answer(job, r)
                if err:
                    with lock:
                        failures.append("thread %d job %d: %s" % (t, i, err))
        except Exception as e:  # noqa: BLE001 - reported as a failure below
            with lock:
                failures.append("thread %d: %r" % (t, e))
        finally:
            s.close()

    threads = [threading.Thread(target=client, args=(t,)) for t in range(len(jobs_per_thread))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(TIMEOUT * 2)
    assert not any(th.is_alive() for th in threads), "clients still running"
    return failures


def batch_hist(d):
    r = d.get("/metrics")
    assert r.status_code == 200
    hists = support.histograms(r.text)
    assert "attnd_batch_size" in hists, "no attnd_batch_size histogram: %s" % sorted(hists)
    return hists["attnd_batch_size"]


def token_metrics(d):
    """(batch tokens histogram sum, tokens counter, queue depth) from /metrics."""
    text = d.get("/metrics").text
    types, samples = support.parse_prometheus(text)
    hists = support.histograms(text)
    _, bt = support.find_histogram(hists, "batch", "tokens")
    counters = [n for n, t in types.items() if t == "counter" and "token" in n]
    assert counters, "no tokens counter"
    c = sorted(counters, key=len)[0]
    tokens = sum(v for n, _, v in samples if n in (c, c + "_total"))
    depth = sum(v for n, _, v in samples
                if types.get(n) == "gauge" and "queue" in n and "depth" in n)
    return bt["sum"], tokens, depth


def test_concurrency_each_answer_is_its_own(d):
    rng = np.random.default_rng(2024)
    jobs = [[make_job(rng, t * PER_THREAD + i) for i in range(PER_THREAD)]
            for t in range(THREADS)]
    before = batch_hist(d)
    bt0, tok0, _ = token_metrics(d)
    failures = run_crowd(d, jobs)
    assert not failures, "\n".join(failures[:20])
    # batches hold the requests' own tokens, no padding: query + key tokens
    want = sum(j["tokens"] for row in jobs for j in row)
    bt1, tok1, depth = token_metrics(d)
    assert bt1 - bt0 == want, "batch tokens grew by %g, the requests hold %d" % (bt1 - bt0, want)
    assert tok1 - tok0 == want, "tokens counter grew by %g, expected %d" % (tok1 - tok0, want)
    assert depth == 0, "queue depth %g after every answer" % depth
    after = batch_hist(d)
    n = after["count"] - before["count"]
    total = after["sum"] - before["sum"]
    assert total == THREADS * PER_THREAD, \
        "batch size histogram sum grew by %g, expected %d requests" % (total, THREADS * PER_THREAD)
    assert 0 < n < total, "no batch held more than one request (%g batches for %g)" % (n, total)
    b1 = dict(after["buckets"]).get(1.0)
    if b1 is not None:
        assert b1 < after["count"], "every batch is in the le=1 bucket"
    assert d.alive()


def test_concurrency_bad_neighbours_change_nothing(d):
    rng = np.random.default_rng(77)
    jobs = [[make_job(rng, t + 3 * i) for i in range(PER_THREAD)] for t in range(THREADS)]
    E = 64
    bad = [
        ("/v1/attention", json.dumps({"model": "self_e64_h8", "query": [[0.5] * E, [0.5] * 3]})),
        ("/v1/attention", json.dumps({"model": "self_e64_h8", "query": [[1e39] * E]})),
        ("/v1/attention", '{"model": "self_e64_h8", "query": [[1,'),
        ("/v1/attention", json.dumps({"model": "nope", "query": [[0.5] * E]})),
        ("/v2/models/self_e64_h8/infer", json.dumps({"inputs": [
            {"name": "query", "shape": [2, E], "datatype": "FP32", "data": [0.5] * E}]})),
        ("/v1/attention", json.dumps({"model": "self_e64_h8", "query": {
            "shape": [2, E], "dtype": "float32", "b64": "AAAA"}})),
    ]
    bad_per_thread = [bad[t % len(bad):] + bad[:t % len(bad)] if t % 2 else None
                      for t in range(THREADS)]
    failures = run_crowd(d, jobs, bad_per_thread)
    assert not failures, "\n".join(failures[:20])
    assert d.alive()


def test_concurrency_batched_requests_in_the_crowd(d):
    """B x L x E requests mixed with single ones: every sequence its own."""
    m = GOLDENS["self_e64_h8"]
    rng = np.random.default_rng(5)
    jobs = []
    for t in range(THREADS):
        B, L = int(rng.integers(1, 4)), int(rng.integers(1, 12))
        q = rng.standard_normal((B, L, m.E)).astype(np.float32)
        kpm = rng.random((B, L)) < 0.2
        kpm[:, 0] = False
        out, w = m.forward(q, None, None, False, kpm)
        jobs.append([{"path": "/v1/attention", "how": "b64", "model": m.name, "out": out,
                      "att": w.mean(axis=1),
                      "body": json.dumps({"model": m.name, "query": b64_tensor(q),
                                          "key_padding_mask": kpm.tolist(),
                                          "attention": "mean", "encoding": "base64"})}])
    failures = run_crowd(d, jobs)
    assert not failures, "\n".join(failures[:20])


def test_concurrency_clients_leaving_in_the_crowd(d):
    """Clients that send a request and leave at once, among clients that wait:
    the waiting ones get their own answers and the daemon keeps serving."""
    rng = np.random.default_rng(31)
    jobs = [[make_job(rng, t * 7 + i) for i in range(PER_THREAD)] for t in range(THREADS)]
    leaving = [j for row in jobs for j in row][:THREADS]
    stop = threading.Event()

    def leaver():
        i = 0
        while not stop.is_set() and i < 4 * THREADS:
            job = leaving[i % len(leaving)]
            raw = (("POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\n\r\n" % (job["path"], len(job["body"]))).encode()
                   + job["body"].encode())
            try:
                s = socket.create_connection(("127.0.0.1", d.port), timeout=10)
                s.sendall(raw)
                s.close()
            except OSError:
                pass
            i += 1
    lv = [threading.Thread(target=leaver) for _ in range(2)]
    for t in lv:
        t.start()
    try:
        failures = run_crowd(d, jobs)
    finally:
        stop.set()
        for t in lv:
            t.join(60)
    assert not failures, "\n".join(failures[:20])
    assert d.alive()
    assert d.get("/health").status_code == 200


def test_concurrency_idle_connections_do_not_block(d):
    """Many open idle connections hold no thread: requests still get answers."""
    socks = []
    try:
        for _ in range(64):
            socks.append(socket.create_connection(("127.0.0.1", d.port), timeout=10))
        for s in socks[::2]:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # headers never finished
        rng = np.random.default_rng(3)
        jobs = [[make_job(rng, t)] for t in range(4)]
        failures = run_crowd(d, jobs)
        assert not failures, failures
    finally:
        for s in socks:
            s.close()


def test_concurrency_drain_under_load(fresh_daemons):
    """SIGTERM while many clients are in flight: every admitted request gets
    its own correct answer, then exit 0."""
    cfg = {"batching": {"max_queue_delay_us": 2000, "max_batch_requests": 8},
           "workers": {"threads": 2}, "models": [GOLDENS[n].config() for n in MODELS]}
    dd = fresh_daemons(cfg)
    rng = np.random.default_rng(99)
    n = THREADS
    jobs = [make_job(rng, i) for i in range(n)]
    results = [None] * n
    started = threading.Barrier(n + 1)

    def client(i):
        try:
            started.wait(30)
            results[i] = requests.post(dd.url + jobs[i]["path"], data=jobs[i]["body"],
                                       timeout=TIMEOUT,
                                       headers={"Content-Type": "application/json"})
        except requests.RequestException as e:
            results[i] = e
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    started.wait(30)
    time.sleep(0.05)  # let some requests in; the rest race the signal
    dd.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(TIMEOUT)
    rc = dd.wait_exit(60)
    assert rc == 0, "exit %s\n%s" % (rc, dd.logs())
    answered = 0
    for i, r in enumerate(results):
        if isinstance(r, requests.ConnectionError):
            continue  # not admitted before the signal: refused
        assert not isinstance(r, Exception), "client %d: %r" % (i, r)
        if r.status_code == 503:
            continue  # arrived while draining
        err = check_answer(jobs[i], r)
        assert err is None, "client %d: %s" % (i, err)
        answered += 1
    print("drain under load: %d of %d answered" % (answered, n))
    assert not dd.sanitizer_reports(), dd.logs()


def max_batch_bound(hist, limit):
    """Batches in buckets up to the smallest bucket bound >= limit."""
    bounds = [(le, c) for le, c in hist["buckets"] if le >= limit]
    assert bounds, hist
    return bounds[0]


@pytest.mark.parametrize("limit", [1, 2])
def test_concurrency_max_batch_requests(fresh_daemons, limit):
    """max_batch_requests caps a batch (1 turns batching off)."""
    m = GOLDENS["self_e64_h8"]
    dd = fresh_daemons({"batching": {"max_batch_requests": limit, "max_queue_delay_us": 5000},
                        "workers": {"threads": 1}, "models": [m.config()]})
    rng = np.random.default_rng(limit)
    jobs = [[make_job(rng, 0)] for _ in range(THREADS)]
    for row in jobs:
        assert row[0]["model"] == m.name
    failures = run_crowd(dd, jobs)
    assert not failures, "\n".join(failures[:20])
    h = batch_hist(dd)
    assert h["sum"] == THREADS
    le, c = max_batch_bound(h, limit)
    assert c == h["count"], "a batch held more than %d requests: %s" % (limit, h["buckets"])
    if limit == 1:
        assert h["count"] == THREADS


def test_concurrency_max_batch_tokens(fresh_daemons):
    """max_batch_tokens caps the query + key tokens of a batch: with 20-token
    requests and a 40-token cap, no batch holds more than two requests."""
    m = GOLDENS["self_e64_h8"]
    dd = fresh_daemons({"batching": {"max_batch_tokens": 40, "max_batch_requests": 64,
                                     "max_queue_delay_us": 5000},
                        "workers": {"threads": 1}, "models": [m.config()]})
    rng = np.random.default_rng(12)
    jobs = []
    for _ in range(THREADS):
        q = rng.standard_normal((10, m.E)).astype(np.float32)
        out, _ = m.forward(q)
        jobs.append([{"path": "/v1/attention", "how": "b64", "model": m.name, "out": out,
                      "att": None, "body": json.dumps({"model": m.name, "query": b64_tensor(q),
                                                       "encoding": "base64"})}])
    failures = run_crowd(dd, jobs)
    assert not failures, "\n".join(failures[:20])
    h = batch_hist(dd)
    assert h["sum"] == THREADS
    le, c = max_batch_bound(h, 2)
    assert c == h["count"], "a batch went over 40 tokens: %s" % h["buckets"]
    assert h["count"] < THREADS, "no two requests shared a batch"
