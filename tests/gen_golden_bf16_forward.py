#!/usr/bin/python3
"""gen_golden_bf16_forward.py - golden data for whole forwards of bf16 models
(SPEC section 8), computed here from the numbers, never from the C code.

    /usr/bin/python3 tests/gen_golden_bf16_forward.py            # writes tests/data/golden/bf16/forward/
    /usr/bin/python3 tests/gen_golden_bf16_forward.py --check    # regenerates in memory, compares

Each sequence carries two references, both in float64 from the float32
inputs and weights:

  "output", "attn_weights"            the exact layer (SPEC sections 1 and 7),
      what a bf16 model must stay within 1e-2 of (relative error in norm);
  "output_bf16", "attn_weights_bf16"  the bf16 formula, every operand rounded
      as SPEC section 8 and core/kernels/block_bf16.h say, every sum in float64:
        projections   bf16(x) @ bf16(W)^T + b, then float32 (then rotated)
        attention     q~ = bf16(f32(q * f32(scale * log2e))), k~ = bf16(k),
                      v~ = bf16(v); x_j = q~ . k~_j (+ the additive mask in
                      log2 units, below -1e30 counted as -1e30: float masks
                      here hold float32's lowest, torch's way of hiding with
                      floats, whole rows of it giving uniform weights);
                      c = ceil(max_j x_j); p_j = 2^(x_j - c);
                      out = sum_j bf16(f32(p_j)) v~_j / sum_j p_j, float32;
                      weights p_j / sum_j p_j
                      (only for a head width the bf16 attention takes: a
                      multiple of 32 up to 256; otherwise the attention is the
                      exact one, from the float32 projections)
        out           bf16(out) @ bf16(W_o)^T + b_o
      which the C forward (fp32 sums in other orders) must stay within
      TIGHT of (tests/test_bf16_forward.c; docs/performance.md says why);
      each sequence checks that the formula without its roundings, or with
      truncation in their place, lies beyond 5 x TIGHT from it.

The models, one pair of files each (<name>.json and <name>.safetensors,
float32 weights, torch or Llama names):
  {"name", "embed_dim", "num_heads", "num_kv_heads", "head_dim", "kdim",
   "vdim", "attention_bf16": whether the attention is bf16 (above),
   "config": the model's entry of an attnd config file, "precision": "bf16",
   "sequences": [{"query", "key", "value", "positions", "key_padding_mask",
     "attn_mask", "attn_mask_kind", "causal", "attention", "output",
     "attn_weights", "output_bf16", "attn_weights_bf16"}]}
A query row whose keys are all hidden: weights 0, output the out bias.
The layers of torch names are cross-checked against torch's own
nn.MultiheadAttention (float64); the Llama-named ones share
tests/gen_golden_decoder.py's reference (cross-checked there against Hugging
Face transformers).
"""
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import OUT_DIR, dumps, f32_safetensors, randn, tolist  # noqa: E402
from gen_golden_bf16 import LOG2E, bf16, mask_log2  # noqa: E402
from gen_golden_decoder import PREFIX, rotate  # noqa: E402

FWD_DIR = os.path.join(OUT_DIR, "bf16", "forward")


def f32(x):
    return np.asarray(x, dtype=np.float32)


def b64(x):
    """float32 values rounded to bf16, in float64."""
    return bf16(f32(x)).astype(np.float64)


# ---------------------------------------------------------------- the layer

def attention_bf16(m):
    """The bf16 attention takes D a multiple of 32 up to 256 (and H/G <= 512)."""
    return m["D"] % 32 == 0 and m["D"] <= 256 and m["H"] // m["G"] <= 512


def scale32(m):
    """The scale as the forward multiplies by it, in float32."""
    if m.get("scale"):
        return np.float32(m["scale"])
    return np.float32(1) / np.sqrt(np.float32(m["D"]))


def weights_of(sd, m):
    """Wq (H*D,E), Wk, Wv, Wo and their biases in float32, whatever the names."""
    H, G, D, E = m["H"], m["G"], m["D"], m["E"]
    if m["layout"] == "llama":
        w = [sd[n + ".weight"] for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        b = [sd.get(n + ".bias", np.zeros(w[i].shape[0], dtype=np.float32))
             for i, n in enumerate(("q_proj", "k_proj", "v_proj", "o_proj"))]
        return w, b
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(sd["in_proj_weight"], 3)
    else:
        wq, wk, wv = sd["q_proj_weight"], sd["k_proj_weight"], sd["v_proj_weight"]
    bq, bk, bv = np.split(sd.get("in_proj_bias", np.zeros(H * D + 2 * G * D, np.float32)), 3)
    return [wq, wk, wv, sd["out_proj.weight"]], [bq, bk, bv, sd.get("out_proj.bias",
                                                                    np.zeros(E, np.float32))]


def linear(x, w, b, rounded):
    """x @ w^T + b in float64; x and w rounded to bf16 first when rounded."""
    if rounded:
        return b64(x) @ b64(w).T + b.astype(np.float64)
    return x.astype(np.float64) @ w.astype(np.float64).T + b.astype(np.float64)


def project(m, w, b, xq, xk, xv, pos, rounded):
    """q (L,H,D), k and v (S,G,D): float64, or float32 values (rounded)."""
    H, G, D = m["H"], m["G"], m["D"]
    cast = f32 if rounded else (lambda a: a)
    q = cast(linear(xq, w[0], b[0], rounded)).reshape(len(xq), H, D).astype(np.float64)
    k = cast(linear(xk, w[1], b[1], rounded)).reshape(len(xk), G, D).astype(np.float64)
    v = cast(linear(xv, w[2], b[2], rounded)).reshape(len(xv), G, D).astype(np.float64)
    if m.get("rope"):
        q, k = cast(rotate(q, pos, m["rope"])).astype(np.float64), \
            cast(rotate(k, pos, m["rope"])).astype(np.float64)
    return q, k, v


def softmax_exact(s, hidden_row):
    if hidden_row.all():
        return np.zeros_like(s)
    e = np.exp(np.where(hidden_row, -np.inf, s) - s[~hidden_row].max())
    return e / e.sum()


def attend_exact(q, k, v, hidden, madd, scale):
    """One head: weights (L,S) and output (L,D), float64."""
    s = q @ k.T * scale + (0 if madd is None else madd)
    p = np.stack([softmax_exact(s[i], hidden[i]) for i in range(len(q))])
    return p, p @ v


def attend_bf16(q, k, v, hidden, madd, m):
    """One head with the bf16 formula of the file's opening."""
    qs = np.float32(scale32(m) * LOG2E)
    qt, kt, vt = b64(f32(q) * qs), b64(k), b64(v)
    x = qt @ kt.T + (0 if madd is None else mask_log2(madd).astype(np.float64))
    p_all, out = np.zeros(hidden.shape), np.zeros((len(q), q.shape[1]))
    for i in range(len(q)):
        vis = ~hidden[i]
        if not vis.any():
            continue
        c = np.ceil(x[i][vis].max())
        p = np.where(vis, np.exp2(np.where(vis, x[i] - c, 0.0)), 0.0)
        out[i] = b64(p) @ vt / p.sum()
        p_all[i] = p / p.sum()
    return p_all, out


def layer(m, sd, xq, xk, xv, pos, hidden, madd, rounded):
    """The layer: output (L,E) and weights (H,L,S) in float64; with rounded,
    the bf16 formula."""
    H, G, D = m["H"], m["G"], m["D"]
    w, b = weights_of(sd, m)
    q, k, v = project(m, w, b, xq, xk, xv, pos, rounded)
    att = np.zeros((H,) + hidden.shape)
    ctx = np.zeros((len(xq), H * D))
    for h in range(H):
        g = h // (H // G)
        if rounded and attention_bf16(m):
            att[h], o = attend_bf16(q[:, h], k[:, g], v[:, g], hidden, madd, m)
        else:
            att[h], o = attend_exact(q[:, h], k[:, g], v[:, g], hidden, madd,
                                     float(scale32(m)) if rounded else
                                     (m.get("scale") or 1 / math.sqrt(D)))
        ctx[:, h * D:(h + 1) * D] = f32(o) if rounded else o
    out = linear(ctx, w[3], b[3], rounded)
    out[hidden.all(axis=1)] = b[3]
    return out, att


def check_torch(m, sd, xq, xk, xv, hidden, am, kind, want_out, want_att):
    """The exact layer of torch names against nn.MultiheadAttention, float64."""
    mha = torch.nn.MultiheadAttention(m["E"], m["H"], bias=m["bias"], kdim=m["kdim"],
                                      vdim=m["vdim"], batch_first=True).double()
    mha.load_state_dict({n: torch.from_numpy(a.astype(np.float64)) for n, a in sd.items()})
    mask = torch.from_numpy(np.where(hidden, -np.inf, 0.0 if am is None or kind != "float"
                                     else am.astype(np.float64)))
    t = lambda a: torch.from_numpy(a.astype(np.float64))[None]
    with torch.no_grad():
        out, w = mha(t(xq), t(xk), t(xv), attn_mask=mask, need_weights=True,
                     average_attn_weights=False)
    keep = ~hidden.all(axis=1)
    assert np.abs(out[0].numpy()[keep] - want_out[keep]).max() < 1e-9, m["name"]
    assert np.abs(w[0].numpy()[:, keep] - want_att[:, keep]).max() < 1e-9, m["name"]


# ---------------------------------------------------------------- models

def make_weights(m, rng):
    """float32 weights (three decimals) under torch or Llama names."""
    E, H, G, D, Kd, Vd = m["E"], m["H"], m["G"], m["D"], m["kdim"], m["vdim"]
    r = lambda shape, fan: np.round(rng.standard_normal(shape) / math.sqrt(fan), 3)
    bias = lambda n: np.round(rng.standard_normal(n) * 0.5, 3)
    sd = {}
    if m["layout"] == "llama":
        for n, (rows, cols) in (("q_proj", (H * D, E)), ("k_proj", (G * D, E)),
                                ("v_proj", (G * D, E)), ("o_proj", (E, H * D))):
            sd[n + ".weight"] = r((rows, cols), cols)
            if m["bias"]:
                sd[n + ".bias"] = bias(rows)
    else:
        if Kd == E and Vd == E:
            sd["in_proj_weight"] = r((3 * E, E), E)
        else:
            sd["q_proj_weight"], sd["k_proj_weight"] = r((E, E), E), r((E, Kd), Kd)
            sd["v_proj_weight"] = r((E, Vd), Vd)
        if m["bias"]:
            sd["in_proj_bias"] = bias(3 * E)
        sd["out_proj.weight"] = r((E, E), E)
        if m["bias"]:
            sd["out_proj.bias"] = bias(E)
    return {n: a.astype(np.float32) for n, a in sd.items()}


def config_entry(m):
    c = {"name": m["name"], "embed_dim": m["E"], "num_heads": m["H"],
         "weights": m["name"] + ".safetensors", "bias": m["bias"], "precision": "bf16"}
    if m["layout"] == "llama":
        c.update(layout="llama", prefix=PREFIX, num_kv_heads=m["G"])
        if m["D"] * m["H"] != m["E"]:
            c["head_dim"] = m["D"]
    else:
        c.update(kdim=m["kdim"], vdim=m["vdim"])
    for k in ("scale", "rope"):
        if m.get(k):
            c[k] = m[k]
    return c


def masks(spec, L, S, rng):
    """(L,S) hidden, and the request's key padding and attention masks."""
    kpm = am = None
    kind = spec.get("mask")
    if spec.get("kpm"):
        kpm = rng.random(S) < 0.25
        kpm[spec.get("kpm_seen", 0)] = False
    if kind == "bool":
        am = rng.random((L, S)) < 0.2
        am[spec.get("full_rows", []), :] = True
    elif kind == "float":
        am = np.round(rng.standard_normal((L, S)) * 2, 2).astype(np.float32)
        am[rng.random((L, S)) < 0.1] = np.finfo(np.float32).min  # torch's "hidden" in floats
        am[rng.random((L, S)) < 0.05] = np.float32(-1e9)
        am[spec.get("min_rows", []), :] = np.finfo(np.float32).min  # uniform, as in torch
    h = np.zeros((L, S), dtype=bool)
    if kpm is not None:
        h |= kpm[None, :]
    if kind == "bool":
        h |= am
    if kind == "float":
        h |= np.isneginf(am)
    if spec.get("causal"):
        h |= np.triu(np.ones((L, S), dtype=bool), k=1)
    return h, kpm, am, kind


TIGHT = 2e-4  # the bound tests/test_bf16_forward.c holds the forward to, against output_bf16


def check_bound_sees_rounding(m, sd, xq, xk, xv, p, hidden, madd, out16):
    """The formula with no rounding (an fp32 forward's numbers) and with
    truncation instead of rounding to nearest are each far past TIGHT from
    out16, so the bound tells a forward that skips or truncates its
    roundings from one that keeps them."""
    global b64
    keep = b64
    try:
        for name, variant in (("unrounded", lambda x: f32(x).astype(np.float64)),
                              ("truncated", lambda x: (f32(x).view(np.uint32) & 0xFFFF0000)
                               .view(np.float32).astype(np.float64))):
            b64 = variant
            o, _ = layer(m, sd, xq, xk, xv, p, hidden, madd, True)
            err = np.linalg.norm(o - out16) / np.linalg.norm(out16)
            assert err > 5 * TIGHT, "%s: %s operands are %.2g from the formula" % (
                m["name"], name, err)
    finally:
        b64 = keep


def run_sequence(m, sd, spec, rng):
    L, S, cross = spec["L"], spec.get("S", spec["L"]), spec.get("cross", False)
    xq = randn(rng, (L, m["E"]))
    xk = randn(rng, (S, m["kdim"])) if cross else xq
    xv = randn(rng, (S, m["vdim"])) if cross else xq
    pos = spec.get("positions")
    p = np.arange(L) if pos is None else np.asarray(pos)
    hidden, kpm, am, kind = masks(spec, L, S, rng)
    assert hidden.all(axis=1).sum() == spec.get("full", 0), (m["name"], spec)
    madd = am.astype(np.float64) if kind == "float" else None
    out, att = layer(m, sd, xq, xk, xv, p, hidden, madd, False)
    if m["layout"] == "torch":
        check_torch(m, sd, xq, xk, xv, hidden, am, kind, out, att)
    out16, att16 = layer(m, sd, xq, xk, xv, p, hidden, madd, True)
    check_bound_sees_rounding(m, sd, xq, xk, xv, p, hidden, madd, out16)
    attention = spec.get("attention", "none")
    pick = lambda a: a if attention == "heads" else a.mean(axis=0) if attention == "mean" else None
    aw, aw16 = pick(att), pick(att16)
    return {
        "query": tolist(xq), "key": tolist(xk) if cross else None,
        "value": tolist(xv) if cross else None, "positions": pos,
        "key_padding_mask": None if kpm is None else tolist(kpm),
        "attn_mask": None if am is None else tolist(am), "attn_mask_kind": kind,
        "causal": bool(spec.get("causal")), "attention": attention,
        "output": tolist(f32(out)), "attn_weights": None if aw is None else tolist(f32(aw)),
        "output_bf16": tolist(f32(out16)),
        "attn_weights_bf16": None if aw16 is None else tolist(f32(aw16)),
    }


# Head widths 32, 64 and 128 (the bf16 attention), and 48 (attention in fp32,
# projections in bf16); MHA, cross-attention with kdim and vdim, grouped and
# multi-query heads with rotary positions, head_dim and scale; every mask; both
# matrices; lengths across 32-token pages and 128-key blocks, and a grouped
# model's 140 rows x 4 heads past one 512-row pass.
MODELS = [
    dict(name="mha_e64_h2", E=64, H=2, G=2, D=32, kdim=64, vdim=64, bias=True, layout="torch",
         seed=31, seqs=[
             dict(L=5),
             dict(L=40, causal=True, attention="heads"),
             dict(L=33, kpm=True, attention="mean"),
             dict(L=70, mask="bool", full_rows=[3], full=1, attention="heads"),
             dict(L=20, mask="float", min_rows=[7], attention="heads"),
             dict(L=150, causal=True),
         ]),
    dict(name="cross_e64_h1_k48_v80", E=64, H=1, G=1, D=64, kdim=48, vdim=80, bias=True,
         layout="torch", seed=32, seqs=[
             dict(L=7, S=40, cross=True, attention="heads"),
             dict(L=1, S=1, cross=True, attention="mean"),
             dict(L=33, S=70, cross=True, kpm=True),
             dict(L=5, S=9, cross=True, causal=True, attention="heads"),
             dict(L=12, S=150, cross=True, mask="float", attention="heads"),
         ]),
    dict(name="gqa_rope_d32", E=64, H=8, G=2, D=32, kdim=64, vdim=64, bias=False,
         layout="llama", seed=33, rope={"theta": 10000, "dim": 32, "style": "half"}, seqs=[
             dict(L=36, causal=True, attention="heads"),
             dict(L=1, causal=True),
             dict(L=40, causal=True, positions=list(range(100, 140)), attention="mean"),
             dict(L=140, causal=True),
             dict(L=20, causal=True, kpm=True, attention="heads"),
         ]),
    dict(name="mqa_d128_scale", E=64, H=2, G=1, D=128, kdim=64, vdim=64, bias=True,
         layout="llama", seed=34, scale=0.05,
         rope={"theta": 500000, "dim": 32, "style": "interleaved",
               "scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                           "high_freq_factor": 4, "original_max_position_embeddings": 64}},
         seqs=[
             dict(L=50, causal=True, attention="heads"),
             dict(L=9),
             dict(L=130, causal=True, attention="mean"),
         ]),
    dict(name="mha_d48_attention_fp32", E=48, H=1, G=1, D=48, kdim=48, vdim=48, bias=True,
         layout="torch", seed=35, seqs=[
             dict(L=20, attention="heads"),
             dict(L=7, causal=True),
             dict(L=9, mask="bool", attention="mean"),
         ]),
]


def build(m):
    rng = np.random.default_rng(m["seed"])
    sd = make_weights(m, rng)
    seqs = [run_sequence(m, sd, s, rng) for s in m["seqs"]]
    obj = {"name": m["name"], "embed_dim": m["E"], "num_heads": m["H"], "num_kv_heads": m["G"],
           "head_dim": m["D"], "kdim": m["kdim"], "vdim": m["vdim"],
           "attention_bf16": attention_bf16(m), "config": config_entry(m),
           "weights": {}, "sequences": seqs}
    prefix = PREFIX if m["layout"] == "llama" else ""
    return dumps(obj).encode(), f32_safetensors([(prefix + n, a) for n, a in sd.items()])


def main():
    check = "--check" in sys.argv[1:]
    bad = 0
    os.makedirs(FWD_DIR, exist_ok=True)
    for m in MODELS:
        js, st = build(m)
        for ext, data in ((".json", js), (".safetensors", st)):
            path = os.path.join(FWD_DIR, m["name"] + ext)
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
