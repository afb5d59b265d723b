// Misuses of attnd's JavaScript client that its types must refuse: each
// line marked "misuse" must be a tsc --strict error, and no other line
// (tests/js/install.test.mjs checks both).
import { Client } from "attnd";

async function main(): Promise<void> {
  const client = new Client({ url: "http://127.0.0.1:8080" });
  new Client({ url: "http://127.0.0.1:8080", timeout: 5 }); // misuse: timeoutMs, not timeout
  await client.attention({ attention: "mean" }); // misuse: no query
  await client.attention({ query: [[1]], attention: "max" }); // misuse: not a mode
  await client.attention({ query: "rows" }); // misuse: a string is not a tensor
  await client.attention({ query: [[1]], keyPaddingMask: [0, 1] }); // misuse: numbers as a padding mask
  await client.attention({ query: [[1]], attentionRows: [0, 2, 4] }); // misuse: rows are [start, end)
  const r = await client.attention({ query: [[1]] });
  const heads: Float32Array = r.attention.data; // misuse: attention may be null, or top-k
  const n: number = r.output.shape; // misuse: shape is number[]
  const s = await client.session({ query: [[1]] });
  await s.step([[1]], "mean"); // misuse: options are an object
  await s.step([[[1]]]); // misuse: rows are (n, E), not a batch
  const id: number = s.id; // misuse: the id is a string
  await client.restoreSession("state"); // misuse: bytes, not a string
  console.log(heads, n, id);
}

void main();
