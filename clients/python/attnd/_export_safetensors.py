"""attnd._export_safetensors - writes one attention layer of a torch model
to a .safetensors file that attnd serves, and gives the config entry for
it. Needs only torch, and _safetensors_header beside it (the file layout,
in the standard library alone).

This is the code of attnd.torch.export and of the command line script
config/export_safetensors.py (docs/config.md), which loads this file from
the repository by its path, without installing the package:

    python3 config/export_safetensors.py SOURCE OUT.safetensors [options]

SOURCE is a file written by torch.save: a whole module (torch.save(model))
or a state_dict (a dict of tensors). Options:

    --attr PATH       the attention layer inside SOURCE, by attribute path
                      (e.g. encoder.layers.3.self_attn); for a state_dict,
                      the key prefix without its final dot. Default: SOURCE
                      itself is the layer.
    --dtype D         F32 (default), F16 or BF16
    --name NAME       the model's name in the config (default: OUT's stem)
    --num-heads H     heads, when SOURCE does not say (a state_dict, or a
                      module without num_heads / num_attention_heads)
    --config FILE     write {"models": [entry]} to FILE instead of stdout

The layer's tensors keep their names (without the --attr prefix), so an
nn.MultiheadAttention gives layout "torch", a BERT attention block
(self.query ..., output.dense) "bert", and q_proj/k_proj/v_proj with
out_proj or o_proj "hf_proj".

From Python, with config/ on sys.path:

    from export_safetensors import export
    entry = export(model, "enc3.safetensors", attr="encoder.layers.3.self_attn")

(a ValueError says what does not fit).
"""
import argparse
import json
import os
import sys

import torch

from ._safetensors_header import safetensors_header

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}

# role tensors each layout reads, to recognise the layout from the names
LAYOUT_KEYS = [
    ("torch", ("out_proj.weight",), ("in_proj_weight", "q_proj_weight")),
    ("bert", ("attention.self.query.weight", "attention.output.dense.weight"), ()),
    ("hf_proj", ("q_proj.weight", "k_proj.weight", "v_proj.weight"), ()),
]


def tensor_bytes(t, dtype):
    """Little-endian bytes of t in dtype (F32, F16 or BF16)."""
    t = t.detach().to("cpu").contiguous().to(DTYPES[dtype])
    if dtype == "BF16":  # numpy has no bfloat16: reinterpret as int16
        t = t.view(torch.int16)
    data = t.numpy().tobytes()
    if sys.byteorder != "little":
        raise ValueError("a little-endian machine is needed")
    return data


def write_safetensors(path, tensors, dtype="F32", metadata=None):
    """tensors: {name: tensor}. Writes them all in dtype to path."""
    blobs = [(name, tensor_bytes(t, dtype), list(t.shape)) for name, t in tensors.items()]
    entries = [(name, dtype, shape, len(data)) for name, data, shape in blobs]
    with open(path, "wb") as f:
        f.write(safetensors_header(entries, metadata or {"format": "pt"}))
        for _, data, _ in blobs:
            f.write(data)


def guess_layout(names):
    for layout, must, one_of in LAYOUT_KEYS:
        if all(n in names for n in must) and (not one_of or any(n in names for n in one_of)):
            return layout
    raise ValueError("the tensors (%s) match no layout (torch, bert, hf_proj); pass the "
                     "attention layer itself with --attr" % ", ".join(sorted(names)[:8]))


def role_names(layout, names):
    """(q weight, k weight, v weight, bias of q or None) names for layout."""
    if layout == "torch":
        if "in_proj_weight" in names:
            return "in_proj_weight", None, None, "in_proj_bias"
        return "q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias"
    if layout == "bert":
        p = "attention.self."
        return p + "query.weight", p + "key.weight", p + "value.weight", p + "query.bias"
    return "q_proj.weight", "k_proj.weight", "v_proj.weight", "q_proj.bias"


def hparams(tensors, layout, num_heads):
    qn, kn, vn, bn = role_names(layout, tensors)
    q = tensors[qn]
    E = q.shape[1]
    kdim = tensors[kn].shape[1] if kn else E
    vdim = tensors[vn].shape[1] if vn else E
    if num_heads is None:
        raise ValueError("the number of heads is unknown; pass --num-heads (num_heads= "
                         "from Python)")
    if E % num_heads:
        raise ValueError("%d heads do not divide embed_dim %d" % (num_heads, E))
    return {"embed_dim": int(E), "num_heads": int(num_heads), "kdim": int(kdim),
            "vdim": int(vdim), "bias": bn in tensors}


def find_heads(module):
    """The layer's head count, from the attribute torch or transformers
    gives it (on the layer or, for BERT's block, on a child)."""
    for m in module.modules():
        for attr in ("num_heads", "num_attention_heads", "n_heads", "n_head"):
            v = getattr(m, attr, None)
            if isinstance(v, int):
                return v
    return None


def export(source, out, attr=None, dtype="F32", name=None, num_heads=None):
    """Writes the attention layer of source (a module or a state_dict) to
    out and returns its config entry (a dict)."""
    if dtype not in DTYPES:
        raise ValueError("dtype %r is not F32, F16 or BF16" % (dtype,))
    if isinstance(source, torch.nn.Module):
        layer = source.get_submodule(attr) if attr else source
        tensors = dict(layer.state_dict())
        if num_heads is None:
            num_heads = find_heads(layer)
    elif isinstance(source, dict):
        prefix = attr + "." if attr else ""
        tensors = {k[len(prefix):]: v for k, v in source.items()
                   if k.startswith(prefix) and isinstance(v, torch.Tensor)}
        if not tensors:
            raise ValueError("no tensor starts with %r" % prefix)
    else:
        raise ValueError("the source is neither a module nor a state_dict")
    tensors = {k: v for k, v in tensors.items() if v.is_floating_point()}
    layout = guess_layout(set(tensors))
    entry = {"name": name or os.path.splitext(os.path.basename(out))[0]}
    entry.update(hparams(tensors, layout, num_heads))
    entry.update({"causal": False, "weights": os.path.basename(out), "layout": layout})
    write_safetensors(out, tensors, dtype)
    return entry


def main(argv=None):
    ap = argparse.ArgumentParser(description="Export one attention layer of a torch model "
                                             "to .safetensors for attnd.")
    ap.add_argument("source", help="file written by torch.save (a module or a state_dict)")
    ap.add_argument("out", help="the .safetensors file to write")
    ap.add_argument("--attr", help="attribute path of the attention layer")
    ap.add_argument("--dtype", default="F32", choices=sorted(DTYPES))
    ap.add_argument("--name", help="model name in the config")
    ap.add_argument("--num-heads", type=int, help="heads, when the source does not say")
    ap.add_argument("--config", help="write the config here instead of stdout")
    a = ap.parse_args(argv)
    try:
        try:
            source = torch.load(a.source, map_location="cpu", weights_only=False)
        except TypeError:  # torch < 1.13 has no weights_only
            source = torch.load(a.source, map_location="cpu")
    except (ImportError, AttributeError) as e:
        raise SystemExit("export_safetensors.py: %s: %s; a whole module needs its classes "
                         "importable (set PYTHONPATH), or save its state_dict instead"
                         % (a.source, e))
    try:
        entry = export(source, a.out, a.attr, a.dtype, a.name, a.num_heads)
    except ValueError as e:
        raise SystemExit("export_safetensors.py: %s" % e) from None
    # attnd resolves a relative weights path against the config's folder
    folder = os.path.dirname(os.path.abspath(a.config or a.out))
    entry["weights"] = os.path.relpath(os.path.abspath(a.out), folder)
    text = json.dumps({"models": [entry]}, indent=2) + "\n"
    if a.config:
        with open(a.config, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
