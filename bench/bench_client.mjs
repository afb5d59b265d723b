// bench_client.mjs - what the JavaScript client (clients/js) adds to a round
// trip: attnd's Client.attention against raw fetch doing the same work by
// hand (base64 of the Float32Array, the same JSON body, fetch, JSON.parse
// and base64 back into a Float32Array), alternating, after warm-up
// rounds, on a daemon bench/bench_client.py started (make bench-client
// runs it from there and prints its rows in the same table).
//
//   node bench/bench_client.mjs --url URL --case NAME,MODEL,SHAPE,ROUNDS ... [--warmup N]
//
// SHAPE is dims joined by "x" (1x512x1024). Prints one JSON line per case:
// {"name", "client": [ms...], "raw": [ms...]}. Asserts nothing.
import { join, resolve, dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..");
const project = process.env.ATTND_JS_PROJECT;
const { Client } = await import(pathToFileURL(project ? join(project, "node_modules", "attnd", "index.js")
  : join(REPO, "clients", "js", "index.js")).href);

function parseArgs(argv) {
  const a = { cases: [], warmup: 5 };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === "--url") a.url = argv[++i];
    else if (argv[i] === "--warmup") a.warmup = Number(argv[++i]);
    else if (argv[i] === "--case") {
      const [name, model, shape, rounds] = argv[++i].split(",");
      a.cases.push({ name, model, shape: shape.split("x").map(Number), rounds: Number(rounds) });
    } else throw new Error(`unknown argument ${argv[i]}`);
  }
  return a;
}

function query(shape, seed) {
  let s = seed >>> 0;
  const data = new Float32Array(shape.reduce((x, y) => x * y, 1));
  for (let i = 0; i < data.length; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    data[i] = s / 2 ** 31 - 1;
  }
  return { data, shape };
}

/** The same request by hand, with the platform's fetch. */
async function raw(url, q, model) {
  const b64 = Buffer.from(q.data.buffer, q.data.byteOffset, q.data.byteLength).toString("base64");
  const body = JSON.stringify({ query: { shape: q.shape, dtype: "float32", b64 }, model, encoding: "base64" });
  const res = await fetch(url + "/v1/attention", { method: "POST", body, headers: { "Content-Type": "application/json" } });
  const ans = await res.json();
  if (res.status !== 200) throw new Error(`raw request: ${res.status} ${JSON.stringify(ans).slice(0, 300)}`);
  const bytes = Buffer.from(ans.output.b64, "base64");
  const out = new Uint8Array(bytes.length);
  out.set(bytes);
  return new Float32Array(out.buffer);
}

const a = parseArgs(process.argv.slice(2));
const client = new Client({ url: a.url, timeoutMs: 120000 });
for (const c of a.cases) {
  const q = query(c.shape, 1);
  const tc = [], tr = [];
  for (let i = 0; i < a.warmup + c.rounds; i++) {
    const t0 = performance.now();
    const mine = await client.attention({ query: q, model: c.model });
    const t1 = performance.now();
    const theirs = await raw(a.url, q, c.model);
    const t2 = performance.now();
    if (i === 0 && !mine.output.data.every((v, j) => Object.is(v, theirs[j]))) {
      throw new Error("the client's answer differs from the raw one");
    }
    if (i >= a.warmup) {
      tc.push(t1 - t0);
      tr.push(t2 - t1);
    }
  }
  console.log(JSON.stringify({ name: c.name, client: tc, raw: tr }));
}
