"""bench_openvino.py - the table of bench/bench_core.c for OpenVINO's CPU
plugin, at the two precisions it offers: f32, and bf16 (its default on CPUs
with AVX512-BF16 or AMX). It runs a graph of plain ONNX operators (MatMul,
Add, Split, Reshape, Transpose, Softmax: the attention of one
nn.MultiheadAttention layer, self-attention, then the out projection),
which OpenVINO fuses into its own attention kernels; the same weights as
bench_ort.py. Median ms of one run over N after a warm-up, at each thread
count (INFERENCE_NUM_THREADS, one stream, latency hint).

Each compiled model's INFERENCE_PRECISION_HINT is read back and printed, so
the table says which precision really ran, and the answer of the first
shape is compared with a float64 reference of the same graph (relative
error ||y - ref|| / ||ref||).

    .venv-bench/bin/python bench/bench_openvino.py [--threads 1,2] [--seconds 1.5] [--json FILE]
                                                   [--clock wall|cpu]

--clock cpu times the process's CPU time instead of the wall clock (as
bench_core --clock cpu and bench_bf16 do), which other work on a shared
machine does not inflate; meaningful at 1 thread.

Numbers only; never part of the tests. openvino is pinned in
bench/requirements-ort.txt.
"""
import argparse
import json
import statistics
import time

import numpy as np
import openvino as ov
from onnx import TensorProto, helper, numpy_helper

from bench_ort import SHAPES, flops, weights

PRECISIONS = ("f32", "bf16")


def model(E, H):
    """x (B,L,E) -> y (B,L,E): QKV projection, per-head softmax(q k^T / sqrt(D)) v,
    out projection, in plain ONNX operators."""
    w, b, wo, bo = weights(E)
    D = E // H
    scale = np.array(1.0 / np.sqrt(D), dtype=np.float32)
    consts = [(w, "w"), (b, "b"), (wo, "wo"), (bo, "bo"), (scale, "scale"),
              (np.array([0, 0, H, D], dtype=np.int64), "heads_shape"),
              (np.array([0, 0, E], dtype=np.int64), "merged_shape"),
              (np.array([E, E, E], dtype=np.int64), "split")]
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["qkv"]),
        helper.make_node("Split", ["qkv", "split"], ["q0", "k0", "v0"], axis=2),
    ]
    for n in ("q", "k", "v"):  # (B,L,E) -> (B,H,L,D); k as (B,H,D,L)
        nodes.append(helper.make_node("Reshape", [n + "0", "heads_shape"], [n + "1"]))
        perm = [0, 2, 3, 1] if n == "k" else [0, 2, 1, 3]
        nodes.append(helper.make_node("Transpose", [n + "1"], [n + "2"], perm=perm))
    nodes += [
        helper.make_node("MatMul", ["q2", "k2"], ["s0"]),
        helper.make_node("Mul", ["s0", "scale"], ["s1"]),
        helper.make_node("Softmax", ["s1"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "v2"], ["o0"]),
        helper.make_node("Transpose", ["o0"], ["o1"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["o1", "merged_shape"], ["o2"]),
        helper.make_node("MatMul", ["o2", "wo"], ["o3"]),
        helper.make_node("Add", ["o3", "bo"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "mha",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "L", E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "L", E])],
        [numpy_helper.from_array(a, n) for a, n in consts])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 8
    return m.SerializeToString()


def reference(x, E, H):
    """The graph in float64."""
    w, b, wo, bo = (a.astype(np.float64) for a in weights(E))
    B, L, _ = x.shape
    D = E // H
    qkv = x.astype(np.float64) @ w + b
    q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(B, L, H, D).transpose(0, 2, 1, 3)
               for i in range(3))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ v).transpose(0, 2, 1, 3).reshape(B, L, E)
    return o @ wo + bo


def compile_model(core, blob, threads, precision):
    m = core.read_model(blob, b"")
    cfg = {"INFERENCE_PRECISION_HINT": precision, "INFERENCE_NUM_THREADS": threads,
           "NUM_STREAMS": 1, "PERFORMANCE_HINT": "LATENCY"}
    c = core.compile_model(m, "CPU", cfg)
    return c, c.get_property("INFERENCE_PRECISION_HINT").get_type_name()


CLOCK = time.perf_counter  # --clock cpu: time.process_time


def time_shape(core, shape, threads, precision, budget):
    B, L, E, H = shape
    c, ran = compile_model(core, model(E, H), threads, precision)
    req = c.create_infer_request()
    x = np.random.default_rng(1).standard_normal((B, L, E)).astype(np.float32)
    t0 = CLOCK()
    y = req.infer({0: x})[0]
    once = CLOCK() - t0
    n = max(3, min(200, int(budget / max(once, 1e-6))))
    t = []
    for _ in range(n):
        t0 = CLOCK()
        req.infer({0: x})
        t.append(CLOCK() - t0)
    return statistics.median(t), n, ran, (x, y)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--json", help="append one JSON line per cell to this file")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    ap.add_argument("--shape", type=int, choices=range(len(SHAPES)),
                    help="run only this shape (an index into SHAPES): make bench times every "
                         "implementation on one shape before the next")
    a = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if a.clock == "cpu" else time.perf_counter
    threads = [int(t) for t in a.threads.split(",")]
    core = ov.Core()
    caps = core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    print("OpenVINO %s CPU (%s; capabilities %s): plain ONNX attention + out projection, "
          "self-attention" % (ov.__version__, core.get_property("CPU", "FULL_DEVICE_NAME"),
                              ",".join(caps)))
    for precision in PRECISIONS:
        print("INFERENCE_PRECISION_HINT=%s" % precision)
        print("%4s %5s %5s %3s" % ("B", "L", "E", "H") +
              "".join(" | %2dt %4s %9s %8s %5s" % (t, "N", "ms", "GFLOP/s", "ran") for t in threads))
        for i, shape in enumerate(SHAPES):
            if a.shape is not None and i != a.shape:
                continue
            print("%4d %5d %5d %3d" % shape, end="", flush=True)
            for t in threads:
                sec, n, ran, xy = time_shape(core, shape, t, precision, a.seconds)
                print(" | %3s %4d %9.2f %8.1f %5s" % ("", n, sec * 1e3, flops(*shape) / sec / 1e9,
                                                      ran), end="", flush=True)
                if a.json:
                    with open(a.json, "a") as f:
                        f.write(json.dumps({"impl": "openvino-" + ran, "shape": shape,
                                            "threads": t, "ms": sec * 1e3}) + "\n")
            print()
            if i == 0:
                x, y = xy
                ref = reference(x, shape[2], shape[3])
                err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
                print("     relative error against float64 on this shape: %.2e" % err)


if __name__ == "__main__":
    main()
