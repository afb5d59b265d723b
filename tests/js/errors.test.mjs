// Failures throw AttndError with the daemon's status and sentence; 429 and
// 503 are sent again after their Retry-After, up to `retries` times, and
// nothing else is; the API key; a burst against a queue of 1; deadlines
// (timeoutMs sent as Request-Timeout-Ms, attnd's 504); AbortSignal.
// No test asserts a speed. Some read the clock as a mechanism: a retry
// comes no sooner than the Retry-After it follows (a lower bound no
// slowness breaks), and an abort ends a call that would otherwise wait
// far longer.
import assert from "node:assert/strict";
import net from "node:net";
import { after, before, test } from "node:test";
import { attnd, freePort, randomTensor, scripted, startDaemon } from "./support.mjs";

const { Client, AttndError } = attnd;
const Q = randomTensor([4, 512], 3);

let d;
before(async () => {
  d = await startDaemon();
});
after(() => d?.stop());

const draining = (retryAfter = "0") => ({ status: 503, headers: { "Retry-After": retryAfter }, body: { error: "draining" } });

test("a 503 with Retry-After is waited, then the daemon's answer", async () => {
  const srv = await scripted(d.url, [draining("1")]);
  try {
    const r = await new Client({ url: srv.url }).attention({ query: Q, attention: "mean" });
    assert.deepEqual(r.output.shape, [4, 512]);
    assert.equal(srv.seen.length, 2);
    assert.deepEqual(srv.seen[1].body, srv.seen[0].body, "the same body again");
    assert.ok(srv.seen[1].at - srv.seen[0].at >= 1000, "sent again before Retry-After: 1");
  } finally {
    await srv.close();
  }
});

test("a 429 without Retry-After waits 1 s; Retry-After may be an HTTP date", async () => {
  const when = new Date(Date.now() + 3000).toUTCString();
  const srv = await scripted(d.url, [{ status: 429, body: { error: "queue full" } },
    { status: 429, headers: { "Retry-After": when }, body: { error: "queue full" } }]);
  try {
    const r = await new Client({ url: srv.url }).attention({ query: Q });
    assert.deepEqual(r.output.shape, [4, 512]);
    assert.equal(srv.seen.length, 3);
    assert.ok(srv.seen[1].at - srv.seen[0].at >= 1000);
    // the date has whole seconds: at least 3 - 1 (waited) - 1 (cut) s are left
    assert.ok(srv.seen[2].at - srv.seen[1].at >= 900, "the date was not waited");
  } finally {
    await srv.close();
  }
});

for (const retries of [0, 2]) {
  test(`retries run out (${retries}): retries + 1 requests, then the last AttndError`, async () => {
    const srv = await scripted(null, Array.from({ length: retries + 2 }, () => draining()));
    try {
      await assert.rejects(new Client({ url: srv.url, retries }).attention({ query: Q }), (e) => {
        assert.ok(e instanceof AttndError);
        assert.deepEqual([e.status, e.message, e.retryAfter], [503, "draining", 0]);
        return true;
      });
      assert.equal(srv.seen.length, retries + 1);
    } finally {
      await srv.close();
    }
  });
}

test("a Retry-After past the timeout is not waited; health() asks once; a proxy's page keeps its text", async () => {
  const srv = await scripted(null, [draining("120"), draining(), { status: 502, headers: { "Content-Type": "text/html" }, body: "<html>502 Bad Gateway</html>" }]);
  try {
    const c = new Client({ url: srv.url, timeoutMs: 5000 });
    await assert.rejects(c.attention({ query: Q }), (e) => e.status === 503 && e.retryAfter === 120);
    await assert.rejects(c.health(), (e) => e.status === 503);
    await assert.rejects(c.attention({ query: Q }), (e) => e.status === 502 && /502 Bad Gateway/.test(e.message));
    assert.equal(srv.seen.length, 3);
  } finally {
    await srv.close();
  }
});

test("the daemon's refusals: status and sentence, sent once", async () => {
  const srv = await scripted(d.url);
  try {
    const c = new Client({ url: srv.url });
    const cases = [
      [{ query: { data: new Float32Array(2 * 500), shape: [2, 500] } }, 400, /^query\.shape\[1\]: rows of 500 numbers, model 'default' has embed_dim 512/],
      [{ query: Q, model: "nope" }, 404, /^unknown model 'nope'/],
      [{ query: Q, fields: { attention_top_kk: 3 } }, 400, /attention_top_kk: unknown field/],
      [{ query: randomTensor([9000, 512], 1) }, 413, /./],
    ];
    for (const [opts, status, message] of cases) {
      const before = srv.seen.length;
      await assert.rejects(c.attention(opts), (e) => {
        assert.ok(e instanceof AttndError, String(e));
        assert.equal(e.status, status, e.message);
        assert.match(e.message, message);
        assert.match(e.requestId, /^[0-9a-f]{16}$/);
        assert.equal(e.retryAfter, null);
        return true;
      });
      assert.equal(srv.seen.length, before + 1, "a refusal was sent again");
    }
  } finally {
    await srv.close();
  }
});

test("the API key", async () => {
  const k = await startDaemon({ env: { ATTND_API_KEY: "k3y" } });
  try {
    const good = new Client({ url: k.url, apiKey: "k3y" });
    assert.deepEqual((await good.attention({ query: Q })).output.shape, [4, 512]);
    assert.equal((await good.models())[0].name, "default");
    for (const apiKey of [null, "wrong"]) {
      const c = new Client({ url: k.url, apiKey });
      await assert.rejects(c.attention({ query: Q }), (e) => e.status === 401 && e.message.length > 0);
      await assert.rejects(c.models(), (e) => e.status === 401);
      assert.deepEqual(await c.health(), { status: "ok" }); // /health needs no key
    }
  } finally {
    await k.stop();
  }
});

test("unreachable: status null naming the URL", async () => {
  const url = `http://127.0.0.1:${await freePort()}`;
  await assert.rejects(new Client({ url }).attention({ query: Q }),
    (e) => e instanceof AttndError && e.status === null && e.message.includes(url));
});

test("no answer: the socket's reason in words, not only its code", async () => {
  // a server that reads the request, then hangs up (a proxy or a crashed daemon)
  const hangUp = net.createServer((c) => c.once("data", () => c.destroy()));
  await new Promise((r) => hangUp.listen(0, "127.0.0.1", r));
  try {
    const url = `http://127.0.0.1:${hangUp.address().port}`;
    await assert.rejects(new Client({ url }).attention({ query: Q }), (e) => {
      assert.ok(e instanceof AttndError && e.status === null, String(e));
      assert.match(e.message, /^POST http:\/\/127\.0\.0\.1:\d+\/v1\/attention: other side closed/);
      return true;
    });
  } finally {
    hangUp.close();
  }
  const refused = `http://127.0.0.1:${await freePort()}`;
  await assert.rejects(new Client({ url: refused }).models(), (e) => /: connect ECONNREFUSED 127\.0\.0\.1:\d+/.test(e.message));
});

test("a burst against a queue of 1: 429s with Retry-After, and with retries every call is answered", async () => {
  const q1 = await startDaemon({ env: { ATTND_MAX_QUEUE_REQUESTS: "1", ATTND_WORKERS: "1" } });
  try {
    const big = randomTensor([1024, 512], 5);
    const burst = (client) => Promise.allSettled(Array.from({ length: 12 }, () => client.attention({ query: big })));
    const once = await burst(new Client({ url: q1.url, retries: 0 }));
    const refused = once.filter((r) => r.status === "rejected").map((r) => r.reason);
    assert.ok(refused.length > 0, "no 429 from a queue of 1 under 12 calls at once");
    for (const e of refused) {
      assert.ok(e instanceof AttndError && e.status === 429, String(e));
      assert.ok(e.retryAfter !== null && e.retryAfter >= 0);
    }
    const patient = await burst(new Client({ url: q1.url, retries: 50 }));
    assert.deepEqual(patient.map((r) => r.status), Array(12).fill("fulfilled"),
      patient.filter((r) => r.status === "rejected").map((r) => String(r.reason)).join("; "));
    for (const r of patient) assert.deepEqual(r.value.output.shape, [1024, 512]);
  } finally {
    await q1.stop();
  }
});

test("timeoutMs is sent as the deadline, and attnd's 504 names it", async () => {
  const srv = await scripted(d.url);
  try {
    const c = new Client({ url: srv.url, timeoutMs: 20000 });
    await c.attention({ query: Q });
    const sent = Number(srv.seen[0].headers["request-timeout-ms"]);
    assert.ok(sent > 15000 && sent <= 20000, `Request-Timeout-Ms: ${sent}`);
    await c.attention({ query: Q, timeoutMs: 1234 });
    const own = Number(srv.seen[1].headers["request-timeout-ms"]);
    assert.ok(own > 0 && own <= 1234, `Request-Timeout-Ms: ${own}`);
    await c.models();
    assert.equal(srv.seen[2].headers["request-timeout-ms"], undefined, "a deadline on a route that computes nothing");
  } finally {
    await srv.close();
  }
  // a real 504: a request far longer than 1 ms of compute
  const long = randomTensor([4096, 512], 6);
  await assert.rejects(new Client({ url: d.url }).attention({ query: long, timeoutMs: 1 }),
    (e) => e instanceof AttndError && e.status === 504 && /Request-Timeout-Ms/.test(e.message));
});

test("an answer held up past the deadline: the client's own timer ends the call", async () => {
  const srv = await scripted(null, [{ status: 200, body: { output: null }, delayMs: 8000 }]);
  try {
    await assert.rejects(new Client({ url: srv.url, timeoutMs: 200 }).attention({ query: Q }),
      (e) => e instanceof AttndError && e.status === null && /no answer within \d+ ms/.test(e.message));
    assert.equal(srv.seen.length, 1);
  } finally {
    await srv.close();
  }
});

test("an AbortSignal ends a call: in flight, during a Retry-After wait, or before it starts", async () => {
  const srv = await scripted(null, [{ status: 200, body: {}, delayMs: 8000 }, draining("30")]);
  try {
    const c = new Client({ url: srv.url, timeoutMs: 60000 });
    const inFlight = new AbortController();
    setTimeout(() => inFlight.abort(), 200);
    await assert.rejects(c.attention({ query: Q, signal: inFlight.signal }), (e) => e.name === "AbortError");
    const waiting = new AbortController();
    const call = c.attention({ query: Q, signal: waiting.signal });
    while (srv.seen.length < 2) await new Promise((r) => setTimeout(r, 20));
    waiting.abort(new Error("user left"));
    await assert.rejects(call, /user left/);
    assert.equal(srv.seen.length, 2, "sent again after the abort");
    await assert.rejects(c.attention({ query: Q, signal: AbortSignal.abort() }), (e) => e.name === "AbortError");
    assert.equal(srv.seen.length, 2);
  } finally {
    await srv.close();
  }
});

test("a timeoutMs past setTimeout's 32-bit range is a long deadline, not an instant one", async () => {
  // setTimeout fires at once when given more than 2^31 - 1 ms (about 24.8 days)
  const c = new Client({ url: d.url, timeoutMs: 2 ** 31 });
  assert.deepEqual((await c.attention({ query: Q })).output.shape, [4, 512]);
  assert.equal((await c.models())[0].name, "default");
  const srv = await scripted(d.url, [draining(String(30 * 24 * 3600))]);
  try {
    const ac = new AbortController();
    const call = new Client({ url: srv.url, timeoutMs: 1e11 }).attention({ query: Q, signal: ac.signal });
    while (srv.seen.length < 1) await new Promise((r) => setTimeout(r, 20));
    await new Promise((r) => setTimeout(r, 300));
    ac.abort(new Error("user left"));
    await assert.rejects(call, /user left/);
    assert.equal(srv.seen.length, 1, "a Retry-After of 30 days was not waited");
  } finally {
    await srv.close();
  }
});

test("a timeoutMs too large for whole-number digits is sent as a whole number", async () => {
  // String(1e21) is "1e+21", which Request-Timeout-Ms refuses (400)
  for (const timeoutMs of [1e21, Number.MAX_VALUE]) {
    const c = new Client({ url: d.url, timeoutMs });
    assert.deepEqual((await c.attention({ query: Q })).output.shape, [4, 512]);
  }
});
