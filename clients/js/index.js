// attnd's native API from JavaScript (Node 18 and later, browsers, any
// runtime with the platform's fetch): Client, Session and AttndError.
// No dependency. The types are index.d.ts, kept by hand beside this file
// (tests/js/types checks both against each other with tsc --strict).
//
// Tensors travel as tensor objects both ways (docs/api.md, "Tensors in
// base64"): {"shape", "dtype", "b64"}, little-endian and row-major. A
// Float32Array is sent as its own bytes on a little-endian machine (every
// common one) and byte-swapped through a DataView on a big-endian one;
// answers are read the same way.

export const version = "0.1.0";

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;
const ATTENTION_MODES = ["none", "mean", "heads"];
// 429 (a full queue or session table) and 503 (starting or draining) are
// worth the same request again after a wait; a failed session step keeps
// nothing (docs/api.md), so steps are retried too.
const RETRY_STATUSES = new Set([429, 503]);
const DEFAULT_RETRY_AFTER_S = 1;
// The client's own timer gives the daemon this long past the deadline it
// was sent, so that attnd's 504 (which names the deadline) arrives first;
// the timer only ends calls whose answer is held up on the way.
const GRACE_MS = 1000;
// setTimeout holds a signed 32-bit count of milliseconds: a longer delay
// fires at once (Node and browsers alike). Timers wait at most this long
// (about 24.8 days), which a timeoutMs or a Retry-After may pass.
const MAX_TIMER_MS = 2 ** 31 - 1;

/** A request attnd refused (status: its HTTP status) or that got no answer
 * (status: null; the daemon could not be reached, or timeoutMs passed). */
export class AttndError extends Error {
  constructor(status, message, { retryAfter = null, requestId = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = "AttndError";
    this.status = status;
    this.retryAfter = retryAfter;
    this.requestId = requestId;
  }

  toString() {
    return this.status === null ? `AttndError: ${this.message}`
      : `AttndError: ${this.status}: ${this.message}`;
  }
}

// ------------------------------------------------------------ tensors in

function product(shape) {
  return shape.reduce((a, b) => a * b, 1);
}

/** A nested array's shape and its leaves, flat, row-major; a ragged or
 * empty one is a RangeError naming the argument and the index. */
function flatten(name, x) {
  const shape = [];
  for (let v = x; Array.isArray(v); v = v[0]) {
    if (v.length === 0) throw new RangeError(`${name}: an empty array holds no element`);
    shape.push(v.length);
  }
  const flat = new Array(product(shape));
  let k = 0;
  const walk = (v, depth, where) => {
    if (depth === shape.length) {
      if (Array.isArray(v)) throw new RangeError(`${name}${where}: an array where a number was expected (ragged)`);
      flat[k++] = v;
      return;
    }
    if (!Array.isArray(v) || v.length !== shape[depth]) {
      const got = Array.isArray(v) ? `${v.length} elements` : typeof v;
      throw new RangeError(`${name}${where}: ${got}, expected ${shape[depth]} like the first (ragged)`);
    }
    for (let i = 0; i < v.length; i++) walk(v[i], depth + 1, `${where}[${i}]`);
  };
  walk(x, 0, "");
  return { flat, shape };
}

/** {data, shape} of any accepted form, checked against ranks. */
function shaped(name, x, ranks, what) {
  let data, shape;
  if (Array.isArray(x)) {
    ({ flat: data, shape } = flatten(name, x));
  } else if (x !== null && typeof x === "object" && "data" in x && "shape" in x) {
    ({ data, shape } = x);
    if (!Array.isArray(shape) || !shape.every((d) => Number.isInteger(d) && d > 0)) {
      throw new RangeError(`${name}.shape: ${JSON.stringify(shape)} is not a list of positive whole numbers`);
    }
    if (data === null || typeof data !== "object" || typeof data.length !== "number") {
      throw new TypeError(`${name}.data: expected a Float32Array or an array, got ${typeof data}`);
    }
    if (data.length !== product(shape)) {
      throw new RangeError(`${name}: data holds ${data.length} elements, shape [${shape}] needs ${product(shape)}`);
    }
  } else {
    throw new TypeError(`${name}: expected {data, shape} or a nested array, got ${x === null ? "null" : typeof x}`);
  }
  if (!ranks.includes(shape.length)) {
    throw new RangeError(`${name}: rank ${shape.length} (shape [${shape}]), expected ${what}`);
  }
  return { data, shape };
}

function floats(name, data) {
  if (data instanceof Float32Array) return data;
  const out = new Float32Array(data.length);
  for (let i = 0; i < data.length; i++) {
    const v = data[i];
    if (typeof v !== "number") {
      throw new TypeError(`${name}[${i}] (flat): ${typeof v}, expected a number`);
    }
    out[i] = v;
  }
  return out;
}

function bools(name, data) {
  if (data instanceof Uint8Array) return data;
  const out = new Uint8Array(data.length);
  for (let i = 0; i < data.length; i++) {
    if (typeof data[i] !== "boolean") {
      throw new TypeError(`${name}[${i}] (flat): ${typeof data[i]}; give booleans (true = hidden), ` +
        "e.g. attentionMask.map((m) => m === 0) for a tokenizer's 0/1 mask");
    }
    out[i] = data[i] ? 1 : 0;
  }
  return out;
}

function littleEndianBytes(f32) {
  if (LITTLE_ENDIAN) return new Uint8Array(f32.buffer, f32.byteOffset, f32.byteLength);
  const out = new Uint8Array(f32.length * 4);
  const view = new DataView(out.buffer);
  for (let i = 0; i < f32.length; i++) view.setFloat32(i * 4, f32[i], true);
  return out;
}

function encodeBase64(bytes) {
  if (typeof globalThis.Buffer === "function") {
    return globalThis.Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("base64");
  }
  let s = "";
  for (let i = 0; i < bytes.length; i += 0x8000) {
    s += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
  }
  return btoa(s);
}

function floatTensor(name, x, ranks, what) {
  const { data, shape } = shaped(name, x, ranks, what);
  return { shape, dtype: "float32", b64: encodeBase64(littleEndianBytes(floats(name, data))) };
}

function boolTensor(name, x, ranks, what) {
  const { data, shape } = shaped(name, x, ranks, what);
  return { shape, dtype: "bool", b64: encodeBase64(bools(name, data)) };
}

/** attnMask: booleans (true = hidden; a Uint8Array, 1 = hidden) or numbers
 * added to the scores (a Float32Array or numbers; -Infinity hides). */
function maskTensor(x) {
  const { data } = shaped("attnMask", x, [2, 3], "(L, S) or (B, L, S)");
  const first = Array.isArray(data) ? data[0] : undefined;
  if (data instanceof Uint8Array || typeof first === "boolean") {
    return boolTensor("attnMask", x, [2, 3], "(L, S) or (B, L, S)");
  }
  return floatTensor("attnMask", x, [2, 3], "(L, S) or (B, L, S)");
}

/** Session rows: (n, E), or one row (E,): a Float32Array or number[]. */
function rowsTensor(name, x) {
  if (x instanceof Float32Array || (Array.isArray(x) && !Array.isArray(x[0]))) {
    x = { data: x, shape: [x.length] };
  }
  const t = shaped(name, x, [1, 2], "rows (n, E) or one row (E,)");
  const shape = t.shape.length === 1 ? [1, t.shape[0]] : t.shape;
  return floatTensor(name, { data: t.data, shape }, [2], "");
}

// ------------------------------------------------------------ tensors out

function decodeBase64(text) {
  if (typeof globalThis.Buffer === "function") {
    const b = globalThis.Buffer.from(text, "base64");
    const out = new Uint8Array(b.length); // a buffer of its own, aligned for any view
    out.set(b);
    return out;
  }
  const s = atob(text.replace(/[\r\n]/g, "").replace(/-/g, "+").replace(/_/g, "/"));
  const out = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) out[i] = s.charCodeAt(i);
  return out;
}

function halfToFloat(h) {
  const e = (h >> 10) & 0x1f, m = h & 0x3ff, s = h & 0x8000 ? -1 : 1;
  if (e === 0) return s * m * 2 ** -24;
  if (e === 31) return m ? NaN : s * Infinity;
  return s * (1 + m / 1024) * 2 ** (e - 15);
}

const WIRE_SIZES = { float32: 4, float16: 2, bfloat16: 2, int32: 4, bool: 1 };

function readTensor(obj) {
  const dtype = obj.dtype ?? "float32";
  if (!(dtype in WIRE_SIZES)) {
    throw new AttndError(null, `the answer holds a tensor of dtype '${dtype}', which this client does not read`);
  }
  const bytes = decodeBase64(obj.b64);
  const n = product(obj.shape);
  if (bytes.length !== n * WIRE_SIZES[dtype]) {
    throw new AttndError(null, `the answer's ${dtype} tensor of shape [${obj.shape}] holds ${bytes.length} bytes`);
  }
  const view = new DataView(bytes.buffer);
  let data;
  if (dtype === "bool") {
    data = bytes;
  } else if (dtype === "float32" && LITTLE_ENDIAN) {
    data = new Float32Array(bytes.buffer, 0, n);
  } else if (dtype === "int32" && LITTLE_ENDIAN) {
    data = new Int32Array(bytes.buffer, 0, n);
  } else if (dtype === "int32") {
    data = new Int32Array(n);
    for (let i = 0; i < n; i++) data[i] = view.getInt32(i * 4, true);
  } else {
    data = new Float32Array(n);
    for (let i = 0; i < n; i++) {
      if (dtype === "float32") data[i] = view.getFloat32(i * 4, true);
      else if (dtype === "float16") data[i] = halfToFloat(view.getUint16(i * 2, true));
      else data[i] = bf16ToFloat(view.getUint16(i * 2, true)); // the high half of a float32
    }
  }
  return { data, shape: obj.shape.slice() };
}

const BF16_SCRATCH = new DataView(new ArrayBuffer(4));
function bf16ToFloat(bits) {
  BF16_SCRATCH.setUint32(0, bits << 16);
  return BF16_SCRATCH.getFloat32(0);
}

/** An answer's tensor object as {data, shape}; a dict of them (top-k) as a
 * dict; JSON numbers (an answer that ignored encoding) as a Float32Array. */
function decode(obj) {
  if (obj === undefined || obj === null) return null;
  if (Array.isArray(obj)) {
    const { flat, shape } = flatten("answer", obj);
    return { data: Float32Array.from(flat), shape };
  }
  if (typeof obj === "object" && typeof obj.b64 === "string" && Array.isArray(obj.shape)) {
    return readTensor(obj);
  }
  if (typeof obj === "object") {
    const out = {};
    for (const [k, v] of Object.entries(obj)) out[k] = decode(v);
    return out;
  }
  return obj;
}

// ------------------------------------------------------------ bodies

// Options every call takes; the rest of an options object is the body's.
const CALL_OPTIONS = ["signal", "timeoutMs", "traceparent"];
const ATTENTION_OPTIONS = ["query", "key", "value", "model", "causal", "keyPaddingMask", "attnMask",
  "attention", "attentionHeads", "attentionRows", "attentionTopK", "attentionDtype", "positions", "fields",
  ...CALL_OPTIONS];
const SESSION_OPTIONS = ["query", "model", "attention", "attentionHeads", "attentionRows", "attentionTopK",
  "attentionDtype", "id", "fields", ...CALL_OPTIONS];
const STEP_OPTIONS = ["attention", "attentionHeads", "attentionRows", "attentionTopK", "attentionDtype",
  "fields", ...CALL_OPTIONS];

function checkKeys(what, opts, known) {
  if (opts === null || typeof opts !== "object") {
    throw new TypeError(`${what}: expected an options object, got ${opts === null ? "null" : typeof opts}`);
  }
  for (const k of Object.keys(opts)) {
    if (!known.includes(k)) throw new TypeError(`${what}: unknown option '${k}' (known: ${known.join(", ")})`);
  }
}

/** Selection and the other fields shared by /v1/attention and sessions. */
function common(body, o) {
  if (o.model !== undefined && o.model !== null) body.model = String(o.model);
  if (o.attention !== undefined && o.attention !== null) {
    if (!ATTENTION_MODES.includes(o.attention)) {
      throw new RangeError(`attention: '${o.attention}' is not one of ${ATTENTION_MODES.join(", ")}`);
    }
    body.attention = o.attention;
  }
  const ints = (name, v, n) => {
    if (!Array.isArray(v) || !v.every(Number.isInteger) || (n !== undefined && v.length !== n)) {
      throw new TypeError(`${name}: expected ${n === undefined ? "a list of" : n} whole numbers, got ${JSON.stringify(v)}`);
    }
    return v.slice();
  };
  if (o.attentionHeads != null) body.attention_heads = ints("attentionHeads", o.attentionHeads);
  if (o.attentionRows != null) body.attention_rows = ints("attentionRows", o.attentionRows, 2);
  if (o.attentionTopK != null) {
    if (!Number.isInteger(o.attentionTopK)) throw new TypeError(`attentionTopK: ${o.attentionTopK} is not a whole number`);
    body.attention_top_k = o.attentionTopK;
  }
  if (o.attentionDtype != null) body.attention_dtype = String(o.attentionDtype);
  if (o.positions != null) body.positions = Array.isArray(o.positions) ? o.positions : Array.from(o.positions);
  for (const [k, v] of Object.entries(o.fields ?? {})) {
    if (k in body || k === "encoding") throw new TypeError(`fields.${k}: set by the client itself`);
    body[k] = v;
  }
  body.encoding = "base64";
  return body;
}

function attentionBody(o) {
  const body = { query: floatTensor("query", o.query, [2, 3], "rows (L, E) or a batch (B, L, E)") };
  if (o.key != null) body.key = floatTensor("key", o.key, [2, 3], "(S, kdim) or (B, S, kdim)");
  if (o.value != null) body.value = floatTensor("value", o.value, [2, 3], "(S, vdim) or (B, S, vdim)");
  if (o.causal != null) body.causal = Boolean(o.causal);
  if (o.keyPaddingMask != null) {
    body.key_padding_mask = boolTensor("keyPaddingMask", o.keyPaddingMask, [1, 2], "(S) or (B, S)");
  }
  if (o.attnMask != null) body.attn_mask = maskTensor(o.attnMask);
  return common(body, o);
}

// ------------------------------------------------------------ answers

function result(ans, res) {
  if (ans === null || typeof ans !== "object" || !("output" in ans)) {
    throw new AttndError(null, `the answer holds no output: ${JSON.stringify(ans).slice(0, 200)}`);
  }
  return {
    output: decode(ans.output),
    attention: decode(ans.attention),
    usage: ans.usage ?? {},
    model: ans.model ?? null,
    requestId: res.requestId,
    traceparent: res.traceparent,
  };
}

function parseJson(res) {
  try {
    return JSON.parse(res.text);
  } catch {
    throw new AttndError(res.status, `the answer is not JSON: ${res.text.slice(0, 200)}`, { requestId: res.requestId });
  }
}

/** Retry-After in seconds: a number of seconds or an HTTP date. */
function retryAfter(value) {
  if (value === null) return null;
  const s = Number(value);
  if (value.trim() !== "" && Number.isFinite(s)) return Math.max(0, s);
  const when = Date.parse(value);
  return Number.isNaN(when) ? null : Math.max(0, (when - Date.now()) / 1000);
}

function errorFrom(res) {
  let message = null;
  try {
    const ans = JSON.parse(res.text);
    if (ans && typeof ans.error === "string") message = ans.error;
  } catch {
    // not attnd's form (a proxy in between): what came, below
  }
  if (message === null) message = res.text.slice(0, 300).trim() || `HTTP ${res.status}`;
  return new AttndError(res.status, message, { retryAfter: res.retryAfter, requestId: res.requestId });
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, Math.min(ms, MAX_TIMER_MS));
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Why fetch got no answer, in words. Node's fetch rejects with "fetch
 * failed" and the socket's error as its cause: "connect ECONNREFUSED
 * 127.0.0.1:8080", or "other side closed" whose code (UND_ERR_SOCKET) says
 * little alone; "localhost" tried on two addresses holds one error per
 * address. A browser gives its own sentence ("Failed to fetch"). */
function noAnswerReason(e) {
  const c = e?.cause;
  const why = c?.message || c?.errors?.[0]?.message || e?.message || String(e);
  return c?.code && !why.includes(c.code) ? `${why} (${c.code})` : why;
}

function positiveMs(name, v) {
  if (typeof v !== "number" || !(v > 0) || !Number.isFinite(v)) {
    throw new RangeError(`${name}: ${v}; give a positive number of milliseconds`);
  }
  return v;
}

// ------------------------------------------------------------ the client

export class Client {
  /**
   * url: the daemon's base URL (or a load balancer's).
   * apiKey: sent as `Authorization: Bearer <key>`.
   * timeoutMs: each call's deadline, sent to attnd as Request-Timeout-Ms on
   *   the compute routes (it drops the work past it and answers 504), and
   *   the longest Retry-After worth waiting for. A call's own timeoutMs
   *   takes its place.
   * retries: how many times a 429 or 503 is sent again, after its
   *   Retry-After (1 s when it names none).
   */
  constructor({ url = "http://127.0.0.1:8080", apiKey = null, timeoutMs = 30000, retries = 3 } = {}) {
    if (typeof url !== "string" || !/^https?:\/\//.test(url)) {
      throw new TypeError(`url: '${url}' is not an http:// or https:// URL`);
    }
    if (!Number.isInteger(retries) || retries < 0) {
      throw new RangeError(`retries: ${retries}; give a whole number from 0`);
    }
    this.url = url.replace(/\/+$/, "");
    this.apiKey = apiKey;
    this.timeoutMs = positiveMs("timeoutMs", timeoutMs);
    this.retries = retries;
  }

  /** Multi-head attention by the daemon (POST /v1/attention). */
  async attention(opts) {
    checkKeys("attention", opts, ATTENTION_OPTIONS);
    const body = JSON.stringify(attentionBody(opts));
    const res = await this._send("POST", "/v1/attention", { ...opts, body, deadline: true });
    return result(parseJson(res), res);
  }

  /** The models the daemon serves (GET /v1/models). */
  async models(opts = {}) {
    checkKeys("models", opts, CALL_OPTIONS);
    const res = await this._send("GET", "/v1/models", opts);
    const ans = parseJson(res);
    if (!Array.isArray(ans.models)) throw new AttndError(null, "GET /v1/models answered no models list");
    return ans.models;
  }

  /** GET /health once, without retries: {status: "ok"} while it serves. */
  async health(opts = {}) {
    checkKeys("health", opts, CALL_OPTIONS);
    return parseJson(await this._send("GET", "/health", { ...opts, retry: false }));
  }

  /** Opens a KV-cache session (POST /v1/sessions), with query as its
   * prefix rows when given; opts.id chooses its id (X-Session-Id). */
  async session(opts = {}) {
    checkKeys("session", opts, SESSION_OPTIONS);
    let body = {};
    if (opts.query != null) {
      body.query = rowsTensor("query", opts.query);
      body = common(body, opts);
    } else {
      for (const k of ["attention", "attentionHeads", "attentionRows", "attentionTopK", "attentionDtype"]) {
        if (opts[k] != null) throw new TypeError(`session: ${k} needs query (the prefix rows)`);
      }
      body = common(body, opts);
      delete body.encoding; // an open without a prefix takes "model" alone
    }
    const res = await this._send("POST", "/v1/sessions", {
      ...opts, body: JSON.stringify(body), deadline: true, sessionId: opts.id,
    });
    return new Session(this, parseJson(res), res);
  }

  /** A session from the bytes of Session.state() (POST /v1/sessions, an
   * application/octet-stream body), on this daemon or any replica serving
   * the same model; opts.id keeps the session's id when it is free (else a new one:
   * session.id says which). */
  async restoreSession(bytes, opts = {}) {
    checkKeys("restoreSession", opts, ["id", ...CALL_OPTIONS]);
    if (!(bytes instanceof Uint8Array) && !(bytes instanceof ArrayBuffer)) {
      throw new TypeError("restoreSession: expected the state's bytes (a Uint8Array or an ArrayBuffer)");
    }
    const res = await this._send("POST", "/v1/sessions", {
      ...opts, body: bytes, contentType: "application/octet-stream", sessionId: opts.id,
    });
    return new Session(this, parseJson(res), res);
  }

  /** The same as a method of a Client made from opts' url, apiKey,
   * timeoutMs and retries: Client.restoreSession(bytes, {url, id}). */
  static async restoreSession(bytes, { url, apiKey, timeoutMs, retries, ...opts } = {}) {
    return new Client({ url, apiKey, timeoutMs, retries }).restoreSession(bytes, opts);
  }

  toString() {
    return `attnd.Client(${this.url})`;
  }

  // One call: sent again after a 429 or 503 while retries and time are
  // left. Resolves with the answer read whole (status < 400), or rejects
  // with an AttndError, or with the signal's reason when it aborts.
  async _send(method, path, o) {
    const timeoutMs = o.timeoutMs === undefined ? this.timeoutMs : positiveMs("timeoutMs", o.timeoutMs);
    const end = Date.now() + timeoutMs;
    const headers = { Accept: "application/json" };
    if (o.body !== undefined) headers["Content-Type"] = o.contentType ?? "application/json";
    if (this.apiKey) headers.Authorization = `Bearer ${this.apiKey}`;
    if (o.traceparent) headers.traceparent = o.traceparent;
    if (o.sessionId) headers["X-Session-Id"] = o.sessionId;
    for (let attempt = 0; ; attempt++) {
      const left = Math.max(1, Math.ceil(end - Date.now()));
      // whole digits: String() writes 1e21 and above as "1e+21", which the
      // header refuses; attnd keeps the smaller of it and its own anyway
      if (o.deadline) headers["Request-Timeout-Ms"] = String(Math.min(left, Number.MAX_SAFE_INTEGER));
      const res = await this._attempt(method, path, o, headers, left + GRACE_MS);
      if (res.status < 400) return res;
      const err = errorFrom(res);
      const retry = o.retry !== false && RETRY_STATUSES.has(res.status) && attempt < this.retries;
      const wait = (err.retryAfter ?? DEFAULT_RETRY_AFTER_S) * 1000;
      if (!retry || wait > end - Date.now()) throw err;
      await sleep(wait, o.signal);
    }
  }

  async _attempt(method, path, o, headers, ms) {
    const url = this.url + path;
    const signal = o.signal;
    if (signal?.aborted) throw signal.reason;
    const ctl = new AbortController();
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      ctl.abort();
    }, Math.min(ms, MAX_TIMER_MS));
    const onAbort = () => ctl.abort(signal.reason);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const r = await fetch(url, { method, headers, body: o.body, signal: ctl.signal });
      const res = {
        status: r.status,
        requestId: r.headers.get("x-request-id"),
        traceparent: r.headers.get("traceparent"),
        retryAfter: retryAfter(r.headers.get("retry-after")),
      };
      if (o.binary && r.status < 400) res.bytes = new Uint8Array(await r.arrayBuffer());
      else res.text = await r.text();
      return res;
    } catch (e) {
      if (signal?.aborted) throw signal.reason;
      if (timedOut) throw new AttndError(null, `${method} ${url}: no answer within ${ms} ms`, { cause: e });
      throw new AttndError(null, `${method} ${url}: ${noAnswerReason(e)}`, { cause: e });
    } finally {
      clearTimeout(timer);
      signal?.removeEventListener("abort", onAbort);
    }
  }
}

/** A KV-cache session (docs/api.md, "KV-cache sessions"): each step sends
 * only its new rows, which attend causally over every row sent before.
 * Every request of it carries its id as X-Session-Id, which a load
 * balancer can hash on to keep the session's replica. */
export class Session {
  constructor(client, ans, res) {
    if (typeof ans.session !== "string") {
      throw new AttndError(null, `the session's open answered no session id: ${Object.keys(ans)}`);
    }
    this.client = client;
    this.id = ans.session;
    this.model = ans.model ?? null;
    this.cachedTokens = ans.cached_tokens ?? 0;
    this.prefix = "output" in ans ? result(ans, res) : null;
    this.closed = false;
  }

  /** A decoding step (POST /v1/sessions/{id}/attention): rows (n, E) or one
   * row (E,) attend over the cache and join it. A failed step leaves the
   * session as it was. */
  async step(rows, opts = {}) {
    checkKeys("step", opts, STEP_OPTIONS);
    this._open();
    const body = JSON.stringify(common({ query: rowsTensor("rows", rows) }, opts));
    const res = await this.client._send("POST", `/v1/sessions/${this.id}/attention`, {
      ...opts, body, deadline: true, sessionId: this.id,
    });
    const ans = parseJson(res);
    this.cachedTokens = ans.cached_tokens ?? this.cachedTokens;
    return { ...result(ans, res), cachedTokens: this.cachedTokens };
  }

  /** The session's state (GET /v1/sessions/{id}/state): a safetensors
   * file's bytes, for Client.restoreSession on any replica. */
  async state(opts = {}) {
    checkKeys("state", opts, CALL_OPTIONS);
    this._open();
    const res = await this.client._send("GET", `/v1/sessions/${this.id}/state`, {
      ...opts, binary: true, sessionId: this.id,
    });
    return res.bytes;
  }

  /** Ends the session (DELETE /v1/sessions/{id}). One the daemon no longer
   * holds is closed already: no error. Closing twice does nothing. A close
   * that failed (aborted, unanswered, refused) leaves the session open, as
   * the daemon still holds it: close() again ends it. */
  async close(opts = {}) {
    checkKeys("close", opts, CALL_OPTIONS);
    if (this.closed) return;
    try {
      await this.client._send("DELETE", `/v1/sessions/${this.id}`, { ...opts, sessionId: this.id });
    } catch (e) {
      if (!(e instanceof AttndError && e.status === 404)) throw e;
    }
    this.closed = true;
  }

  _open() {
    if (this.closed) throw new AttndError(null, `session ${this.id} is closed; open a new one`);
  }
}
