"""attnd.torch against the real daemon and the installed torch:
RemoteMultiheadAttention gives nn.MultiheadAttention's (output, weights)
for every argument of its forward (batch_first both ways, need_weights,
average_attn_weights, masks, cross-attention, unbatched input); a small
model and a TransformerEncoderLayer whose attention layer is swapped for
the served one give their local outputs to 1e-5; export writes a layer
the daemon loads (its config file as written) and serves to 1e-5."""
import copy
import inspect
import json
import pickle
import warnings

import pytest
import torch
from torch import nn

import attnd
import attnd.torch
from tools import TOL, rel_err


def t(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def local_and_remote(served, name, batch_first):
    m = copy.deepcopy(served.layers[name])
    m.batch_first = batch_first
    return m, attnd.torch.RemoteMultiheadAttention(served.url, name, batch_first=batch_first)


def compare(local, remote, *args, **kw):
    """Both layers' (output, weights) for the same arguments, as torch
    returns them: shapes, dtypes, None-ness, values to 1e-5."""
    lo, lw = local(*args, **kw)
    ro, rw = remote(*args, **kw)
    assert ro.shape == lo.shape and ro.dtype == lo.dtype
    assert rel_err(ro, lo) <= TOL
    assert (rw is None) == (lw is None)
    if lw is not None:
        assert rw.shape == lw.shape and rw.dtype == lw.dtype
        assert rel_err(rw, lw) <= TOL
    return ro, rw


def test_forward_takes_the_installed_torchs_arguments():
    want = list(inspect.signature(nn.MultiheadAttention.forward).parameters)
    got = list(inspect.signature(attnd.torch.RemoteMultiheadAttention.forward).parameters)
    assert got == want
    assert attnd.torch.HAS_IS_CAUSAL == ("is_causal" in want)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("need_weights,average", [(True, True), (True, False), (False, True)],
                         ids=["mean", "heads", "no_weights"])
def test_self_attention(served, batch_first, need_weights, average):
    local, remote = local_and_remote(served, "self64", batch_first)
    x = t(3, 7, 64) if batch_first else t(7, 3, 64)
    compare(local, remote, x, x, x, need_weights=need_weights, average_attn_weights=average)


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
def test_cross_attention_with_masks(served, batch_first):
    """Other key and value widths; a padding mask and attn_masks: bool
    (L, S) (and bytes, as torch reads them), float (L, S) with -inf, and
    (B·H, L, S) whose heads agree; masks together."""
    local, remote = local_and_remote(served, "cross48", batch_first)
    B, L, S, H = 2, 5, 8, 6
    q, k, v = t(B, L, 48, seed=1), t(B, S, 40, seed=2), t(B, S, 24, seed=3)
    if not batch_first:
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[0, [2, 5]] = True
    kpm[1, 7] = True
    bool_mask = torch.zeros(L, S, dtype=torch.bool)
    bool_mask[1, [0, 3]] = True
    float_mask = t(L, S, seed=4)
    float_mask[3, 6] = float("-inf")
    per_seq = t(B, 1, L, S, seed=5).expand(B, H, L, S).reshape(B * H, L, S)
    for kw in ({"key_padding_mask": kpm}, {"attn_mask": bool_mask},
               {"attn_mask": bool_mask.to(torch.uint8)}, {"attn_mask": float_mask},
               {"attn_mask": per_seq}, {"attn_mask": float_mask, "key_padding_mask": kpm},
               {"attn_mask": bool_mask, "key_padding_mask": kpm, "average_attn_weights": False}):
        with warnings.catch_warnings():  # torch 1.13: byte masks are deprecated
            warnings.simplefilter("ignore")
            compare(local, remote, q, k, v, **kw)


def test_float_padding_mask_alone(served):
    """A float key_padding_mask is added to the scores (torch 1.13 does so
    when it comes alone)."""
    local, remote = local_and_remote(served, "self64", True)
    x = t(2, 6, 64)
    kpm = t(2, 6, seed=8)
    kpm[0, 4] = float("-inf")
    compare(local, remote, x, x, x, key_padding_mask=kpm)


def test_unbatched_and_float64(served):
    """(L, E) input gives (L, E) output and (L, S) or (H, L, S) weights;
    float64 input gives float64 answers."""
    local, remote = local_and_remote(served, "self64", True)
    x = t(5, 64)
    compare(local, remote, x, x, x)
    compare(local, remote, x, x, x, average_attn_weights=False,
            attn_mask=torch.zeros(4, 5, 5).masked_fill(torch.eye(5, dtype=torch.bool), 0.5))
    local64 = copy.deepcopy(local).double()
    x64 = x.double()
    lo, lw = local64(x64, x64, x64)
    ro, rw = remote(x64, x64, x64)
    assert ro.dtype == rw.dtype == torch.float64
    assert rel_err(ro, lo) <= TOL and rel_err(rw, lw) <= TOL


def test_bfloat16(served):
    """A bfloat16 layer swapped for the served one: bfloat16 input (which
    numpy cannot hold) is sent as float32 and the answers come back as
    bfloat16, those of the float32 layer on the same numbers."""
    local, remote = local_and_remote(served, "self64", True)
    x = t(2, 5, 64).to(torch.bfloat16)
    ro, rw = remote(x, x, x)
    lo, lw = local(x.float(), x.float(), x.float())
    assert ro.dtype == rw.dtype == torch.bfloat16
    assert rel_err(ro.float(), lo) <= 1e-2 and rel_err(rw.float(), lw) <= 1e-2


def test_refused_masks(served):
    _, remote = local_and_remote(served, "self64", True)
    x = t(2, 3, 64)
    mask = torch.zeros(2 * 4, 3, 3)
    mask[1, 0, 2] = float("-inf")  # the second head of the first sequence differs
    with pytest.raises(ValueError, match="heads' masks of a sequence differ"):
        remote(x, x, x, attn_mask=mask)
    with pytest.raises(ValueError, match="attn_mask: shape"):
        remote(x, x, x, attn_mask=torch.zeros(3, 4))
    with pytest.raises(TypeError, match="attn_mask: dtype torch.int32"):
        remote(x, x, x, attn_mask=torch.zeros(3, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="key_padding_mask: shape"):
        remote(x, x, x, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="key_padding_mask: dtype torch.uint8"):
        remote(x, x, x, key_padding_mask=torch.zeros(2, 3, dtype=torch.uint8))


class Tiny(nn.Module):
    """A small model around one attention layer: embed, attend, normalise,
    project; returns the output and the attention weights."""

    def __init__(self, batch_first, need_weights):
        super().__init__()
        torch.manual_seed(21)
        self.embed = nn.Linear(10, 32)
        self.attn = nn.MultiheadAttention(32, 4, batch_first=batch_first)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 3)
        self.need_weights = need_weights

    def forward(self, x, pad):
        h = self.embed(x)
        a, w = self.attn(h, h, h, key_padding_mask=pad, need_weights=self.need_weights)
        return self.head(self.norm(h + a)), w


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("need_weights", [True, False], ids=["weights", "no_weights"])
def test_swap_a_models_layer(daemons, tmp_path, batch_first, need_weights):
    """Export the model's layer, serve it, swap it in: the model's output
    (and weights) are the local ones to 1e-5."""
    model = Tiny(batch_first, need_weights).eval()
    entry = attnd.torch.export(model.attn, tmp_path / "tiny.safetensors", "tiny")
    d = daemons({"models": [entry]})
    x = t(3, 6, 10) if batch_first else t(6, 3, 10)
    pad = torch.zeros(3, 6, dtype=torch.bool)
    pad[2, 4:] = True
    with torch.no_grad():
        lo, lw = model(x, pad)
        model.attn = attnd.torch.RemoteMultiheadAttention(d.url, "tiny", batch_first=batch_first)
        ro, rw = model(x, pad)
    assert ro.shape == lo.shape and rel_err(ro, lo) <= TOL
    assert (rw is None) == (lw is None) == (not need_weights)
    if need_weights:
        assert rel_err(rw, lw) <= TOL


def test_swap_a_transformer_encoder_layers_attention(daemons, tmp_path):
    """nn.TransformerEncoderLayer in eval mode (torch takes its fused path
    locally; the served layer makes it take the plain one), with a padding
    mask: the same output to 1e-5."""
    torch.manual_seed(3)
    layer = nn.TransformerEncoderLayer(32, 4, dim_feedforward=64, batch_first=True).eval()
    entry = attnd.torch.export(layer.self_attn, tmp_path / "enc.safetensors", "enc")
    d = daemons({"models": [entry]})
    x = t(2, 7, 32)
    pad = torch.zeros(2, 7, dtype=torch.bool)
    pad[1, 5:] = True
    with torch.no_grad():
        lo = layer(x, src_key_padding_mask=pad)
        layer.self_attn = attnd.torch.RemoteMultiheadAttention(d.url, "enc")
        ro = layer(x, src_key_padding_mask=pad)
    keep = ~pad  # torch's fused path leaves padded rows to its own rules
    assert rel_err(ro[keep], lo[keep]) <= TOL


def test_export_then_serve(fresh_daemons, tmp_path):
    """export with config=: the daemon starts from that file as written
    (weights relative to it); other key and value widths, no biases, F16
    (compared against the layer with its weights rounded the same way)."""
    torch.manual_seed(4)
    layers = {"kv": nn.MultiheadAttention(24, 3, kdim=16, vdim=8, batch_first=True).eval(),
              "nb": nn.MultiheadAttention(16, 2, bias=False, batch_first=True).eval()}
    (tmp_path / "cfg").mkdir()
    entry = attnd.torch.export(layers["kv"], tmp_path / "kv.safetensors", "kv",
                               config=tmp_path / "cfg" / "kv.json")
    assert entry == {"name": "kv", "embed_dim": 24, "num_heads": 3, "kdim": 16, "vdim": 8,
                     "bias": True, "causal": False, "weights": "../kv.safetensors",
                     "layout": "torch"}
    assert json.loads((tmp_path / "cfg" / "kv.json").read_text()) == {"models": [entry]}
    nb = attnd.torch.export(layers["nb"], tmp_path / "nb.safetensors", "nb", dtype="F16")
    assert nb["weights"] == str(tmp_path / "nb.safetensors") and nb["bias"] is False
    d = fresh_daemons(args=["--config", str(tmp_path / "cfg" / "kv.json")])
    q, k, v = t(2, 4, 24), t(2, 5, 16, seed=1), t(2, 5, 8, seed=2)
    compare(layers["kv"], attnd.torch.RemoteMultiheadAttention(d.url, "kv"), q, k, v)
    d2 = fresh_daemons({"models": [nb]})
    rounded = copy.deepcopy(layers["nb"])
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    x = t(2, 5, 16, seed=3)
    compare(rounded, attnd.torch.RemoteMultiheadAttention(d2.url, "nb"), x, x, x)


def test_export_refusals(tmp_path):
    with pytest.raises(ValueError, match="add_bias_kv"):
        attnd.torch.export(nn.MultiheadAttention(8, 2, add_bias_kv=True), tmp_path / "a", "a")
    with pytest.raises(ValueError, match="add_zero_attn"):
        attnd.torch.export(nn.MultiheadAttention(8, 2, add_zero_attn=True), tmp_path / "a", "a")
    with pytest.raises(ValueError, match="name"):
        attnd.torch.export(nn.MultiheadAttention(8, 2), tmp_path / "a", "no spaces")
    with pytest.raises(ValueError, match="match no layout"):
        attnd.torch.export(nn.Linear(8, 8), tmp_path / "a", "lin")
    assert not (tmp_path / "a").exists()


def test_unknown_model_copies_and_pickles(daemons, served):
    """An unknown model fails when the module is made; a deep copy keeps
    the API key, a pickle (torch.save) leaves it out."""
    with pytest.raises(attnd.Error, match="nope"):
        attnd.torch.RemoteMultiheadAttention(served.url, "nope")
    d = daemons(env={"ATTND_API_KEY": "k"})
    with pytest.raises(attnd.Error) as e:
        attnd.torch.RemoteMultiheadAttention(d.url, "default")
    assert e.value.status == 401
    remote = attnd.torch.RemoteMultiheadAttention(d.url, "default", api_key="k")
    x = t(1, 3, 512)
    out = remote(x, x, x)[0]
    twin = copy.deepcopy(remote)
    assert twin.client is not remote.client and torch.equal(twin(x, x, x)[0], out)
    loaded = pickle.loads(pickle.dumps(remote))
    assert loaded.api_key is None and loaded.model == "default" and remote.api_key == "k"
    with pytest.raises(attnd.Error) as e:
        loaded(x, x, x)
    assert e.value.status == 401
    loaded.api_key = "k"
    assert torch.equal(loaded(x, x, x)[0], out)
