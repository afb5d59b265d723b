"""attnd.torch: a torch model's attention layer served by attnd.

- RemoteMultiheadAttention: an nn.Module that takes the arguments of the
  installed torch's nn.MultiheadAttention.forward and returns what it
  returns, (output, weights), computed by the daemon; a model swaps its
  local layer for it.
- export: writes an nn.MultiheadAttention's weights as the .safetensors file
  the daemon serves, and its config entry (docs/config.md).

Needs torch (Debian's python3-torch, 1.13, or a newer one from PyPI).
"""
from __future__ import annotations

import copy
import inspect
import json
import os
import re
from typing import Any, Dict, Optional, Tuple, Union

import numpy as np
import torch
from torch import Tensor, nn

from . import _export_safetensors
from ._client import Client
from ._wire import Error

# torch 2.0 added is_causal to nn.MultiheadAttention.forward; forward takes
# it exactly where the installed torch does.
HAS_IS_CAUSAL = "is_causal" in inspect.signature(nn.MultiheadAttention.forward).parameters
_NAME = re.compile(r"^[A-Za-z0-9._-]{1,63}$")


class RemoteMultiheadAttention(nn.Module):
    """nn.MultiheadAttention, computed by attnd.

    url: the daemon's base URL; model: the served model's name; api_key as
    in attnd.Client (with timeout and retries). The model's embed_dim,
    num_heads, kdim and vdim are read from the daemon when the module is
    made (an unknown model is an Error then).

    batch_first: as torch's (True: (B, L, E); False: (L, B, E), transposed
    on the way). forward takes query, key, value, key_padding_mask,
    need_weights, attn_mask, average_attn_weights (and is_causal where the
    installed torch has it) and returns (output, weights) as torch does:
    output in the query's layout, dtype and device; weights None when
    need_weights is False, else (B, L, S) averaged over heads or
    (B, H, L, S) per head (average_attn_weights=False); unbatched inputs
    (L, E) give unbatched answers.

    What differs from a local layer: no gradient flows through the daemon
    (inference only; the module holds no parameters), dropout is never
    applied (the eval() result), a 3-D attn_mask must give every head of
    a sequence the same mask (attnd takes one mask per sequence), and a
    query row whose keys are all hidden gets out_proj.bias where torch
    gives NaN (SPEC section 1).
    """

    def __init__(self, url: str, model: str, api_key: Optional[str] = None, *,
                 batch_first: bool = True, timeout: float = 30.0, retries: int = 3) -> None:
        super().__init__()
        self.url, self.model, self.batch_first = url, model, batch_first
        self.timeout, self.retries = timeout, retries
        self.api_key = api_key
        info = next((m for m in self.client.models() if m.get("name") == model), None)
        if info is None:
            raise Error(404, "model %r: not served at %s (its models: %s)" % (
                model, url, ", ".join(m.get("name", "?") for m in self.client.models())))
        self.embed_dim: int = info["embed_dim"]
        self.num_heads: int = info["num_heads"]
        self.kdim: int = info.get("kdim", self.embed_dim)
        self.vdim: int = info.get("vdim", self.embed_dim)
        self.head_dim: int = info.get("head_dim", self.embed_dim // self.num_heads)
        # torch's fused paths (TransformerEncoderLayer's fast path) read the
        # projection weights of a layer whose q, k and v share one in_proj;
        # this one holds no weights, so they must take the plain call.
        self._qkv_same_embed_dim = False

    @property
    def api_key(self) -> Optional[str]:
        """The API key sent to the daemon; setting it makes a new client."""
        return self._api_key

    @api_key.setter
    def api_key(self, key: Optional[str]) -> None:
        self._api_key = key
        self._client: Optional[Client] = None

    @property
    def client(self) -> Client:
        """The module's attnd.Client, made on first use (and again after a
        copy or unpickling)."""
        if self._client is None:
            self._client = Client(self.url, self.api_key, self.timeout, self.retries)
        return self._client

    if HAS_IS_CAUSAL:
        def forward(self, query: Tensor, key: Tensor, value: Tensor,
                    key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                    attn_mask: Optional[Tensor] = None, average_attn_weights: bool = True,
                    is_causal: bool = False) -> Tuple[Tensor, Optional[Tensor]]:
            """nn.MultiheadAttention.forward, by the daemon."""
            return self._remote(query, key, value, key_padding_mask, need_weights, attn_mask,
                                average_attn_weights, is_causal)
    else:
        def forward(self, query: Tensor, key: Tensor, value: Tensor,  # type: ignore[misc]
                    key_padding_mask: Optional[Tensor] = None, need_weights: bool = True,
                    attn_mask: Optional[Tensor] = None,
                    average_attn_weights: bool = True) -> Tuple[Tensor, Optional[Tensor]]:
            """nn.MultiheadAttention.forward, by the daemon."""
            return self._remote(query, key, value, key_padding_mask, need_weights, attn_mask,
                                average_attn_weights, False)

    def _remote(self, query: Tensor, key: Tensor, value: Tensor,
                key_padding_mask: Optional[Tensor], need_weights: bool,
                attn_mask: Optional[Tensor], average_attn_weights: bool,
                is_causal: bool) -> Tuple[Tensor, Optional[Tensor]]:
        self_attention = key is query and value is query  # mha(x, x, x): send x once
        value_is_key = value is key
        batched = query.dim() == 3
        if query.dim() not in (2, 3):
            raise ValueError("query: shape %s; expected (L, E) or a batch" % (tuple(query.shape),))
        q, k, v = (t.unsqueeze(0) if not batched else t if self.batch_first else t.transpose(0, 1)
                   for t in (query, key, value))  # (B, L, E), (B, S, kdim), (B, S, vdim)
        B, L, S = q.shape[0], q.shape[1], k.shape[1]
        mask = _attn_mask(attn_mask, B, L, S, self.num_heads)
        kpm, mask = _padding_mask(key_padding_mask, mask, B, L, S)
        mode = ("mean" if average_attn_weights else "heads") if need_weights else None
        r = self.client.attention(
            q, None if self_attention else k, None if self_attention or value_is_key else v,
            model=self.model, causal=bool(is_causal), key_padding_mask=kpm, attn_mask=mask,
            attention=mode)
        out = torch.from_numpy(r.output).to(device=query.device, dtype=query.dtype)
        out = out[0] if not batched else out if self.batch_first else out.transpose(0, 1)
        if not need_weights:
            return out, None
        w = torch.from_numpy(r.attention).to(device=query.device, dtype=query.dtype)
        return out, (w if batched else w[0])

    # A copy (copy.deepcopy, as torch's _get_clones makes) shares the
    # settings, API key included, and makes its own connections; a pickle
    # (torch.save) leaves the API key out, so that no checkpoint holds it:
    # set .api_key again after loading.
    def __deepcopy__(self, memo: Dict[int, Any]) -> "RemoteMultiheadAttention":
        new = self.__class__.__new__(self.__class__)
        memo[id(self)] = new
        state = {k: v for k, v in self.__dict__.items() if k != "_client"}
        new.__dict__.update(copy.deepcopy(state, memo))
        new._client = None
        return new

    def __getstate__(self) -> Dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"], state["_api_key"] = None, None
        return state

    def extra_repr(self) -> str:
        return "url=%r, model=%r, embed_dim=%d, num_heads=%d, batch_first=%s" % (
            self.url, self.model, self.embed_dim, self.num_heads, self.batch_first)


def _attn_mask(attn_mask: Optional[Tensor], B: int, L: int, S: int,
               H: int) -> Optional[np.ndarray]:
    """torch's attn_mask as attnd's: (L, S), or (B·H, L, S) whose heads
    agree, as (B, L, S); bytes as booleans (as torch reads them)."""
    if attn_mask is None:
        return None
    m = attn_mask.detach().cpu()
    if m.dtype == torch.uint8:
        m = m.to(torch.bool)
    if m.dtype != torch.bool and not m.is_floating_point():
        raise TypeError("attn_mask: dtype %s; torch takes bool, uint8 or float masks" % m.dtype)
    a = m.numpy() if m.dtype == torch.bool else m.to(torch.float32).numpy()
    if a.ndim == 2:
        if a.shape != (L, S):
            raise ValueError("attn_mask: shape %s, expected (L, S) = %s" % (a.shape, (L, S)))
        return a
    if a.ndim != 3 or a.shape != (B * H, L, S):
        raise ValueError("attn_mask: shape %s, expected (L, S) = %s or (B*num_heads, L, S) = %s"
                         % (a.shape, (L, S), (B * H, L, S)))
    a = a.reshape(B, H, L, S)
    if not (a == a[:, :1]).all():
        raise ValueError("attn_mask: the %d heads' masks of a sequence differ; attnd applies "
                         "one mask per sequence to every head" % H)
    return np.ascontiguousarray(a[:, 0])


def _padding_mask(key_padding_mask: Optional[Tensor], mask: Optional[np.ndarray], B: int,
                  L: int, S: int) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """(key_padding_mask, attn_mask) for attnd: a boolean padding mask goes
    as it is; a float one is added to the scores, as torch does, so it
    joins attn_mask as (B, L, S) numbers."""
    if key_padding_mask is None:
        return None, mask
    p = key_padding_mask.detach().cpu()
    p = p.reshape(1, -1) if p.dim() == 1 else p
    if tuple(p.shape) != (B, S):
        raise ValueError("key_padding_mask: shape %s, expected (B, S) = %s"
                         % (tuple(key_padding_mask.shape), (B, S)))
    if p.dtype == torch.bool:
        return p.numpy(), mask
    if not p.is_floating_point():
        raise TypeError("key_padding_mask: dtype %s; torch takes bool or float masks" % p.dtype)
    add = np.zeros((B, L, S), np.float32)
    if mask is not None:
        add += np.where(mask, -np.inf, 0).astype(np.float32) if mask.dtype == np.bool_ else mask
    return None, add + p.to(torch.float32).numpy()[:, None, :]


def export(module: nn.Module, path: Union[str, os.PathLike], name: str, *,
           config: Union[str, os.PathLike, None] = None, dtype: str = "F32") -> Dict[str, Any]:
    """Writes module's weights to path (.safetensors, tensors named as in its
    state_dict) and returns its config entry for attnd (docs/config.md):
    name, embed_dim, num_heads, kdim, vdim, bias, causal, weights, layout.

    module: an nn.MultiheadAttention (or another layer whose tensors match a
        layout: torch, bert, hf_proj; config/export_safetensors.py says how).
    name: the model's name in the config (1 to 63 of A-Z a-z 0-9 . _ -).
    config: when given, {"models": [entry]} is written there too, and the
        entry's weights path is relative to the config's folder (as attnd
        reads it); otherwise weights is path made absolute.
    dtype: F32 (the default), F16 or BF16.

    Raises ValueError for a layer attnd cannot serve (bias_k / bias_v,
    add_zero_attn) or whose tensors match no layout.
    """
    if not _NAME.match(name):
        raise ValueError("name: %r is not 1 to 63 of A-Z a-z 0-9 . _ -" % (name,))
    if isinstance(module, nn.MultiheadAttention) and (module.bias_k is not None
                                                      or module.add_zero_attn):
        raise ValueError("module: add_bias_kv and add_zero_attn add key rows that attnd's "
                         "models do not have")
    path = os.fspath(path)
    entry = _export_safetensors.export(module, path, name=name, dtype=dtype)
    if config is None:
        entry["weights"] = os.path.abspath(path)
        return entry
    folder = os.path.dirname(os.path.abspath(config))
    entry["weights"] = os.path.relpath(os.path.abspath(path), folder)
    with open(config, "w") as f:
        f.write(json.dumps({"models": [entry]}, indent=2) + "\n")
    return entry
