#!/usr/bin/python3
"""gen_weights.py - weights files and golden outputs for attnd's loader
(config/weights.c, config/safetensors.c), made by torch modules that own
those weights under each layout's names.

Run with a Python that has torch (Debian's python3-torch 1.13):

    /usr/bin/python3 tests/gen_weights.py          # writes tests/data/weights/
    /usr/bin/python3 tests/gen_weights.py --check  # regenerates in memory, compares

Every case writes two files under tests/data/weights/:

  <case>.safetensors  written by hand here (8-byte length, JSON header padded
                      with spaces to 8 bytes, raw little-endian data), with a
                      __metadata__ entry and, where a checkpoint would have
                      them, unrelated tensors around the attention layer.
  <case>.json         {"config": an attnd config file whose one model reads
                       <case>.safetensors (path relative to this folder),
                       "query": L x E, "key": S x Kd or null, "value": S x Vd
                       or null, "output": L x E}
The output is the owning module's own forward, in float64, with the weights
exactly as stored (F16 and BF16 rounded), then rounded to float32.

It also writes default_model.json: the embedded default model re-implemented
(splitmix64 from the documented seed, torch's nn.MultiheadAttention
initialisation), some of its weights, a query and torch's output.
"""
import json
import math
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "config"))
from safetensors_header import safetensors_bytes  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "weights")
torch.set_default_dtype(torch.float64)

# ------------------------------------------------------------- safetensors


def tensor_bytes(t, dtype):
    """Little-endian bytes of t stored as dtype ("F32", "F16", "BF16", "I64")."""
    t = t.detach().contiguous()
    if dtype == "F32":
        return t.to(torch.float32).numpy().astype("<f4").tobytes()
    if dtype == "F16":
        return t.to(torch.float16).numpy().astype("<f2").tobytes()
    if dtype == "BF16":
        return t.to(torch.bfloat16).view(torch.int16).numpy().astype("<i2").tobytes()
    if dtype == "I64":
        return t.to(torch.int64).numpy().astype("<i8").tobytes()
    raise ValueError(dtype)


def stored(t, dtype):
    """t as attnd reads it back: rounded to dtype, as float64."""
    if dtype == "F16":
        return t.detach().to(torch.float16).to(torch.float64)
    if dtype == "BF16":
        return t.detach().to(torch.bfloat16).to(torch.float64)
    return t.detach().to(torch.float32).to(torch.float64)


def safetensors_file(items, metadata=None):
    """items: list of (name, tensor, dtype). Returns the file's bytes."""
    return safetensors_bytes([(name, dtype, t.shape, tensor_bytes(t, dtype))
                              for name, t, dtype in items], metadata)


def round_module(module, dtype):
    """Rounds every floating parameter of module to dtype, in place."""
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(stored(p, dtype))


# ------------------------------------------------------------- formatting


def f32s(x):
    """Shortest decimal that reads back as the same float32."""
    return np.format_float_positional(np.float32(x), unique=True, trim="-")


def enc(o):
    if isinstance(o, np.ndarray):
        if o.ndim == 1:
            return "[" + ",".join(f32s(x) for x in o) + "]"
        return "[" + ",\n".join(enc(r) for r in o) + "]"
    if isinstance(o, dict):
        return "{" + ",\n".join(json.dumps(k) + ":" + enc(v) for k, v in o.items()) + "}"
    return json.dumps(o)


def f32(t):
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    a = a.astype(np.float32)
    assert np.isfinite(a).all()
    return a


# ------------------------------------------------------------- modules


def fill(module, gen):
    """Draws every parameter of module (biases too) from gen."""
    with torch.no_grad():
        for p in module.parameters():
            scale = 1.0 / math.sqrt(p.shape[-1]) if p.dim() == 2 else 0.3
            p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return module


def heads(x, H):
    """(L, E) -> (H, L, D)."""
    L, E = x.shape
    return x.view(L, H, E // H).transpose(0, 1)


def merge(x):
    """(H, L, D) -> (L, E)."""
    H, L, D = x.shape
    return x.transpose(0, 1).reshape(L, H * D)


class BertSelfAttention(torch.nn.Module):
    def __init__(self, E):
        super().__init__()
        self.query = torch.nn.Linear(E, E)
        self.key = torch.nn.Linear(E, E)
        self.value = torch.nn.Linear(E, E)


class BertSelfOutput(torch.nn.Module):
    def __init__(self, E):
        super().__init__()
        self.dense = torch.nn.Linear(E, E)
        self.LayerNorm = torch.nn.LayerNorm(E)


class BertAttention(torch.nn.Module):
    """BERT's attention block under BERT's names; forward returns the
    output.dense projection, before dropout, residual and LayerNorm (those
    are not part of the attention layer attnd serves)."""

    def __init__(self, E, H):
        super().__init__()
        self.H = H
        self.self = BertSelfAttention(E)
        self.output = BertSelfOutput(E)

    def forward(self, x):
        q, k, v = (heads(m(x), self.H) for m in (self.self.query, self.self.key, self.self.value))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        ctx = merge(torch.softmax(scores, dim=-1) @ v)
        return self.output.dense(ctx)


class BertLayer(torch.nn.Module):
    def __init__(self, E, H):
        super().__init__()
        self.attention = BertAttention(E, H)
        self.intermediate = torch.nn.Module()
        self.intermediate.dense = torch.nn.Linear(E, 2 * E)


class HfAttention(torch.nn.Module):
    """BART/OPT (out_proj, q scaled in the projection) or Llama (o_proj,
    no biases, no rotary embedding here) attention under their names."""

    def __init__(self, E, H, out_name, bias):
        super().__init__()
        self.H, self.out_name = H, out_name
        self.q_proj = torch.nn.Linear(E, E, bias=bias)
        self.k_proj = torch.nn.Linear(E, E, bias=bias)
        self.v_proj = torch.nn.Linear(E, E, bias=bias)
        setattr(self, out_name, torch.nn.Linear(E, E, bias=bias))

    def forward(self, x):
        D = x.shape[1] // self.H
        q = heads(self.q_proj(x) * D ** -0.5, self.H)
        k, v = heads(self.k_proj(x), self.H), heads(self.v_proj(x), self.H)
        ctx = merge(torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v)
        return getattr(self, self.out_name)(ctx)


class CustomAttention(torch.nn.Module):
    """An attention layer under names no preset knows: served through the
    "tensors" map."""

    def __init__(self, E, H):
        super().__init__()
        self.H = H
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(E, E) for _ in range(4))

    def forward(self, x):
        q, k, v = (heads(m(x), self.H) for m in (self.wq, self.wk, self.wv))
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        return self.wo(merge(a @ v))


def randn32(gen, *shape):
    """Standard normal inputs that are exact float32 values."""
    return torch.randn(*shape, generator=gen).to(torch.float32).to(torch.float64)


def mha_same_as(x, out, E, H, w, b):
    """Checks out against nn.MultiheadAttention given the role tensors
    w = (q, k, v, o) weights and b = biases (or None), so that each layout's
    names are known to map onto torch's math."""
    mha = torch.nn.MultiheadAttention(E, H, bias=b is not None, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat(w[:3]))
        mha.out_proj.weight.copy_(w[3])
        if b is not None:
            mha.in_proj_bias.copy_(torch.cat(b[:3]))
            mha.out_proj.bias.copy_(b[3])
    ref = mha_out(mha, x, x, x)
    assert torch.allclose(out, ref, rtol=1e-9, atol=1e-9), (out - ref).abs().max()


def mha_out(mha, q, k, v):
    with torch.no_grad():
        return mha(q[None], k[None], v[None], need_weights=False)[0][0]


# ------------------------------------------------------------- cases


def model_entry(name, E, H, weights, **extra):
    m = {"name": name, "embed_dim": E, "num_heads": H}
    m.update(extra)
    m["weights"] = weights
    return m


def case_torch(name, dtype, gen, prefix=False):
    """nn.MultiheadAttention, alone or as layers.1.self_attn of a
    TransformerEncoder (prefix)."""
    E, H, L = 16, 4, 5
    if prefix:
        layer = torch.nn.TransformerEncoderLayer(E, 2, dim_feedforward=24, dropout=0.0,
                                                 batch_first=True)
        owner = fill(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), gen)
        mha, pre = owner.layers[1].self_attn, "layers.1.self_attn."
        H = 2
    else:
        owner = mha = fill(torch.nn.MultiheadAttention(E, H, batch_first=True), gen)
        pre = ""
    round_module(owner, dtype)
    items = [(k, t, dtype) for k, t in owner.state_dict().items()]
    x = randn32(gen, L, E)
    model = model_entry(name, E, H, name + ".safetensors", layout="torch")
    if pre:
        model["prefix"] = pre
    return items, model, x, None, None, mha_out(mha, x, x, x)


def case_kdim(name, dtype, gen):
    """Cross-attention with kdim != vdim != E: q/k/v_proj_weight."""
    E, H, Kd, Vd, L, S = 12, 3, 8, 10, 4, 6
    mha = fill(torch.nn.MultiheadAttention(E, H, kdim=Kd, vdim=Vd, batch_first=True), gen)
    round_module(mha, dtype)
    items = [(k, t, dtype) for k, t in mha.state_dict().items()]
    q = randn32(gen, L, E)
    k = randn32(gen, S, Kd)
    v = randn32(gen, S, Vd)
    model = model_entry(name, E, H, name + ".safetensors", kdim=Kd, vdim=Vd)
    return items, model, q, k, v, mha_out(mha, q, k, v)


def case_bert(name, dtype, gen):
    """Layer 1 of a small BERT encoder, with the embeddings' I64
    position_ids beside it."""
    E, H, L = 16, 4, 5
    enc_layers = torch.nn.ModuleList([fill(BertLayer(E, H), gen) for _ in range(2)])
    for layer in enc_layers:
        round_module(layer, dtype)
    items = [("bert.embeddings.position_ids", torch.arange(32)[None], "I64")]
    for i, layer in enumerate(enc_layers):
        items += [("bert.encoder.layer.%d.%s" % (i, k), t, dtype)
                  for k, t in layer.state_dict().items()]
    x = randn32(gen, L, E)
    with torch.no_grad():
        att = enc_layers[1].attention
        out = att(x)
        lin = (att.self.query, att.self.key, att.self.value, att.output.dense)
        mha_same_as(x, out, E, H, [m.weight for m in lin], [m.bias for m in lin])
    model = model_entry(name, E, H, name + ".safetensors", layout="bert",
                        prefix="bert.encoder.layer.1.")
    return items, model, x, None, None, out


def case_hf(name, dtype, gen, out_name, bias, prefix):
    E, H, L = 16, 4, 6
    attn = fill(HfAttention(E, H, out_name, bias), gen)
    round_module(attn, dtype)
    items = [(prefix + k, t, dtype) for k, t in attn.state_dict().items()]
    items.append((prefix.replace("self_attn.", "mlp.up_proj.weight"),
                  torch.randn(2 * E, E, generator=gen), dtype))
    x = randn32(gen, L, E)
    with torch.no_grad():
        out = attn(x)
        lin = (attn.q_proj, attn.k_proj, attn.v_proj, getattr(attn, out_name))
        mha_same_as(x, out, E, H, [m.weight for m in lin],
                    [m.bias for m in lin] if bias else None)
    model = model_entry(name, E, H, name + ".safetensors", bias=bias, layout="hf_proj",
                        prefix=prefix)
    return items, model, x, None, None, out


def case_tensors_map(name, dtype, gen):
    E, H, L = 8, 2, 3
    attn = fill(CustomAttention(E, H), gen)
    round_module(attn, dtype)
    items = [("blocks.0.attn." + k, t, dtype) for k, t in attn.state_dict().items()]
    x = randn32(gen, L, E)
    with torch.no_grad():
        out = attn(x)
        lin = (attn.wq, attn.wk, attn.wv, attn.wo)
        mha_same_as(x, out, E, H, [m.weight for m in lin], [m.bias for m in lin])
    roles = {"q": "wq", "k": "wk", "v": "wv", "out": "wo"}
    tensors = {}
    for role, mod in roles.items():
        tensors[role + "_weight"] = mod + ".weight"
        tensors[role + "_bias"] = mod + ".bias"
    model = model_entry(name, E, H, name + ".safetensors", prefix="blocks.0.attn.",
                        tensors=tensors)
    return items, model, x, None, None, out


def case_exported(name, dtype, gen):
    """The whole road: a TransformerEncoder saved with torch.save, its
    layers.0.self_attn written by config/export_safetensors.py (run as a
    program), served through the config entry the script printed."""
    import subprocess
    import tempfile
    E, L = 16, 4
    layer = torch.nn.TransformerEncoderLayer(E, 4, dim_feedforward=24, dropout=0.0,
                                             batch_first=True)
    owner = fill(torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False), gen)
    owner.float()
    round_module(owner, dtype)
    script = os.path.join(os.path.dirname(OUT_DIR), "..", "..", "config",
                          "export_safetensors.py")
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "model.pt"), os.path.join(tmp, name + ".safetensors")
        torch.save(owner, src)
        printed = subprocess.run([sys.executable, script, src, out, "--attr",
                                  "layers.0.self_attn", "--dtype", dtype, "--name", name],
                                 check=True, capture_output=True, text=True).stdout
        data = open(out, "rb").read()
    model = json.loads(printed)["models"][0]
    owner.double()
    x = randn32(gen, L, E)
    return data, model, x, None, None, mha_out(owner.layers[0].self_attn, x, x, x)


CASES = [
    ("torch_f32", lambda g: case_torch("torch_f32", "F32", g)),
    ("torch_f16", lambda g: case_torch("torch_f16", "F16", g)),
    ("torch_bf16", lambda g: case_torch("torch_bf16", "BF16", g)),
    ("torch_prefix_f32", lambda g: case_torch("torch_prefix_f32", "F32", g, prefix=True)),
    ("torch_prefix_f16", lambda g: case_torch("torch_prefix_f16", "F16", g, prefix=True)),
    ("torch_prefix_bf16", lambda g: case_torch("torch_prefix_bf16", "BF16", g, prefix=True)),
    ("torch_kdim_vdim_f32", lambda g: case_kdim("torch_kdim_vdim_f32", "F32", g)),
    ("torch_kdim_vdim_bf16", lambda g: case_kdim("torch_kdim_vdim_bf16", "BF16", g)),
    ("bert_f32", lambda g: case_bert("bert_f32", "F32", g)),
    ("bert_f16", lambda g: case_bert("bert_f16", "F16", g)),
    ("hf_bart_f16", lambda g: case_hf("hf_bart_f16", "F16", g, "out_proj", True,
                                      "model.encoder.layers.0.self_attn.")),
    ("hf_llama_bf16", lambda g: case_hf("hf_llama_bf16", "BF16", g, "o_proj", False,
                                        "model.layers.0.self_attn.")),
    ("tensors_map_f32", lambda g: case_tensors_map("tensors_map_f32", "F32", g)),
    ("exported_bf16", lambda g: case_exported("exported_bf16", "BF16", g)),
]


def build_case(index, make):
    gen = torch.Generator().manual_seed(1000 + index)
    items, model, q, k, v, out = make(gen)
    if isinstance(items, bytes):  # written by config/export_safetensors.py
        st = items
    else:
        st = safetensors_file(items, metadata={"format": "pt", "source": "tests/gen_weights.py"})
    golden = {"config": {"models": [model]}, "query": f32(q),
              "key": None if k is None else f32(k), "value": None if v is None else f32(v),
              "output": f32(out)}
    return st, enc(golden) + "\n"


# ------------------------------------------------------------- default model

DEFAULT_SEED = 0x6174746E64  # "attnd" in ASCII
MASK64 = (1 << 64) - 1
GAMMA = 0x9E3779B97F4A7C15


def splitmix64_scalar(state):
    """One step as config/splitmix.c writes it: (new state, output)."""
    state = (state + GAMMA) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def splitmix64_stream(seed, start, n):
    """Outputs start .. start+n-1 of the generator (uint64 numpy array); the
    state after i steps is seed + i * GAMMA, so the stream vectorises."""
    i = np.arange(start + 1, start + n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + i * np.uint64(GAMMA)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform(seed, start, shape, bound):
    n = int(np.prod(shape))
    u = (splitmix64_stream(seed, start, n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
    return ((2.0 * u - 1.0) * bound).astype(np.float32).reshape(shape), start + n


def default_model():
    E, H = 512, 8
    state, first = splitmix64_scalar(DEFAULT_SEED)
    assert int(splitmix64_stream(DEFAULT_SEED, 0, 1)[0]) == first
    in_w, at = uniform(DEFAULT_SEED, 0, (3 * E, E), math.sqrt(6.0 / (E + 3 * E)))
    out_w, at = uniform(DEFAULT_SEED, at, (E, E), 1.0 / math.sqrt(E))
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.from_numpy(in_w.astype(np.float64)))
        mha.out_proj.weight.copy_(torch.from_numpy(out_w.astype(np.float64)))
        mha.in_proj_bias.zero_()
        mha.out_proj.bias.zero_()
    gen = torch.Generator().manual_seed(512)
    x = randn32(gen, 3, E)
    out = mha_out(mha, x, x, x)
    golden = {"seed": DEFAULT_SEED, "embed_dim": E, "num_heads": H,
              "in_proj_weight_head": in_w.reshape(-1)[:8],
              "in_proj_weight_tail": in_w.reshape(-1)[-8:],
              "out_proj_weight_head": out_w.reshape(-1)[:8],
              "query": f32(x), "output": f32(out)}
    return enc(golden) + "\n"


# ------------------------------------------------------------- main


def outputs():
    files = {}
    for index, (name, make) in enumerate(CASES):
        st, js = build_case(index, make)
        files[name + ".safetensors"] = st
        files[name + ".json"] = js.encode()
    files["default_model.json"] = default_model().encode()
    return files


def main():
    files = outputs()
    if "--check" in sys.argv:
        bad = [n for n, b in files.items()
               if not os.path.exists(os.path.join(OUT_DIR, n))
               or open(os.path.join(OUT_DIR, n), "rb").read() != b]
        print("differs: " + ", ".join(bad) if bad else "all %d files match" % len(files))
        return 1 if bad else 0
    os.makedirs(OUT_DIR, exist_ok=True)
    for n, b in files.items():
        with open(os.path.join(OUT_DIR, n), "wb") as f:
            f.write(b)
    print("wrote %d files to %s" % (len(files), OUT_DIR))
    return 0


if __name__ == "__main__":
    sys.exit(main())
