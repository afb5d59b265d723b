"""Client.session against the real daemon: a decoder golden model (grouped
key/value heads, rotary positions; tests/data/golden/decoder/) stepped row
by row and in uneven steps gives the golden whole-sequence causal answer
at every step, outputs and per-head attention; an nn.MultiheadAttention
layer the same against torch with a causal mask; and the session's life:
context manager, close, a step after close, a failed step that keeps
nothing, passthrough fields (positions) on the decoder."""
import numpy as np
import pytest
import requests

import attnd
from tools import TOL, decoder_config, ref, rel_err

CONFIG, GOLDENS = decoder_config()


@pytest.fixture(scope="module")
def decoder(daemons):
    return daemons(CONFIG)


@pytest.mark.parametrize("g", GOLDENS, ids=[g["name"] for g in GOLDENS])
@pytest.mark.parametrize("cuts", [(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16),
                                  (5, 6, 9, 16)], ids=["row_by_row", "prefix_then_uneven"])
def test_decoder_steps_equal_the_whole_sequence(decoder, g, cuts):
    """Sequence 0 of each golden (16 rows, causal, per-head attention):
    a prefix of cuts[0] rows (none: an empty session), then steps ending at
    each later cut; every answer equals the golden rows, and its attention
    the golden rows over the cached keys."""
    s = g["sequences"][0]
    assert s["causal"] and s["positions"] is None and s["attention"] == "heads"
    q = np.array(s["query"], np.float32)
    out, att = np.array(s["output"]), np.array(s["attn_weights"])
    with attnd.Client(decoder.url) as c:
        prefix = {"query": q[:cuts[0]], "attention": "heads"} if cuts[0] else {}
        with c.session(model=g["name"], **prefix) as sess:
            assert sess.cached_tokens == cuts[0] and sess.model == g["name"]
            if cuts[0]:
                assert rel_err(sess.prefix.output, out[:cuts[0]]) <= TOL
                assert rel_err(sess.prefix.attention, att[:, :cuts[0], :cuts[0]]) <= TOL
            else:
                assert sess.prefix is None
            for a, b in zip(cuts, cuts[1:]):
                rows = q[a] if b == a + 1 else q[a:b]  # one row as (E,)
                r = sess.step(rows, attention="heads")
                assert sess.cached_tokens == b
                assert r.output.shape == (b - a, q.shape[1])
                assert rel_err(r.output, out[a:b]) <= TOL
                assert rel_err(r.attention, att[:, a:b, :b]) <= TOL
        assert sess.closed
        sid = sess.id
    r = requests.post(decoder.url + "/v1/sessions/%s/attention" % sid,
                      json={"query": q[:1].tolist()}, timeout=60)
    assert r.status_code == 404, "the context manager left the session open"


def test_mha_session_equals_torch_causal(served):
    """A session on an nn.MultiheadAttention layer: each step's rows equal
    the torch layer's whole sequence under a causal mask."""
    m = served.layers["self64"]
    q = np.random.default_rng(11).standard_normal((9, 64), dtype=np.float32)
    causal = np.triu(np.ones((9, 9), bool), 1)
    import torch
    out, w = ref(m, q[None], attn_mask=torch.from_numpy(causal))
    with attnd.Client(served.url) as c, c.session(q[:4], model="self64") as sess:
        assert sess.prefix.attention is None and rel_err(sess.prefix.output, out[0, :4]) <= TOL
        for a, b in ((4, 5), (5, 9)):
            r = sess.step(q[a:b], attention="mean")
            assert rel_err(r.output, out[0, a:b]) <= TOL
            assert rel_err(r.attention, w[0, a:b, :b]) <= TOL


def test_failed_step_keeps_nothing_and_close(decoder):
    g = GOLDENS[0]
    E = g["embed_dim"]
    s = g["sequences"][0]
    q = np.array(s["query"], np.float32)
    with attnd.Client(decoder.url) as c:
        sess = c.session(q[:3], model=g["name"])
        with pytest.raises(attnd.Error) as e:
            sess.step(np.ones((1, E + 1)))
        assert e.value.status == 400 and sess.cached_tokens == 3
        with pytest.raises(ValueError, match="rows: rank 3"):
            sess.step(np.ones((1, 1, E)))
        r = sess.step(q[3])
        assert sess.cached_tokens == 4
        assert rel_err(r.output, np.array(s["output"])[3:4]) <= TOL
        assert "cached_tokens=4" in repr(sess)
        sess.close()
        sess.close()  # twice: nothing
        with pytest.raises(attnd.Error, match="closed") as e:  # SPEC 10: failures raise attnd.Error
            sess.step(q[4])
        assert e.value.status is None
        # a session the daemon no longer holds closes without an error
        other = c.session(q[:2], model=g["name"])
        assert requests.delete(decoder.url + "/v1/sessions/" + other.id,
                               timeout=60).status_code == 204
        other.close()
        with pytest.raises(attnd.Error) as e:
            other.closed = False
            other.step(q[2])
        assert e.value.status == 404 and "no such session" in e.value.message


def test_a_failed_close_leaves_the_session_open(decoder):
    """A close that got no answer leaves the session open, as the daemon
    still holds it; close() again ends it there."""
    g = GOLDENS[0]
    q = np.array(g["sequences"][0]["query"], np.float32)
    with attnd.Client(decoder.url) as c, attnd.Client("http://127.0.0.1:9", retries=0) as dead:
        sess = c.session(q[:2], model=g["name"])
        sess._client = dead  # its DELETE goes nowhere
        with pytest.raises(attnd.Error) as e:
            sess.close()
        assert e.value.status is None and not sess.closed
        sess._client = c
        assert sess.step(q[2]).output.shape == (1, q.shape[1])
        sess.close()
        assert sess.closed
        assert requests.delete(decoder.url + "/v1/sessions/" + sess.id,
                               timeout=60).status_code == 404


def test_decoder_positions_passthrough(decoder):
    """positions, a decoder model's field, passes through **fields; a field
    the daemon does not know is its 400 naming it."""
    g = GOLDENS[0]
    s = next(s for s in g["sequences"] if s["positions"] is not None and s["attn_mask"] is None)
    with attnd.Client(decoder.url) as c:
        r = c.attention(np.array(s["query"]), model=g["name"], causal=s["causal"],
                        positions=np.array(s["positions"]))
        assert rel_err(r.output, np.array(s["output"])) <= TOL
        with c.session(model=g["name"]) as sess:
            with pytest.raises(attnd.Error) as e:
                sess.step(np.ones(g["embed_dim"]), timeout_mss=5)
            assert e.value.status == 400 and "timeout_mss" in e.value.message
