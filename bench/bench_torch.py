#!/usr/bin/python3
"""bench_torch.py - the table of bench/bench_core.c, for torch.

torch.nn.MultiheadAttention(batch_first=True) in eval mode under
torch.no_grad(), self-attention, need_weights=False, for the same shapes as
bench_core: median time of one forward over N runs after a warm-up, GFLOP/s
with FLOPs = 8*T*E^2 + 4*B*L^2*E (T = B*L), and that rate as a share of
torch.mm's own rate (2048^3) at the same thread count. Then the peak RSS rise
of one forward at B=1 L=8192 E=512 H=8, each in a fresh subprocess.

    /usr/bin/python3 bench/bench_torch.py [--threads 1,2] [--seconds 1.5] [--no-memory] [--json FILE]

make bench runs it with OPENBLAS_CORETYPE set to the kernels attnd chose (its
OpenBLAS is Debian's too), so that both compute on the same BLAS kernels.

Needs a Python with torch (Debian's python3-torch). Never part of the tests.
"""
import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time

import torch

SHAPES = [(1, 128, 512, 8), (1, 512, 1024, 16), (8, 128, 512, 8),
          (32, 64, 768, 12), (1, 2048, 1024, 16), (1, 4096, 512, 8)]
MEM_SHAPE = (1, 8192, 512, 8)


def flops(B, L, E, H):
    T = B * L
    return 8.0 * T * E * E + 4.0 * B * L * L * E


def make(B, L, E, H):
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    x = torch.randn(B, L, E)
    return mha, x


def forward(mha, x):
    with torch.no_grad():
        return mha(x, x, x, need_weights=False)[0]


def openblas():
    """The OpenBLAS torch computes with (Debian's torch calls the system BLAS)."""
    for path in blas_libs().split(", "):
        if "openblas" in os.path.basename(path):
            lib = ctypes.CDLL(path)
            if hasattr(lib, "openblas_set_num_threads"):
                return lib
    return None


def set_threads(threads):
    """torch.set_num_threads governs torch's own loops but not the OpenBLAS
    it calls, which otherwise starts a thread per CPU: both get `threads`."""
    torch.set_num_threads(threads)
    lib = openblas()
    if lib is not None:
        lib.openblas_set_num_threads(threads)


def mm_rate(threads, n=2048):
    set_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)
    t = []
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        t.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / statistics.median(t) / 1e9


def time_forward(shape, threads, budget):
    set_threads(threads)
    mha, x = make(*shape)
    t0 = time.perf_counter()
    forward(mha, x)  # warm-up
    once = time.perf_counter() - t0
    n = max(3, min(200, int(budget / max(once, 1e-6))))
    t = []
    for _ in range(n):
        t0 = time.perf_counter()
        forward(mha, x)
        t.append(time.perf_counter() - t0)
    return statistics.median(t), n


def blas_libs():
    """The BLAS libraries mapped into this process (torch's is a system one)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in os.path.basename(path).lower():
                libs.add(os.path.realpath(path))
    return ", ".join(sorted(libs)) or "unknown"


def status_kb(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return -1


def memory_child(threads):
    """Runs in its own process: rise of the peak RSS over one forward."""
    try:  # big blocks from and back to the system, as in bench_core
        ctypes.CDLL("libc.so.6").mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
    except OSError:
        pass
    set_threads(threads)
    B, L, E, H = MEM_SHAPE
    mha, x = make(B, L, E, H)
    out = forward(mha, x)  # warm-up: the BLAS buffers become resident
    del out
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        base, note = status_kb("VmHWM"), ""
    except OSError:
        base, note = status_kb("VmRSS"), " (peak not resettable: VmHWM - VmRSS)"
    t0 = time.perf_counter()
    out = forward(mha, x)
    secs = time.perf_counter() - t0
    peak = status_kb("VmHWM")
    io = (sum(p.numel() for p in mha.parameters()) + 2 * B * L * E) * 4 / 1048576.0
    print("  threads %d: forward %.2f s, peak RSS +%.1f MiB over weights+inputs+outputs "
          "(%.1f MiB)%s" % (threads, secs, (peak - base) / 1024.0, io, note))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2", help="thread counts, comma separated")
    ap.add_argument("--seconds", type=float, default=1.5, help="time budget per table cell")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory run")
    ap.add_argument("--json", help="append one JSON line per cell to this file")
    ap.add_argument("--shape", type=int, choices=range(len(SHAPES)),
                    help="run only this shape (an index into SHAPES): make bench times every "
                         "implementation on one shape before the next")
    ap.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return 0
    threads = [int(t) for t in args.threads.split(",") if t]
    if not threads or min(threads) < 1 or args.seconds <= 0:
        ap.error("bad --threads or --seconds")

    torch.mm(torch.ones(2, 2), torch.ones(2, 2))  # loads the BLAS
    print("torch %s nn.MultiheadAttention: self-attention, need_weights=False; BLAS %s; "
          "OPENBLAS_CORETYPE=%s" % (torch.__version__, blas_libs(),
                                    os.environ.get("OPENBLAS_CORETYPE", "(unset)")))
    if not args.no_memory:
        B, L, E, H = MEM_SHAPE
        print("memory of one forward, B=%d L=%d E=%d H=%d:" % (B, L, E, H))
        for t in threads:
            r = subprocess.run([sys.executable, os.path.abspath(__file__), "--memory-child",
                                str(t)], capture_output=True, text=True)
            if r.returncode == 0:
                sys.stdout.write(r.stdout)
            else:
                print("  threads %d: failed (exit %d): %s" % (t, r.returncode,
                                                             r.stderr.strip()[-200:]))
            sys.stdout.flush()

    gemm = [mm_rate(t) for t in threads]
    print("torch.mm 2048^3:" + "".join("  %d thread%s %.1f GFLOP/s" % (t, "s" if t > 1 else "", g)
                                       for t, g in zip(threads, gemm)))
    print("FLOPs = 8*T*E^2 + 4*B*L^2*E; median ms over N runs; % = share of torch.mm's rate")
    head = "%4s %5s %5s %3s" % ("B", "L", "E", "H")
    for t in threads:
        head += " | %2dt %4s %9s %8s %5s" % (t, "N", "ms", "GFLOP/s", "%")
    print(head)
    for shape in SHAPES if args.shape is None else [SHAPES[args.shape]]:
        line = "%4d %5d %5d %3d" % shape
        for t, g in zip(threads, gemm):
            sec, n = time_forward(shape, t, args.seconds)
            rate = flops(*shape) / sec / 1e9
            if args.json:
                with open(args.json, "a") as f:
                    f.write(json.dumps({"impl": "torch", "shape": shape, "threads": t,
                                        "ms": sec * 1e3}) + "\n")
            line += " | %3s %4d %9.2f %8.1f %5.1f" % ("", n, sec * 1e3, rate, 100.0 * rate / g)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
