// The documented API of attnd's JavaScript client, used as docs/clients.md
// uses it: tsc --noEmit --strict must compile this file (tests/js/install.test.mjs).
import { AttndError, Client, type Result, type Session, type Tensor, type TopK } from "attnd";

async function main(): Promise<void> {
  const client = new Client({ url: "http://127.0.0.1:8080", apiKey: null, timeoutMs: 5000, retries: 2 });
  const query: Tensor = { data: new Float32Array(2 * 512), shape: [2, 512] };
  const ac = new AbortController();
  const r: Result = await client.attention({
    query, key: [[0.5, 1]], value: { data: [1, 2], shape: [1, 2] }, model: "default", causal: true,
    keyPaddingMask: [false], attnMask: [[0]], attention: "heads", attentionHeads: [0, 3],
    attentionRows: [0, 2], attentionTopK: 4, attentionDtype: "float16", positions: [0, 1],
    fields: { timeout_ms: 100 }, signal: ac.signal, timeoutMs: 100, traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
  });
  const out: Float32Array = r.output.data;
  const dims: number[] = r.output.shape;
  if (r.attention !== null && "indices" in r.attention) {
    const top: TopK = r.attention;
    const keys: Int32Array = top.indices.data;
    console.log(keys.length);
  } else if (r.attention !== null) {
    const w: Float32Array = r.attention.data;
    console.log(w.length);
  }
  console.log(out.length, dims, r.usage.query_tokens, r.requestId, r.traceparent, r.model);
  const names: string[] = (await client.models()).map((m) => m.name);
  const ok: string = (await client.health({ signal: ac.signal })).status;
  const s: Session = await client.session({ query: [[1, 2]], model: "default", id: "7c1e5b2a9d4f3e8a0b6c1d2e3f4a5b6c" });
  const step = await s.step(new Float32Array(512), { attention: "mean", timeoutMs: 50 });
  const cached: number = step.cachedTokens + s.cachedTokens;
  const bytes: Uint8Array = await s.state();
  await s.close();
  const again: Session = await client.restoreSession(bytes, { id: s.id });
  const elsewhere: Session = await Client.restoreSession(bytes, { url: "http://127.0.0.1:8081", apiKey: "k", id: s.id });
  console.log(elsewhere.cachedTokens);
  console.log(names, ok, cached, again.prefix?.output.shape);
  try {
    await client.attention({ query: [[1]] });
  } catch (e) {
    if (e instanceof AttndError) {
      const status: number | null = e.status;
      const wait: number | null = e.retryAfter;
      console.log(status, wait, e.message);
    }
  }
}

void main();
