// What the JavaScript client's suites share (make test-js): the client as a
// user installs it, real daemons on 127.0.0.1, the torch goldens of
// tests/gen_golden.py and tests/gen_golden_decoder.py (tests/data/golden/),
// the relative error of SPEC section 1, and a small scripted HTTP server
// that answers from a script, then relays to a daemon, and records what
// the client sent.
import { spawn } from "node:child_process";
import { mkdtempSync, readFileSync, readdirSync, writeFileSync, rmSync } from "node:fs";
import http from "node:http";
import net from "node:net";
import { tmpdir } from "node:os";
import { join, resolve, dirname } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

export const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "..", "..");
export const BIN = process.env.ATTND_BIN ?? join(REPO, "build", "attnd");
export const GOLDEN_DIR = join(REPO, "tests", "data", "golden");
export const TOL = 1e-5;

// The client from the project make installed it into from its npm pack
// tarball (ATTND_JS_PROJECT), as a user gets it; the source folder when
// run by hand without one.
const project = process.env.ATTND_JS_PROJECT;
export const INSTALLED = project ? join(project, "node_modules", "attnd") : null;
export const attnd = await import(pathToFileURL(INSTALLED ? join(INSTALLED, "index.js")
  : join(REPO, "clients", "js", "index.js")).href);

export function freePort() {
  return new Promise((ok, fail) => {
    const s = net.createServer();
    s.once("error", fail);
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => ok(port));
    });
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** A daemon on a free port of 127.0.0.1, with config (an object) written
 * to a temp file when given, env added to a copy of the environment
 * without any ATTND_* of the machine's; gRPC off unless args give
 * --grpc-port. stop() ends it (SIGTERM). */
export async function startDaemon({ config = null, env = {}, args = [] } = {}) {
  const dir = mkdtempSync(join(tmpdir(), "attnd-js-"));
  const port = await freePort();
  // daemons started side by side never meet on gRPC's 8081
  const grpc = args.includes("--grpc-port") ? [] : ["--grpc-port", "0"];
  const argv = ["--host", "127.0.0.1", "--port", String(port), ...grpc, ...args];
  if (config) {
    writeFileSync(join(dir, "attnd.json"), JSON.stringify(config));
    argv.push("--config", join(dir, "attnd.json"));
  }
  const clean = Object.fromEntries(Object.entries(process.env)
    .filter(([k]) => !k.startsWith("ATTND_") && k !== "OPENBLAS_CORETYPE"));
  const proc = spawn(BIN, argv, { env: { ...clean, ...env }, cwd: dir, stdio: ["ignore", "pipe", "pipe"] });
  let logs = "";
  proc.stdout.on("data", (b) => { logs += b; });
  proc.stderr.on("data", (b) => { logs += b; });
  let exited = null;
  proc.on("exit", (code) => { exited = code; });
  const url = `http://127.0.0.1:${port}`;
  for (let t = Date.now(); ; await sleep(50)) {
    if (exited !== null) throw new Error(`attnd exited with ${exited} before it was healthy:\n${logs}`);
    try {
      if ((await fetch(url + "/health")).status === 200) break;
    } catch { /* not listening yet */ }
    if (Date.now() - t > 60000) throw new Error(`attnd not healthy after 60 s:\n${logs}`);
  }
  return {
    url, port, proc,
    logs: () => logs,
    alive: () => exited === null,
    async stop() {
      if (exited === null) {
        const done = new Promise((r) => proc.once("exit", r));
        proc.kill("SIGTERM");
        await done;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}

export function loadGolden(name) {
  return JSON.parse(readFileSync(join(GOLDEN_DIR, name + ".json"), "utf8"));
}

/** A golden's config entry (tests/blackbox/support.py's Model.config). */
export function goldenEntry(g) {
  return { name: g.name, embed_dim: g.embed_dim, num_heads: g.num_heads, kdim: g.kdim,
    vdim: g.vdim, bias: g.bias, weights: join(GOLDEN_DIR, g.name + ".safetensors") };
}

/** Every decoder golden (grouped heads, rotary), its config's weights made absolute. */
export function decoderGoldens() {
  const d = join(GOLDEN_DIR, "decoder");
  return readdirSync(d).filter((f) => f.endsWith(".json")).sort().map((f) => {
    const g = JSON.parse(readFileSync(join(d, f), "utf8"));
    g.config = { ...g.config, weights: join(d, g.config.weights) };
    return g;
  });
}

export function flat(x) {
  return Array.isArray(x) ? x.flat(Infinity) : Array.from(x);
}

export function shapeOf(x) {
  const s = [];
  for (let v = x; Array.isArray(v); v = v[0]) s.push(v.length);
  return s;
}

/** ‖out − ref‖ / ‖ref‖ in float64 (an all-zero ref: ‖out‖). */
export function relErr(out, ref) {
  const a = flat(out), b = flat(ref);
  if (a.length !== b.length) return Infinity;
  let num = 0, den = 0;
  for (let i = 0; i < a.length; i++) {
    num += (a[i] - b[i]) ** 2;
    den += b[i] ** 2;
  }
  return den === 0 ? Math.sqrt(num) : Math.sqrt(num / den);
}

/** A seeded generator of floats in [-1, 1) (mulberry32). */
export function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (((t ^ (t >>> 14)) >>> 0) / 4294967296) * 2 - 1;
  };
}

export function randomTensor(shape, seed) {
  const r = rng(seed);
  return { data: Float32Array.from({ length: shape.reduce((a, b) => a * b, 1) }, r), shape };
}

/**
 * A real HTTP server that answers from script (a list of {status, headers,
 * body, delayMs}) while it lasts, then relays each request to target (a
 * daemon's URL) when given (else 500). seen: [{method, url, headers, body,
 * at}] of every request the client sent.
 */
export async function scripted(target, script = []) {
  const seen = [];
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    seen.push({ method: req.method, url: req.url, headers: req.headers, body, at: Date.now() });
    const step = script.shift();
    if (step) {
      if (step.delayMs) await sleep(step.delayMs);
      if (res.destroyed) return;
      const text = typeof step.body === "string" ? step.body : JSON.stringify(step.body);
      res.writeHead(step.status, { "Content-Type": "application/json", ...(step.headers ?? {}) });
      res.end(text);
      return;
    }
    if (!target) {
      res.writeHead(500).end('{"error":"script ended"}');
      return;
    }
    const headers = { ...req.headers };
    delete headers.host;
    delete headers.connection;
    const r = await fetch(target + req.url, { method: req.method, headers,
      body: ["GET", "HEAD", "DELETE"].includes(req.method) ? undefined : body });
    const out = Buffer.from(await r.arrayBuffer());
    const keep = {};
    for (const [k, v] of r.headers) if (!["content-length", "connection", "transfer-encoding", "keep-alive"].includes(k)) keep[k] = v;
    res.writeHead(r.status, keep).end(out);
  });
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    seen,
    close: () => new Promise((r) => {
      server.closeAllConnections();
      server.close(r);
    }),
  };
}
