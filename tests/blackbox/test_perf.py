"""Speed by default, checked as facts rather than timings (SPEC section 5,
docs/performance.md): the OpenBLAS kernels match the CPU's features and are
reported in the start-up log, /v1/models, /v2 and /metrics, and a user's
OPENBLAS_CORETYPE wins, with a warning when it is weaker than the CPU allows;
one compute pool as large as the CPUs the process may use (taskset), sized
by config too, old configs still loading; a lone request starts at once and
requests arriving during a batch join the next; an answer is bit-identical
whatever shares its batch and whatever the pool's size.
"""
import os
import re
import threading
from pathlib import Path
import numpy as np

import support

AVX512_CORES = {"SkylakeX", "Cooperlake", "SapphireRapids"}
AVX2_CORES = {"Haswell", "Zen"} | AVX512_CORES
AVX512_FLAGS = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


def cpu_flags():
    """The flags Linux lists for this CPU (it drops those the OS does not enable)."""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    return set()


def build_info(d):
    _, samples = support.parse_prometheus(d.get("/metrics").text)
    infos = [labels for name, labels, v in samples if name == "attnd_build_info" and v == 1]
    assert len(infos) == 1, "expected one attnd_build_info sample, got %r" % infos
    return infos[0]


def test_kernels_fit_the_cpu(daemons):
    d = daemons()
    flags = cpu_flags()
    compute = d.get("/v1/models").json()["compute"]
    core = compute["blas_core"]
    assert compute["blas_core_from_env"] is False
    if AVX512_FLAGS <= flags:
        assert core in AVX512_CORES, "AVX-512 CPU computes with %s" % core
    elif {"avx2", "fma"} <= flags:
        assert core in AVX2_CORES, "AVX2 CPU computes with %s" % core
    # the same core everywhere it is reported
    assert d.get("/v2").json()["blas_core"] == core
    info = build_info(d)
    assert info["blas_core"] == core
    assert re.fullmatch(r"\d+\.\d+\.\d+", info["version"]), info
    features = set(info["cpu_features"].split(","))
    assert features == set(compute["cpu_features"].split(","))
    # every feature named is one Linux lists (which spells one of them otherwise)
    linux = {"avx512bf16": "avx512_bf16"}
    assert {linux.get(f, f) for f in features} <= flags, features
    assert "blas core %s (chosen from the cpu features)" % core in d.stdout()
    assert not re.search(r" warn .*OpenBLAS", d.stdout()), d.stdout()


def test_user_coretype_wins(fresh_daemons):
    d = fresh_daemons(env={"OPENBLAS_CORETYPE": "Haswell"})
    compute = d.get("/v1/models").json()["compute"]
    assert compute["blas_core"] == "Haswell"
    assert compute["blas_core_from_env"] is True
    assert build_info(d)["blas_core"] == "Haswell"
    assert "blas core Haswell (from OPENBLAS_CORETYPE)" in d.stdout()
    if AVX512_FLAGS <= cpu_flags():
        assert re.search(r" warn OpenBLAS computes with its Haswell kernels, weaker than this CPU allows", d.stdout()), \
            d.stdout()


# ---------------------------------------------------------------- the compute pool

def compute_info(d):
    return d.get("/v1/models").json()["compute"]


def pinned_daemon(factory, cpus, **kw):
    """A daemon started under taskset -c CPUS (registered for the factory's checks)."""
    n = len(factory.daemons)
    d = support.Daemon(factory.tmpdir / ("pinned%d" % n), name="pinned%d" % n, **kw)
    d.args = ["taskset", "-c", cpus] + d.args
    factory.daemons.append(d)
    return d.start()


def test_pool_defaults_to_the_cpus(daemons):
    d = daemons()
    c = compute_info(d)
    allowed = len(os.sched_getaffinity(0))
    assert 1 <= c["cpus"] <= allowed, c  # a cgroup quota may allow fewer
    assert c["threads"] == c["cpus"], c
    assert c["http_threads"] == min(c["cpus"], 64), c
    assert d.get("/v1/models").json()["workers"]["threads"] == c["threads"]
    assert gauge(d, "attnd_compute_threads") == c["threads"]
    assert re.search(r"%d cpus?.* %d compute threads?( \(pinned, one cpu each\))?, %d http threads?"
                     % (c["cpus"], c["threads"], c["http_threads"]), d.stdout()), d.stdout()


def test_pool_follows_the_affinity_mask(fresh_daemons):
    first = sorted(os.sched_getaffinity(0))[0]
    d = pinned_daemon(fresh_daemons, str(first))
    c = compute_info(d)
    assert (c["cpus"], c["threads"], c["http_threads"]) == (1, 1, 1), c
    assert re.search(r" 1 cpu \(affinity 1, cgroup quota \d+\), 1 compute thread"
                     r"( \(pinned, one cpu each\))?, 1 http thread", d.stdout()), d.stdout()
    # and it computes
    r = d.post("/v1/attention", {"query": [[0.25] * 512] * 3})
    assert r.status_code == 200, r.text


def test_pool_size_from_config_and_obsolete_keys(fresh_daemons):
    d = fresh_daemons(config={"workers": {"threads": 3}})
    assert compute_info(d)["threads"] == 3
    assert not re.search(r" warn .*obsolete", d.stdout())
    # an old config's pair still loads: the pool gets threads x blas_threads
    old = fresh_daemons(config={"workers": {"threads": 2, "blas_threads": 2}})
    assert compute_info(old)["threads"] == 4
    assert re.search(r" warn workers\.blas_threads is obsolete: one compute pool of 4 threads",
                     old.stdout()), old.stdout()
    env = fresh_daemons(env={"ATTND_WORKERS": "1"})
    assert compute_info(env)["threads"] == 1


def compute_thread_cpus(d):
    """The CPUs each compute thread may run on: the batcher (the pool's
    thread 0) and the pool's helpers, by their thread names."""
    out = {}
    for task in (Path("/proc") / str(d.proc.pid) / "task").iterdir():
        name = (task / "comm").read_text().strip()
        if name in ("attnd-batcher", "attn-pool"):
            status = (task / "status").read_text()
            cpus = re.search(r"Cpus_allowed_list:\s*(\S+)", status).group(1)
            out.setdefault(name, []).append(cpus)
    return out


def cpu_list(text):
    got = set()
    for part in text.split(","):
        a, _, b = part.partition("-")
        got |= set(range(int(a), int(b or a) + 1))
    return got


def test_compute_threads_pinned_when_they_own_the_cpus(fresh_daemons):
    """workers.pin_threads: auto pins the pool's threads one CPU each when
    the pool has every CPU of the affinity mask (a woken thread is then
    never queued behind the thread that woke it); off leaves them to the
    OS, and so does auto when the pool is larger than the mask."""
    allowed = os.sched_getaffinity(0)
    d = fresh_daemons()
    c = compute_info(d)
    threads = compute_thread_cpus(d)
    assert len(threads["attnd-batcher"]) == 1 and len(threads.get("attn-pool", [])) == c["threads"] - 1
    each = [cpu_list(t) for t in threads["attnd-batcher"] + threads.get("attn-pool", [])]
    if c["threads"] == len(allowed):
        assert c["pinned"] is True, c
        assert all(len(cpus) == 1 for cpus in each), threads
        assert set().union(*each) == allowed, threads  # one CPU each, every CPU
        assert "(pinned, one cpu each)" in d.stdout()
    for config in ({"workers": {"pin_threads": "off"}},
                   {"workers": {"threads": len(allowed) + 1}}):
        free = fresh_daemons(config=config)
        assert compute_info(free)["pinned"] is False
        ts = compute_thread_cpus(free)
        assert all(cpu_list(t) == allowed for t in ts["attnd-batcher"] + ts["attn-pool"]), ts
        r = free.post("/v1/attention", {"query": [[0.5] * 512] * 2})
        assert r.status_code == 200, r.text


# ---------------------------------------------------------------- batching without idle waits

def small_body(rows=4, seed=0, encoding=None):
    rng = np.random.default_rng(seed)
    body = {"query": support.b64_tensor(rng.standard_normal((rows, 512)).astype(np.float32))}
    if encoding:
        body["encoding"] = encoding
    return body


def test_lone_request_starts_at_once(fresh_daemons):
    """With compute idle a request does not wait for company. The mechanism,
    not a speed: a daemon told to hold a batch on idle compute for company
    (max_queue_delay_us 300 ms) makes each lone request wait that long; at
    the default (0) no lone request waits a tenth of it, which allows any
    scheduler delay on a busy machine or a sanitizer build while telling
    the two behaviours apart. The queue histogram counts every request."""
    delay_us = 300_000

    def lone_waits(d, n):
        waits = []
        for i in range(n):
            r = d.post("/v1/attention", small_body(seed=i))
            assert r.status_code == 200, r.text
            u = r.json()["usage"]
            assert u["batch"] == 1
            waits.append(u["queue_us"])
        return waits

    held = fresh_daemons(config={"batching": {"max_queue_delay_us": delay_us}})
    waits = lone_waits(held, 3)
    assert min(waits) >= delay_us, waits
    d = fresh_daemons()
    waits = lone_waits(d, 20)
    assert max(waits) < delay_us / 10, sorted(waits)
    h = support.histograms(d.get("/metrics").text)["attnd_queue_seconds"]
    assert h["count"] == 20, h


def gauge(d, name):
    _, samples = support.parse_prometheus(d.get("/metrics").text)
    return sum(v for n, labels, v in samples if n == name)


def queue_depth(d):
    return gauge(d, "attnd_queue_depth")


def test_requests_during_a_batch_join_the_next(fresh_daemons):
    """While one long request computes, eight small ones queue; when compute
    frees up they run as one batch of eight."""
    # a sanitizer build computes the long request for seconds even at 2048
    # rows (4096: 24 s under ASan): no deadline may cut it, or the small
    # ones queued behind it
    d = fresh_daemons(config={"workers": {"threads": 1},
                              "server": {"request_timeout_ms": 600000}})
    rng = np.random.default_rng(7)
    rows = 2048 if support.sanitized_build() else 4096
    big = {"query": support.b64_tensor(rng.standard_normal((rows, 512)).astype(np.float32))}
    out = {}

    def send(name, body):
        out[name] = d.post("/v1/attention", body)

    tb = threading.Thread(target=send, args=("big", big))
    tb.start()
    assert support.wait_until(lambda: gauge(d, "attnd_requests_running") == 1 or "big" in out, 30)
    smalls = [threading.Thread(target=send, args=(i, small_body(seed=i))) for i in range(8)]
    for t in smalls:
        t.start()
    assert support.wait_until(lambda: queue_depth(d) == 8 or "big" in out, 30)
    assert "big" not in out, "the long request ended before the small ones queued; too fast"
    for t in smalls + [tb]:
        t.join(60)
    assert out["big"].status_code == 200, out["big"].text[:300]
    for i in range(8):
        assert out[i].status_code == 200, (i, out[i].status_code, out[i].text[:300])
    batches = [out[i].json()["usage"]["batch"] for i in range(8)]
    assert batches == [8] * 8, batches


# ---------------------------------------------------------------- batch invariance over HTTP

def test_answer_independent_of_company_and_threads(fresh_daemons):
    """A request's answer is bit-identical alone and among concurrent
    requests of other lengths, on a 1-thread and a 2-thread pool."""
    solo = fresh_daemons(config={"workers": {"threads": 1}})
    pool = fresh_daemons(config={"workers": {"threads": 2}})
    body = small_body(rows=37, seed=99, encoding="base64")
    body["attention"] = "mean"
    want = solo.post("/v1/attention", body).json()
    others = [small_body(rows=n, seed=n, encoding="base64") for n in (1, 5, 64, 130, 17, 200, 3)]
    for d in (solo, pool):
        for rnd in range(3):
            got = {}

            def send(i, b):
                got[i] = d.post("/v1/attention", b).json()

            ts = [threading.Thread(target=send, args=(i, b)) for i, b in enumerate(others)]
            ts.insert(rnd * 3, threading.Thread(target=send, args=("x", body)))
            for t in ts:
                t.start()
            for t in ts:
                t.join(60)
            x = got["x"]
            assert x["output"]["b64"] == want["output"]["b64"], "output bits differ"
            assert x["attention"]["b64"] == want["attention"]["b64"], "attention bits differ"
    # the concurrent rounds did share batches, or the test shows nothing
    h = support.histograms(pool.get("/metrics").text)["attnd_batch_size"]
    assert h["sum"] > h["count"], "every batch held one request"
