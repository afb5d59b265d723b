#!/usr/bin/python3
"""gen_golden_bf16.py - golden numbers for attnd's bf16 kernels (core/kernels/block_bf16.h),
computed here from the numbers, never from the C code: operands rounded to
bf16 with numpy (the rule below, checked against torch's own rounding),
products and sums in float64.

    /usr/bin/python3 tests/gen_golden_bf16.py            # writes tests/data/golden/bf16/
    /usr/bin/python3 tests/gen_golden_bf16.py --check    # regenerates in memory, compares

Every number comes from fixed seeds. Three files, read by tests/test_bf16.c:

rounding.json  {"cases": [[fp32 bits, bf16 bits, "what"], ...]}: the rounding
    rule of bf16.h: to nearest, ties to even; NaN stays NaN (quiet, sign and
    top payload kept); a subnormal becomes a zero of its sign (as AVX512-BF16's
    vcvtne2ps2bf16 does; torch keeps subnormals, the one difference, checked
    below); overflow to infinity. Hand-picked cases (each with the value this
    script must give, written by hand) and random bit patterns of every class
    ("what" left empty).

gemm.json  {"cases": [{"name", "M", "N", "K", "exact", "A" (M,K), "W" (N,K),
    "bias" (N), "C" (M,N)}]}: C = bf16(A) @ bf16(W)^T + bias in float64, then
    float32. "exact" cases are built so that every partial sum, in any order,
    is a float32 (W and bias on a coarse grid, |A| in [2^-6, 2^-3), sums
    below 32): every path must give these bits exactly, so a wrong rounding of
    one input shows. Their A holds ties (a bf16 value plus half its ulp) and
    values a hair off the ties.

attention.json  {"cases": [{"name", "D", "S", "L", "R", "i0", "causal", "scale",
    "q" (L, R*D), "k" (S,D), "v" (S,D), "key_padding_mask" (S) | null,
    "attn_mask" (L,S) | null, "attn_mask_kind": "bool" | "float" | null,
    "out" (L, R*D), "tol" (L, R*D)}]}: attn_bf16_block's formula for rows at
    positions i0..i0+L-1, R query heads per position, in float64:
      q~ = bf16(f32(q * f32(scale * log2e)));  k~, v~ = bf16(k), bf16(v)
      x_j = q~ . k~_j (+ f32(mask_j * log2e))   (mask below -1e30 counts as -1e30)
      c = ceil(max_j x_j);  p_j = 2^(x_j - c);  out = sum_j bf16(f32(p_j)) v~_j / sum_j p_j
    and, per output, the bound `tol` a kernel must meet (see bound()). A row
    with every key hidden has out 0 and tol 0.
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "golden", "bf16")
U = 2.0 ** -24  # unit roundoff of float32
LOG2E = np.float32(1.44269504088896341)  # the kernels' float32 log2(e)
E_EXP = 4e-7  # the kernels' 2^t: 1.8e-7 measured (core/kernels/block_bf16.c), doubled


# ---------------------------------------------------------------- rounding

def bf16_bits(x):
    """The rounding of bf16.h on float32 values: uint16 bits."""
    u = np.atleast_1d(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF
    r = np.where((u & 0x7FFFFFFF) > 0x7F800000, ((u >> 16) | 0x40) & 0xFFFF, r)
    r = np.where((u & 0x7F800000) == 0, (u >> 16) & 0x8000, r)
    return r.astype(np.uint16)


def bf16(x):
    """float32 values rounded to bf16, as float32."""
    x = np.asarray(x, dtype=np.float32)
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32).reshape(x.shape)


def bits_f32(b):
    return np.array([b], dtype=np.uint32).view(np.float32)[0]


# (fp32 bits, the bf16 bits the rule gives, written by hand, what it shows)
HAND = [
    (0x3F800000, 0x3F80, "1.0 is a bf16"),
    (0x3F808000, 0x3F80, "tie below an even bf16: down"),
    (0x3F818000, 0x3F82, "tie below an odd bf16: up to even"),
    (0x3F808001, 0x3F81, "a hair above a tie: up"),
    (0x3F807FFF, 0x3F80, "a hair below a tie: down"),
    (0xBF818000, 0xBF82, "negative tie: to even, away from zero"),
    (0xBF808000, 0xBF80, "negative tie: to even, towards zero"),
    (0x3F80FFFF, 0x3F81, "just below the next bf16: up"),
    (0x3FFFFFFF, 0x4000, "carry into the exponent"),
    (0x00000000, 0x0000, "zero"),
    (0x80000000, 0x8000, "negative zero"),
    (0x00000001, 0x0000, "smallest subnormal: zero"),
    (0x007FFFFF, 0x0000, "largest subnormal: zero, not the smallest normal"),
    (0x807FFFFF, 0x8000, "negative subnormal: negative zero"),
    (0x00800000, 0x0080, "smallest normal"),
    (0x00808000, 0x0080, "smallest normal, tie: to even"),
    (0x7F7F0000, 0x7F7F, "largest bf16"),
    (0x7F7F7FFF, 0x7F7F, "below the tie past the largest bf16"),
    (0x7F7F8000, 0x7F80, "tie past the largest bf16: infinity"),
    (0x7F7FFFFF, 0x7F80, "largest float32: infinity"),
    (0x7F800000, 0x7F80, "infinity"),
    (0xFF800000, 0xFF80, "negative infinity"),
    (0x7FC00000, 0x7FC0, "quiet NaN"),
    (0x7F800001, 0x7FC0, "signalling NaN, low payload: quiet NaN"),
    (0x7F810000, 0x7FC1, "signalling NaN, payload in the upper half: kept, quietened"),
    (0xFFFFFFFF, 0xFFFF, "negative NaN, full payload: never rounded into infinity"),
    (0x7FFFFFFF, 0x7FFF, "NaN with every payload bit"),
]


def rounding_cases(rng):
    cases = []
    for bits, want, what in HAND:
        got = int(bf16_bits(bits_f32(bits))[0])
        assert got == want, f"rule gives {got:#06x} for {bits:#010x}, by hand {want:#06x}: {what}"
        cases.append([bits, want, what])
    # random patterns: every exponent class, low halves near the tie
    hi = rng.integers(0, 1 << 16, 1200, dtype=np.uint64)
    lo = rng.integers(0, 1 << 16, 1200, dtype=np.uint64)
    lo[::4] = 0x8000
    lo[1::4] = 0x8000 + rng.integers(-2, 3, 300, dtype=np.int64).astype(np.uint64)
    raw = ((hi << 16) | lo).astype(np.uint32)
    raw[:100] = (raw[:100] & 0x807FFFFF)  # subnormals and zeros
    raw[100:200] = (raw[100:200] | 0x7F800000)  # infinities and NaNs
    want = bf16_bits(raw.view(np.float32))
    for b, w in zip(raw.tolist(), want.tolist()):
        cases.append([b, w, ""])
    check_with_torch(rng.integers(0, 1 << 32, 200000, dtype=np.uint64).astype(np.uint32))
    check_with_torch(raw)
    return cases


def check_with_torch(raw):
    """The rule equals torch's rounding except where bf16.h says otherwise."""
    f = raw.view(np.float32)
    mine = bf16_bits(f)
    theirs = torch.from_numpy(f.copy()).to(torch.bfloat16).view(torch.int16).numpy()
    theirs = theirs.astype(np.uint16)
    nan = np.isnan(f)
    sub = (raw & 0x7F800000) == 0
    same = ~nan & ~sub
    assert (mine[same] == theirs[same]).all(), "rounding differs from torch"
    assert ((mine[nan] & 0x7FFF) > 0x7F80).all() and ((theirs[nan] & 0x7FFF) > 0x7F80).all()
    t_sub = theirs[sub] & 0x7FFF
    assert (mine[sub] & 0x7FFF == 0).all() and (t_sub <= 0x80).all()


# ---------------------------------------------------------------- projections

def exact_inputs(rng, M, N, K):
    """A, W, bias whose every fp32 partial sum is exact (see the file doc)."""
    assert K <= 960
    W = (rng.integers(-16, 17, (N, K)) / 64.0).astype(np.float32)  # 5 bits, |w| <= 1/4
    sign = np.where(rng.random((M, K)) < 0.5, -1.0, 1.0)
    A = (sign * 2.0 ** rng.uniform(-6, -3, (M, K))).astype(np.float32)
    ab = A.view(np.uint32)
    tie = rng.random((M, K)) < 0.25
    ab[tie] = (ab[tie] & 0xFFFF0000) | 0x8000  # ties, both parities
    hair = rng.random((M, K)) < 0.1
    ab[hair] = (ab[hair] & 0xFFFF0000) | np.where(rng.random(hair.sum()) < 0.5, 0x7FFF, 0x8001)
    A[rng.random((M, K)) < 0.05] = 0.0
    bias = (rng.integers(-2 ** 18, 2 ** 18, N) / 2.0 ** 19).astype(np.float32)
    Ah, Wh = bf16(A).astype(np.float64), W.astype(np.float64)
    grid = 2.0 ** 19  # every bf16(a) * w, and the bias, is a multiple of 2^-19
    assert (np.abs(Ah) @ np.abs(Wh).T + np.abs(bias)).max() < 32, "a sum could round"
    assert np.all((Ah * 2.0 ** 13) == np.round(Ah * 2.0 ** 13)) and np.all(bias * grid % 1 == 0)
    return A, W, bias


def gemm_case(rng, name, M, N, K, exact):
    if exact:
        A, W, bias = exact_inputs(rng, M, N, K)
    else:
        A = np.round(rng.standard_normal((M, K)), 3).astype(np.float32)
        W = np.round(rng.standard_normal((N, K)) / math.sqrt(K), 4).astype(np.float32)
        bias = np.round(rng.standard_normal(N) * 0.5, 3).astype(np.float32)
    C = bf16(A).astype(np.float64) @ bf16(W).astype(np.float64).T + bias
    if exact:  # ... and a truncating rounding of A would not give the same C
        trunc = (A.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)
        assert (trunc @ bf16(W).astype(np.float64).T + bias != C).any()
    return {"name": name, "M": M, "N": N, "K": K, "exact": exact, "A": A, "W": W,
            "bias": bias, "C": C.astype(np.float32)}


GEMMS = [  # name, M, N, K, exact: ragged in every dimension, both K tails
    ("exact_small", 3, 5, 7, True),
    ("exact_tails", 33, 47, 100, True),
    ("exact_long_k", 2, 3, 900, True),
    ("unit_tails", 37, 50, 70, False),
    ("unit_one_row", 1, 33, 64, False),
    ("unit_k_step", 17, 16, 32, False),
]


# ---------------------------------------------------------------- attention

def hidden_of(L, S, i0, causal, kpm, am, kind):
    """(L,S) bool: key j hidden from the row at position i0 + i."""
    h = np.zeros((L, S), dtype=bool)
    if kpm is not None:
        h |= kpm[None, :]
    if kind == "bool":
        h |= am
    if kind == "float":
        h |= np.isneginf(am)
    if causal:
        h |= np.arange(S)[None, :] > (i0 + np.arange(L))[:, None]
    return h


def mask_log2(am):
    """The additive mask in log2 units, as the kernels compute it (float32)."""
    a = np.where(np.isneginf(am), am, np.maximum(am, np.float32(-1e30))).astype(np.float32)
    return (a * LOG2E).astype(np.float32)


def near_tie(p, slack):
    """1 where bf16(f32(p)) could round the other way under a relative error
    `slack` of p: p within slack * p of the midpoint of its two bf16."""
    p32 = p.astype(np.float32)
    lower = (p32.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)
    step = ((p32.view(np.uint32) & 0xFFFF0000) + 0x10000).view(np.float32).astype(np.float64)
    mid = (lower + step) / 2
    return (np.abs(p - mid) <= slack * p) & (p > 0)


def bound(p, pr, l, vh, dx, x, c):
    """What a kernel may differ from out = pr @ vh / l by, with every
    operand rounded as here and only its float32 arithmetic differing:
      - x: the fp32 sums of D exact products, any order: |dx| <= g_D sum|q~ k~|
        (and the rounding of x + mask), then t = x - c rounded (u |x - c|);
        p = 2^t to E_EXP, so p's relative error is d = ln2 (dx + u|x-c|) + E_EXP;
      - l = sum p in fp32, any order: relative g_S + sum p d / l;
      - sum bf16(p) v~ in fp32, any order: g_S sum bf16(p) |v~|; where p lies
        within 2d of a tie between two bf16, bf16(p) may go the other way, one
        ulp (2^-7 p at most) times |v~|;
      - the division: 2u.
    Twice the sum, for second-order terms. Rows are (S,) vectors here."""
    S = p.shape[0]
    g_S = S * U / (1 - S * U)
    d = math.log(2) * (dx + U * np.abs(x - c)) + E_EXP
    d = np.where(p > 0, d, 0.0)
    eps_l = g_S + (p * d).sum() / l
    W = (pr[:, None] * np.abs(vh)).sum(axis=0) / l
    flip = near_tie(p, 2 * d + 2 * U)
    F = (2.0 ** -7 * p[flip][:, None] * np.abs(vh[flip])).sum(axis=0) / l
    return 2 * ((eps_l + 2 * U + g_S) * W + F)


def attn_rows(qh, kh, vh, hidden, madd, R, D, round_p):
    """out and tol (L, R*D) in float64 from rounded operands; round_p rounds
    the probabilities (float32 in, float32 out)."""
    L, S = hidden.shape
    out, tol = np.zeros((L, R * D)), np.zeros((L, R * D))
    g_D = D * U / (1 - D * U)
    for i in range(L):
        vis = ~hidden[i]
        if not vis.any():
            continue
        for h in range(R):
            qr = qh[i, h * D:(h + 1) * D]
            s = kh @ qr
            dx = g_D * (np.abs(kh) @ np.abs(qr))
            x = s.copy()
            if madd is not None:
                x = s + madd[i]
                dx = dx + U * (np.abs(s) + np.abs(madd[i]))
            c = math.ceil(x[vis].max())
            p = np.where(vis, np.exp2(np.where(vis, x - c, 0.0)), 0.0)
            pr = round_p(p.astype(np.float32)).astype(np.float64)
            l = p.sum()
            out[i, h * D:(h + 1) * D] = pr @ vh / l
            tol[i, h * D:(h + 1) * D] = bound(p, pr, l, vh, dx, x, c)
    return out, tol


def attn_formula(q, k, v, hidden, am, kind, R, D, scale, variant=None):
    """The formula of the file doc; `variant` drops one of its roundings, to
    show that the bound tells it apart."""
    qs = np.float32(np.float32(scale) * LOG2E)
    qsc = (q * qs).astype(np.float32)
    qh = qsc.astype(np.float64) if variant == "q_unrounded" else bf16(qsc).astype(np.float64)
    if variant == "q_truncated":
        qh = (qsc.view(np.uint32) & 0xFFFF0000).view(np.float32).astype(np.float64)
    kh = bf16(k).astype(np.float64) if variant != "kv_unrounded" else k.astype(np.float64)
    vh = bf16(v).astype(np.float64) if variant != "kv_unrounded" else v.astype(np.float64)
    madd = mask_log2(am).astype(np.float64) if kind == "float" else None
    round_p = (lambda p: p) if variant == "p_unrounded" else bf16
    with np.errstate(invalid="ignore", over="ignore"):  # hidden keys: inf * 0, dropped
        return attn_rows(qh, kh, vh, hidden, madd, R, D, round_p)


def draw_masks(rng, spec, L, S):
    kpm, am, kind = None, None, spec.get("mask")
    if spec.get("kpm"):
        kpm = rng.random(S) < 0.25
        kpm[spec.get("kpm_hidden", [])] = True
        kpm[spec.get("kpm_seen", [])] = False
    if kind == "bool":
        am = rng.random((L, S)) < 0.2
        am[spec.get("full_rows", []), :] = True
    elif kind == "float":
        am = np.round(rng.standard_normal((L, S)) * 2, 2).astype(np.float32)
        am[rng.random((L, S)) < 0.1] = -np.inf
        am[rng.random((L, S)) < 0.05] = np.float32(-1e9)
        am[spec.get("full_rows", []), :] = -np.inf
    return kpm, am, kind


def attn_case(rng, spec, variants_seen):
    D, S, L, R = spec["D"], spec["S"], spec["L"], spec.get("R", 1)
    i0, causal = spec.get("i0", 0), spec.get("causal", False)
    q = np.round(rng.standard_normal((L, R * D)), 3).astype(np.float32)
    k = np.round(rng.standard_normal((S, D)), 3).astype(np.float32)
    v = np.round(rng.standard_normal((S, D)), 3).astype(np.float32)
    kpm, am, kind = draw_masks(rng, spec, L, S)
    hidden = hidden_of(L, S, i0, causal, kpm, am, kind)
    assert hidden.all(axis=1).sum() == spec.get("full", 0), spec["name"]
    scale = np.float32(1) / np.sqrt(np.float32(D))
    out, tol = attn_formula(q, k, v, hidden, am, kind, R, D, scale)
    for var in ("q_unrounded", "q_truncated", "kv_unrounded", "p_unrounded"):
        o, _ = attn_formula(q, k, v, hidden, am, kind, R, D, scale, var)
        variants_seen[var] += int((np.abs(o - out) > tol).sum())
    return {"name": spec["name"], "D": D, "S": S, "L": L, "R": R, "i0": i0, "causal": causal,
            "scale": scale, "q": q, "k": k, "v": v, "key_padding_mask": kpm, "attn_mask": am,
            "attn_mask_kind": kind, "out": out.astype(np.float32), "tol": tol}


ATTENTION = [  # rows are positions i0..i0+L-1 (times R heads); S crosses 128 in two
    dict(name="d64_plain", D=64, S=50, L=16),
    dict(name="d64_self_causal_kpm", D=64, S=30, L=30, causal=True, kpm=True, kpm_hidden=[0],
         kpm_seen=[1], full=1),
    dict(name="d128_bool_full_row", D=128, S=37, L=8, mask="bool", full_rows=[3], full=1),
    dict(name="d32_float_mask_two_blocks", D=32, S=150, L=20, mask="float", full_rows=[7],
         full=1),
    dict(name="d256_kpm", D=256, S=20, L=3, kpm=True),
    dict(name="d96_gqa_decode", D=96, S=40, L=3, R=4, i0=37, causal=True),
    dict(name="d64_gqa_self_causal", D=64, S=33, L=33, R=2, causal=True),
    dict(name="d160_cross", D=160, S=20, L=9),
]


# ---------------------------------------------------------------- writing

def f32s(x):
    """Shortest decimal that reads back as the same float32."""
    x = np.float32(x)
    if np.isneginf(x):
        return '"-inf"'
    s = np.format_float_positional(x, unique=True, trim="-")
    return s if len(s) <= 12 else np.format_float_scientific(x, unique=True, trim="-")


def up3(x):
    """x with 3 significant digits, rounded up: a bound stays a bound."""
    if x == 0:
        return "0"
    e = math.floor(math.log10(x)) - 2
    return "%.3g" % (math.ceil(x / 10.0 ** e * (1 + 1e-12)) * 10.0 ** e)


def enc(v, tol=False):
    if v is None or isinstance(v, (bool, str, int)) and not isinstance(v, np.ndarray):
        return json.dumps(v)
    a = np.asarray(v)
    if a.dtype == np.bool_:
        return json.dumps(a.ravel().tolist())
    if a.ndim == 0:
        return up3(float(a)) if tol else f32s(a)
    return "[" + ",".join(up3(float(x)) if tol else f32s(x) for x in a.ravel()) + "]"


def dump_cases(cases):
    lines = []
    for c in cases:
        lines.append("{" + ",".join(json.dumps(k) + ":" + enc(v, k == "tol")
                                    for k, v in c.items()) + "}")
    return '{"cases":[\n' + ",\n".join(lines) + "]}\n"


def generate():
    rng = np.random.default_rng(20251)
    files = {}
    rc = rounding_cases(rng)
    files["rounding.json"] = ('{"cases":[\n' + ",\n".join(json.dumps(c) for c in rc) + "]}\n")
    files["gemm.json"] = dump_cases([gemm_case(rng, *g) for g in GEMMS])
    seen = {"q_unrounded": 0, "q_truncated": 0, "kv_unrounded": 0, "p_unrounded": 0}
    files["attention.json"] = dump_cases([attn_case(rng, a, seen) for a in ATTENTION])
    for var, n in seen.items():  # the bound is tight enough to see each rounding
        assert n > 0, f"the bound does not tell a kernel without {var} apart"
        print(f"  without {var}: {n} outputs past the bound", file=sys.stderr)
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the files, write nothing")
    args = ap.parse_args()
    files = generate()
    bad = 0
    for name, text in files.items():
        path = os.path.join(OUT_DIR, name)
        if args.check:
            with open(path) as f:
                if f.read() != text:
                    print(f"{path}: differs from what this script makes", file=sys.stderr)
                    bad = 1
            continue
        os.makedirs(OUT_DIR, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
        print(f"wrote {path} ({len(text)} bytes)")
    sys.exit(bad)


if __name__ == "__main__":
    main()
