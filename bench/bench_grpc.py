"""bench_grpc.py - attnd's gRPC side against its HTTP side, one table.

All against one build on this machine, each part on a fresh daemon that
serves HTTP and gRPC at once (issue 30's three goals):
  1. small requests (16x512, the default model) at the same concurrency,
     and again on a layer of that shape in bf16 and int8 (--precisions):
     requests/s of grpc_load (bench/grpc_load.c: ModelInfer with
     raw_input_contents on gRPC's C core, one thread) against wrk
     (POST /v1/attention, "encoding": "base64", bench_http.sh's body);
     ghz too, for reference (in Go: about 8x wrk's CPU a request, taken
     from the same cores as the daemon's);
  2. a lone large request (1, 512, 1024; H=16) on a kept-alive connection:
     median round trip of grpcio's ModelInfer (raw) against http.client's
     base64 POST /v1/attention, from the input's bytes to the output's
     (each side's encoding and decoding in the client included, as a user
     pays them), and on the wire only (the body or the serialized message
     made before, the answer's bytes not read into anything);
  3. session steps, one row each, one after the other: a ModelStreamInfer
     stream against POST /v1/sessions/{id}/attention on a kept-alive
     connection, from C (grpc_load's stream and http modes) and from
     Python (grpcio with messages made from server/grpc/inference.proto,
     and http.client); and on the stream only, steps sent without waiting
     for answers (--window in flight, from C and from grpcio), which a
     stream keeps in order and HTTP refuses (409: one step at a time per
     session): a client that has its rows ahead (a known continuation
     scored, a prefix fed in pieces);
  4. what no transport can pass, on the same machine: the small requests'
     forward alone (bench_core --dims: B of them in one attn_forward, the
     best B of 1, 4, 16 and 64, in each precision) and one session step's
     forward alone (bench_decode --shape mha, a cache of 128 tokens), with
     what the goals then leave for the transport of both ends.
Each part runs --runs times, HTTP and gRPC alternating, and the table
quotes the medians. Numbers only; nothing is asserted. Run by
`make bench-grpc` in the venv of bench/requirements-grpc.txt.
"""

import argparse
import array
import base64
import http.client
import importlib
import json
import os
import queue
import random
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "config"))
from safetensors_header import safetensors_bytes  # noqa: E402


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def floats(rnd, n, scale=1.0):
    return array.array("f", (rnd.uniform(-scale, scale) for _ in range(n))).tobytes()


def b64(raw):
    return base64.b64encode(raw).decode()


class Daemon:
    """build/attnd on 127.0.0.1 with HTTP and gRPC on free ports."""

    def __init__(self, binary, tmp, env=None):
        self.port, self.grpc_port = free_port(), free_port()
        self.log = os.path.join(tmp, "daemon.log")
        self.proc = subprocess.Popen(
            [binary, "--host", "127.0.0.1", "--port", str(self.port),
             "--grpc-port", str(self.grpc_port)],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
            env=dict(os.environ, **(env or {})))
        for _ in range(300):
            if self.proc.poll() is not None:
                break
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % self.port, timeout=1)
                return
            except OSError:
                time.sleep(0.1)
        sys.exit("bench_grpc: the daemon did not start:\n" + open(self.log).read())

    def cpu_s(self):
        """The daemon's user + system CPU seconds so far."""
        f = open("/proc/%d/stat" % self.proc.pid).read().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")

    def blas_core(self):
        m = re.search(r"blas core (\S+ \([^)]*\))", open(self.log).read())
        return m.group(1) if m else "unknown"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(30)


def proto_modules(tmp):
    """inference_pb2 and inference_pb2_grpc of server/grpc/inference.proto."""
    from grpc_tools import protoc
    out = os.path.join(tmp, "pb")
    os.makedirs(out)
    rc = protoc.main(["protoc", "-I" + os.path.join(ROOT, "server/grpc"),
                      "--python_out=" + out, "--grpc_python_out=" + out, "inference.proto"])
    if rc:
        sys.exit("bench_grpc: protoc failed on server/grpc/inference.proto")
    sys.path.insert(0, out)
    return importlib.import_module("inference_pb2"), importlib.import_module("inference_pb2_grpc")


def children_cpu_s():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def with_cpu(daemon, seconds, run):
    """run()'s (req/s, p50, errors) and the CPU ms a request that the daemon
    and the load generator spent, over the 2 s warm-up and the run (the
    warm-up's requests counted at the run's rate)."""
    d0, c0 = daemon.cpu_s(), children_cpu_s()
    rps, p50, errors = run()
    d1, c1 = daemon.cpu_s(), children_cpu_s()
    n = rps * (seconds + 2)  # the 2 s warm-up runs at about the same rate
    return rps, p50, errors, (d1 - d0) * 1e3 / n, (c1 - c0) * 1e3 / n


def wrk_rps(port, body, seconds, conns, lua, path="/v1/attention"):
    env = dict(os.environ, BODY=body)
    url = "http://127.0.0.1:%d%s" % (port, path)
    args = ["wrk", "-t2", "-c%d" % conns, "--timeout", "10s", "-s", lua]
    subprocess.run(args + ["-d2s", url], env=env, check=True, capture_output=True)
    out = subprocess.run(args + ["-d%ds" % seconds, url], env=env, check=True,
                         capture_output=True, text=True).stdout
    f = next(line for line in out.splitlines() if line.startswith("RESULT")).split()
    return float(f[1]), float(f[2]), int(f[4])


def ghz_rps(ghz, port, data, seconds, conns, connections):
    """ModelInfer requests/s: answers OK over the run's time. ghz cuts the
    calls in flight when the time is up ("... is closing"); those are not
    counted, as errors or as answers."""
    args = [ghz, "--insecure", "--proto", os.path.join(ROOT, "server/grpc/inference.proto"),
            "--call", "inference.GRPCInferenceService.ModelInfer", "-D", data,
            "-c", str(conns), "--connections", str(connections), "-O", "json",
            "127.0.0.1:%d" % port]
    subprocess.run(args + ["-z", "2s"], check=True, capture_output=True)
    r = json.loads(subprocess.run(args + ["-z", "%ds" % seconds], check=True,
                                  capture_output=True, text=True).stdout)
    ok = r.get("statusCodeDistribution", {}).get("OK", 0)
    p50 = next(x["latency"] for x in r["latencyDistribution"] if x["percentage"] == 50) / 1e6
    errors = {k: v for k, v in r.get("errorDistribution", {}).items()
              if "is closing" not in k}
    for k, v in errors.items():
        print("ghz: %d x %s" % (v, k), file=sys.stderr)
    return ok / (r["total"] / 1e9), p50, sum(errors.values())


def load_rps(load, args):
    """grpc_load's RESULT line: (per second, median ms, errors)."""
    out = subprocess.run([load] + [str(a) for a in args], check=True, capture_output=True,
                         text=True).stdout
    f = next(line for line in out.splitlines() if line.startswith("RESULT")).split()
    return float(f[1]), float(f[2]), int(f[4])


def grpc_load_rps(load, port, msg_file, seconds, conns, connections):
    """ModelInfer requests/s from grpc_load, after a 2 s warm-up."""
    return load_rps(load, ["unary", port, msg_file, "-c", conns, "-n", connections,
                           "-d", seconds, "-w", 2])


def c_steps(load, port, prefix, step_json, step_msg_of, steps, grpc_port=None, window=1):
    """Steps/s of grpc_load on a session opened over HTTP: HTTP steps, or
    (grpc_port given) steps on one ModelStreamInfer stream, window of them
    sent and not yet answered."""
    conn, sid = open_session(port, prefix)
    if grpc_port:
        rate, _, errors = load_rps(load, ["stream", grpc_port, step_msg_of(sid), "-s", steps,
                                          "-p", window])
    else:
        rate, _, errors = load_rps(load, ["http", port, "/v1/sessions/%s/attention" % sid,
                                          step_json, "-s", steps])
    if errors:
        sys.exit("bench_grpc: %d session steps failed" % errors)
    conn.request("DELETE", "/v1/sessions/" + sid)
    conn.getresponse().read()
    return rate, steps


def core_env():
    """The environment of the core's own benches: OpenBLAS picks its kernels
    from the CPU, as the daemon has it pick them."""
    return {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}


def forward_ceiling(core, precision, threads, tmp):
    """The small requests' forward with no transport: bench_core timing
    B sequences of 16x512 through attn_forward in one batch, B of 1, 4, 16
    and 64, on the daemon's thread count. (requests/s at the best B, that
    B, CPU ms a request there): what no transport and no client can pass."""
    best = (0.0, 0, 0.0)
    for b in (1, 4, 16, 64):
        out = os.path.join(tmp, "ceiling.json")
        if os.path.exists(out):
            os.remove(out)
        subprocess.run([core, "--dims", "%d,16,512,8" % b, "--precision", precision,
                        "--threads", str(threads), "--no-memory", "--no-rates",
                        "--seconds", "1", "--json", out],
                       check=True, capture_output=True, env=core_env())
        ms = json.loads(open(out).read().splitlines()[0])["ms"]
        if b * 1e3 / ms > best[0]:
            best = (b * 1e3 / ms, b, threads * ms / b)
    return best


def step_ceiling(decode, threads):
    """One session's one-row step with no transport and no queue: bench_decode
    on the default model's shape (--shape mha; it adds rotary positions, a
    few hundred ns a step), a cache of 128 tokens. (steps/s, ms a step)."""
    out = subprocess.run([decode, "--shape", "mha", "--max-len", "128", "--seconds", "1",
                          "--threads", str(threads)], check=True, capture_output=True,
                         text=True, env=core_env()).stdout
    row = next(line for line in out.splitlines() if line.startswith("| 128 | 1 |"))
    ms = float(row.split("|")[3])
    return 1e3 / ms, ms


def metric(d, name):
    """A counter of the daemon's /metrics (0 when absent)."""
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % d.port, timeout=10).read()
    for line in text.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def http_post(conn, path, body):
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    if r.status not in (200, 201):
        sys.exit("bench_grpc: %s answered %d: %s" % (path, r.status, data[:200]))
    return data


def median_round_trip(fn, n):
    times = []
    for i in range(n + 1):
        t0 = time.perf_counter()
        fn()
        if i:  # the first one warms up
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def infer_request(pb, model, shape, raw, params=None):
    req = pb.ModelInferRequest(model_name=model)
    t = req.inputs.add(name="query", datatype="FP32")
    t.shape.extend(shape)
    req.raw_input_contents.append(raw)
    for k, v in (params or {}).items():
        if isinstance(v, bool):
            req.parameters[k].bool_param = v
        else:
            req.parameters[k].string_param = v
    return req


STEP_TIMES = ("attnd_queue_seconds_sum", 'attnd_compute_seconds_sum{precision="fp32"}')


def steps_cpu(daemon, run):
    """run()'s steps/s, the CPU ms a step of the daemon and of the client
    (this process with grpcio's threads, or grpc_load), and the ms a step
    spent queued and computing (the daemon's /metrics; the session's opening
    counted in, one request of 16 rows against the run's steps)."""
    t0 = [metric(daemon, m) for m in STEP_TIMES]
    d0, c0 = daemon.cpu_s(), time.process_time() + children_cpu_s()
    rate, steps = run()
    d1, c1 = daemon.cpu_s(), time.process_time() + children_cpu_s()
    t1 = [metric(daemon, m) for m in STEP_TIMES]
    return (rate, 0.0, 0, (d1 - d0) * 1e3 / steps, (c1 - c0) * 1e3 / steps,
            (t1[0] - t0[0]) * 1e3 / steps, (t1[1] - t0[1]) * 1e3 / steps)


def open_session(port, prefix):
    """A kept-alive connection and the id of a session opened on it with
    the 16-row prefix."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    opened = json.loads(http_post(conn, "/v1/sessions", json.dumps({
        "query": {"shape": [16, 512], "dtype": "float32", "b64": b64(prefix)},
        "encoding": "base64"})))
    return conn, opened["session"]


def http_steps(port, prefix, step, steps):
    conn, sid = open_session(port, prefix)
    path = "/v1/sessions/%s/attention" % sid
    body = json.dumps({"query": {"shape": [1, 512], "dtype": "float32", "b64": b64(step)},
                       "encoding": "base64"})
    t0 = time.perf_counter()
    for _ in range(steps):
        http_post(conn, path, body)
    rate = steps / (time.perf_counter() - t0)
    conn.request("DELETE", "/v1/sessions/" + sid)
    conn.getresponse().read()
    return rate, steps


def grpc_steps_ahead(pb, stub, prefix, step, steps, window):
    """grpcio on one stream, window steps sent and not yet answered: the
    request iterator blocks until an answer frees a place."""
    free = threading.Semaphore(window)
    sid_q = queue.Queue()

    def requests():
        yield infer_request(pb, "default", [1, 16, 512], prefix, {"session_open": True})
        sid = sid_q.get()
        req = infer_request(pb, "default", [1, 1, 512], step, {"session_id": sid})
        for _ in range(steps):
            free.acquire()
            yield req
    answers = stub.ModelStreamInfer(requests())
    first = next(answers)
    sid = first.infer_response.parameters["session_id"].string_param
    t0 = time.perf_counter()
    sid_q.put(sid)
    for _ in range(steps):
        a = next(answers)
        if a.error_message:
            sys.exit("bench_grpc: ModelStreamInfer: " + a.error_message)
        free.release()
    rate = steps / (time.perf_counter() - t0)
    for a in answers:  # none: the stream ends OK after the last answer
        sys.exit("bench_grpc: ModelStreamInfer: an answer too many")
    stub.ModelInfer(pb.ModelInferRequest(model_name="default", parameters={
        "session_id": pb.InferParameter(string_param=sid),
        "session_close": pb.InferParameter(bool_param=True)}))
    return rate, steps


def grpc_steps(pb, stub, prefix, step, steps):
    requests = queue.Queue()
    answers = stub.ModelStreamInfer(iter(requests.get, None))

    def call(req):
        requests.put(req)
        a = next(answers)
        if a.error_message:
            sys.exit("bench_grpc: ModelStreamInfer: " + a.error_message)
        return a.infer_response

    sid = call(infer_request(pb, "default", [1, 16, 512], prefix,
                             {"session_open": True})).parameters["session_id"].string_param
    req = infer_request(pb, "default", [1, 1, 512], step, {"session_id": sid})
    t0 = time.perf_counter()
    for _ in range(steps):
        call(req)
    rate = steps / (time.perf_counter() - t0)
    call(pb.ModelInferRequest(model_name="default", parameters={
        "session_id": pb.InferParameter(string_param=sid),
        "session_close": pb.InferParameter(bool_param=True)}))
    requests.put(None)
    return rate, steps


def stub_channel_bytes(port):
    """ModelInfer taking and giving serialized messages: no protobuf work
    in the client."""
    import grpc
    ch = grpc.insecure_channel("127.0.0.1:%d" % port,
                               options=[("grpc.max_receive_message_length", 64 << 20)])
    return ch.unary_unary("/inference.GRPCInferenceService/ModelInfer")


def large_config(tmp, rnd):
    E = 1024
    parts = [("in_proj_weight", [3 * E, E], floats(rnd, 3 * E * E)),
             ("in_proj_bias", [3 * E], bytes(4 * 3 * E)),
             ("out_proj.weight", [E, E], floats(rnd, E * E)),
             ("out_proj.bias", [E], bytes(4 * E))]
    path = os.path.join(tmp, "large.safetensors")
    with open(path, "wb") as f:
        f.write(safetensors_bytes([(n, "F32", s, d) for n, s, d in parts]))
    cfg = os.path.join(tmp, "large_config.json")
    json.dump({"models": [{"name": "large", "embed_dim": E, "num_heads": 16, "weights": path}]},
              open(cfg, "w"))
    return cfg


def precision_config(tmp, rnd, precisions):
    """A config of the default model's shape (E=512, H=8) in each precision,
    one drawn set of weights: models small_bf16, small_int8, ..."""
    E = 512
    parts = [("in_proj_weight", [3 * E, E], floats(rnd, 3 * E * E, 0.05)),
             ("in_proj_bias", [3 * E], floats(rnd, 3 * E, 0.05)),
             ("out_proj.weight", [E, E], floats(rnd, E * E, 0.05)),
             ("out_proj.bias", [E], floats(rnd, E, 0.05))]
    path = os.path.join(tmp, "small.safetensors")
    with open(path, "wb") as f:
        f.write(safetensors_bytes([(n, "F32", s, d) for n, s, d in parts]))
    cfg = os.path.join(tmp, "precision_config.json")
    json.dump({"models": [{"name": "small_" + p, "embed_dim": E, "num_heads": 8,
                           "precision": p, "weights": path} for p in precisions]},
              open(cfg, "w"))
    return cfg


def effective_precisions(port):
    """{model name: what it computes in, and on which kernels} from GET /v1/models."""
    info = json.load(urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port))
    kernels = {"int8": info["compute"].get("int8_kernels"),
               "bf16": info["compute"].get("bf16_kernels")}
    return {m["name"]: m["effective_precision"] + (
        " on " + kernels[m["effective_precision"]] if m["effective_precision"] in kernels else "")
        for m in info["models"]}


def cpu_name():
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attnd", default=os.path.join(ROOT, "build/attnd"))
    ap.add_argument("--ghz", default=os.path.join(ROOT, "build/ghz/ghz"))
    ap.add_argument("--core", default=os.path.join(ROOT, "build/bench/bench_core"),
                    help="bench/bench_core.c, built: the forward with no transport")
    ap.add_argument("--decode", default=os.path.join(ROOT, "build/bench/bench_decode"),
                    help="bench/bench_decode.c, built: a session step with no transport")
    ap.add_argument("--load", default=os.path.join(ROOT, "build/bench/grpc_load"),
                    help="bench/grpc_load.c, built")
    ap.add_argument("--seconds", type=int, default=10, help="per throughput run")
    ap.add_argument("--runs", type=int, default=3, help="of each part; the table quotes medians")
    ap.add_argument("--connections", type=int, default=64, help="requests in flight")
    ap.add_argument("--grpc-connections", type=int, default=8,
                    help="HTTP/2 connections ghz spreads them over")
    ap.add_argument("--large", type=int, default=20, help="large requests a run")
    ap.add_argument("--steps", type=int, default=300, help="session steps a run")
    ap.add_argument("--window", type=int, default=16,
                    help="stream steps sent and not yet answered, for the steps sent ahead")
    ap.add_argument("--precisions", default="bf16,int8",
                    help="the small requests again on a model of the default's shape in each "
                         "(comma-separated; \"\" for none): a cheaper forward, the same transport")
    args = ap.parse_args()
    import grpc

    tmp = tempfile.mkdtemp(prefix="bench_grpc.")
    pb, pb_grpc = proto_modules(tmp)
    rnd = random.Random(1234)
    small = floats(rnd, 16 * 512)
    small_http = os.path.join(tmp, "small.base64")
    json.dump({"query": {"shape": [16, 512], "dtype": "float32", "b64": b64(small)},
               "encoding": "base64"}, open(small_http, "w"))
    small_grpc = os.path.join(tmp, "small.ghz.json")
    json.dump({"model_name": "default",
               "inputs": [{"name": "query", "datatype": "FP32", "shape": [1, 16, 512]}],
               "raw_input_contents": [b64(small)]}, open(small_grpc, "w"))
    small_msg = os.path.join(tmp, "small.msg")
    open(small_msg, "wb").write(
        infer_request(pb, "default", [1, 16, 512], small).SerializeToString())
    large = floats(rnd, 512 * 1024)
    step = floats(rnd, 512)
    step_json = os.path.join(tmp, "step.json")
    json.dump({"query": {"shape": [1, 512], "dtype": "float32", "b64": b64(step)},
               "encoding": "base64"}, open(step_json, "w"))

    def step_msg_of(sid):
        path = os.path.join(tmp, "step.msg")
        open(path, "wb").write(infer_request(pb, "default", [1, 1, 512], step,
                                             {"session_id": sid}).SerializeToString())
        return path
    lua = os.path.join(HERE, "wrk_post.lua")
    rows = {}

    def add(key, value):
        rows.setdefault(key, []).append(value)

    # the daemon's pool: every CPU this process may use, as attnd counts them
    threads = len(os.sched_getaffinity(0))
    d = Daemon(args.attnd, tmp)
    core = d.blas_core()
    print("attnd gRPC benchmark: %s, %d cpus, blas core %s" % (cpu_name(), os.cpu_count(), core))
    print("%d runs a part, medians; %d requests in flight for %ds a run (grpc_load and ghz "
          "over %d HTTP/2 connections, wrk over %d HTTP/1.1 connections)" % (
              args.runs, args.connections, args.seconds, args.grpc_connections,
              args.connections), flush=True)
    for _ in range(args.runs):
        add("http_small", with_cpu(d, args.seconds, lambda: wrk_rps(
            d.port, small_http, args.seconds, args.connections, lua)))
        add("grpc_small", with_cpu(d, args.seconds, lambda: grpc_load_rps(
            args.load, d.grpc_port, small_msg, args.seconds, args.connections,
            args.grpc_connections)))
        add("ghz_small", with_cpu(d, args.seconds, lambda: ghz_rps(
            args.ghz, d.grpc_port, small_grpc, args.seconds, args.connections,
            args.grpc_connections)))
        add("core_small", forward_ceiling(args.core, "fp32", threads, tmp))
    stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel("127.0.0.1:%d" % d.grpc_port))
    for _ in range(args.runs):
        add("http_steps", steps_cpu(d, lambda: c_steps(
            args.load, d.port, small, step_json, step_msg_of, args.steps)))
        add("grpc_steps", steps_cpu(d, lambda: c_steps(
            args.load, d.port, small, step_json, step_msg_of, args.steps, d.grpc_port)))
        add("http_steps_py", steps_cpu(d, lambda: http_steps(d.port, small, step, args.steps)))
        add("grpc_steps_py", steps_cpu(d, lambda: grpc_steps(pb, stub, small, step,
                                                             args.steps)))
        add("grpc_ahead", steps_cpu(d, lambda: c_steps(
            args.load, d.port, small, step_json, step_msg_of, args.steps, d.grpc_port,
            args.window)))
        add("grpc_ahead_py", steps_cpu(d, lambda: grpc_steps_ahead(pb, stub, small, step,
                                                                   args.steps, args.window)))
        add("core_steps", step_ceiling(args.decode, threads))
    rows["merged"] = [metric(d, "attnd_grpc_stream_merged_steps_total")]
    d.stop()

    precisions = [p for p in args.precisions.split(",") if p]
    if precisions:
        d = Daemon(args.attnd, tmp, {"ATTND_CONFIG": precision_config(tmp, rnd, precisions)})
        rows["effective"] = effective_precisions(d.port)
        for p in precisions:
            msg = os.path.join(tmp, "small_%s.msg" % p)
            open(msg, "wb").write(
                infer_request(pb, "small_" + p, [1, 16, 512], small).SerializeToString())
            for _ in range(args.runs):
                add("http_small_" + p, with_cpu(d, args.seconds, lambda: wrk_rps(
                    d.port, small_http, args.seconds, args.connections, lua,
                    "/v1/models/small_%s/attention" % p)))
                add("grpc_small_" + p, with_cpu(d, args.seconds, lambda: grpc_load_rps(
                    args.load, d.grpc_port, msg, args.seconds, args.connections,
                    args.grpc_connections)))
                add("core_small_" + p, forward_ceiling(args.core, p, threads, tmp))
        d.stop()

    d = Daemon(args.attnd, tmp, {"ATTND_CONFIG": large_config(tmp, rnd)})
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=60)
    body = json.dumps({"query": {"shape": [1, 512, 1024], "dtype": "float32", "b64": b64(large)},
                       "encoding": "base64"})
    stub = pb_grpc.GRPCInferenceServiceStub(grpc.insecure_channel(
        "127.0.0.1:%d" % d.grpc_port, options=[("grpc.max_receive_message_length", 64 << 20)]))
    req = infer_request(pb, "large", [1, 512, 1024], large)
    wire = stub_channel_bytes(d.grpc_port)
    msg = req.SerializeToString()

    def http_bytes():
        out = http_post(conn, "/v1/attention", json.dumps({"query": {
            "shape": [1, 512, 1024], "dtype": "float32", "b64": b64(large)},
            "encoding": "base64"}))
        return base64.b64decode(json.loads(out)["output"]["b64"])

    def grpc_bytes():
        return stub.ModelInfer(infer_request(pb, "large", [1, 512, 1024], large),
                               timeout=60).raw_output_contents[0]
    if len(http_bytes()) != len(grpc_bytes()):
        sys.exit("bench_grpc: the large answers differ in size")
    for _ in range(args.runs):
        add("http_large", median_round_trip(http_bytes, args.large))
        add("grpc_large", median_round_trip(grpc_bytes, args.large))
        add("http_large_wire", median_round_trip(lambda: http_post(conn, "/v1/attention", body),
                                                 args.large))
        add("grpc_large_wire", median_round_trip(lambda: wire(msg, timeout=60), args.large))
    d.stop()
    shutil.rmtree(tmp)
    report(rows, args)


def report(rows, args):
    def med(k, i=0):
        return statistics.median(x if isinstance(x, float) else x[i] for x in rows[k])

    def each(k, fmt="%.0f"):
        return " ".join(fmt % (x if isinstance(x, float) else x[0]) for x in rows[k])

    def yes(ok):
        return "yes" if ok else "no"

    def ceiling_row(what, h, key):
        c = med(key)
        print("| no transport%s: the forward alone, B requests in one batch in-process "
              "(bench_core, best B: %s): req/s | | %.0f | at most %.2fx | | |"
              % (what, "/".join("%d" % x[1] for x in rows[key]), c, c / h))

    print()
    print("| part | HTTP base64 | gRPC | gRPC / HTTP | goal | met |")
    print("|---|---|---|---|---|---|")
    h, g, z = med("http_small"), med("grpc_small"), med("ghz_small")
    print("| small 16×512, %d in flight: req/s (p50 ms), grpc_load | %.0f (%.1f) | %.0f (%.1f) "
          "| %.2fx | ≥ 1.5x | %s |" % (args.connections, h, med("http_small", 1), g,
                                      med("grpc_small", 1), g / h, yes(g / h >= 1.5)))
    print("| the same, ghz as the gRPC client | %.0f | %.0f (%.1f) | %.2fx | | |"
          % (h, z, med("ghz_small", 1), z / h))
    ceiling_row("", h, "core_small")
    for name, eff in sorted(rows.get("effective", {}).items()):
        p = name[len("small_"):]
        h, g = med("http_small_" + p), med("grpc_small_" + p)
        print("| the same, the layer in %s (%s), grpc_load | %.0f (%.1f) | %.0f (%.1f) "
              "| %.2fx | | |" % (p, eff, h, med("http_small_" + p, 1), g,
                                 med("grpc_small_" + p, 1), g / h))
        ceiling_row(" in " + p, h, "core_small_" + p)
    hl, gl = med("http_large"), med("grpc_large")
    print("| large 1×512×1024, H=16: round trip ms, input bytes to output bytes | %.1f | %.1f "
          "| %.2fx as fast | no slower | %s |" % (hl, gl, hl / gl, yes(gl <= hl)))
    hl, gl = med("http_large_wire"), med("grpc_large_wire")
    print("| the same on the wire only (body made before, answer not read) | %.1f | %.1f "
          "| %.2fx as fast | | |" % (hl, gl, hl / gl))
    h, g = med("http_steps"), med("grpc_steps")
    print("| session steps, 1 row, 16-row prefix, each sent once the last is answered: steps/s, "
          "C clients | %.0f | %.0f | %.2fx | ≥ 2x | %s |" % (h, g, g / h, yes(g / h >= 2)))
    c = med("core_steps")
    print("| no transport and no queue: one step's forward alone in-process (bench_decode "
          "--shape mha, cache 128): steps/s | | %.0f | at most %.2fx | | |" % (c, c / h))
    h, g = med("http_steps_py"), med("grpc_steps_py")
    print("| the same, Python clients (http.client, grpcio) | %.0f | %.0f | %.2fx | | |"
          % (h, g, g / h))
    h, g = med("http_steps"), med("grpc_ahead")
    print("| steps sent ahead, %d in flight on the stream and merged (HTTP: one at a time, a "
          "second in flight is 409), C | %.0f | %.0f | %.2fx | ≥ 2x | %s |"
          % (args.window, h, g, g / h, yes(g / h >= 2)))
    h, g = med("http_steps_py"), med("grpc_ahead_py")
    print("| the same, Python | %.0f | %.0f | %.2fx | | |" % (h, g, g / h))
    print()
    print("each run (HTTP | gRPC): small req/s %s | %s (ghz %s); large ms %s | %s (wire %s | %s); "
          "steps/s C %s | %s (ahead %s), Python %s | %s (ahead %s)" % (
              each("http_small"), each("grpc_small"), each("ghz_small"),
              each("http_large", "%.1f"), each("grpc_large", "%.1f"),
              each("http_large_wire", "%.1f"), each("grpc_large_wire", "%.1f"), each("http_steps"),
              each("grpc_steps"), each("grpc_ahead"), each("http_steps_py"),
              each("grpc_steps_py"), each("grpc_ahead_py")))
    print("small requests, CPU ms a request (medians): daemon HTTP %.2f, gRPC %.2f (%.2f under "
          "ghz); load generator wrk %.2f, grpc_load %.2f, ghz %.2f (they share the same %d cpus)"
          % (med("http_small", 3), med("grpc_small", 3), med("ghz_small", 3),
             med("http_small", 4), med("grpc_small", 4), med("ghz_small", 4), os.cpu_count()))
    for suffix, what in [("", "")] + [(n[len("small"):], " in " + n[len("small_"):])
                                      for n in sorted(rows.get("effective", {}))]:
        both = med("http_small" + suffix, 3) + med("http_small" + suffix, 4)
        fwd = med("core_small" + suffix, 2)
        print("what 1.5x leaves%s: an HTTP request costs the %d cpus %.3f ms (daemon and wrk), "
              "1.5x its requests/s leaves %.3f ms a request for all, the forward alone takes "
              "%.3f (no transport): %.3f ms for gRPC at both ends, where grpc_load alone spends "
              "%.3f" % (what, os.cpu_count(), both, both / 1.5, fwd, both / 1.5 - fwd,
                        med("grpc_small" + suffix, 4)))
    for name in sorted(rows.get("effective", {})):
        p = name[len("small_"):]
        print("the same, the layer in %s: req/s each run %s | %s; CPU ms a request, daemon "
              "HTTP %.2f, gRPC %.2f; wrk %.2f, grpc_load %.2f" % (
                  p, each("http_small_" + p), each("grpc_small_" + p),
                  med("http_small_" + p, 3), med("grpc_small_" + p, 3),
                  med("http_small_" + p, 4), med("grpc_small_" + p, 4)))
    print("session steps, CPU ms a step (medians): daemon HTTP %.3f, gRPC %.3f (ahead %.3f); "
          "client C %.3f, %.3f; Python HTTP %.3f, gRPC %.3f" % (
              med("http_steps", 3), med("grpc_steps", 3), med("grpc_ahead", 3),
              med("http_steps", 4), med("grpc_steps", 4), med("http_steps_py", 4),
              med("grpc_steps_py", 4)))
    print("session steps, ms a step queued | computing (medians, from /metrics): HTTP %.3f | "
          "%.3f, the stream one at a time %.3f | %.3f (C clients; the rest of a step's round "
          "trip is the transport, both ends)" % (
              med("http_steps", 5), med("http_steps", 6), med("grpc_steps", 5),
              med("grpc_steps", 6)))
    h = med("http_steps")
    print("what 2x leaves for steps one at a time: an HTTP step's round trip is %.3f ms, 2x its "
          "steps/s leaves %.3f ms a step, the step's forward alone takes %.3f (no transport, no "
          "queue): %.3f ms for the rest, where the C client alone spends %.3f of CPU a step on "
          "the stream" % (1e3 / h, 5e2 / h, med("core_steps", 1), 5e2 / h - med("core_steps", 1),
                          med("grpc_steps", 4)))
    total = args.runs * 2 * args.steps
    print("steps sent ahead answered from a merged step: %.0f of %d "
          "(attnd_grpc_stream_merged_steps_total)" % (rows["merged"][0], total))
    err = {k: sum(x[2] for x in rows[k]) for k in ("http_small", "grpc_small", "ghz_small")}
    for k in rows:
        if k.startswith(("http_small_", "grpc_small_")) and sum(x[2] for x in rows[k]):
            print("errors: %s %d" % (k, sum(x[2] for x in rows[k])))
    if any(err.values()):
        print("errors: wrk %d, grpc_load %d, ghz %d (besides ghz's calls cut at the end of a run)"
              % (err["http_small"], err["grpc_small"], err["ghz_small"]))


if __name__ == "__main__":
    main()
