"""What the client's tests share: torch layers with weights of their own
seed, exported with attnd.torch.export and served by a real daemon, torch's
reference answer, and the relative error of SPEC section 1."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "blackbox"))
import support  # noqa: E402

import attnd.torch  # noqa: E402

TOL = 1e-5


def rel_err(out, ref):
    """‖out − ref‖ / ‖ref‖ in float64 (torch tensors or numpy arrays)."""
    if isinstance(out, torch.Tensor):
        out = out.detach().double().numpy()
    if isinstance(ref, torch.Tensor):
        ref = ref.detach().double().numpy()
    return support.rel_err(out, ref)


def mha(E, H, seed, **kw):
    """An nn.MultiheadAttention with weights of its own seed (biases drawn
    too, so that a wrong bias shows), in eval mode."""
    torch.manual_seed(seed)
    m = torch.nn.MultiheadAttention(E, H, batch_first=True, **kw).eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() == 1:
                p.normal_(0, 0.5)
    return m


def ref(m, q, k=None, v=None, **kw):
    """torch's (output, weights) for numpy inputs, batch_first (B, L, E).
    Grad stays enabled: torch 1.13's fused inference path (taken under
    no_grad in eval mode) fails on a layer without biases, and the plain
    path is the reference anyway."""
    q = torch.from_numpy(q)
    k = q if k is None else torch.from_numpy(k)
    v = k if v is None else torch.from_numpy(v)
    out, w = m(q, k, v, **kw)
    return out.detach(), None if w is None else w.detach()


class Served:
    """Local torch layers served by one daemon: layers[name] is the module,
    url the daemon's."""

    def __init__(self, daemon, layers):
        self.daemon, self.layers, self.url = daemon, layers, daemon.url


def serve(factory, tmp, layers, limits=None, env=None):
    """Exports every layer (name -> nn.MultiheadAttention) into tmp with
    attnd.torch.export and starts a daemon (factory: the daemons fixture)
    on them."""
    tmp.mkdir(parents=True, exist_ok=True)
    entries = [attnd.torch.export(m, tmp / (n + ".safetensors"), n) for n, m in layers.items()]
    config = {"models": entries}
    if limits:
        config["limits"] = limits
    return Served(factory(config, env=env), layers)


def decoder_config(limits=None):
    """Every decoder golden model (tests/data/golden/decoder/), by its name."""
    import json
    d = support.GOLDEN_DIR / "decoder"
    goldens = [json.loads(p.read_text()) for p in sorted(d.glob("*.json"))]
    models = []
    for g in goldens:
        c = dict(g["config"])
        c["weights"] = str(d / c["weights"])
        models.append(c)
    cfg = {"models": models}
    if limits:
        cfg["limits"] = limits
    return cfg, goldens
