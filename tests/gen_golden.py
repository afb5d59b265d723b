#!/usr/bin/python3
"""gen_golden.py - golden data for attnd's attention core, made by
torch.nn.MultiheadAttention (batch_first=True).

Run with a Python that has torch (Debian's python3-torch, 1.13):

    /usr/bin/python3 tests/gen_golden.py            # writes tests/data/golden/
    /usr/bin/python3 tests/gen_golden.py --check    # regenerates in memory, compares

Every number comes from fixed seeds, so the output is the same on every run.
The reference is computed in float64 from the float32 inputs and weights, then
rounded to float32, and is cross-checked against a plain numpy formula.

One model per pair of files:

  tests/data/golden/<name>.safetensors   the weights, F32, torch state_dict names
  tests/data/golden/<name>.json          the same weights plus test sequences:

  {"name": str, "embed_dim": E, "num_heads": H, "kdim": Kd, "vdim": Vd,
   "bias": bool,
   "weights": {state_dict name: flat row-major list of floats},
   "sequences": [
     {"query": L x E,
      "key": S x Kd, or null for self-attention (key = value = query),
      "value": S x Vd, or null for value = key,
      "key_padding_mask": S bools (true = hidden), or null,
      "attn_mask": L x S bools (true = hidden) or floats (added), or null,
      "attn_mask_kind": "bool" | "float" | null,
      "causal": bool (hide key j > query i),
      "attention": "none" | "mean" | "heads",
      "output": L x E,
      "attn_weights": H x L x S ("heads"), L x S ("mean"), or null ("none"),
      and, for the sequences that test selections of the attention matrices
      (SPEC section 9):
      "selections": [{"attention": "heads" | "mean", "attention_heads": [...],
                      "attention_rows": [start, end], "attention_top_k": k}, ...]
                    (each field but "attention" optional),
      "torch_rows": [r0, r1], the query rows every selection stays within,
      "torch_weights": H x (r1 - r0) x S, torch's weights of those rows, which
                       the tests slice, average and argsort themselves}]}

Floats are the shortest decimal that reads back as the same float32 (at most
9 significant digits). A query row whose keys are all hidden has NaN in torch;
here, as in attnd's contract, its attention weights are 0 and its output row
is out_proj.bias (zeros when bias is false). Every other value is finite.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config"))
from safetensors_header import safetensors_bytes  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "golden")


# ---------------------------------------------------------------- formatting

def f32s(x):
    """Shortest decimal string that round-trips the float32 value x."""
    s = np.format_float_positional(np.float32(x), unique=True, trim="-")
    if len(s) > 12:
        s = np.format_float_scientific(np.float32(x), unique=True, trim="-")
    return s


class F32(float):
    """A float that json writes as its shortest float32 repr."""

    def __repr__(self):
        return f32s(self)


def tolist(a):
    """Nested lists of F32 (floats) or bools from a numpy array."""
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return a.tolist()
    if a.ndim == 0:
        return F32(float(a))
    return [tolist(x) for x in a]


def dumps(obj):
    """Compact JSON with float32 reprs; one sequence per line for diffs."""
    def enc(o):
        if isinstance(o, F32):
            if not math.isfinite(o):
                raise ValueError("non-finite value in golden data")
            return f32s(o)
        if isinstance(o, bool) or o is None:
            return json.dumps(o)
        if isinstance(o, (int, str)):
            return json.dumps(o)
        if isinstance(o, float):
            return enc(F32(o))
        if isinstance(o, list):
            return "[" + ",".join(enc(x) for x in o) + "]"
        if isinstance(o, dict):
            return "{" + ",".join(json.dumps(k) + ":" + enc(v) for k, v in o.items()) + "}"
        raise TypeError(type(o))

    head = {k: v for k, v in obj.items() if k not in ("weights", "sequences")}
    parts = ["{" + enc(head)[1:-1]]
    parts.append(',\n"weights":{' + ",\n".join(
        json.dumps(k) + ":" + enc(v) for k, v in obj["weights"].items()) + "}")
    parts.append(',\n"sequences":[\n' + ",\n".join(enc(s) for s in obj["sequences"]) + "]}\n")
    return "".join(parts)


def f32_safetensors(tensors):
    """tensors: list of (name, float32 numpy array). Returns the file bytes."""
    return safetensors_bytes([(name, "F32", arr.shape,
                               np.ascontiguousarray(arr, dtype="<f4").tobytes())
                              for name, arr in tensors])


# ---------------------------------------------------------------- the models

def make_module(E, H, kdim, vdim, bias, rng):
    """A MultiheadAttention with every parameter (biases too) drawn from rng."""
    mha = torch.nn.MultiheadAttention(E, H, dropout=0.0, bias=bias, kdim=kdim, vdim=vdim,
                                      batch_first=True)
    with torch.no_grad():
        for name, p in mha.named_parameters():
            if p.dim() == 2:
                scale = 1.0 / math.sqrt(p.shape[1])
            else:
                scale = 0.5
            # three decimals keep the JSON small; the values stay random
            v = np.round(rng.standard_normal(tuple(p.shape)) * scale, 3).astype(np.float32)
            p.copy_(torch.from_numpy(v))
    return mha


def hidden_matrix(L, S, kpm, am, am_kind, causal):
    """(L,S) bool: key j hidden from query i."""
    h = np.zeros((L, S), dtype=bool)
    if kpm is not None:
        h |= np.asarray(kpm, dtype=bool)[None, :]
    if am is not None and am_kind == "bool":
        h |= np.asarray(am, dtype=bool)
    if am is not None and am_kind == "float":
        h |= np.isneginf(np.asarray(am))
    if causal:
        h |= np.triu(np.ones((L, S), dtype=bool), k=1)
    return h


def numpy_reference(sd, E, H, q, k, v, hidden, am_add):
    """The formula of SPEC section 1 in float64, plain numpy."""
    D = E // H
    if "in_proj_weight" in sd:
        wq, wk, wv = np.split(sd["in_proj_weight"].astype(np.float64), 3)
    else:
        wq, wk, wv = (sd[n].astype(np.float64) for n in
                      ("q_proj_weight", "k_proj_weight", "v_proj_weight"))
    b = sd.get("in_proj_bias", np.zeros(3 * E)).astype(np.float64)
    bq, bk, bv = np.split(b, 3)
    wo = sd["out_proj.weight"].astype(np.float64)
    bo = sd.get("out_proj.bias", np.zeros(E)).astype(np.float64)
    qp, kp, vp = q @ wq.T + bq, k @ wk.T + bk, v @ wv.T + bv
    L, S = q.shape[0], k.shape[0]
    att = np.zeros((H, L, S))
    ctx = np.zeros((L, E))
    for h in range(H):
        sl = slice(h * D, (h + 1) * D)
        s = qp[:, sl] @ kp[:, sl].T / math.sqrt(D)
        if am_add is not None:
            s = s + am_add
        s = np.where(hidden, -np.inf, s)
        for i in range(L):
            if hidden[i].all():
                continue
            e = np.exp(s[i] - s[i].max())
            att[h, i] = e / e.sum()
        ctx[:, sl] = att[h] @ vp[:, sl]
    out = ctx @ wo.T + bo
    full = hidden.all(axis=1)
    out[full] = bo
    return out, att


def randn(rng, shape):
    """Standard normal float32 inputs, rounded to two decimals (short JSON)."""
    return np.round(rng.standard_normal(shape), 2).astype(np.float32)


def run_sequence(mha, sd, E, H, spec, rng):
    """Draws the inputs of one sequence, runs torch, returns its JSON object."""
    L, S, cross = spec["L"], spec.get("S", spec["L"]), spec.get("cross", False)
    kdim, vdim = mha.kdim, mha.vdim
    q = randn(rng, (L, E))
    if cross:
        k = randn(rng, (S, kdim))
        v = None if spec.get("value_null") else randn(rng, (S, vdim))
    else:
        assert S == L
        k, v = None, None
    kk = q if k is None else k
    vv = kk if v is None else v

    kpm = spec.get("kpm")
    if kpm == "random":
        kpm = rng.random(S) < 0.3
        kpm[rng.integers(S)] = False
    elif kpm is not None:
        kpm = np.asarray(kpm, dtype=bool)
    am, am_kind = None, spec.get("mask")
    if am_kind == "bool":
        am = rng.random((L, S)) < 0.3
        for i in range(L):
            am[i, rng.integers(S)] = False
        for i in spec.get("full_rows", []):
            am[i, :] = True
    elif am_kind == "float":
        am = randn(rng, (L, S)) * np.float32(2.0)
        am[rng.random((L, S)) < 0.15] = np.float32(-1e9)
        for i in range(L):  # keep one ordinary key per row
            am[i, rng.integers(S)] = randn(rng, ())
    causal = bool(spec.get("causal", False))
    attention = spec.get("attention", "none")
    hidden = hidden_matrix(L, S, kpm, am, am_kind, causal)
    full = hidden.all(axis=1)
    if "expect_full" in spec:
        assert full.sum() == spec["expect_full"], (spec, full)

    # torch in float64; need_weights=True and training mode keep it on the
    # plain (non-fused) path, which is the definition being matched.
    m64 = torch.nn.MultiheadAttention(E, H, dropout=0.0, bias=mha.in_proj_bias is not None,
                                      kdim=kdim, vdim=vdim, batch_first=True).double()
    m64.load_state_dict({n: t.double() for n, t in mha.state_dict().items()})
    m64.train()
    t = lambda a: torch.from_numpy(np.asarray(a, dtype=np.float64))[None]
    mask = None
    if am_kind == "bool":
        mask = torch.from_numpy(am.copy())
        if causal:
            mask = mask | torch.ones(L, S, dtype=torch.bool).triu(1)
    elif am_kind == "float":
        mask = torch.from_numpy(am.astype(np.float64))
        if causal:
            mask = mask.masked_fill(torch.ones(L, S, dtype=torch.bool).triu(1), -math.inf)
    elif causal:
        mask = torch.ones(L, S, dtype=torch.bool).triu(1)
    with torch.no_grad():
        out, w = m64(t(q), t(kk), t(vv),
                     key_padding_mask=None if kpm is None else torch.from_numpy(kpm)[None],
                     attn_mask=mask, need_weights=True, average_attn_weights=False)
    out, w = out[0].numpy().copy(), w[0].numpy().copy()  # (L,E), (H,L,S)

    # torch gives NaN exactly in the fully hidden rows; the contract says bias / 0.
    assert np.isnan(out[full]).all() and np.isfinite(out[~full]).all()
    assert np.isnan(w[:, full]).all() and np.isfinite(w[:, ~full]).all()
    bo = sd.get("out_proj.bias", np.zeros(E, dtype=np.float32)).astype(np.float64)
    out[full] = bo
    w[:, full] = 0.0

    am_add = am.astype(np.float64) if am_kind == "float" else None
    ref_out, ref_w = numpy_reference(sd, E, H, q.astype(np.float64), kk.astype(np.float64),
                                     vv.astype(np.float64), hidden, am_add)
    assert np.abs(ref_out - out).max() <= 1e-9 * max(1.0, np.abs(out).max()), "numpy != torch"
    assert np.abs(ref_w - w).max() <= 1e-9, "numpy != torch (weights)"

    if attention == "heads":
        aw = w
    elif attention == "mean":
        aw = w.mean(axis=0)
    else:
        aw = None
    seq = {
        "query": tolist(q),
        "key": None if k is None else tolist(k),
        "value": None if v is None else tolist(v),
        "key_padding_mask": None if kpm is None else tolist(kpm),
        "attn_mask": None if am is None else tolist(am),
        "attn_mask_kind": am_kind,
        "causal": causal,
        "attention": attention,
        "output": tolist(out.astype(np.float32)),
        "attn_weights": None if aw is None else tolist(aw.astype(np.float32)),
    }
    if "selections" in spec:
        r0, r1 = spec.get("torch_rows", [0, L])
        for sel in spec["selections"]:
            rows = sel.get("attention_rows", [r0, r1])
            assert r0 <= rows[0] < rows[1] <= r1, (sel, r0, r1)
        seq["selections"] = spec["selections"]
        seq["torch_rows"] = [r0, r1]
        seq["torch_weights"] = tolist(w[:, r0:r1].astype(np.float32))
    return seq


# Each model: hyper-parameters, a seed and its sequences. "cross" gives key
# (and value unless "value_null"); "kpm" is "random" or a list; "mask" is
# "bool" or "float"; "full_rows" forces bool-mask rows to all hidden;
# "expect_full" is the number of fully hidden rows the spec must produce;
# "selections" and "torch_rows" (default: every row) as in the header.
# select_e32_h4's long sequence crosses the core's blocks of 128 query rows.
HEADS = "heads"
SELECT_LONG = [
    dict(attention=HEADS, attention_heads=[3, 0], attention_rows=[116, 136]),
    dict(attention="mean", attention_heads=[1, 2], attention_rows=[126, 131], attention_top_k=5),
    dict(attention=HEADS, attention_rows=[135, 136], attention_top_k=136),
    dict(attention="mean", attention_rows=[120, 130]),
    dict(attention=HEADS, attention_heads=[2], attention_rows=[127, 129], attention_top_k=1),
]
SELECT_CROSS = [
    dict(attention=HEADS, attention_heads=[1], attention_top_k=40),
    dict(attention="mean", attention_heads=[0, 3, 2], attention_top_k=7),
    dict(attention=HEADS, attention_heads=[2, 1], attention_rows=[4, 5]),
]
SELECT_HIDDEN = [
    dict(attention=HEADS, attention_heads=[0], attention_rows=[2, 5], attention_top_k=3),
    dict(attention="mean", attention_rows=[3, 4]),
    dict(attention=HEADS, attention_heads=[3, 2, 1, 0]),
]
MODELS = [
    dict(name="self_e64_h8", E=64, H=8, seed=1, seqs=[
        dict(L=5),
        dict(L=1, attention="heads"),
        dict(L=7, attention="mean", kpm="random"),
        dict(L=6, attention="heads", mask="bool", full_rows=[2], expect_full=1),
        dict(L=4, attention="mean", mask="float"),
        dict(L=8, attention="heads", causal=True),
        dict(L=5, attention="heads", causal=True, kpm=[1, 0, 0, 1, 0], expect_full=1),
        dict(L=3, kpm=[1, 1, 1], expect_full=3),
        dict(L=4, S=9, cross=True, value_null=True, attention="heads"),
        dict(L=3, S=1, cross=True, attention="mean"),
        dict(L=6, mask="float", causal=True, kpm="random"),
        dict(L=1, S=6, cross=True, kpm="random", attention="heads"),
    ]),
    dict(name="cross_e48_h4_k40_v24", E=48, H=4, kdim=40, vdim=24, seed=2, seqs=[
        dict(L=6, S=9, cross=True, attention="heads"),
        dict(L=1, S=1, cross=True, attention="mean"),
        dict(L=1, S=5, cross=True),
        dict(L=7, S=1, cross=True, attention="heads"),
        dict(L=5, S=8, cross=True, kpm="random", mask="bool", attention="mean"),
        dict(L=4, S=6, cross=True, causal=True, attention="heads"),
        dict(L=6, S=3, cross=True, causal=True),
        dict(L=3, S=4, cross=True, mask="float", attention="heads"),
        dict(L=2, S=3, cross=True, kpm=[1, 1, 1], attention="mean", expect_full=2),
        dict(L=4, S=5, cross=True, mask="bool", full_rows=[0, 3], attention="heads",
             expect_full=2),
    ]),
    dict(name="self_e30_h3", E=30, H=3, seed=3, seqs=[
        dict(L=1),
        dict(L=9, attention="heads"),
        dict(L=5, attention="mean", kpm="random"),
        dict(L=7, attention="heads", causal=True),
        dict(L=4, mask="float"),
        dict(L=3, S=6, cross=True, value_null=True, attention="heads"),
        dict(L=6, mask="bool", full_rows=[5], attention="mean", expect_full=1),
    ]),
    dict(name="self_e16_h1", E=16, H=1, seed=4, seqs=[
        dict(L=5, attention="heads"),
        dict(L=1, attention="mean"),
        dict(L=6, causal=True, mask="bool", attention="mean"),
        dict(L=4, S=7, cross=True, attention="heads"),
        dict(L=3, kpm=[0, 1, 1]),
    ]),
    dict(name="nobias_e32_h4", E=32, H=4, bias=False, seed=5, seqs=[
        dict(L=5, attention="heads"),
        dict(L=6, attention="mean", kpm=[1, 1, 1, 1, 1, 1], expect_full=6),
        dict(L=4, causal=True),
        dict(L=7, mask="float", attention="heads"),
        dict(L=2, S=5, cross=True, kpm="random", attention="mean"),
    ]),
    dict(name="nobias_cross_e24_h2_k16_v20", E=24, H=2, kdim=16, vdim=20, bias=False, seed=6,
         seqs=[
             dict(L=4, S=6, cross=True, attention="heads"),
             dict(L=1, S=1, cross=True, attention="heads"),
             dict(L=5, S=3, cross=True, causal=True, kpm=[1, 0, 0], attention="mean",
                  expect_full=1),
         ]),
    dict(name="select_e32_h4", E=32, H=4, seed=7, seqs=[
        dict(L=136, causal=True, torch_rows=[116, 136], selections=SELECT_LONG),
        dict(L=9, S=40, cross=True, kpm="random", mask="float", selections=SELECT_CROSS),
        dict(L=10, mask="bool", full_rows=[3], expect_full=1, selections=SELECT_HIDDEN),
    ]),
]


def build(model):
    E, H = model["E"], model["H"]
    kdim, vdim = model.get("kdim", E), model.get("vdim", E)
    bias = model.get("bias", True)
    rng = np.random.default_rng(model["seed"])
    mha = make_module(E, H, kdim, vdim, bias, rng)
    sd = {n: t.detach().numpy().astype(np.float32) for n, t in mha.state_dict().items()}
    seqs = [run_sequence(mha, sd, E, H, s, rng) for s in model["seqs"]]
    obj = {"name": model["name"], "embed_dim": E, "num_heads": H, "kdim": kdim, "vdim": vdim,
           "bias": bias,
           "weights": {n: tolist(a.reshape(-1)) for n, a in sd.items()},
           "sequences": seqs}
    return dumps(obj).encode(), f32_safetensors(list(sd.items()))


def main():
    check = "--check" in sys.argv[1:]
    torch.manual_seed(0)
    os.makedirs(OUT_DIR, exist_ok=True)
    bad = 0
    for model in MODELS:
        js, st = build(model)
        for ext, data in ((".json", js), (".safetensors", st)):
            path = os.path.join(OUT_DIR, model["name"] + ext)
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
