#!/usr/bin/python3
"""gen_golden_int8.py - golden data for whole forwards of int8 models (SPEC
section 8, its last paragraph), computed here from the numbers, never from
the C code.

    /usr/bin/python3 tests/gen_golden_int8.py            # writes tests/data/golden/int8/
    /usr/bin/python3 tests/gen_golden_int8.py --check    # regenerates in memory, compares

Each sequence carries two references, both in float64 from the float32
inputs and weights:

  "output", "attn_weights"            the exact layer (SPEC sections 1 and 7),
      what an int8 model must stay within 3e-2 of (relative error in norm);
  "output_int8", "attn_weights_int8"  the int8 formula from the quantized
      operands (core/kernels/gemm_int8.h), sums in float64:
        quantize   s = f32(max|x| / 127) per row (inputs: per row of the
                   projection's input; weights: per output channel),
                   x~ = rint(f32(x / s)) (ties to even), clamped to +-127
        projection x~ @ w~^T * s_x * s_w + b, then float32 (then rotated)
        attention  the bf16 formula of tests/gen_golden_bf16_forward.py, for a
                   head width the bf16 attention takes (else the exact one
                   from the float32 projections)
        out        the int8 projection of the float32 attention output
      which the C forward must stay within TIGHT of
      (tests/test_int8_forward.c; docs/performance.md says why); each
      sequence checks that the formula without quantizing the inputs, or
      truncating instead of rounding, lies beyond 3 x TIGHT from it.

The models: <name>.json and <name>.safetensors (float32 weights; one model
stores them as BF16 and one as F16, which the loader quantizes from), in
the layout of tests/gen_golden_bf16_forward.py with "precision": "int8".
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gen_golden_bf16_forward as fw  # noqa: E402
from gen_golden import (OUT_DIR, dumps, f32_safetensors, randn, safetensors_bytes,  # noqa: E402
                        tolist)
from gen_golden_decoder import PREFIX, rotate  # noqa: E402

INT8_DIR = os.path.join(OUT_DIR, "int8")
TIGHT = 1e-3  # the bound tests/test_int8_forward.c holds the forward to, against output_int8
f32 = fw.f32

# How the formula quantizes: "round" (the formula), "skip" (no input
# quantization: an unquantized forward's inputs), "trunc" (toward zero).
MODE = "round"


def quantize(x):
    """Rows of x (n, K) float32: q (float64 integers), s (n,) float32."""
    x = f32(x)
    s = (np.abs(x).max(axis=1) / np.float32(127)).astype(np.float32)
    safe = np.where(s > 0, s, np.float32(1))
    v = (x / safe[:, None]).astype(np.float32)
    q = np.trunc(v) if MODE == "trunc" else np.rint(v)
    q = np.clip(q, -127, 127)
    q[s == 0] = 0
    return q.astype(np.float64), s


def linear_int8(x, w, b):
    """The int8 projection of x (n, K) by w (N, K), float64."""
    qw, sw = quantize(w)
    if MODE == "skip":
        return f32(x).astype(np.float64) @ (qw * sw.astype(np.float64)[:, None]).T \
            + b.astype(np.float64)
    qx, sx = quantize(x)
    return (qx @ qw.T) * sx.astype(np.float64)[:, None] * sw.astype(np.float64)[None, :] \
        + b.astype(np.float64)


def layer_int8(m, sd, xq, xk, xv, pos, hidden, madd):
    """The int8 formula: output (L,E) and weights (H,L,S), float64."""
    H, G, D = m["H"], m["G"], m["D"]
    w, b = fw.weights_of(sd, m)
    q = f32(linear_int8(xq, w[0], b[0])).reshape(len(xq), H, D).astype(np.float64)
    k = f32(linear_int8(xk, w[1], b[1])).reshape(len(xk), G, D).astype(np.float64)
    v = f32(linear_int8(xv, w[2], b[2])).reshape(len(xv), G, D).astype(np.float64)
    if m.get("rope"):
        q = f32(rotate(q, pos, m["rope"])).astype(np.float64)
        k = f32(rotate(k, pos, m["rope"])).astype(np.float64)
    att = np.zeros((H,) + hidden.shape)
    ctx = np.zeros((len(xq), H * D))
    for h in range(H):
        g = h // (H // G)
        if fw.attention_bf16(m):
            att[h], o = fw.attend_bf16(q[:, h], k[:, g], v[:, g], hidden, madd, m)
        else:
            att[h], o = fw.attend_exact(q[:, h], k[:, g], v[:, g], hidden, madd,
                                        float(fw.scale32(m)))
        ctx[:, h * D:(h + 1) * D] = f32(o)
    out = linear_int8(ctx, w[3], b[3])
    out[hidden.all(axis=1)] = b[3]
    return out, att


def check_bound_sees_quantization(m, sd, xq, xk, xv, p, hidden, madd, out8):
    """The formula without input quantization, and with truncation, are each
    past 3 x TIGHT from out8."""
    global MODE
    try:
        for MODE in ("skip", "trunc"):
            o, _ = layer_int8(m, sd, xq, xk, xv, p, hidden, madd)
            err = np.linalg.norm(o - out8) / np.linalg.norm(out8)
            assert err > 3 * TIGHT, "%s: %s is %.2g from the formula" % (m["name"], MODE, err)
    finally:
        MODE = "round"


def run_sequence(m, sd, spec, rng):
    L, S, cross = spec["L"], spec.get("S", spec["L"]), spec.get("cross", False)
    xq = randn(rng, (L, m["E"]))
    xk = randn(rng, (S, m["kdim"])) if cross else xq
    xv = randn(rng, (S, m["vdim"])) if cross else xq
    pos = spec.get("positions")
    p = np.arange(L) if pos is None else np.asarray(pos)
    hidden, kpm, am, kind = fw.masks(spec, L, S, rng)
    assert hidden.all(axis=1).sum() == spec.get("full", 0), (m["name"], spec)
    madd = am.astype(np.float64) if kind == "float" else None
    out, att = fw.layer(m, sd, xq, xk, xv, p, hidden, madd, False)
    if m["layout"] == "torch":
        fw.check_torch(m, sd, xq, xk, xv, hidden, am, kind, out, att)
    out8, att8 = layer_int8(m, sd, xq, xk, xv, p, hidden, madd)
    check_bound_sees_quantization(m, sd, xq, xk, xv, p, hidden, madd, out8)
    attention = spec.get("attention", "none")
    pick = lambda a: a if attention == "heads" else a.mean(axis=0) if attention == "mean" else None
    aw, aw8 = pick(att), pick(att8)
    return {
        "query": tolist(xq), "key": tolist(xk) if cross else None,
        "value": tolist(xv) if cross else None, "positions": pos,
        "key_padding_mask": None if kpm is None else tolist(kpm),
        "attn_mask": None if am is None else tolist(am), "attn_mask_kind": kind,
        "causal": bool(spec.get("causal")), "attention": attention,
        "output": tolist(f32(out)), "attn_weights": None if aw is None else tolist(f32(aw)),
        "output_int8": tolist(f32(out8)),
        "attn_weights_int8": None if aw8 is None else tolist(f32(aw8)),
    }


# MHA with every mask, cross-attention with kdim and vdim, grouped heads with
# rotary positions, multi-query with head_dim and scale, a head width whose
# attention is fp32; weights from F32, BF16 and F16 files.
MODELS = [
    dict(name="mha_e64_h2", E=64, H=2, G=2, D=32, kdim=64, vdim=64, bias=True, layout="torch",
         seed=81, dtype="F32", seqs=[
             dict(L=5),
             dict(L=40, causal=True, attention="heads"),
             dict(L=33, kpm=True, attention="mean"),
             dict(L=70, mask="bool", full_rows=[3], full=1, attention="heads"),
             dict(L=20, mask="float", min_rows=[7], attention="heads"),
             dict(L=150, causal=True),
         ]),
    dict(name="cross_e64_h1_k48_v80", E=64, H=1, G=1, D=64, kdim=48, vdim=80, bias=True,
         layout="torch", seed=82, dtype="BF16", seqs=[
             dict(L=7, S=40, cross=True, attention="heads"),
             dict(L=1, S=1, cross=True, attention="mean"),
             dict(L=33, S=70, cross=True, kpm=True),
             dict(L=12, S=150, cross=True, mask="float", attention="heads"),
         ]),
    dict(name="gqa_rope_d32", E=64, H=8, G=2, D=32, kdim=64, vdim=64, bias=False,
         layout="llama", seed=83, dtype="F16", rope={"theta": 10000, "dim": 32, "style": "half"},
         seqs=[
             dict(L=36, causal=True, attention="heads"),
             dict(L=1, causal=True),
             dict(L=40, causal=True, positions=list(range(100, 140)), attention="mean"),
             dict(L=140, causal=True),
         ]),
    dict(name="mqa_d128_scale", E=64, H=2, G=1, D=128, kdim=64, vdim=64, bias=True,
         layout="llama", seed=84, dtype="F32", scale=0.05,
         rope={"theta": 500000, "dim": 32, "style": "interleaved"},
         seqs=[
             dict(L=50, causal=True, attention="heads"),
             dict(L=9),
         ]),
    dict(name="mha_d48_attention_fp32", E=48, H=1, G=1, D=48, kdim=48, vdim=48, bias=True,
         layout="torch", seed=85, dtype="F32", seqs=[
             dict(L=20, attention="heads"),
             dict(L=7, causal=True),
         ]),
]


def stored(sd, dtype):
    """The weights as the file stores them (BF16, F16: rounded), in float32:
    what the loader reads and quantizes."""
    if dtype == "BF16":
        return {n: fw.bf16(a).astype(np.float32) for n, a in sd.items()}
    if dtype == "F16":
        return {n: a.astype(np.float16).astype(np.float32) for n, a in sd.items()}
    return sd


def safetensors_of(named, dtype):
    """A safetensors file of float32 arrays (exact in dtype) stored as dtype."""
    if dtype == "F32":
        return f32_safetensors(named)
    raw = lambda a: (a.astype("<f2").tobytes() if dtype == "F16"
                     else (f32(a).view(np.uint32) >> 16).astype("<u2").tobytes())
    return safetensors_bytes([(n, dtype, a.shape, raw(a)) for n, a in named])


def build(m):
    rng = np.random.default_rng(m["seed"])
    sd = stored(fw.make_weights(m, rng), m["dtype"])
    seqs = [run_sequence(m, sd, s, rng) for s in m["seqs"]]
    cfg = fw.config_entry(m)
    cfg["precision"] = "int8"
    obj = {"name": m["name"], "embed_dim": m["E"], "num_heads": m["H"], "num_kv_heads": m["G"],
           "head_dim": m["D"], "kdim": m["kdim"], "vdim": m["vdim"], "dtype": m["dtype"],
           "attention_bf16": fw.attention_bf16(m), "config": cfg, "weights": {},
           "sequences": seqs}
    prefix = PREFIX if m["layout"] == "llama" else ""
    return dumps(obj).encode(), safetensors_of([(prefix + n, a) for n, a in sd.items()],
                                               m["dtype"])


def main():
    check = "--check" in sys.argv[1:]
    bad = 0
    os.makedirs(INT8_DIR, exist_ok=True)
    for m in MODELS:
        js, st = build(m)
        for ext, data in ((".json", js), (".safetensors", st)):
            path = os.path.join(INT8_DIR, m["name"] + ext)
            if check:
                with open(path, "rb") as f:
                    same = f.read() == data
                print(("same " if same else "DIFFERENT ") + path)
                bad += not same
            else:
                with open(path, "wb") as f:
                    f.write(data)
                print("wrote %s (%d bytes)" % (path, len(data)))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
