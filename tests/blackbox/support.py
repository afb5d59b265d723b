"""support.py - what the black-box suites share: starting the real daemon on
127.0.0.1, a plain numpy reference of SPEC section 1, safetensors files,
golden data, tensor encodings and a Prometheus text parser.

Nothing here knows how the daemon is written; it only speaks HTTP to it.
"""
import base64
import json
import math
import os
import re
import shlex
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "config"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from safetensors_header import safetensors_bytes  # noqa: E402
from ports import address_in_use, free_port  # noqa: E402,F401

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("ATTND_BIN", str(REPO / "build" / "attnd")))
GOLDEN_DIR = REPO / "tests" / "data" / "golden"
# ATTND_WRAP: a command line the daemon runs under, its binary and flags
# appended (make valgrind: valgrind's memcheck); empty, the daemon alone.
WRAP = shlex.split(os.environ.get("ATTND_WRAP", ""))
# ATTND_SLOW: how many times slower than alone the daemon runs under WRAP
# (memcheck: 20 to 50 times); every timeout of the fixtures (start, stop,
# each HTTP call) is multiplied by it.
SLOW = float(os.environ.get("ATTND_SLOW", "1"))

# Every network call of the suites is bounded by this many seconds.
HTTP_TIMEOUT = 60.0 * SLOW

# "valgrind-error": the marker make valgrind has memcheck print before each
# of its reports (--error-markers).
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "LeakSanitizer",
                   "runtime error:", "WARNING: ThreadSanitizer", "ThreadSanitizer: ",
                   "valgrind-error")


def sanitized_build():
    """True when the daemon under test is an ASan or TSan build (slower)."""
    b = str(BIN)
    return ("asan" in b or "tsan" in b or os.environ.get("ATTND_TSAN") == "1"
            or os.environ.get("ATTND_ASAN") == "1")


def tsan_build():
    return "tsan" in str(BIN) or os.environ.get("ATTND_TSAN") == "1"


def slowed(kw):
    """A requests call's keywords with its timeout multiplied by SLOW, or
    HTTP_TIMEOUT (SLOW's already) when it has none; kw itself, changed."""
    t = kw.get("timeout")
    if "timeout" not in kw:
        kw["timeout"] = HTTP_TIMEOUT
    elif t is not None:
        kw["timeout"] = tuple(x * SLOW for x in t) if isinstance(t, tuple) else t * SLOW
    return kw


class Daemon:
    """One attnd process on 127.0.0.1 with its own port, config and logs."""

    def __init__(self, workdir, config=None, env=None, args=None, name="attnd", flags=True):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        # gRPC listens too (server.grpc_port, 8081 by default): each daemon
        # on a free port of its own, so that daemons started together never
        # meet on 8081; a test sets ATTND_GRPC_PORT in env (or a flag) to choose
        self.grpc_port = free_port()
        self.grpc_target = "127.0.0.1:%d" % self.grpc_port
        self.config_path = None
        if config is not None:
            self.config_path = self.workdir / (name + ".json")
            self.config_path.write_text(json.dumps(config, indent=1))
        self.stdout_path = self.workdir / (name + ".stdout")
        self.stderr_path = self.workdir / (name + ".stderr")
        # A daemon starts as a fresh user's would: no ATTND_* and no
        # OPENBLAS_CORETYPE inherited from the machine running the tests (some
        # preset one); a test that wants either passes it in env. A value of
        # None removes a key.
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("ATTND_") and k != "OPENBLAS_CORETYPE"}
        self.env["ATTND_GRPC_PORT"] = str(self.grpc_port)
        for k, v in (env or {}).items():
            if v is None:
                self.env.pop(k, None)
            else:
                self.env[k] = v
        self.args = WRAP + [str(BIN)]
        self.flags = flags  # otherwise the caller says where to listen (env or config)
        if flags:
            self.args += ["--host", "127.0.0.1", "--port", str(self.port)]
        if self.config_path is not None:
            self.args += ["--config", str(self.config_path)]
        self.extra_args = list(args or [])
        self.args += self.extra_args
        self.proc = None
        self.returncode = None

    def _ports_picked_here(self):
        """The ports this harness chose and the daemon listens on as chosen:
        (which, port) pairs, a test's own choice left out."""
        out = []
        if self.flags and "--port" not in self.extra_args:
            out.append(("http", self.port))
        if self.env.get("ATTND_GRPC_PORT") == str(self.grpc_port) \
                and "--grpc-port" not in self.extra_args:
            out.append(("grpc", self.grpc_port))
        return out

    def _repick(self, which):
        if which == "http":
            i = self.args.index("--port")
            self.port = free_port()
            self.args[i + 1] = str(self.port)
            self.url = "http://127.0.0.1:%d" % self.port
        else:
            self.grpc_port = free_port()
            self.grpc_target = "127.0.0.1:%d" % self.grpc_port
            self.env["ATTND_GRPC_PORT"] = str(self.grpc_port)

    def start(self, wait=True, timeout=60.0):
        """Starts the daemon (and waits until healthy). A port the harness
        chose that another process took before the daemon bound it is chosen
        again, up to three times: a test that chose its own is not retried."""
        assert BIN.exists(), "daemon binary %s is missing: run make" % BIN
        for attempt in range(4):
            self._out = open(self.stdout_path, "wb")
            self._err = open(self.stderr_path, "wb")
            self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._err,
                                         stdin=subprocess.DEVNULL, env=self.env,
                                         cwd=self.workdir)
            if not wait:
                return self
            try:
                self.wait_healthy(timeout)
                return self
            except AssertionError:
                if self.proc.poll() is None or attempt == 3:
                    raise
                text = self.stdout() + self.stderr()
                taken = [w for w, p in self._ports_picked_here() if address_in_use(text, p)]
                if not taken:
                    raise
                self._close()
                for w in taken:
                    self._repick(w)
        return self

    def wait_healthy(self, timeout=60.0):
        deadline = time.monotonic() + timeout * SLOW
        last = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("attnd exited with %s before it was healthy:\n%s"
                                     % (self.proc.returncode, self.logs()))
            try:
                r = requests.get(self.url + "/health", timeout=2 * SLOW)
                last = r.status_code
                if r.status_code == 200:
                    return
            except requests.RequestException as e:
                last = repr(e)
            time.sleep(0.05)
        raise AssertionError("attnd not healthy after %.0fs (last: %s):\n%s"
                             % (timeout * SLOW, last, self.logs()))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        self.proc.send_signal(sig)

    def stop(self, sig=signal.SIGTERM, timeout=60.0):
        """Signals the daemon and waits; returns its exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout * SLOW)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                self._close()
                raise AssertionError("attnd did not exit within %.0fs of signal %d:\n%s"
                                     % (timeout * SLOW, sig, self.logs()))
        self._close()
        self.returncode = self.proc.returncode
        return self.returncode

    def wait_exit(self, timeout=60.0):
        try:
            self.proc.wait(timeout * SLOW)
        except subprocess.TimeoutExpired:
            return None
        self._close()
        self.returncode = self.proc.returncode
        return self.returncode

    def _close(self):
        for f in (getattr(self, "_out", None), getattr(self, "_err", None)):
            if f is not None and not f.closed:
                f.close()

    def stdout(self):
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def stderr(self):
        return self.stderr_path.read_text(errors="replace") if self.stderr_path.exists() else ""

    def logs(self, tail=4000):
        return ("--- stderr ---\n" + self.stderr()[-tail:] + "\n--- stdout ---\n"
                + self.stdout()[-tail:])

    def sanitizer_reports(self):
        err = self.stderr() + self.stdout()
        return [m for m in SANITIZER_MARKS if m in err]

    def check_clean_exit(self, sig=signal.SIGTERM):
        """Stops (if running) and asserts exit 0 and no sanitizer report."""
        rc = self.stop(sig)
        problems = []
        if rc != 0:
            problems.append("exit code %s, expected 0" % rc)
        marks = self.sanitizer_reports()
        if marks:
            problems.append("sanitizer reports: %s" % marks)
        assert not problems, "attnd on port %d: %s\n%s" % (self.port, "; ".join(problems),
                                                          self.logs(20000))

    # -- HTTP shortcuts
    def get(self, path, **kw):
        return requests.get(self.url + path, **slowed(kw))

    def post(self, path, body=None, **kw):
        slowed(kw)
        if body is not None and "data" not in kw and "json" not in kw:
            kw["data"] = json.dumps(body)
            kw.setdefault("headers", {}).setdefault("Content-Type", "application/json")
        return requests.post(self.url + path, **kw)

    def request(self, method, path, **kw):
        return requests.request(method, self.url + path, **slowed(kw))


class DaemonFactory:
    """Starts daemons on demand; at teardown stops every one still running and
    asserts that each exited 0 without sanitizer reports."""

    def __init__(self, tmpdir):
        self.tmpdir = Path(tmpdir)
        self.daemons = []

    def __call__(self, config=None, env=None, args=None, wait=True, timeout=60.0, flags=True,
                 port=None):
        n = len(self.daemons)
        d = Daemon(self.tmpdir / ("d%d" % n), config=config, env=env, args=args,
                   name="attnd%d" % n, flags=flags)
        if port is not None:
            d.port, d.url = port, "http://127.0.0.1:%d" % port
        self.daemons.append(d)
        d.start(wait=wait, timeout=timeout)
        return d

    def next_workdir(self):
        """The folder the next daemon started here will run in and write its
        config to (the config's folder: where relative weight paths resolve),
        made now so that files can be put there before it starts."""
        w = self.tmpdir / ("d%d" % len(self.daemons))
        w.mkdir(parents=True, exist_ok=True)
        return w

    def finish(self):
        problems = []
        for d in self.daemons:
            if d.proc is None:
                continue
            try:
                if d.returncode is None:
                    # not stopped by a test: it must still run, then exit 0 on SIGTERM
                    rc = d.proc.poll()
                    assert rc is None, "attnd exited by itself during the tests (code %s):\n%s" \
                        % (rc, d.logs(20000))
                    d.check_clean_exit()
                else:
                    # stopped by its test, which checked its exit code; sanitizer
                    # reports are still checked here
                    marks = d.sanitizer_reports()
                    assert not marks, "sanitizer reports %s:\n%s" % (marks, d.logs(20000))
            except AssertionError as e:
                problems.append(str(e))
        assert not problems, "\n\n".join(problems)


# ---------------------------------------------------------------- tensors

def b64_tensor(a):
    """A tensor object of SPEC section 4: shape, float32, base64 little-endian."""
    a = np.ascontiguousarray(a, dtype="<f4")
    return {"shape": list(a.shape), "dtype": "float32",
            "b64": base64.b64encode(a.tobytes()).decode()}


def from_b64_tensor(obj):
    assert isinstance(obj, dict), "expected a tensor object, got %r" % type(obj)
    assert obj.get("dtype") == "float32", obj.get("dtype")
    raw = base64.b64decode(obj["b64"], validate=True)
    a = np.frombuffer(raw, dtype="<f4")
    assert a.size == int(np.prod(obj["shape"])), (a.size, obj["shape"])
    return a.reshape(obj["shape"])


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert out.shape == ref.shape, "shape %s, expected %s" % (out.shape, ref.shape)
    assert np.isfinite(out).all(), "non-finite numbers in the answer"
    n = np.linalg.norm(ref)
    d = np.linalg.norm(out - ref)
    return d / n if n > 0 else d


def v2_ranked(ref, attention=None):
    """A reference output (attention=None) or attention matrix ("mean" or
    "heads") in the ranks the v2 model metadata declares: output (B, L, E),
    attention (B, H, L, S) with H = 1 for "mean"; an (L, E) query is a batch
    of one."""
    ref = np.asarray(ref)
    if attention is None:
        return ref[None] if ref.ndim == 2 else ref
    if attention == "mean":
        return ref[None, None] if ref.ndim == 2 else ref[:, None]
    return ref[None] if ref.ndim == 3 else ref


def tolist32(a):
    """Nested lists of floats that round-trip float32 (for JSON requests)."""
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return a.tolist()
    return np.asarray(a, dtype=np.float32).astype(np.float64).tolist()


# ---------------------------------------------------------------- safetensors

def write_safetensors(path, tensors, dtype="F32"):
    """tensors: dict name -> numpy array, written as F32 (or F16/BF16)."""
    entries = []
    for name, arr in tensors.items():
        arr = np.asarray(arr, dtype=np.float32)
        if dtype == "F32":
            data = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        elif dtype == "F16":
            data = np.ascontiguousarray(arr, dtype="<f2").tobytes()
        elif dtype == "BF16":
            u = np.ascontiguousarray(arr, dtype="<f4").view("<u4")
            data = (u >> 16).astype("<u2").tobytes()  # exact for bf16-representable values
        else:
            raise ValueError(dtype)
        entries.append((name, dtype, arr.shape, data))
    Path(path).write_bytes(safetensors_bytes(entries))


def read_safetensors(path):
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32"
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"])
    return out


# ---------------------------------------------------------------- the reference

class Model:
    """One attention layer's hyper-parameters and weights (float32, torch names)."""

    def __init__(self, name, E, H, kdim=None, vdim=None, bias=True, weights=None):
        self.name, self.E, self.H = name, E, H
        self.kdim = kdim or E
        self.vdim = vdim or E
        self.bias = bias
        self.sd = weights  # state_dict name -> float32 array
        self.path = None   # safetensors file

    @classmethod
    def random(cls, name, E, H, kdim=None, vdim=None, bias=True, seed=0):
        rng = np.random.default_rng(seed)
        kdim, vdim = kdim or E, vdim or E
        sd = {}
        if kdim == E and vdim == E:
            sd["in_proj_weight"] = rng.standard_normal((3 * E, E)) / math.sqrt(E)
        else:
            sd["q_proj_weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
            sd["k_proj_weight"] = rng.standard_normal((E, kdim)) / math.sqrt(kdim)
            sd["v_proj_weight"] = rng.standard_normal((E, vdim)) / math.sqrt(vdim)
        if bias:
            sd["in_proj_bias"] = rng.standard_normal(3 * E) * 0.5
        sd["out_proj.weight"] = rng.standard_normal((E, E)) / math.sqrt(E)
        if bias:
            sd["out_proj.bias"] = rng.standard_normal(E) * 0.5
        sd = {k: v.astype(np.float32) for k, v in sd.items()}
        return cls(name, E, H, kdim, vdim, bias, sd)

    @classmethod
    def from_golden(cls, golden):
        m = cls(golden["name"], golden["embed_dim"], golden["num_heads"], golden["kdim"],
                golden["vdim"], golden["bias"])
        m.path = GOLDEN_DIR / (golden["name"] + ".safetensors")
        m.sd = read_safetensors(m.path)
        return m

    def save(self, path, dtype="F32", rename=None):
        rename = rename or {}
        write_safetensors(path, {rename.get(k, k): v for k, v in self.sd.items()}, dtype)
        self.path = Path(path)
        return self.path

    def config(self, **extra):
        c = {"name": self.name, "embed_dim": self.E, "num_heads": self.H, "kdim": self.kdim,
             "vdim": self.vdim, "bias": self.bias, "weights": str(self.path)}
        c.update(extra)
        return c

    def forward(self, query, key=None, value=None, causal=False, key_padding_mask=None,
                attn_mask=None):
        """SPEC section 1 in float64 for one sequence (L,E) or a batch (B,L,E).
        Returns (output, attention weights (.., H, L, S))."""
        q = np.asarray(query, dtype=np.float64)
        if q.ndim == 3:
            outs, ws = [], []
            for b in range(q.shape[0]):
                kpm = None
                if key_padding_mask is not None:
                    kpm = np.asarray(key_padding_mask)
                    kpm = kpm[b] if kpm.ndim == 2 else kpm
                o, w = self.forward(q[b], None if key is None else key[b],
                                    None if value is None else value[b], causal, kpm, attn_mask)
                outs.append(o)
                ws.append(w)
            return np.stack(outs), np.stack(ws)
        k = q if key is None else np.asarray(key, dtype=np.float64)
        v = k if value is None else np.asarray(value, dtype=np.float64)
        E, H = self.E, self.H
        D = E // H
        sd = {n: a.astype(np.float64) for n, a in self.sd.items()}
        if "in_proj_weight" in sd:
            wq, wk, wv = np.split(sd["in_proj_weight"], 3)
        else:
            wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
        bq, bk, bv = np.split(sd.get("in_proj_bias", np.zeros(3 * E)), 3)
        wo, bo = sd["out_proj.weight"], sd.get("out_proj.bias", np.zeros(E))
        L, S = q.shape[0], k.shape[0]
        hidden = np.zeros((L, S), dtype=bool)
        add = np.zeros((L, S))
        if key_padding_mask is not None:
            hidden |= np.asarray(key_padding_mask, dtype=bool)[None, :]
        if attn_mask is not None:
            am = np.asarray(attn_mask)
            if am.dtype == np.bool_:
                hidden |= am
            else:
                add = am.astype(np.float64)
                hidden |= np.isneginf(add)
                add = np.where(np.isneginf(add), 0.0, add)
        if causal:
            hidden |= np.triu(np.ones((L, S), dtype=bool), 1)
        qp, kp, vp = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv
        att = np.zeros((H, L, S))
        ctx = np.zeros((L, E))
        for h in range(H):
            sl = slice(h * D, (h + 1) * D)
            s = qp[:, sl] @ kp[:, sl].T / math.sqrt(D) + add
            s = np.where(hidden, -np.inf, s)
            for i in range(L):
                if hidden[i].all():
                    continue
                e = np.exp(s[i] - s[i].max())
                att[h, i] = e / e.sum()
            ctx[:, sl] = att[h] @ vp[:, sl]
        out = ctx @ wo.T + bo
        out[hidden.all(axis=1)] = bo
        return out, att


def load_goldens():
    """Every golden model: list of (json object, Model)."""
    out = []
    for p in sorted(GOLDEN_DIR.glob("*.json")):
        g = json.loads(p.read_text())
        out.append((g, Model.from_golden(g)))
    return out


def golden_body(seq, model_name=None, encoding=None, b64_inputs=False):
    """The native request of one golden sequence."""
    body = {"query": b64_tensor(np.array(seq["query"])) if b64_inputs else seq["query"]}
    if model_name is not None:
        body["model"] = model_name
    for f in ("key", "value"):
        if seq.get(f) is not None:
            body[f] = b64_tensor(np.array(seq[f])) if b64_inputs else seq[f]
    if seq.get("key_padding_mask") is not None:
        body["key_padding_mask"] = seq["key_padding_mask"]
    if seq.get("attn_mask") is not None:
        if b64_inputs and seq.get("attn_mask_kind") == "float":
            body["attn_mask"] = b64_tensor(np.array(seq["attn_mask"]))
        else:
            body["attn_mask"] = seq["attn_mask"]
    body["causal"] = bool(seq.get("causal", False))
    body["attention"] = seq.get("attention", "none")
    if encoding is not None:
        body["encoding"] = encoding
    return body


def golden_mask(seq):
    am = seq.get("attn_mask")
    if am is None:
        return None
    return np.array(am, dtype=bool if seq.get("attn_mask_kind") == "bool" else np.float64)


def check_error_body(r, status):
    """Asserts the status and that the body is exactly {"error": "<sentence>"}.
    Returns the sentence."""
    assert r.status_code == status, "status %d, expected %d; body %r" % (
        r.status_code, status, r.text[:500])
    ct = r.headers.get("Content-Type", "")
    assert ct.startswith("application/json"), "Content-Type %r" % ct
    try:
        body = r.json()
    except ValueError:
        raise AssertionError("error body is not JSON: %r" % r.text[:500])
    assert isinstance(body, dict) and list(body.keys()) == ["error"], body
    msg = body["error"]
    assert isinstance(msg, str) and msg.strip(), body
    assert "\n" not in msg.strip(), "error is not one sentence: %r" % msg
    # every response, errors included, carries these two (SPEC 4, Operations)
    assert r.headers.get("X-Request-Id"), "error response without X-Request-Id"
    assert r.headers.get("Server-Timing"), "error response without Server-Timing"
    return msg


def vm_rss_bytes(pid):
    """Resident memory of a process now (VmRSS), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for pid %d" % pid)


def vm_hwm_bytes(pid):
    """Peak resident memory of a process (VmHWM), in bytes."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM for pid %d" % pid)


# ---------------------------------------------------------------- Prometheus text

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+-?\d+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_prometheus(text):
    """Strict enough parse of the text exposition format 0.0.4.
    Returns (types: name -> type, samples: list of (name, labels dict, value))."""
    types, samples = {}, []
    for ln, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] == "TYPE":
                assert len(parts) == 4 and parts[3].strip() in (
                    "counter", "gauge", "histogram", "summary", "untyped"), \
                    "line %d: bad TYPE line %r" % (ln, line)
                types[parts[2]] = parts[3].strip()
            continue
        m = _SAMPLE.match(line)
        assert m, "line %d is not a Prometheus sample: %r" % (ln, line)
        name, lab, val = m.group(1), m.group(2), m.group(3)
        labels = {}
        if lab:
            inner = lab[1:-1]
            pos = 0
            while pos < len(inner):
                lm = _LABEL.match(inner, pos)
                assert lm and lm.end() > pos, "line %d: bad labels %r" % (ln, lab)
                labels[lm.group(1)] = lm.group(2)
                pos = lm.end()
        try:
            v = float(val)
        except ValueError:
            raise AssertionError("line %d: bad value %r" % (ln, val))
        samples.append((name, labels, v))
    return types, samples


def histograms(text):
    """name -> {"buckets": [(le, count)], "sum": x, "count": n} summed over
    every label set other than le."""
    types, samples = parse_prometheus(text)
    out = {}
    for name, typ in types.items():
        if typ != "histogram":
            continue
        h = {"buckets": {}, "sum": 0.0, "count": 0.0}
        for n, labels, v in samples:
            if n == name + "_bucket":
                le = float(labels["le"].replace("+Inf", "inf"))
                h["buckets"][le] = h["buckets"].get(le, 0.0) + v
            elif n == name + "_sum":
                h["sum"] += v
            elif n == name + "_count":
                h["count"] += v
        h["buckets"] = sorted(h["buckets"].items())
        out[name] = h
    return out


def find_histogram(hists, *words):
    """The histogram whose name contains every word (exactly one expected)."""
    names = [n for n in hists if all(w in n for w in words)]
    assert names, "no histogram named with %s among %s" % (words, sorted(hists))
    names.sort(key=len)
    return names[0], hists[names[0]]


def raw_http(port, data, timeout=10.0, read=True):
    """Sends raw bytes to 127.0.0.1:port and returns what comes back (bytes)."""
    timeout *= SLOW
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if not read:
            return b""
        chunks = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                c = s.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not c:
                break
            chunks.append(c)
            blob = b"".join(chunks)
            # stop when a full response with Content-Length has arrived
            head, sep, rest = blob.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if m and len(rest) >= int(m.group(1)):
                    break
        return b"".join(chunks)
    finally:
        s.close()


def wait_until(pred, timeout, step=0.02):
    deadline = time.monotonic() + timeout * SLOW
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(step)
    return pred()


def bf16_attention(entry, kernels):
    """What a bf16 or int8 model's attention_precision must be: "bf16" when
    the CPU has bf16 kernels and its head width D (head_dim, or
    embed_dim / num_heads) is a multiple of 32 up to 256, "fp32" otherwise
    (docs/performance.md, "bf16 models")."""
    D = entry.get("head_dim") or entry["embed_dim"] // entry["num_heads"]
    return "bf16" if kernels != "none" and D % 32 == 0 and D <= 256 else "fp32"
