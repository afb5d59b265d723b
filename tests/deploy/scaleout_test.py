"""make scaleout-test: three attnd replicas behind a real nginx on 127.0.0.1,
with docker/nginx.conf as the one source of truth (sed rewrites only its
host, port and path lines).

Under a bounded, paced load (a few threads, RATE requests per second for
LOAD_SECONDS seconds, at most MAX_REQUESTS) it kills one replica with SIGKILL, restarts it, and
later stops another with SIGTERM. Every request must get a 200 with the right
answer: nginx retries what a dead or draining replica fails on another one.
It then checks, from nginx's access log, that nginx did retry, that the
restarted replica took traffic again, and that the SIGTERM'd replica exited 0.
Before the load, KV-cache sessions go through nginx, native and KServe v2
(X-Session-Id on each v2 step): every step must reach the replica that
holds its session. Then a rolling restart in the middle of decoding: each
replica keeps its sessions in sessions.save_dir; while sessions step through
nginx, the replica holding the most of them is stopped with SIGTERM (it saves
them) and started again (it loads them); a step that meets it draining or
down gets 503 with Retry-After and is sent again, and every session's steps
equal, bit for bit, the same rows computed as one causal sequence by an
untouched replica.
"""

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import base64
import time

import numpy as np

import deploylib as dl

LOAD_SECONDS = 18.0
RATE = 300.0  # requests per second, paced, so the load lasts through every event
MAX_REQUESTS = int(RATE * LOAD_SECONDS)
THREADS = 12
# Each replica holds a request up to this long for company before computing,
# so that SIGKILL and SIGTERM find requests in flight (queued or computing).
QUEUE_DELAY_US = 20000
KILL_AT, RESTART_AT, TERM_AT = 4.0, 8.0, 12.0
E = 512
L = 4


def nginx_config(tmp, lb_port, ports):
    """docker/nginx.conf, rewritten by sed for loopback. Every rewrite must
    match exactly once, so a change to the original that breaks the mapping
    fails here instead of testing something else."""
    src = os.path.join(dl.ROOT, "docker", "nginx.conf")
    text = open(src).read()
    expect = {r"^pid ": 1, r"^error_log ": 1, r"access_log /dev/stdout": 1,
              r"listen 8080;": 1, r"server attnd:8080": 3, r"^http \{": 1}
    for pat, n in expect.items():
        got = len(re.findall(pat, text, re.M))
        if got != n:
            raise RuntimeError(f"docker/nginx.conf: expected {n} line(s) matching {pat!r}, "
                               f"found {got}; update scaleout_test.py's rewrite")
    servers = "\\n".join(f"        server 127.0.0.1:{p}\\1;" for p in ports)
    temp = "\\n".join(f"    {d}_temp_path {tmp}/{d};"
                      for d in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    script = ";".join([
        f"s|^pid .*|pid {tmp}/nginx.pid;|",
        f"s|^error_log .*|error_log {tmp}/error.log warn;|",
        f"s|access_log /dev/stdout|access_log {tmp}/access.log|",
        f"s|listen 8080;|listen 127.0.0.1:{lb_port};|",
        f"s|^ *server attnd:8080\\(.*\\);|{servers}|",
        f"s|^http {{|http {{\\n{temp}|",
    ])
    out = subprocess.run(["sed", "-e", script, src], capture_output=True, text=True, check=True)
    path = os.path.join(tmp, "nginx.conf")
    with open(path, "w") as f:
        f.write(out.stdout)
    return path


class Replica:
    def __init__(self, idx, port, tmp):
        self.idx, self.port, self.tmp = idx, port, tmp
        self.proc = None
        self.starts = 0

    def start(self):
        self.starts += 1
        log = open(os.path.join(self.tmp, f"attnd{self.idx}.{self.starts}.log"), "wb")
        self.proc = dl.start_attnd(self.port, env={"ATTND_WORKERS": "1", "ATTND_HTTP_THREADS": "1",
                                        "ATTND_MAX_QUEUE_DELAY_US": str(QUEUE_DELAY_US),
                                        "ATTND_SESSIONS_SAVE_DIR":
                                            os.path.join(self.tmp, f"saved{self.idx}")},
                                   log=log)
        log.close()

    def log_text(self):
        return open(os.path.join(self.tmp, f"attnd{self.idx}.{self.starts}.log"),
                    errors="replace").read()


class Load:
    """THREADS clients, each on its own keep-alive connection to nginx,
    posting one of a few fixed queries and checking every answer."""

    def __init__(self, port, bodies, refs):
        self.port, self.bodies, self.refs = port, bodies, refs
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.ok = 0
        self.failures = []  # (t, what)
        self.sent = 0
        self.t0 = None
        self.last_ok = 0.0  # seconds from the start to the last good answer

    def take(self):
        """The next request's number, once its time (t0 + n / RATE) has
        come; -1 when the load is over."""
        with self.lock:
            if self.sent >= MAX_REQUESTS:
                return -1
            n = self.sent
            self.sent += 1
        delay = self.t0 + n / RATE - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        return n

    def client(self, tid):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        i = tid
        while not self.stop.is_set():
            if self.take() < 0:
                break
            k = i % len(self.bodies)
            i += 1
            try:
                conn.request("POST", "/v1/attention", body=self.bodies[k],
                             headers={"Content-Type": "application/json"})
                r = conn.getresponse()
                raw = r.read()
                if r.status != 200:
                    self.fail(f"status {r.status}: {raw[:200]!r}")
                    continue
                out = json.loads(raw).get("output")
                err = dl.rel_err(out, self.refs[k])
                if not err < 1e-5:
                    self.fail(f"wrong answer, relative error {err}")
                    continue
                with self.lock:
                    self.ok += 1
                    self.last_ok = time.monotonic() - self.t0
            except (OSError, http.client.HTTPException, ValueError) as e:
                self.fail(f"{type(e).__name__}: {e}")
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.close()

    def fail(self, what):
        with self.lock:
            self.failures.append((time.monotonic() - self.t0, what))

    def run(self, events):
        """Runs the clients for LOAD_SECONDS, calling each (at, fn) of events
        at its time; returns the elapsed seconds."""
        self.t0 = time.monotonic()
        threads = [threading.Thread(target=self.client, args=(t,)) for t in range(THREADS)]
        for t in threads:
            t.start()
        for at, fn in sorted(events, key=lambda e: e[0]):
            time.sleep(max(0.0, at - (time.monotonic() - self.t0)))
            fn()
        time.sleep(max(0.0, LOAD_SECONDS - (time.monotonic() - self.t0)))
        self.stop.set()
        for t in threads:
            t.join()
        return time.monotonic() - self.t0


def wait_queued(port, timeout=3.0):
    """Polls a replica's /metrics until a request waits in its queue, so a
    signal sent next finds work in flight. Returns whether it saw one."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        st, text, _ = dl.http("GET", f"http://127.0.0.1:{port}/metrics", timeout=2)
        if st == 200 and isinstance(text, str):
            m = re.search(r"^attnd_queue_depth\{[^}]*\} (\d+)", text, re.M)
            if m and int(m.group(1)) > 0:
                return True
        time.sleep(0.002)
    return False


def v2_sessions(c, lb, tmp, queries, reps):
    """KServe v2 sessions through nginx: the id of a v2 step is in its body,
    which nginx does not read, so clients send it as X-Session-Id on every
    step (docs/deploy.md). Half the opens let nginx name the session (no
    header: it sends its $request_id, which attnd takes as the id), half
    name it themselves. Every step must reach its session and equal the
    whole sequence computed causally at once; the sessions spread over the
    replicas, and the native DELETE of each reaches it too."""
    refs = []
    for q in queries:
        st, body, _ = dl.http("POST", f"http://127.0.0.1:{reps[2].port}/v1/attention",
                              {"query": q, "causal": True})
        c.check(st == 200, "causal reference answer from a replica", str(st), fatal=True)
        refs.append(np.asarray(body["output"]))

    def infer(rows, params, sid):
        body = {"inputs": [{"name": "query", "shape": [1, len(rows), E], "datatype": "FP32",
                            "data": np.asarray(rows, dtype=np.float32).reshape(-1).tolist()}],
                "parameters": params}
        return dl.http("POST", lb + "/v2/models/default/infer", body,
                       headers={"X-Session-Id": sid} if sid else None)

    mark = len(access_lines(tmp))
    sids, named, steps_ok, deleted = [], 0, 0, 0
    for k in range(12):
        own = os.urandom(16).hex() if k % 2 else None
        st, body, _ = infer(queries[k % 4][:2], {"session_open": True}, own)
        if st != 200:
            c.check(False, "v2 session opened through nginx", f"{st} {str(body)[:200]}")
            break
        sid = body["parameters"]["session_id"]
        named += own is None or sid == own
        sids.append(sid)
        for i in range(2, L):
            st, body, _ = infer(queries[k % 4][i:i + 1], {"session_id": sid}, sid)
            if st != 200:
                continue
            out = np.asarray(body["outputs"][0]["data"]).reshape(1, E)
            steps_ok += (body["parameters"].get("cached_tokens") == i + 1
                         and dl.rel_err(out, refs[k % 4][i:i + 1]) < 1e-5)
    c.check(len(sids) == 12 and named == 12 and steps_ok == 12 * (L - 2),
            "every v2 step (X-Session-Id) of 12 sessions opened through nginx reached its "
            "session and equals the causal whole sequence",
            f"{len(sids)} opened, {named} with the id asked for, "
            f"{steps_ok} of {12 * (L - 2)} steps right")
    lines = [ln for ln in access_lines(tmp)[mark:] if '"POST /v2/models/default/infer' in ln]
    spread = {re.search(r"upstream=(\S+) ", ln).group(1) for ln in lines}
    c.check(len(spread) >= 2, "v2 sessions spread over the replicas", str(spread))
    for sid in sids:
        st, _, _ = dl.http("DELETE", f"{lb}/v1/sessions/{sid}")
        deleted += st == 204
    c.check(deleted == len(sids), "the native DELETE reaches every v2 session",
            f"{deleted} of {len(sids)} answered 204")


ROLLING_SESSIONS = 12
ROLLING_STEPS = 24   # rows each session decodes one by one, after a prefix of 2
STEP_PAUSE = 0.03    # seconds between a session's steps, so decoding outlasts the restart


def step_retrying(lb, sid, row):
    """One step through nginx, sent again after each 503 (a replica draining,
    or down while it restarts: nginx's 503); returns (status, body, tries)."""
    for tries in range(1, 400):
        st, body, headers = dl.http("POST", f"{lb}/v1/sessions/{sid}/attention",
                                    {"query": [row], "encoding": "base64"})
        if st != 503:
            return st, body, tries
        time.sleep(min(float(headers.get("Retry-After", "1")), 0.2))
    return st, body, tries


def rolling_restart(c, lb, tmp, reps):
    """Sessions decoding through nginx while the replica holding the most of
    them restarts (SIGTERM: saved; started again: loaded). Every step's
    output equals, bit for bit, the same row of the whole causal sequence
    computed at once by a replica that never stopped."""
    seqs = [dl.query(2 + ROLLING_STEPS, E, seed=100 + k) for k in range(ROLLING_SESSIONS)]
    sids, refs = [], []
    for q in seqs:
        st, body, _ = dl.http("POST", lb + "/v1/sessions", {"query": q[:2]})
        if st != 201:
            c.check(False, "sessions opened through nginx for the rolling restart",
                    f"{st} {str(body)[:200]}", fatal=True)
        sids.append(body["session"])
    holders = []
    for r in reps:
        st, text, _ = dl.http("GET", f"http://127.0.0.1:{r.port}/metrics")
        m = re.search(r"^attnd_sessions (\d+)", text if isinstance(text, str) else "", re.M)
        holders.append(int(m.group(1)) if m else 0)
    victim = reps[max(range(len(reps)), key=lambda i: holders[i])]
    for k, q in enumerate(seqs):  # the reference: a replica that is not restarted
        other = reps[(reps.index(victim) + 1) % len(reps)]
        st, body, _ = dl.http("POST", f"http://127.0.0.1:{other.port}/v1/attention",
                              {"query": q, "causal": True, "encoding": "base64"})
        if st != 200:
            c.check(False, "causal reference of a whole sequence", str(st), fatal=True)
        out = np.frombuffer(base64.b64decode(body["output"]["b64"]), "<f4").reshape(-1, E)
        refs.append(out)
    done = [0] * ROLLING_SESSIONS
    bad, retried = [], [0]
    lock = threading.Lock()

    def decode(k):
        for i in range(2, 2 + ROLLING_STEPS):
            st, body, tries = step_retrying(lb, sids[k], seqs[k][i])
            got = (np.frombuffer(base64.b64decode(body["output"]["b64"]), "<f4")
                   if st == 200 else None)
            with lock:
                retried[0] += tries - 1
                if got is None or body.get("cached_tokens") != i + 1 or \
                        got.tobytes() != refs[k][i].tobytes():
                    bad.append(f"session {k} step {i}: {st} {str(body)[:160]}")
                    return
                done[k] += 1
            time.sleep(STEP_PAUSE)

    threads = [threading.Thread(target=decode, args=(k,)) for k in range(ROLLING_SESSIONS)]
    for t in threads:
        t.start()
    end = time.monotonic() + 60
    while min(done) < 3 and not bad and time.monotonic() < end:
        time.sleep(0.01)
    left = ROLLING_STEPS - max(done)
    victim.proc.send_signal(signal.SIGTERM)
    code = victim.proc.wait(45)
    saved = victim.log_text()
    victim.start()
    for t in threads:
        t.join(120)
    c.check(code == 0, "the replica stopped mid-decoding drained and exited 0", f"exit {code}")
    c.check(left > 0 and holders[reps.index(victim)] > 0,
            "the restart came in the middle of decoding, on a replica holding sessions",
            f"{left} steps left, {holders} sessions per replica")
    m = re.search(r"(\d+) sessions? saved", saved)
    loaded = re.search(r"(\d+) sessions? loaded", victim.log_text())
    c.check(m and loaded and int(m.group(1)) == holders[reps.index(victim)] ==
            int(loaded.group(1)),
            "it saved every session it held at SIGTERM and loaded them all again",
            f"saved {m and m.group(1)}, loaded {loaded and loaded.group(1)}, held "
            f"{holders[reps.index(victim)]}")
    c.check(not bad and sum(done) == ROLLING_SESSIONS * ROLLING_STEPS,
            "every step of every session went on through the restart, equal bit for bit to "
            "the whole causal sequence", "; ".join(bad[:4]) or f"{sum(done)} steps")
    print(f"rolling restart: {holders} sessions per replica, replica {reps.index(victim)} "
          f"restarted with {left} steps left, {retried[0]} steps sent again", flush=True)
    for sid in sids:
        dl.http("DELETE", f"{lb}/v1/sessions/{sid}")


def access_lines(tmp):
    path = os.path.join(tmp, "access.log")
    return open(path, errors="replace").read().splitlines() if os.path.exists(path) else []


def lb_answers(c, lb, tmp):
    """What nginx itself answers, in attnd's form: a body past the limit
    both hold is a JSON 413 from nginx; attnd's own 504 (the request's
    deadline passed) comes back from the one replica that gave it, not
    retried on the others."""
    big = b'{"query": [[0.1]]' + b" " * (64 << 20) + b"}"
    st, body, _ = dl.http("POST", lb + "/v1/attention", big)
    c.check(st == 413 and isinstance(body, dict) and "limit" in body.get("error", ""),
            "a body past 64 MiB: nginx answers a JSON 413", f"{st} {str(body)[:200]}")
    rid = "deadline%024x" % os.getpid()
    st, body, _ = dl.http("POST", lb + "/v1/attention",
                          {"query": dl.query(2048, E, seed=9), "timeout_ms": 1},
                          headers={"X-Request-Id": rid})
    line = ""
    for _ in range(50):  # nginx writes its line just after the answer
        line = next((ln for ln in access_lines(tmp) if "id=" + rid in ln), "")
        if line:
            break
        time.sleep(0.1)
    c.check(st == 504 and "upstream_status=504 " in line,
            "attnd's 504 (timeout_ms passed) reaches the client from one replica, not retried",
            f"{st} {line}")


def main():
    c = dl.Checks("scaleout-test")
    nginx_bin = shutil.which("nginx") or "/usr/sbin/nginx"
    tmp = tempfile.mkdtemp(prefix="attnd-scaleout-")
    os.chmod(tmp, 0o755)  # nginx workers may run as another user
    reps = [Replica(i, dl.free_port(), tmp) for i in range(3)]
    nginx = None
    try:
        for r in reps:
            r.start()
        lb_port = dl.free_port()
        conf = nginx_config(tmp, lb_port, [r.port for r in reps])
        t = subprocess.run([nginx_bin, "-t", "-p", tmp, "-c", conf, "-e", f"{tmp}/error.log"],
                           capture_output=True, text=True)
        c.check(t.returncode == 0, "nginx -t accepts the config made from docker/nginx.conf",
                t.stderr, fatal=True)
        nginx = subprocess.Popen([nginx_bin, "-p", tmp, "-c", conf, "-e", f"{tmp}/error.log",
                                  "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        c.check(dl.wait_status(f"http://127.0.0.1:{lb_port}/nginx-health", 200, 10, nginx),
                "nginx answers on 127.0.0.1", fatal=True)

        # Reference answers straight from one replica.
        queries = [dl.query(L, E, seed=s) for s in range(4)]
        bodies = [json.dumps({"query": q}).encode() for q in queries]
        refs = []
        for q in queries:
            st, body, _ = dl.http("POST", f"http://127.0.0.1:{reps[2].port}/v1/attention",
                                  {"query": q})
            ok, why = dl.output_ok(body.get("output") if st == 200 else None, L, E)
            c.check(ok, "reference answer from a replica", f"{st} {why}", fatal=True)
            refs.append(np.asarray(body["output"]))

        # KV-cache sessions through nginx: the open and every step of a session
        # reach the same replica (consistent hash on the session id, which
        # nginx names at the open), while sessions spread over the replicas.
        lb = f"http://127.0.0.1:{lb_port}"
        steps_ok, sids = 0, []
        for k in range(12):
            st, body, _ = dl.http("POST", lb + "/v1/sessions", {"query": queries[k % 4][:2]})
            if st != 201:
                break
            sids.append(body["session"])
            for i in range(2, L):
                st, body, _ = dl.http("POST", f"{lb}/v1/sessions/{sids[-1]}/attention",
                                      {"query": queries[k % 4][i:i + 1]})
                steps_ok += st == 200 and body.get("cached_tokens") == i + 1
        c.check(len(sids) == 12 and steps_ok == 12 * (L - 2),
                "every step of 12 sessions opened through nginx reached its session",
                f"{len(sids)} opened, {steps_ok} of {12 * (L - 2)} steps answered")
        opens = [ln for ln in access_lines(tmp) if '"POST /v1/sessions HTTP' in ln]
        spread = {re.search(r"upstream=(\S+) ", ln).group(1) for ln in opens}
        c.check(len(spread) >= 2, "sessions spread over the replicas", str(spread))
        for sid in sids:
            dl.http("DELETE", f"{lb}/v1/sessions/{sid}")
        v2_sessions(c, lb, tmp, queries, reps)
        lb_answers(c, lb, tmp)
        rolling_restart(c, lb, tmp, reps)

        marks = {}
        term_code = {}

        def kill0():
            marks["kill"] = len(access_lines(tmp))
            marks["kill_queued"] = wait_queued(reps[0].port)
            reps[0].proc.send_signal(signal.SIGKILL)
            reps[0].proc.wait()

        def restart0():
            reps[0].start()
            marks["restart"] = len(access_lines(tmp))

        def term1():
            marks["term_queued"] = wait_queued(reps[1].port)
            reps[1].proc.send_signal(signal.SIGTERM)
            threading.Thread(target=lambda: term_code.setdefault(
                1, reps[1].proc.wait(45))).start()

        load = Load(lb_port, bodies, refs)
        took = load.run([(KILL_AT, kill0), (RESTART_AT, restart0), (TERM_AT, term1)])
        total = load.ok + len(load.failures)
        print(f"load: {total} requests in {took:.1f} s ({total / took:.0f}/s), "
              f"{len(load.failures)} failed", flush=True)
        c.check(total >= 1000, "load reached at least 1000 requests", str(total))
        c.check(load.last_ok > TERM_AT + 2, "the load went on past the last event",
                f"last answer at {load.last_ok:.1f} s, SIGTERM at {TERM_AT} s")
        c.check(marks.get("kill_queued"), "SIGKILL hit a replica with requests in its queue")
        c.check(marks.get("term_queued"), "SIGTERM hit a replica with requests in its queue")
        c.check(not load.failures, "no request failed through kill -9, restart and SIGTERM",
                "; ".join(f"t={t:.1f}s {w}" for t, w in load.failures[:5]))

        deadline = time.monotonic() + 45
        while 1 not in term_code and time.monotonic() < deadline:
            time.sleep(0.1)
        c.check(term_code.get(1) == 0, "the SIGTERM'd replica drained and exited 0",
                f"exit {term_code.get(1)}; its log ends: "
                + " | ".join(reps[1].log_text().splitlines()[-8:]))

        lines = access_lines(tmp)
        # Wait for nginx to write its last lines (it logs after answering).
        time.sleep(0.3)
        lines = access_lines(tmp)
        addr = {i: f"127.0.0.1:{r.port}" for i, r in enumerate(reps)}
        first = lines[:marks.get("kill", 0)]
        c.check(all(any(f"upstream={addr[i]}" in ln for ln in first) for i in range(3)),
                "before the kill, every replica took traffic")
        retried = [ln for ln in lines if re.search(r"upstream=\S+, ", ln)]
        c.check(len(retried) > 0, "nginx retried requests on another replica",
                "no access log line with two upstreams")
        after = lines[marks.get("restart", len(lines)):]
        back = [ln for ln in after if re.search(rf"upstream=(\S+, )*{re.escape(addr[0])} "
                                                 r"upstream_status=(\S+, )*200 ", ln)]
        c.check(len(back) > 0, "the restarted replica takes traffic again (nginx log)",
                f"{len(after)} lines after restart")
        c.check("/v1/attention" in reps[0].log_text(),
                "the restarted replica logged served /v1/attention requests")
        if retried:
            print("a retried request:", retried[0], flush=True)
    finally:
        if nginx is not None:
            nginx.send_signal(signal.SIGQUIT)
            try:
                nginx.wait(10)
            except subprocess.TimeoutExpired:
                nginx.kill()
        for r in reps:
            if r.proc is not None and r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    return c.finish()


if __name__ == "__main__":
    sys.exit(main())
