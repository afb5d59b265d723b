// Client.attention against a real daemon serving the golden models of
// tests/gen_golden.py (torch.nn.MultiheadAttention's numbers): every golden
// sequence (self- and cross-attention, key padding and boolean and float
// masks, causal, no attention, mean and per-head attention), sent as
// nested arrays and as Float32Array tensors, batched; the selections of
// SPEC section 9 against torch's weights; models() and health(); the
// traceparent; arguments refused before anything is sent.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import {
  attnd, flat, goldenEntry, loadGolden, relErr, shapeOf, startDaemon, TOL, randomTensor,
} from "./support.mjs";

const { Client } = attnd;
const NAMES = ["self_e64_h8", "cross_e48_h4_k40_v24", "nobias_e32_h4", "nobias_cross_e24_h2_k16_v20",
  "self_e30_h3", "self_e16_h1", "select_e32_h4"];
const GOLDENS = Object.fromEntries(NAMES.map((n) => [n, loadGolden(n)]));

let d, client;
before(async () => {
  d = await startDaemon({ config: { models: NAMES.map((n) => goldenEntry(GOLDENS[n])) } });
  client = new Client({ url: d.url });
});
after(() => d?.stop());

function tensor(x) {
  return { data: Float32Array.from(flat(x)), shape: shapeOf(x) };
}

function maskTensor(seq) {
  if (seq.attn_mask_kind === "bool") return { data: Uint8Array.from(flat(seq.attn_mask), Number), shape: shapeOf(seq.attn_mask) };
  return tensor(seq.attn_mask);
}

/** The options of one golden sequence: nested arrays, or tensors. */
function optionsOf(name, seq, asTensors) {
  const o = { model: name, query: asTensors ? tensor(seq.query) : seq.query, causal: seq.causal, attention: seq.attention };
  if (seq.key) o.key = asTensors ? tensor(seq.key) : seq.key;
  if (seq.value) o.value = asTensors ? tensor(seq.value) : seq.value;
  if (seq.key_padding_mask) {
    o.keyPaddingMask = asTensors ? { data: seq.key_padding_mask, shape: [seq.key_padding_mask.length] } : seq.key_padding_mask;
  }
  if (seq.attn_mask) o.attnMask = asTensors ? maskTensor(seq) : seq.attn_mask;
  return o;
}

function checkAnswer(r, seq) {
  assert.ok(r.output.data instanceof Float32Array);
  assert.deepEqual(r.output.shape, shapeOf(seq.output));
  assert.ok(relErr(r.output.data, seq.output) <= TOL, `output off torch by ${relErr(r.output.data, seq.output)}`);
  if (seq.attention === "none") {
    assert.equal(r.attention, null);
  } else {
    assert.deepEqual(r.attention.shape, shapeOf(seq.attn_weights));
    assert.ok(relErr(r.attention.data, seq.attn_weights) <= TOL, `attention off torch by ${relErr(r.attention.data, seq.attn_weights)}`);
  }
}

describe("every golden sequence against torch", () => {
  for (const name of NAMES) {
    GOLDENS[name].sequences.forEach((seq, i) => {
      for (const asTensors of [false, true]) {
        test(`${name} #${i} ${asTensors ? "Float32Array" : "nested arrays"}`, async () => {
          const r = await client.attention(optionsOf(name, seq, asTensors));
          checkAnswer(r, seq);
          assert.equal(r.model, name);
          assert.equal(r.usage.query_tokens, seq.query.length);
          assert.match(r.requestId, /^[0-9a-f]{16}$/);
        });
      }
    });
  }
});

test("a batch (B, L, E) of golden sequences equals each alone", async () => {
  const g = GOLDENS.cross_e48_h4_k40_v24;
  const pair = [g.sequences[0], { ...g.sequences[0] }];
  const r = await client.attention({ model: g.name, query: pair.map((s) => s.query), key: pair.map((s) => s.key),
    value: pair.map((s) => s.value), attention: "heads" });
  assert.deepEqual(r.output.shape, [2, ...shapeOf(pair[0].output)]);
  assert.deepEqual(r.attention.shape, [2, ...shapeOf(pair[0].attn_weights)]);
  assert.ok(relErr(r.output.data, [pair[0].output, pair[0].output]) <= TOL);
  assert.ok(relErr(r.attention.data, [pair[0].attn_weights, pair[0].attn_weights]) <= TOL);
  assert.equal(r.usage.sequences, 2);
});

/** torch's weights of a selection, as tests/blackbox/test_select.py reads them. */
function expectedSelection(g, seq, sel) {
  const [t0] = seq.torch_rows;
  const [r0, r1] = sel.attention_rows ?? [0, seq.query.length];
  const heads = sel.attention_heads ?? [...Array(g.num_heads).keys()];
  const part = heads.map((h) => seq.torch_weights[h].slice(r0 - t0, r1 - t0));
  if (sel.attention !== "mean") return part;
  return part[0].map((row, i) => row.map((_, j) => part.reduce((a, p) => a + p[i][j], 0) / part.length));
}

describe("selection (SPEC section 9) against torch's weights", () => {
  const g = GOLDENS.select_e32_h4;
  g.sequences.forEach((seq, i) => {
    seq.selections.forEach((sel, j) => {
      test(`select_e32_h4 #${i} selection ${j} ${JSON.stringify(sel)}`, async () => {
        const o = optionsOf(g.name, seq, true);
        o.attention = sel.attention;
        if (sel.attention_heads) o.attentionHeads = sel.attention_heads;
        if (sel.attention_rows) o.attentionRows = sel.attention_rows;
        if (sel.attention_top_k) o.attentionTopK = sel.attention_top_k;
        const r = await client.attention(o);
        assert.ok(relErr(r.output.data, seq.output) <= TOL);
        const want = expectedSelection(g, seq, sel);
        if (!sel.attention_top_k) {
          assert.deepEqual(r.attention.shape, shapeOf(want));
          assert.ok(relErr(r.attention.data, want) <= TOL, `selection off torch by ${relErr(r.attention.data, want)}`);
          return;
        }
        const { indices, values } = r.attention;
        const k = sel.attention_top_k;
        assert.ok(indices.data instanceof Int32Array);
        assert.deepEqual(indices.shape, [...shapeOf(want).slice(0, -1), k]);
        const rows = want.flat(want.length && Array.isArray(want[0][0]) ? 1 : 0);
        rows.forEach((row, n) => {
          const top = [...row].sort((a, b) => b - a).slice(0, k);
          const got = Array.from(values.data.subarray(n * k, (n + 1) * k));
          assert.ok(relErr(got, top) <= TOL, `row ${n}: top-k values off torch`);
          for (let m = 0; m < k; m++) {
            assert.ok(Math.abs(row[indices.data[n * k + m]] - top[m]) <= 1e-6, `row ${n}: key ${indices.data[n * k + m]} is not among torch's top ${k}`);
          }
        });
      });
    });
  });

  test("attention_dtype float16 and bfloat16 come back as Float32Array near float32's", async () => {
    const seq = g.sequences[0];
    const o = { ...optionsOf(g.name, seq, true), attention: "mean", attentionRows: [0, 4] };
    const full = await client.attention(o);
    for (const [dtype, tol] of [["float16", 1e-3], ["bfloat16", 1e-2]]) {
      const r = await client.attention({ ...o, attentionDtype: dtype });
      assert.ok(r.attention.data instanceof Float32Array);
      assert.deepEqual(r.attention.shape, full.attention.shape);
      const e = relErr(r.attention.data, full.attention.data);
      assert.ok(e > 0 && e <= tol, `${dtype}: off float32 by ${e}`);
    }
  });
});

test("models() and health()", async () => {
  const models = await client.models();
  assert.deepEqual(models.map((m) => m.name).sort(), [...NAMES].sort());
  const m = models.find((x) => x.name === "cross_e48_h4_k40_v24");
  assert.equal(m.embed_dim, 48);
  assert.equal(m.kdim, 40);
  assert.deepEqual(await client.health(), { status: "ok" });
});

test("a traceparent given is continued: the answer's has its trace id", async () => {
  const trace = "4bf92f3577b34da6a3ce929d0e0e4736";
  const tp = `00-${trace}-00f067aa0ba902b7-01`;
  const r = await client.attention({ model: "self_e16_h1", query: randomTensor([2, 16], 1), traceparent: tp });
  assert.match(r.traceparent, new RegExp(`^00-${trace}-[0-9a-f]{16}-01$`));
  assert.notEqual(r.traceparent, tp);
  const other = await client.attention({ model: "self_e16_h1", query: randomTensor([2, 16], 1) });
  assert.doesNotMatch(other.traceparent, new RegExp(trace));
});

describe("arguments refused before anything is sent", () => {
  const cases = [
    [{ query: [[1, 2], [3]] }, RangeError, /query\[1\]: 1 elements, expected 2/],
    [{ query: [1, 2, 3] }, RangeError, /query: rank 1/],
    [{ query: { data: new Float32Array(5), shape: [2, 3] } }, RangeError, /query: data holds 5 elements, shape \[2,3\] needs 6/],
    [{ query: [["a", 1]] }, TypeError, /query\[0\] \(flat\): string/],
    [{ query: [[1, 2]], keyPaddingMask: [0, 1] }, TypeError, /keyPaddingMask\[0\] \(flat\): number; give booleans/],
    [{ query: [[1, 2]], attention: "all" }, RangeError, /attention: 'all' is not one of none, mean, heads/],
    [{ query: [[1, 2]], atention: "mean" }, TypeError, /attention: unknown option 'atention'/],
    [{ query: [[1, 2]], attentionRows: [0] }, TypeError, /attentionRows: expected 2 whole numbers/],
  ];
  for (const [opts, type, message] of cases) {
    test(JSON.stringify(opts), async () => {
      const nobody = new Client({ url: "http://127.0.0.1:1" }); // a request sent would be a connection error
      await assert.rejects(nobody.attention(opts), (e) => e instanceof type && message.test(e.message));
    });
  }
  test("bad settings", () => {
    assert.throws(() => new Client({ timeoutMs: 0 }), /timeoutMs: 0/);
    assert.throws(() => new Client({ retries: -1 }), /retries: -1/);
    assert.throws(() => new Client({ url: "127.0.0.1:8080" }), /not an http:\/\/ or https:\/\/ URL/);
  });
});
