import { Client, AttndError } from "/tmp/hjs/clients/js/index.js";
const url = process.argv[2];
for (const apiKey of [null, "bad", "k3y"]) {
  const c = new Client({ url, apiKey });
  for (const [n, f] of [["att", () => c.attention({ query: [Array(512).fill(1)] })], ["models", () => c.models()], ["session", () => c.session()], ["health", () => c.health()]]) {
    try { const r = await f(); console.log(apiKey, n, "ok"); if (n === "session") await r.close(); } catch (e) { console.log(apiKey, n, e instanceof AttndError, e.status, e.message, String(e)); }
  }
}
