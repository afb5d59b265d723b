#!/usr/bin/python3
"""gen_golden_decoder.py - golden data for attnd's decoder options: grouped
key/value heads, head_dim, scale and rotary positions (SPEC section 7).

The numbers come from an independent float64 implementation in numpy (the
formulas of the Llama and GPT-J papers as Hugging Face writes them), and
are cross-checked against Hugging Face transformers' own code when it is
installed: LlamaAttention and Qwen2Attention run whole in float64, the
rotary frequency rules (default, linear, llama3, yarn) and YaRN's attention factor against
transformers.modeling_rope_utils, and the interleaved rotation against
GPT-J's rotate_every_two and Meta's complex-number form. Make the venv once
(Debian's python3-torch 1.13 comes from the system):

    /usr/bin/python3 -m venv --system-site-packages .venv-golden
    .venv-golden/bin/pip install -r tests/requirements-golden.txt
    .venv-golden/bin/python tests/gen_golden_decoder.py           # writes tests/data/golden/decoder/
    .venv-golden/bin/python tests/gen_golden_decoder.py --check   # regenerates in memory, compares

`make golden-decoder-check` does all three steps but the writing, with
--require-transformers (which fails when transformers does not import,
rather than skipping the cross-checks); tests/data/golden/decoder/README
records its last output. Without transformers the script still writes the
same files (the cross-checks are skipped and it says so). Every number
comes from fixed seeds.

One model per pair of files, tests/data/golden/decoder/<name>.{json,safetensors}:
the weights in Llama's names under the prefix model.layers.0.self_attn., and

  {"name", "embed_dim", "num_heads", "num_kv_heads", "head_dim", "kdim",
   "vdim", "bias",
   "config": the model's entry of an attnd config file, as attnd reads it,
   "weights": {name: flat row-major floats} (names without the prefix),
   "sequences": [
     {"query": L x E, "positions": L ints or null (0..L-1),
      "key": null, "value": null, "key_padding_mask": L bools or null,
      "attn_mask": L x L bools (true = hidden) or null, "attn_mask_kind",
      "causal": bool, "attention": "none" | "mean" | "heads",
      "output": L x E, "attn_weights": H x L x L, L x L or null}]}

A query row whose keys are all hidden has attention weights 0 and the
output o_proj.bias (zeros without it), as attnd's contract says.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gen_golden import OUT_DIR, dumps, randn, f32_safetensors, tolist  # noqa: E402

DEC_DIR = os.path.join(OUT_DIR, "decoder")

PREFIX = "model.layers.0.self_attn."

try:
    import torch
    import transformers
    from transformers import LlamaConfig, Qwen2Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb as gptj_rotary
    from transformers.models.llama.modeling_llama import LlamaAttention
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention
    HF = transformers.__version__
except ImportError:  # the goldens do not need it; the cross-checks do
    HF = None


# ---------------------------------------------------------------- the reference

def inv_freq(rope):
    """Rotation frequency of each of the dim/2 pairs, float64, with scaling."""
    dim = rope["dim"]
    f = rope["theta"] ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    sc = rope.get("scaling")
    if sc is None:
        return f
    if sc["type"] == "linear":
        return f / sc["factor"]
    if sc["type"] == "yarn":
        return yarn_inv_freq(f, dim, rope["theta"], sc)
    # llama3: long wavelengths divided by factor, short kept, blended between
    old = sc["original_max_position_embeddings"]
    lo, hi, factor = sc["low_freq_factor"], sc["high_freq_factor"], sc["factor"]
    wavelen = 2 * math.pi / f
    smooth = (old / wavelen - lo) / (hi - lo)
    blended = (1 - smooth) * f / factor + smooth * f
    return np.where(wavelen < old / hi, f, np.where(wavelen > old / lo, f / factor, blended))


def yarn_inv_freq(f, dim, theta, sc):
    """YaRN (arXiv 2309.00071) as Hugging Face writes it: the pairs between
    the one that turns beta_fast times over the trained context and the one
    that turns beta_slow times go from f to f / factor along a linear ramp;
    the bounds floored and ceiled unless truncate is false."""
    old = sc["original_max_position_embeddings"]

    def pair(turns):  # the (fractional) pair index that turns `turns` times over old
        return dim * math.log(old / (turns * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = pair(sc.get("beta_fast", 32)), pair(sc.get("beta_slow", 1))
    if sc.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, dim - 1)
    if lo == hi:
        hi += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - lo) / (hi - lo), 0, 1)
    return f * (1 - ramp) + f / sc["factor"] * ramp


def attention_factor(rope):
    """What YaRN multiplies cos and sin by (1 for every other rule): given,
    or 0.1 ln(factor) + 1, with mscale and mscale_all_dim each weighting the
    logarithm of a ratio when both are given (DeepSeek's form)."""
    sc = rope.get("scaling") or {}
    if sc.get("type") != "yarn":
        return 1.0
    if "attention_factor" in sc:
        return sc["attention_factor"]
    m = lambda w: 1.0 if sc["factor"] <= 1 else 0.1 * w * math.log(sc["factor"]) + 1
    if sc.get("mscale") and sc.get("mscale_all_dim"):
        return m(sc["mscale"]) / m(sc["mscale_all_dim"])
    return m(1)


def pair_index(rope):
    """The two column indices of each rotated pair."""
    half = rope["dim"] // 2
    if rope["style"] == "half":
        return np.arange(half), np.arange(half) + half
    return np.arange(0, 2 * half, 2), np.arange(1, 2 * half, 2)


def rotate(x, pos, rope):
    """x (L, heads, D) float64 rotated at positions pos (L)."""
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq(rope)[None, :]  # (L, dim/2)
    af = attention_factor(rope)
    c, s = af * np.cos(ang)[:, None, :], af * np.sin(ang)[:, None, :]
    i0, i1 = pair_index(rope)
    y = x.copy()
    y[:, :, i0] = x[:, :, i0] * c - x[:, :, i1] * s
    y[:, :, i1] = x[:, :, i1] * c + x[:, :, i0] * s
    return y


def project(sd, m, x):
    """q (L,H,D), k (L,G,D), v (L,G,D) in float64, before rotation."""
    H, G, D = m["H"], m["G"], m["D"]
    lin = lambda n: x @ sd[n + ".weight"].astype(np.float64).T + \
        sd.get(n + ".bias", np.zeros(sd[n + ".weight"].shape[0])).astype(np.float64)
    L = x.shape[0]
    return (lin("q_proj").reshape(L, H, D), lin("k_proj").reshape(L, G, D),
            lin("v_proj").reshape(L, G, D))


def reference(sd, m, x, pos, hidden):
    """The layer in float64: output (L,E) and weights (H,L,L)."""
    H, G, D = m["H"], m["G"], m["D"]
    L = x.shape[0]
    q, k, v = project(sd, m, x)
    if m.get("rope"):
        q, k = rotate(q, pos, m["rope"]), rotate(k, pos, m["rope"])
    scale = m.get("scale") or 1 / math.sqrt(D)
    att = np.zeros((H, L, L))
    ctx = np.zeros((L, H * D))
    for h in range(H):
        g = h // (H // G)
        s = np.where(hidden, -np.inf, q[:, h] @ k[:, g].T * scale)
        for i in range(L):
            if not hidden[i].all():
                e = np.exp(s[i] - s[i].max())
                att[h, i] = e / e.sum()
        ctx[:, h * D:(h + 1) * D] = att[h] @ v[:, g]
    bo = sd.get("o_proj.bias", np.zeros(m["E"])).astype(np.float64)
    out = ctx @ sd["o_proj.weight"].astype(np.float64).T + bo
    out[hidden.all(axis=1)] = bo
    return out, att


# ---------------------------------------------------------------- cross-checks

WORST = {}  # what -> the largest relative error seen, printed at the end


def close(a, b, tol, what):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    err = np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-300)
    assert err <= tol, "%s: relative error %.3g > %.3g" % (what, err, tol)
    WORST[what] = max(WORST.get(what, 0.0), err)
    return err


def hf_config(m, qwen=False):
    """A transformers config for model m (float64 runs, eager attention)."""
    rope = m.get("rope") or {"theta": 10000.0, "dim": m["D"]}
    sc = rope.get("scaling")
    kw = dict(hidden_size=m["E"], num_attention_heads=m["H"], num_key_value_heads=m["G"],
              rope_theta=float(rope["theta"]), max_position_embeddings=1 << 16,
              attention_dropout=0.0)
    if sc:
        kw["rope_scaling"] = {("rope_type" if k == "type" else k):
                              (v if isinstance(v, (str, bool)) or k.startswith("original")
                               else float(v))
                              for k, v in sc.items()}
        if sc["type"] == "yarn":  # transformers 4.46 bounds YaRN's ramp by this, newer by sc's
            kw["max_position_embeddings"] = sc["original_max_position_embeddings"]
    if qwen:
        cfg = Qwen2Config(**kw)
    else:
        cfg = LlamaConfig(head_dim=m["D"], attention_bias=m["bias"] == "all", **kw)
    cfg.partial_rotary_factor = rope["dim"] / m["D"]
    cfg._attn_implementation = "eager"
    return cfg


# YaRN's keys that transformers 4.46 does not read yet (it takes them
# silently, and computes without them); a model that gives one is checked
# against the float64 reference here only.
HF_UNREAD = {"mscale", "mscale_all_dim", "truncate"}


def check_freqs(m):
    """Our frequencies and YaRN's attention factor against transformers'
    rules (computed in float32 there)."""
    sc = m["rope"].get("scaling") or {}
    if HF_UNREAD & set(sc):
        print("  %s: frequencies not cross-checked (transformers %s does not read %s)"
              % (m["name"], HF, ", ".join(sorted(HF_UNREAD & set(sc)))))
        return None
    cfg = hf_config(m)
    inv, af = ROPE_INIT_FUNCTIONS[sc.get("type", "default")](cfg, "cpu")
    close([af], [attention_factor(m["rope"])], 1e-12, m["name"] + " attention factor")
    return close(inv.double().numpy(), inv_freq(m["rope"]), 1e-6, m["name"] + " frequencies")


def check_rotation(m, rng):
    """The interleaved rotation against GPT-J's code and Meta's complex form;
    the half rotation against Llama's rotate_half."""
    rope, D = m["rope"], m["D"]
    L, heads, dim = 9, 3, rope["dim"]
    x = rng.standard_normal((L, heads, D))
    pos = rng.integers(0, 5000, L)
    ours = rotate(x, pos, rope)
    ours[:, :, :dim] /= attention_factor(rope)  # the rotation alone, as the references do it
    ang = torch.from_numpy(pos.astype(np.float64)[:, None] * inv_freq(rope)[None, :])
    xt = torch.from_numpy(x)
    if rope["style"] == "interleaved":
        rot = gptj_rotary(xt[None, :, :, :dim], torch.sin(ang)[None], torch.cos(ang)[None])[0]
        xc = torch.view_as_complex(xt[:, :, :dim].reshape(L, heads, dim // 2, 2).contiguous())
        meta = torch.view_as_real(xc * torch.polar(torch.ones_like(ang), ang)[:, None, :])
        close(meta.reshape(L, heads, dim).numpy(), ours[:, :, :dim], 1e-12,
              m["name"] + " rotation (Meta's complex form)")
    else:
        from transformers.models.llama.modeling_llama import rotate_half
        emb = torch.cat((ang, ang), dim=-1)[:, None, :]
        part = xt[:, :, :dim]
        rot = part * emb.cos() + rotate_half(part) * emb.sin()
    close(rot.numpy(), ours[:, :, :dim], 1e-12, m["name"] + " rotation (" +
          ("GPT-J" if rope["style"] == "interleaved" else "rotate_half") + ")")
    assert np.array_equal(ours[:, :, dim:], x[:, :, dim:])


def check_layer(m, sd, x, pos, hidden, want):
    """The whole layer through LlamaAttention or Qwen2Attention in float64,
    with cos and sin from our float64 frequencies (transformers makes them in
    float32) and a scale other than 1/sqrt(D) folded into q_proj."""
    cfg = hf_config(m, qwen=m["bias"] == "qkv")
    attn = (Qwen2Attention if m["bias"] == "qkv" else LlamaAttention)(cfg, layer_idx=0).double()
    fold = (m.get("scale") or 1 / math.sqrt(m["D"])) * math.sqrt(m["D"])
    state = {}
    for n, p in attn.state_dict().items():
        if n.startswith("rotary_emb"):
            continue
        t = torch.from_numpy(sd[n].astype(np.float64))
        state[n] = t * fold if n.startswith("q_proj") else t
    attn.load_state_dict(state, strict=False)
    ang = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq(m["rope"])[None, :]
    emb = torch.from_numpy(np.concatenate([ang, ang], axis=-1))[None]
    af = attention_factor(m["rope"])  # transformers multiplies its cos and sin by it
    mask = torch.from_numpy(np.where(hidden, torch.finfo(torch.float64).min, 0.0))[None, None]
    with torch.no_grad():
        out = attn(torch.from_numpy(x)[None], attention_mask=mask,
                   position_ids=torch.from_numpy(np.asarray(pos))[None],
                   position_embeddings=(emb.cos() * af, emb.sin() * af))[0][0].numpy()
    keep = ~hidden.all(axis=1)
    # eager attention takes its softmax in float32: 1e-6 leaves room for that
    return close(out[keep], want[keep], 1e-6, "%s layer (%s)" % (m["name"], type(attn).__name__))


# ---------------------------------------------------------------- models

def make_weights(m, rng):
    """Llama-named tensors (float32, three decimals), biases per m["bias"]:
    "none", "qkv" (Qwen2) or "all" (Llama with attention_bias)."""
    E, H, G, D = m["E"], m["H"], m["G"], m["D"]
    shapes = {"q_proj": (H * D, E), "k_proj": (G * D, E), "v_proj": (G * D, E),
              "o_proj": (E, H * D)}
    sd = {}
    for n, (r, c) in shapes.items():
        sd[n + ".weight"] = np.round(rng.standard_normal((r, c)) / math.sqrt(c), 3)
        if m["bias"] == "all" or (m["bias"] == "qkv" and n != "o_proj"):
            sd[n + ".bias"] = np.round(rng.standard_normal(r) * 0.5, 3)
    return {n: a.astype(np.float32) for n, a in sd.items()}


def config_entry(m):
    """The model's entry of an attnd config file."""
    c = {"name": m["name"], "embed_dim": m["E"], "num_heads": m["H"], "num_kv_heads": m["G"],
         "weights": m["name"] + ".safetensors", "layout": "llama", "prefix": PREFIX,
         "bias": m["bias"] != "none"}
    if m["D"] * m["H"] != m["E"]:
        c["head_dim"] = m["D"]
    if m.get("scale"):
        c["scale"] = m["scale"]
    if m.get("rope"):
        c["rope"] = m["rope"]
    return c


def hidden_matrix(L, spec, rng):
    """(L,L) bool hidden keys, and the request's masks that give it."""
    causal = spec.get("causal", True)
    h = np.triu(np.ones((L, L), dtype=bool), k=1) if causal else np.zeros((L, L), dtype=bool)
    kpm = am = None
    if "kpm" in spec:
        kpm = np.asarray(spec["kpm"], dtype=bool)
        h |= kpm[None, :]
    if "packed" in spec:  # block-diagonal: several sequences in one
        seg = np.repeat(np.arange(len(spec["packed"])), spec["packed"])
        am = seg[:, None] != seg[None, :]
        h |= am
    return h, causal, kpm, am


def run_sequence(m, sd, spec, rng):
    L = spec["L"]
    x = randn(rng, (L, m["E"]))
    pos = spec.get("positions")
    if pos == "packed":
        pos = np.concatenate([np.arange(n) for n in spec["packed"]]).tolist()
    hidden, causal, kpm, am = hidden_matrix(L, spec, rng)
    p = np.arange(L) if pos is None else np.asarray(pos)
    out, w = reference(sd, m, x.astype(np.float64), p, hidden)
    if HF and m["rope"]["style"] == "half" and m["rope"]["dim"] == m["D"]:
        check_layer(m, sd, x.astype(np.float64), p, hidden, out)
    attention = spec.get("attention", "none")
    aw = w if attention == "heads" else w.mean(axis=0) if attention == "mean" else None
    return {
        "query": tolist(x), "positions": pos, "key": None, "value": None,
        "key_padding_mask": None if kpm is None else tolist(kpm),
        "attn_mask": None if am is None else tolist(am),
        "attn_mask_kind": None if am is None else "bool",
        "causal": causal, "attention": attention,
        "output": tolist(out.astype(np.float32)),
        "attn_weights": None if aw is None else tolist(aw.astype(np.float32)),
    }


# Sequences: causal by default; "positions" a list, "packed" or absent
# (0..L-1); "packed" lengths make a block-diagonal mask; "kpm" hides keys.
# Every model has a plain causal sequence (the first) that sessions replay
# step by step, positions far past anything trained, and a fully hidden row.
SEQS = [
    dict(L=16, attention="heads"),
    dict(L=7, positions=[100, 101, 102, 103, 104, 105, 106]),
    dict(L=9, positions="packed", packed=[4, 5], attention="mean"),
    dict(L=5, causal=False),
    dict(L=6, positions=[5000, 5001, 5002, 5003, 5004, 5005], attention="heads"),
    dict(L=4, kpm=[1, 0, 0, 0], attention="heads"),
]

MODELS = [
    # Llama 2 style: GQA 8 over 2, rotate_half over the whole head, no biases
    dict(name="gqa_half", E=64, H=8, G=2, D=8, bias="none", seed=11,
         rope={"theta": 10000, "dim": 8, "style": "half"}),
    # GPT-J / Meta pairs, multi-query, a partial rotary width, all biases
    dict(name="mqa_interleaved", E=48, H=4, G=1, D=12, bias="all", seed=12,
         rope={"theta": 10000, "dim": 8, "style": "interleaved"}),
    # Llama 3.1: llama3 scaling, head_dim 16 != E/H 12, biases everywhere
    dict(name="llama3_head_dim", E=48, H=4, G=2, D=16, bias="all", seed=13,
         rope={"theta": 500000, "dim": 16, "style": "half",
               "scaling": {"type": "llama3", "factor": 8, "low_freq_factor": 1,
                           "high_freq_factor": 4, "original_max_position_embeddings": 64}}),
    # Qwen2 biases (q, k, v only), linear scaling, and a scale of its own
    dict(name="qwen_linear_scale", E=32, H=4, G=2, D=8, bias="qkv", seed=14, scale=0.2,
         rope={"theta": 10000, "dim": 8, "style": "half",
               "scaling": {"type": "linear", "factor": 4}}),
    # Qwen2.5's long-context YaRN (factor and the trained context only)
    dict(name="yarn_qwen", E=48, H=4, G=2, D=12, bias="qkv", seed=15,
         rope={"theta": 10000, "dim": 12, "style": "half",
               "scaling": {"type": "yarn", "factor": 4,
                           "original_max_position_embeddings": 512}}),
    # DeepSeek's YaRN numbers (betas, mscale over mscale_all_dim) and gpt-oss's
    # unrounded bounds, on interleaved pairs of a partial rotary width
    dict(name="yarn_mscale_interleaved", E=32, H=2, G=1, D=16, bias="all", seed=16,
         rope={"theta": 50000, "dim": 12, "style": "interleaved",
               "scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 256,
                           "beta_fast": 16, "beta_slow": 2, "mscale": 1.0,
                           "mscale_all_dim": 0.5, "truncate": False}}),
]


def build(m):
    rng = np.random.default_rng(m["seed"])
    sd = make_weights(m, rng)
    if HF:
        check_freqs(m)
        check_rotation(m, np.random.default_rng(m["seed"] + 100))
    seqs = [run_sequence(m, sd, s, rng) for s in SEQS]
    obj = {"name": m["name"], "embed_dim": m["E"], "num_heads": m["H"], "num_kv_heads": m["G"],
           "head_dim": m["D"], "kdim": m["E"], "vdim": m["E"], "bias": m["bias"] != "none",
           "config": config_entry(m),
           "weights": {n: tolist(a.reshape(-1)) for n, a in sd.items()},
           "sequences": seqs}
    tensors = [(PREFIX + n, a) for n, a in sd.items()]
    return dumps(obj).encode(), f32_safetensors(tensors)


def main():
    check = "--check" in sys.argv[1:]
    if "--require-transformers" in sys.argv[1:] and not HF:
        print("transformers does not import here: the cross-checks cannot run "
              "(make golden-decoder-check makes a venv that has it)")
        return 2
    print("transformers %s on torch %s: cross-checks on" % (HF, torch.__version__) if HF else
          "transformers not installed: cross-checks skipped")
    bad = 0
    os.makedirs(DEC_DIR, exist_ok=True)
    for m in MODELS:
        js, st = build(m)
        for ext, data in ((".json", js), (".safetensors", st)):
            path = os.path.join(DEC_DIR, m["name"] + ext)
            if check:
                with open(path, "rb") as f:
                    same = f.read() == data
                print(("same " if same else "DIFFERENT ") + path)
                bad += not same
            else:
                with open(path, "wb") as f:
                    f.write(data)
                print("wrote %s (%d bytes)" % (path, len(data)))
    for what, err in sorted(WORST.items()):
        print("  against transformers: %-40s relative error %.2e" % (what, err))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
