"""attnd.AsyncClient against the real daemon: twenty concurrent calls on
one client, each answer checked against torch; sessions opened both ways
(await, async with); a 503 retried after its Retry-After; errors raised
as attnd.Error. Each test runs its coroutine with asyncio.run."""
import asyncio
import inspect

import numpy as np
import pytest
import torch

import attnd
from scripted import Scripted
from tools import TOL, ref, rel_err


def test_twenty_concurrent_calls(served):
    """Twenty requests in flight at once (different lengths, models,
    masks and attention), every answer its own torch result."""
    rng = np.random.default_rng(5)
    calls = []
    for i in range(20):
        L = 1 + i % 7
        if i % 3 == 2:
            q = rng.standard_normal((2, L, 48), dtype=np.float32)
            k = rng.standard_normal((2, L + 2, 40), dtype=np.float32)
            v = rng.standard_normal((2, L + 2, 24), dtype=np.float32)
            calls.append(("cross48", q, k, v, {}, "heads"))
        else:
            q = rng.standard_normal((L, 64), dtype=np.float32)
            kw = {"causal": True} if i % 2 else {}
            calls.append(("self64", q, None, None, kw, "mean"))

    async def run():
        async with attnd.AsyncClient(served.url) as c:
            return await asyncio.gather(*[
                c.attention(q, k, v, model=name, attention=att, **kw)
                for name, q, k, v, kw, att in calls])

    results = asyncio.run(run())
    ids = set()
    for (name, q, k, v, kw, att), r in zip(calls, results):
        m = served.layers[name]
        tkw = {"average_attn_weights": att == "mean"}
        if kw.get("causal"):
            tkw["attn_mask"] = torch.from_numpy(np.triu(np.ones((len(q), len(q)), bool), 1))
        out, w = ref(m, q if q.ndim == 3 else q[None], k, v, **tkw)
        if q.ndim == 2:
            out, w = out[0], w[0]
        assert rel_err(r.output, out) <= TOL and rel_err(r.attention, w) <= TOL
        ids.add(r.request_id)
    assert len(ids) == 20


def test_sessions_both_ways(served):
    """`await client.session()` and `async with client.session()`: the same
    steps give the same answers, and each session is closed."""
    q = np.random.default_rng(9).standard_normal((6, 64), dtype=np.float32)

    async def run():
        async with attnd.AsyncClient(served.url) as c:
            s = await c.session(q[:2], model="self64")
            one = [await s.step(q[i:i + 1], attention="mean") for i in range(2, 6)]
            await s.close()
            async with c.session(q[:2], model="self64") as t:
                two = [await t.step(q[i], attention="mean") for i in range(2, 6)]
                cached = t.cached_tokens
            whole = await c.attention(q, model="self64", causal=True, attention="mean")
            return s, t, one, two, cached, whole

    s, t, one, two, cached, whole = asyncio.run(run())
    assert s.closed and t.closed and cached == 6
    for i, (a, b) in enumerate(zip(one, two)):
        assert np.array_equal(a.output, b.output)
        assert rel_err(a.output, whole.output[2 + i:3 + i]) <= TOL
        assert rel_err(a.attention, whole.attention[2 + i:3 + i, :3 + i]) <= TOL


def test_retry_and_errors(served):
    """A 503 with Retry-After, then the relayed answer; a 404 is raised at
    once with the daemon's sentence; an unreachable daemon is status None."""
    q = np.ones((3, 64), np.float32)

    async def run():
        script = [(503, {"Retry-After": "0.5"}, {"error": "draining"}, 0)]
        with Scripted(served.url, script) as srv:
            async with attnd.AsyncClient(srv.url) as c:
                r = await c.attention(q, model="self64")
                with pytest.raises(attnd.Error) as e:
                    await c.attention(q, model="nope")
                models = await c.models()
                health = await c.health()
            return r, e.value, srv.seen, models, health

    r, err, seen, models, health = asyncio.run(run())
    assert rel_err(r.output, ref(served.layers["self64"], q[None])[0][0]) <= TOL
    assert err.status == 404 and "nope" in err.message
    assert len(seen) == 5 and seen[1][3] - seen[0][3] >= 0.5
    assert {m["name"] for m in models} == {"self64", "cross48", "nobias32"}
    assert health == {"status": "ok"}


def test_same_methods_as_client():
    """Every public method of Client and Session is on AsyncClient and
    AsyncSession, as a coroutine (session: awaitable): close() too, beside
    httpx's aclose()."""
    for sync, aio in ((attnd.Client, attnd.AsyncClient), (attnd.Session, attnd.AsyncSession)):
        for name, f in inspect.getmembers(sync, inspect.isfunction):
            if name.startswith("_") or name == "session":
                continue
            assert inspect.iscoroutinefunction(getattr(aio, name, None)), (aio.__name__, name)

    async def run(url):
        c = attnd.AsyncClient(url)
        await c.health()
        await c.close()
        assert c._http.is_closed

    with Scripted(script=[(200, {}, {"status": "ok"}, 0)]) as srv:
        asyncio.run(run(srv.url))
