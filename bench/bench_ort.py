"""bench_ort.py - the table of bench/bench_core.c, for onnxruntime's CPU
attention as BERT-style serving runs it: one com.microsoft.Attention node
(the fused QKV projection, masks and softmax) followed by the output
projection (MatMul + Add), self-attention, for the same six shapes. Median
ms of one run over N after a warm-up, at each thread count
(intra_op_num_threads; inter-op 1, sequential execution).

    .venv-bench/bin/python bench/bench_ort.py [--threads 1,2] [--seconds 1.5] [--json FILE]
                                             [--int8]

--int8 times the same graph after onnxruntime.quantization.quantize_dynamic
(per-channel QInt8 weights, activations quantized at run time: what users
run for transformer layers on CPU), as "onnxruntime-int8", and prints the
operators the quantized graph holds.

Numbers only; never part of the tests. onnxruntime and onnx are pinned in
bench/requirements-ort.txt.
"""
import argparse
import json
import statistics
import time

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

SHAPES = [(1, 128, 512, 8), (1, 512, 1024, 16), (8, 128, 512, 8),
          (32, 64, 768, 12), (1, 2048, 1024, 16), (1, 4096, 512, 8)]


def flops(B, L, E, H):
    return 8.0 * B * L * E * E + 4.0 * B * L * L * E


def weights(E):
    """QKV weights (E,3E) and bias (3E), out projection (E,E) and bias (E),
    drawn from a fixed seed (bench_openvino.py uses the same)."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((E, 3 * E)) / np.sqrt(E)).astype(np.float32)
    b = (rng.standard_normal(3 * E) * 0.1).astype(np.float32)
    wo = (rng.standard_normal((E, E)) / np.sqrt(E)).astype(np.float32)
    bo = (rng.standard_normal(E) * 0.1).astype(np.float32)
    return w, b, wo, bo


def model(E, H):
    """Attention (weights (E,3E), bias (3E)) then out projection, as ORT's
    transformer optimizer leaves a BERT layer's attention."""
    w, b, wo, bo = weights(E)
    nodes = [
        helper.make_node("Attention", ["x", "w", "b"], ["ctx"], domain="com.microsoft",
                         num_heads=H),
        helper.make_node("MatMul", ["ctx", "wo"], ["proj"]),
        helper.make_node("Add", ["proj", "bo"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "mha",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "L", E])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "L", E])],
        [numpy_helper.from_array(a, n) for a, n in ((w, "w"), (b, "b"), (wo, "wo"), (bo, "bo"))])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17),
                                            helper.make_opsetid("com.microsoft", 1)])
    m.ir_version = 8
    return m.SerializeToString()


def session(blob, threads):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])


def quantized(blob):
    """The graph through quantize_dynamic (per-channel QInt8), and its ops."""
    import logging
    import os
    import tempfile
    from onnxruntime.quantization import QuantType, quantize_dynamic
    logging.getLogger().setLevel(logging.ERROR)  # its advice to pre-process, once per shape
    with tempfile.TemporaryDirectory() as d:
        src, dst = os.path.join(d, "f32.onnx"), os.path.join(d, "int8.onnx")
        with open(src, "wb") as f:
            f.write(blob)
        quantize_dynamic(src, dst, per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
        q = onnx.load(dst)
    return q.SerializeToString(), sorted({n.op_type for n in q.graph.node})


def time_shape(shape, threads, budget, int8=False):
    B, L, E, H = shape
    blob = model(E, H)
    if int8:
        blob, _ = quantized(blob)
    s = session(blob, threads)
    x = np.random.default_rng(1).standard_normal((B, L, E)).astype(np.float32)
    t0 = time.perf_counter()
    s.run(None, {"x": x})
    once = time.perf_counter() - t0
    n = max(3, min(200, int(budget / max(once, 1e-6))))
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        s.run(None, {"x": x})
        t.append(time.perf_counter() - t0)
    return statistics.median(t), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--seconds", type=float, default=1.5)
    ap.add_argument("--json", help="append one JSON line per cell to this file")
    ap.add_argument("--shape", type=int, choices=range(len(SHAPES)),
                    help="run only this shape (an index into SHAPES): make bench times every "
                         "implementation on one shape before the next")
    ap.add_argument("--int8", action="store_true",
                    help="the graph quantized by quantize_dynamic (per-channel QInt8)")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    impl = "onnxruntime-int8" if a.int8 else "onnxruntime"
    print("onnxruntime %s CPU: com.microsoft.Attention + out projection (MatMul, Add), "
          "self-attention" % ort.__version__)
    if a.int8:
        shape = SHAPES[a.shape or 0]
        print("quantize_dynamic(per_channel=True, weight_type=QInt8) gives the ops: %s" %
              ", ".join(quantized(model(shape[2], shape[3]))[1]))
    print("%4s %5s %5s %3s" % ("B", "L", "E", "H") +
          "".join(" | %2dt %4s %9s %8s" % (t, "N", "ms", "GFLOP/s") for t in threads))
    for shape in SHAPES if a.shape is None else [SHAPES[a.shape]]:
        print("%4d %5d %5d %3d" % shape, end="", flush=True)
        for t in threads:
            sec, n = time_shape(shape, t, a.seconds, a.int8)
            print(" | %3s %4d %9.2f %8.1f" % ("", n, sec * 1e3, flops(*shape) / sec / 1e9),
                  end="", flush=True)
            if a.json:
                with open(a.json, "a") as f:
                    f.write(json.dumps({"impl": impl, "shape": shape, "threads": t,
                                        "ms": sec * 1e3}) + "\n")
        print()


if __name__ == "__main__":
    main()
