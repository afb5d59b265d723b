"""attnd.Client against the real daemon: its answers equal
torch.nn.MultiheadAttention's with the same weights (exported by
attnd.torch.export) to 1e-5, for self- and cross-attention, batches, every
kind of mask and both attention matrices; arguments are converted or
refused (naming them) before anything is sent; models() and health();
attention_heads sent only when given; passthrough fields."""
import numpy as np
import pytest
import torch

import attnd
from scripted import Scripted
from tools import TOL, ref, rel_err

RNG = np.random.default_rng(7)


def randn(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


@pytest.fixture(scope="module")
def client(served):
    with attnd.Client(served.url) as c:
        yield c


def test_self_attention_batch_and_matrices(served, client):
    """(B, L, E) with per-head and mean attention, (L, E) alone, and no
    attention asked: None."""
    m = served.layers["self64"]
    q = randn(3, 7, 64)
    r = client.attention(q, model="self64", attention="heads")
    out, w = ref(m, q, average_attn_weights=False)
    assert r.output.dtype == np.float32 and r.output.shape == (3, 7, 64)
    assert r.attention.dtype == np.float32 and r.attention.shape == (3, 4, 7, 7)
    assert rel_err(r.output, out) <= TOL and rel_err(r.attention, w) <= TOL
    r = client.attention(q[1], model="self64", attention="mean")
    out, w = ref(m, q[1:2])
    assert r.output.shape == (7, 64) and r.attention.shape == (7, 7)
    assert rel_err(r.output, out[0]) <= TOL and rel_err(r.attention, w[0]) <= TOL
    r = client.attention(q, model="self64")
    assert r.attention is None and rel_err(r.output, ref(m, q)[0]) <= TOL
    assert r.model == "self64" and r.usage["sequences"] == 3 and r.usage["query_tokens"] == 21
    assert r.request_id and r.output.flags.writeable


def test_cross_attention_other_widths(served, client):
    """key (S, kdim) and value (S, vdim) of their own widths, batched."""
    m = served.layers["cross48"]
    q, k, v = randn(2, 5, 48), randn(2, 9, 40), randn(2, 9, 24)
    r = client.attention(q, k, v, model="cross48", attention="heads")
    out, w = ref(m, q, k, v, average_attn_weights=False)
    assert r.attention.shape == (2, 6, 5, 9)
    assert rel_err(r.output, out) <= TOL and rel_err(r.attention, w) <= TOL


def test_key_alone_is_key_and_value(served, client):
    m = served.layers["self64"]
    q, k = randn(4, 64), randn(6, 64)
    r = client.attention(q, k, model="self64", attention="mean")
    out, w = ref(m, q[None], k[None])
    assert rel_err(r.output, out[0]) <= TOL and rel_err(r.attention, w[0]) <= TOL


def test_no_bias_layer(served, client):
    m = served.layers["nobias32"]
    q = randn(2, 6, 32)
    r = client.attention(q, model="nobias32", attention="mean")
    out, w = ref(m, q)
    assert rel_err(r.output, out) <= TOL and rel_err(r.attention, w) <= TOL


def padding():
    kpm = np.zeros((2, 6), bool)
    kpm[0, [1, 4]] = True
    kpm[1, 5] = True
    return kpm


@pytest.mark.parametrize("case", ["padding", "padding_shared", "bool_mask", "float_mask",
                                  "float_mask_per_sequence", "causal", "all_masks"])
def test_masks(served, client, case):
    """Each mask alone and all together, against torch's masks for the same
    sequences: padding (B, S) and (S,), attn_mask booleans and numbers (with
    -inf) as (L, S) and per sequence, causal."""
    m, H = served.layers["self64"], 4
    q, k = randn(2, 5, 64), randn(2, 6, 64)
    bool_mask = np.zeros((5, 6), bool)
    bool_mask[2, [0, 3]] = True
    float_mask = randn(5, 6)
    float_mask[0, 2] = -np.inf
    per_seq = randn(2, 5, 6)
    per_seq[1, 3, 4] = -np.inf
    kw, tkw = {}, {}
    if case in ("padding", "all_masks"):
        kw["key_padding_mask"] = tkw["key_padding_mask"] = padding()
    if case == "padding_shared":
        kw["key_padding_mask"] = padding()[0]
        tkw["key_padding_mask"] = np.stack([padding()[0]] * 2)
    if case == "bool_mask":
        kw["attn_mask"] = tkw["attn_mask"] = bool_mask
    if case in ("float_mask", "all_masks"):
        kw["attn_mask"] = tkw["attn_mask"] = float_mask
    if case == "float_mask_per_sequence":
        kw["attn_mask"] = per_seq
        tkw["attn_mask"] = np.repeat(per_seq, H, axis=0)  # torch's (B·H, L, S)
    if case == "causal":
        q, k = q, q  # causal is self-attention: S = L
        kw["causal"] = True
        tkw["attn_mask"] = np.triu(np.ones((5, 5), bool), 1)
    r = client.attention(q, k, model="self64", attention="heads", **kw)
    out, w = ref(m, q, k, average_attn_weights=False,
                 **{n: torch.from_numpy(a) for n, a in tkw.items()})
    assert rel_err(r.output, out) <= TOL and rel_err(r.attention, w) <= TOL
    hidden = r.attention == 0
    assert hidden.any(), "the masks hid no key"


def test_conversions_give_the_same_answer(client):
    """float64 arrays, nested lists, integers and torch tensors (bfloat16
    too, which numpy cannot hold) are sent as float32: the answers are
    those of the float32 array, bit for bit."""
    q = randn(3, 64)
    base = client.attention(q, model="self64").output
    for x in (q.astype(np.float64), q.tolist(), torch.from_numpy(q),
              torch.from_numpy(q).requires_grad_(True), np.asfortranarray(q)):
        assert np.array_equal(client.attention(x, model="self64").output, base)
    bf16 = torch.from_numpy(q).to(torch.bfloat16)
    assert np.array_equal(client.attention(bf16, model="self64").output,
                          client.attention(bf16.float().numpy(), model="self64").output)
    ints = np.arange(3 * 64).reshape(3, 64) % 5
    assert np.array_equal(client.attention(ints, model="self64").output,
                          client.attention(ints.astype(np.float32), model="self64").output)
    kpm = [False, True, False]
    assert np.array_equal(client.attention(q, model="self64", key_padding_mask=kpm).output,
                          client.attention(q, model="self64",
                                           key_padding_mask=np.array(kpm)).output)


REFUSED = [
    (dict(query=np.ones((2, 64), bool)), TypeError, "query: dtype bool"),
    (dict(query=np.ones((2, 64), np.complex64)), TypeError, "query: dtype complex64"),
    (dict(query=[["a"] * 64]), TypeError, "query: dtype <U1"),
    (dict(query=np.ones(64)), ValueError, "query: rank 1"),
    (dict(query=np.ones((1, 2, 3, 64))), ValueError, "query: rank 4"),
    (dict(query=np.ones((0, 64))), ValueError, "query: shape (0, 64) holds no element"),
    (dict(query=[[1.0, 2.0], [3.0]]), ValueError, "query: not a rectangular array"),
    (dict(query=np.ones((2, 64)), key=np.ones(64)), ValueError, "key: rank 1"),
    (dict(query=np.ones((2, 64)), value=np.ones((2, 64), bool)), TypeError, "value: dtype bool"),
    (dict(query=np.ones((2, 64)), key_padding_mask=[0, 1]), TypeError,
     "key_padding_mask: dtype int64; give booleans"),
    (dict(query=np.ones((2, 64)), key_padding_mask=np.zeros((1, 1, 2), bool)), ValueError,
     "key_padding_mask: rank 3"),
    (dict(query=np.ones((2, 64)), attn_mask=np.zeros(2, bool)), ValueError, "attn_mask: rank 1"),
    (dict(query=np.ones((2, 64)), attn_mask=[["x", "y"]] * 2), TypeError, "attn_mask: dtype"),
    (dict(query=np.ones((2, 64)), attention="all"), ValueError, "attention: 'all' is not one of"),
    (dict(query=np.ones((2, 64)), attention_heads=[0.5]), TypeError, "attention_heads"),
    (dict(query=np.ones((2, 64)), encoding="json"), TypeError, "encoding: set by the client"),
]


@pytest.mark.parametrize("kw,exc,msg", REFUSED, ids=[r[2].split(":")[0] + "-%d" % i
                                                     for i, r in enumerate(REFUSED)])
def test_refused_before_sending(kw, exc, msg):
    """A wrong dtype or rank is refused with the argument's name, and
    nothing reaches the server."""
    with Scripted() as srv, attnd.Client(srv.url) as c:
        with pytest.raises(exc) as e:
            c.attention(**kw)
        assert msg in str(e.value), str(e.value)
        assert srv.seen == []


def test_models_and_health(served, client):
    models = {m["name"]: m for m in client.models()}
    assert set(models) == {"self64", "cross48", "nobias32"}
    assert (models["cross48"]["embed_dim"], models["cross48"]["num_heads"],
            models["cross48"]["kdim"], models["cross48"]["vdim"]) == (48, 6, 40, 24)
    assert models["nobias32"]["bias"] is False
    assert client.health() == {"status": "ok"}


def test_attention_heads_sent_only_when_given(served):
    """Without attention_heads no request carries the field (today's daemon
    refuses unknown fields, so every other test would fail too); with it,
    the field is sent as a list of ints, and the daemon either serves the
    selection (SPEC section 9: "mean" over the chosen heads) or refuses the
    field by name, raised as attnd.Error."""
    m = served.layers["self64"]
    q = randn(5, 64)
    with Scripted(served.url) as srv, attnd.Client(srv.url) as c:
        r = c.attention(q, model="self64", attention="heads")
        assert "attention_heads" not in srv.bodies()[0]
        try:
            sel = c.attention(q, model="self64", attention="mean",
                              attention_heads=np.array([0, 2]))
        except attnd.Error as e:
            assert e.status == 400 and "attention_heads" in e.message, e
        else:
            assert rel_err(sel.attention, r.attention[[0, 2]].mean(axis=0)) <= TOL
        assert srv.bodies()[1]["attention_heads"] == [0, 2]
        assert len(srv.seen) == 2  # a 400 is not sent again
    _, w = ref(m, q[None], average_attn_weights=False)
    assert rel_err(r.attention, w[0]) <= TOL


def test_passthrough_fields(served):
    """**fields go into the body as given (numpy values as JSON); a field the
    daemon does not know is its 400, naming it."""
    with Scripted(served.url) as srv, attnd.Client(srv.url) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(randn(2, 64), model="self64", attention_rowz=np.array([0, 1]))
        assert e.value.status == 400 and "attention_rowz" in e.value.message
        assert srv.bodies()[0]["attention_rowz"] == [0, 1]
        assert srv.bodies()[0]["encoding"] == "base64"
        assert srv.bodies()[0]["query"]["dtype"] == "float32"


def test_connections_kept_alive(served):
    """One after the other, a client's calls share one kept-alive
    connection: the server sees the same client port every time."""
    with Scripted(served.url) as srv:
        with attnd.Client(srv.url) as c:
            for _ in range(5):
                c.attention(randn(2, 64), model="self64")
            c.models()
        ports = {s[4] for s in srv.seen}
    assert len(srv.seen) == 6 and len(ports) == 1, ports
