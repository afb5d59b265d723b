// Sessions against real daemons: every decoder golden of
// tests/gen_golden_decoder.py (grouped heads, rotary positions) stepped row
// by row and in uneven steps equals the golden whole causal sequence at
// every step; a state taken with state() and restored on a second daemon
// continues bit for bit like the uninterrupted session; X-Session-Id is on
// every request of a session; close() and a step after it.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { attnd, decoderGoldens, relErr, scripted, startDaemon, TOL } from "./support.mjs";

const { Client, AttndError } = attnd;
const GOLDENS = decoderGoldens();
const CONFIG = { models: GOLDENS.map((g) => g.config) };

let d1, d2;
before(async () => {
  [d1, d2] = await Promise.all([startDaemon({ config: CONFIG }), startDaemon({ config: CONFIG })]);
});
after(async () => Promise.all([d1?.stop(), d2?.stop()]));

const rowsOf = (q, a, b) => ({ data: Float32Array.from(q.slice(a, b).flat()), shape: [b - a, q[0].length] });

/** The golden attention H×L×S, rows a..b, keys 0..b. */
const attOf = (att, a, b) => att.map((h) => h.slice(a, b).map((row) => row.slice(0, b)));

describe("steps equal the whole causal sequence", () => {
  for (const g of GOLDENS) {
    for (const [label, cuts] of [["row by row", [...Array(17).keys()]], ["prefix then uneven", [5, 6, 9, 16]]]) {
      test(`${g.name} ${label}`, async () => {
        const s = g.sequences[0];
        assert.ok(s.causal && s.attention === "heads" && s.query.length === 16);
        const client = new Client({ url: d1.url });
        const open = cuts[0] ? { query: rowsOf(s.query, 0, cuts[0]), attention: "heads" } : {};
        const sess = await client.session({ model: g.name, ...open });
        assert.match(sess.id, /^[0-9a-f]{32}$/);
        assert.equal(sess.cachedTokens, cuts[0]);
        if (cuts[0]) {
          assert.ok(relErr(sess.prefix.output.data, s.output.slice(0, cuts[0])) <= TOL);
          assert.ok(relErr(sess.prefix.attention.data, attOf(s.attn_weights, 0, cuts[0])) <= TOL);
        } else {
          assert.equal(sess.prefix, null);
        }
        for (let i = 1; i < cuts.length; i++) {
          const [a, b] = [cuts[i - 1], cuts[i]];
          // one row goes as a bare Float32Array (E,), more as (n, E)
          const rows = b === a + 1 ? Float32Array.from(s.query[a]) : rowsOf(s.query, a, b);
          const r = await sess.step(rows, { attention: "heads" });
          assert.equal(r.cachedTokens, b);
          assert.equal(sess.cachedTokens, b);
          assert.deepEqual(r.output.shape, [b - a, s.query[0].length]);
          assert.ok(relErr(r.output.data, s.output.slice(a, b)) <= TOL, `rows ${a}..${b} off the golden`);
          assert.ok(relErr(r.attention.data, attOf(s.attn_weights, a, b)) <= TOL);
        }
        await sess.close();
        assert.ok(sess.closed);
        await sess.close(); // twice: nothing
        await assert.rejects(sess.step(Float32Array.from(s.query[0])), /is closed/);
        const raw = await fetch(`${d1.url}/v1/sessions/${sess.id}/attention`, { method: "POST",
          body: JSON.stringify({ query: [s.query[0]] }) });
        assert.equal(raw.status, 404, "close() left the session open");
      });
    }
  }
});

test("a state restored on a second daemon continues bit for bit", async () => {
  const g = GOLDENS[0], s = g.sequences[0];
  const one = new Client({ url: d1.url }), two = new Client({ url: d2.url });
  const sess = await one.session({ model: g.name, query: rowsOf(s.query, 0, 6) });
  await sess.step(rowsOf(s.query, 6, 8));
  const bytes = await sess.state();
  assert.ok(bytes instanceof Uint8Array);
  const headerLen = Number(new DataView(bytes.buffer, bytes.byteOffset).getBigUint64(0, true));
  const header = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + headerLen)));
  assert.equal(header.__metadata__.format, "attnd-session-state");
  assert.equal(header.__metadata__.model, g.name);
  assert.equal(header.__metadata__.length, "8");

  const moved = await two.restoreSession(bytes, { id: sess.id });
  assert.equal(moved.id, sess.id);
  assert.equal(moved.cachedTokens, 8);
  const fresh = await Client.restoreSession(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length),
    { url: d2.url });
  assert.notEqual(fresh.id, sess.id);
  assert.equal(fresh.cachedTokens, 8);
  await fresh.close();
  for (let i = 8; i < 16; i++) {
    const row = Float32Array.from(s.query[i]);
    const [a, b] = await Promise.all([sess.step(row, { attention: "heads" }), moved.step(row, { attention: "heads" })]);
    assert.deepEqual(b.output.data, a.output.data, `step ${i}: the restored session differs`);
    assert.deepEqual(b.attention.data, a.attention.data);
    assert.ok(relErr(b.output.data, s.output.slice(i, i + 1)) <= TOL);
  }
  await Promise.all([sess.close(), moved.close()]);
  // the same file where the id is taken: the copy gets a new id
  const again = await two.restoreSession(bytes, { id: sess.id });
  assert.equal(again.id, sess.id);
  const copy = await two.restoreSession(bytes, { id: sess.id });
  assert.notEqual(copy.id, sess.id);
  assert.equal(copy.cachedTokens, 8);
  await Promise.all([again.close(), copy.close()]);
  // a truncated file: 400, the daemon's sentence
  await assert.rejects(two.restoreSession(bytes.subarray(0, bytes.length - 4)),
    (e) => e instanceof AttndError && e.status === 400 && e.message.length > 0);
});

test("every request of a session carries X-Session-Id", async () => {
  const g = GOLDENS[0], s = g.sequences[0];
  const relay = await scripted(d1.url);
  try {
    const client = new Client({ url: relay.url });
    const id = "7c1e5b2a9d4f3e8a0b6c1d2e3f4a5b6c";
    const sess = await client.session({ model: g.name, query: rowsOf(s.query, 0, 2), id });
    assert.equal(sess.id, id);
    await sess.step(Float32Array.from(s.query[2]));
    const bytes = await sess.state();
    await sess.close();
    const back = await client.restoreSession(bytes, { id });
    await back.close();
    assert.deepEqual(relay.seen.map((r) => [r.method, r.url.replace(id, "ID"), r.headers["x-session-id"]]), [
      ["POST", "/v1/sessions", id],
      ["POST", "/v1/sessions/ID/attention", id],
      ["GET", "/v1/sessions/ID/state", id],
      ["DELETE", "/v1/sessions/ID", id],
      ["POST", "/v1/sessions", id],
      ["DELETE", "/v1/sessions/ID", id],
    ]);
    assert.equal(relay.seen[4].headers["content-type"], "application/octet-stream");
    assert.ok(relay.seen[1].headers["request-timeout-ms"], "a step carries its deadline");
  } finally {
    await relay.close();
  }
});

test("a session closed by the daemon (idle timeout) closes without an error", async () => {
  const d = await startDaemon({ config: CONFIG, env: { ATTND_SESSION_IDLE_S: "1" } });
  try {
    const client = new Client({ url: d.url });
    const sess = await client.session({ model: GOLDENS[0].name, query: rowsOf(GOLDENS[0].sequences[0].query, 0, 2) });
    await new Promise((r) => setTimeout(r, 2500));
    await assert.rejects(sess.step(Float32Array.from(GOLDENS[0].sequences[0].query[2])),
      (e) => e instanceof AttndError && e.status === 404 && /no such session/.test(e.message));
    await sess.close();
    assert.ok(sess.closed);
  } finally {
    await d.stop();
  }
});

test("a close that failed is not closed: close() again ends the session", async () => {
  const g = GOLDENS[0], s = g.sequences[0];
  const sess = await new Client({ url: d1.url }).session({ model: g.name, query: rowsOf(s.query, 0, 2) });
  await assert.rejects(sess.close({ signal: AbortSignal.abort() }), (e) => e.name === "AbortError");
  assert.equal(sess.closed, false, "a close that sent nothing left the session marked closed");
  const r = await sess.step(Float32Array.from(s.query[2])); // still the daemon's, still usable
  assert.equal(r.cachedTokens, 3);
  await sess.close();
  assert.ok(sess.closed);
  await assert.rejects(sess.step(Float32Array.from(s.query[2])), // SPEC 10: failures throw AttndError
    (e) => e instanceof AttndError && e.status === null && /is closed/.test(e.message));
  const raw = await fetch(`${d1.url}/v1/sessions/${sess.id}/attention`, { method: "POST",
    body: JSON.stringify({ query: [s.query[0]] }) });
  assert.equal(raw.status, 404, "the session outlived its close()");
});
