/* app.js - the attention viewer's script (GET /ui; docs/ui.md).
 *
 * Plain JavaScript, no framework and no build step. Every request goes to
 * the daemon that served the page (paths relative to /ui), with the API key
 * from sessionStorage when there is one. What it does:
 *   - lists the models (GET /v1/models) and makes an input: random rows
 *     from a length and a seed (randomRows below says how, exactly), or a
 *     pasted request body;
 *   - asks POST /v1/attention for the attention ("heads" or "mean", in
 *     base64) and draws every head and their mean as heatmaps, one of them
 *     large with labelled axes and the weight under the cursor; past
 *     MAX_CELLS rows or keys a heatmap is max-pooled, and the page says so;
 *   - steps a KV-cache session (POST /v1/sessions, then
 *     /v1/sessions/{id}/attention) one row at a time;
 *   - shows the daemon's load from /metrics every 2 s while visible.
 * Hooks for tests and links: URL parameters (readParams),
 * document.body.dataset.state ("done" or "error" once a run is drawn),
 * window.attnd.lastRequest / lastResponse, data-head on each heatmap.
 */
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const KEY_STORE = "attnd.apiKey";
  const MAX_CELLS = 512; /* rows or keys a heatmap draws; past it, max-pooling */
  const LOAD_EVERY_MS = 2000;
  const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

  const st = {
    models: [], /* GET /v1/models' models */
    limits: {}, /* and its limits */
    view: null, /* what is drawn: see makeView */
    large: 0, /* index in view.mats of the one drawn large */
    focus: null, /* {i, j}: the cell the readout is about */
    session: null, /* {id, model, mode, heads, rows, n}: see sessionOpen */
    pendingRun: false, /* run=1 waits for the models (and the key) */
  };
  const hooks = (window.attnd = { lastRequest: null, lastResponse: null });

  /* ---- state, messages ---- */

  function setState(s, msg) {
    document.body.dataset.state = s;
    if (msg !== undefined) $("message").textContent = msg;
  }

  function status(text) {
    $("status").textContent = text;
  }

  /* An answer that is not 2xx: its status and the daemon's sentence. */
  class ApiError extends Error {
    constructor(status, message) {
      super(message);
      this.status = status;
    }
  }

  /* ---- random rows: mulberry32 and Box-Muller ---- */

  /* mulberry32, a 32-bit generator (its definition: state += 0x6D2B79F5,
   * then three xorshift-multiply rounds), one uniform number in [0, 1) per
   * call, its state starting at the seed. */
  function mulberry32(seed) {
    let a = seed >>> 0;
    return function () {
      a = (a + 0x6d2b79f5) >>> 0;
      let t = a;
      t = Math.imul(t ^ (t >>> 15), t | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    };
  }

  /* Standard normal numbers from a seed, row after row of width numbers:
   * draws are taken in pairs (u1, u2), r = sqrt(-2 ln(1 - u1)), and the pair
   * gives r cos(2 pi u2) then r sin(2 pi u2), each rounded to float32. Rows
   * are read in order, so row i is the same however many rows are asked
   * (a session's steps continue the run's rows). */
  function randomRows(seed, width) {
    const next = mulberry32(seed);
    let data = new Float32Array(0);
    let filled = 0;
    function grow(n) {
      const cap = Math.max(n + (n & 1), 2 * data.length);
      const d = new Float32Array(cap);
      d.set(data.subarray(0, filled));
      for (let k = filled; k < cap; k += 2) {
        const u1 = next(), u2 = next();
        const r = Math.sqrt(-2 * Math.log(1 - u1));
        d[k] = r * Math.cos(2 * Math.PI * u2);
        d[k + 1] = r * Math.sin(2 * Math.PI * u2);
      }
      data = d;
      filled = cap;
    }
    /* rows [from, to) as one row-major (to - from, width) array */
    return function rows(from, to) {
      if (to * width > filled) grow(to * width);
      return data.slice(from * width, to * width);
    };
  }

  /* ---- tensors ---- */

  function b64FromF32(a) {
    const u8 = new Uint8Array(a.buffer, a.byteOffset, a.byteLength);
    if (!LITTLE_ENDIAN) swap4(u8);
    let s = "";
    for (let i = 0; i < u8.length; i += 0x8000)
      s += String.fromCharCode.apply(null, u8.subarray(i, i + 0x8000));
    return btoa(s);
  }

  function swap4(u8) {
    for (let i = 0; i + 3 < u8.length; i += 4) {
      let t = u8[i]; u8[i] = u8[i + 3]; u8[i + 3] = t;
      t = u8[i + 1]; u8[i + 1] = u8[i + 2]; u8[i + 2] = t;
    }
  }

  function f32FromB64(b64) {
    const s = atob(b64);
    const u8 = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) u8[i] = s.charCodeAt(i);
    if (!LITTLE_ENDIAN) swap4(u8);
    return new Float32Array(u8.buffer, 0, u8.length >> 2);
  }

  function tensorObject(shape, data) {
    return { shape: shape, dtype: "float32", b64: b64FromF32(data) };
  }

  function shapeOf(x) {
    if (x && !Array.isArray(x) && Array.isArray(x.shape)) return x.shape.slice();
    const shape = [];
    for (let v = x; Array.isArray(v); v = v[0]) shape.push(v.length);
    return shape;
  }

  /* A tensor of an answer, base64 object or nested arrays: {shape, data}. */
  function tensorOf(x, what) {
    const shape = shapeOf(x);
    const n = shape.reduce((a, b) => a * b, 1);
    let data;
    if (x && !Array.isArray(x)) {
      if (typeof x.b64 !== "string") throw new Error(what + ": neither arrays nor a base64 tensor");
      data = f32FromB64(x.b64);
    } else {
      data = new Float32Array(n);
      let k = 0;
      (function walk(v, d) {
        if (d === shape.length) data[k++] = v;
        else for (const e of v) walk(e, d + 1);
      })(x, 0);
    }
    if (data.length !== n) throw new Error(what + ": " + data.length + " numbers for shape [" + shape + "]");
    return { shape: shape, data: data };
  }

  /* ---- the API ---- */

  async function api(method, path, body) {
    const headers = {};
    const key = sessionStorage.getItem(KEY_STORE);
    if (key) headers.Authorization = "Bearer " + key;
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, {
      method: method, headers: headers, cache: "no-store",
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let data = null;
    try {
      data = text ? JSON.parse(text) : null;
    } catch (e) {
      if (res.ok) throw new Error(method + " " + path + ": the answer is not JSON");
    }
    if (!res.ok) throw new ApiError(res.status, data && data.error ? data.error : text.slice(0, 200));
    return data;
  }

  /* What a failed call means to a person: the 401 and 413 said plainly. */
  function explain(err) {
    if (!(err instanceof ApiError)) return err.message || String(err);
    if (err.status === 401) {
      showKeyPanel(sessionStorage.getItem(KEY_STORE)
        ? "401 Unauthorized: the daemon refused this key. Check it and try again."
        : "401 Unauthorized: this daemon needs an API key. Enter it above.");
      return "401 Unauthorized: " + (sessionStorage.getItem(KEY_STORE)
        ? "the API key was refused (" + err.message + ")."
        : "this daemon needs an API key; enter it in the API key field above.");
    }
    if (err.status === 413 && /attention/.test(err.message)) {
      const max = st.limits.max_attention_floats;
      return "413 Too large: the full attention matrix is over the daemon's limit on returned " +
        "attention (limits.max_attention_floats" + (max ? " = " + max : "") + "): " + err.message +
        ". Ask for the mean, or fewer rows.";
    }
    return err.status + ": " + err.message;
  }

  function fail(err) {
    const msg = explain(err);
    setState("error", msg);
    status("Error.");
  }

  /* ---- the key ---- */

  function showKeyPanel(msg) {
    $("key-panel").hidden = false;
    $("key-msg").textContent = msg;
    $("key").focus();
  }

  async function useKey(ev) {
    ev.preventDefault();
    const k = $("key").value.trim();
    if (k) sessionStorage.setItem(KEY_STORE, k);
    else sessionStorage.removeItem(KEY_STORE);
    setState("loading", ""); /* the last run's error no longer stands */
    $("key-msg").textContent = "Checking the key…";
    if (await loadModels()) {
      $("key-msg").textContent = "";
      $("key-panel").hidden = true;
      if (st.pendingRun) run();
    }
  }

  /* ---- models ---- */

  async function loadModels() {
    status("Loading the models…");
    let res;
    try {
      res = await api("GET", "v1/models");
    } catch (err) {
      fail(err);
      return false;
    }
    st.models = res.models || [];
    st.limits = res.limits || {};
    const sel = $("model");
    const want = sel.value || readParams().model;
    sel.replaceChildren();
    for (const m of st.models) {
      const o = document.createElement("option");
      o.value = m.name;
      o.textContent = m.name + " (E " + m.embed_dim + ", " + m.num_heads + " heads)";
      sel.append(o);
    }
    if (want && st.models.some((m) => m.name === want)) sel.value = want;
    else if (want) {
      setState("error", "No model named '" + want + "' on this daemon.");
      return false;
    }
    modelChanged(readParams().causal === undefined);
    setState("ready", "");
    status(st.models.length + " model" + (st.models.length === 1 ? "" : "s") + " served.");
    return true;
  }

  function currentModel() {
    return st.models.find((m) => m.name === $("model").value) || st.models[0];
  }

  function modelChanged(resetCausal) {
    const m = currentModel();
    if (!m) return;
    if (resetCausal) $("causal").checked = !!m.causal;
    const kinds = [m.embed_dim + " wide", m.num_heads + " heads"];
    if (m.num_kv_heads && m.num_kv_heads !== m.num_heads) kinds.push(m.num_kv_heads + " key/value heads");
    if (m.rope) kinds.push("rotary positions");
    if (m.kdim !== m.embed_dim || m.vdim !== m.embed_dim) kinds.push("keys " + m.kdim + ", values " + m.vdim + " wide");
    kinds.push(m.causal ? "causal by default" : "not causal by default");
    $("model-info").textContent = kinds.join(" · ");
    const sessions = m.kdim === m.embed_dim && m.vdim === m.embed_dim;
    $("sess-open").disabled = !sessions;
    if (!sessions) $("sess-info").textContent = "This model cannot hold sessions (its keys are not its queries).";
  }

  /* ---- controls and URL parameters ---- */

  /* /ui?model=NAME&len=L&seed=S&causal=0|1&attention=heads|mean&run=1, and
   * hide=n (keys hidden at the end), labels=a,b,c. */
  function readParams() {
    const q = new URLSearchParams(location.search);
    const p = {};
    for (const k of ["model", "len", "seed", "attention", "hide", "labels", "scale"]) if (q.has(k)) p[k] = q.get(k);
    if (q.has("causal")) p.causal = q.get("causal") === "1" || q.get("causal") === "true";
    p.run = q.get("run") === "1" || q.get("run") === "true";
    return p;
  }

  function applyParams(p) {
    if (p.len) $("len").value = p.len;
    if (p.seed) $("seed").value = p.seed;
    if (p.attention === "heads" || p.attention === "mean") $("attention").value = p.attention;
    if (p.hide) $("hide").value = p.hide;
    if (p.labels) $("labels").value = p.labels;
    if (p.scale === "each" || p.scale === "shared") $("scale").value = p.scale;
    if (p.causal !== undefined) $("causal").checked = p.causal;
  }

  function linkParams() {
    const q = new URLSearchParams();
    q.set("model", $("model").value);
    q.set("len", $("len").value);
    q.set("seed", $("seed").value);
    q.set("causal", $("causal").checked ? "1" : "0");
    q.set("attention", $("attention").value);
    if (Number($("hide").value) > 0) q.set("hide", $("hide").value);
    if ($("labels").value.trim()) q.set("labels", $("labels").value.trim());
    if ($("scale").value !== "shared") q.set("scale", $("scale").value);
    q.set("run", "1");
    return "ui?" + q.toString();
  }

  function sourceIsBody() {
    return $("src-body").checked;
  }

  function sourceChanged() {
    const body = sourceIsBody();
    $("body-opts").hidden = !body;
    $("random-opts").hidden = body;
    $("causal").disabled = body;
    $("hide").disabled = body;
    $("mask-hint").textContent = body
      ? "With a pasted body, causal and masks are what the body says."
      : "The last n keys are hidden with a key_padding_mask.";
  }

  function intField(id, lo, hi) {
    const v = Number($(id).value);
    if (!Number.isInteger(v) || v < lo || v > hi)
      throw new Error($(id).labels[0].textContent + ": " + $(id).value + " is not a whole number from " + lo + " to " + hi);
    return v;
  }

  function tokenLabels() {
    return $("labels").value.split(/[\s,]+/).filter((s) => s.length > 0);
  }

  /* ---- request bodies ---- */

  /* The one place request bodies are made. Every call that asks for
   * attention (a run, a session's open, each step) goes through here, and
   * what it asks of the matrix is set here alone: the attention mode and
   * base64 answers (large matrices parse fast), unless a pasted body says
   * otherwise. fit = {H, L, S} (a run of random rows) lets a matrix over
   * limits.max_attention_floats be asked for in part: the last rows that
   * fit (attention_rows; in a causal run they see every key), so a long
   * sequence draws instead of a 413. */
  function requestBody(fields, fit) {
    const body = Object.assign({}, fields);
    if (body.attention === undefined || body.attention === "none") body.attention = $("attention").value;
    if (body.encoding === undefined) body.encoding = "base64";
    const max = st.limits.max_attention_floats;
    if (fit && max && body.attention_rows === undefined) {
      const perRow = (body.attention === "heads" ? fit.H : 1) * fit.S;
      const rows = Math.floor(max / perRow);
      if (rows >= 1 && rows < fit.L) body.attention_rows = [fit.L - rows, fit.L];
    }
    return body;
  }

  /* The random input of the controls as request fields: rows [0, L) of the
   * seed's stream; a model whose keys or values are not as wide as its
   * queries gets keys from seed + 1 and values from seed + 2. */
  function randomFields(m, L, seed) {
    const f = { model: m.name, query: tensorObject([L, m.embed_dim], randomRows(seed, m.embed_dim)(0, L)) };
    if (!m.rope && (m.kdim !== m.embed_dim || m.vdim !== m.embed_dim)) {
      f.key = tensorObject([L, m.kdim], randomRows((seed + 1) >>> 0, m.kdim)(0, L));
      f.value = tensorObject([L, m.vdim], randomRows((seed + 2) >>> 0, m.vdim)(0, L));
    }
    return f;
  }

  function runBody() {
    const m = currentModel();
    if (!m) throw new Error("No model to run.");
    if (sourceIsBody()) {
      let b;
      try {
        b = JSON.parse($("body").value);
      } catch (e) {
        throw new Error("The request body is not JSON: " + e.message);
      }
      if (!b || typeof b !== "object" || Array.isArray(b)) throw new Error("The request body must be a JSON object.");
      if (b.model === undefined) b.model = m.name;
      return requestBody(b);
    }
    const L = intField("len", 1, 16384);
    const f = randomFields(m, L, intField("seed", 0, 4294967295));
    f.causal = $("causal").checked;
    const hide = intField("hide", 0, L);
    if (hide > 0) f.key_padding_mask = Array.from({ length: L }, (_, j) => j >= L - hide);
    return requestBody(f, { H: m.num_heads, L: L, S: L });
  }

  /* ---- a run ---- */

  async function run(ev) {
    if (ev) ev.preventDefault();
    st.pendingRun = false;
    let req;
    try {
      req = runBody();
    } catch (err) {
      return fail(err);
    }
    hooks.lastRequest = req;
    setState("running", "");
    status("Computing…");
    $("run").disabled = true;
    try {
      const res = await api("POST", "v1/attention", req);
      hooks.lastResponse = res;
      st.view = viewOfAnswer(req, res, 0);
      draw();
      if (!sourceIsBody()) {
        $("permalink").href = linkParams();
        history.replaceState(null, "", linkParams());
      }
      status("Drawn: " + describe(res));
      setState("done", "");
    } catch (err) {
      fail(err);
    } finally {
      $("run").disabled = false;
    }
  }

  function describe(res) {
    const u = res.usage || {};
    return (u.query_tokens || "?") + " query × " + (u.key_tokens || "?") + " key tokens, model " +
      res.model + (u.compute_us !== undefined ? ", computed in " + (u.compute_us / 1000).toFixed(2) + " ms" : "");
  }

  /* ---- views: what is drawn ---- */

  /* A matrix: rows × cols float32, row-major; NaN marks a cell with no
   * weight (a session's rows before their keys exist). */
  function matrix(data, rows, cols) {
    return { data: data, rows: rows, cols: cols };
  }

  /* Mean over heads of equal shape, in double, rounded to float32. */
  function meanOf(mats) {
    const out = new Float32Array(mats[0].data.length);
    for (let k = 0; k < out.length; k++) {
      let s = 0;
      for (const m of mats) s += m.data[k];
      out[k] = s / mats.length;
    }
    return matrix(out, mats[0].rows, mats[0].cols);
  }

  /* Max-pooling to at most MAX_CELLS rows and columns: each drawn cell is
   * the largest weight of its fr × fc block. */
  function pool(m) {
    const fr = Math.ceil(m.rows / MAX_CELLS), fc = Math.ceil(m.cols / MAX_CELLS);
    if (fr === 1 && fc === 1) return Object.assign({ fr: 1, fc: 1 }, m);
    const R = Math.ceil(m.rows / fr), C = Math.ceil(m.cols / fc);
    const out = new Float32Array(R * C).fill(NaN);
    for (let i = 0; i < m.rows; i++) {
      const o = ((i / fr) | 0) * C, r = i * m.cols;
      for (let j = 0; j < m.cols; j++) {
        const v = m.data[r + j], k = o + ((j / fc) | 0);
        if (v === v && !(out[k] >= v)) out[k] = v;
      }
    }
    return { data: out, rows: R, cols: C, fr: fr, fc: fc };
  }

  /* The view of heads (each a matrix) and their mean: the mats to draw,
   * their pooled forms and the color scale shared by all. newRow >= 0
   * marks a session's latest row. */
  function makeView(heads, mean, newRow) {
    const mats = heads.map((m, h) => ({ key: h, label: "head " + h, m: m }));
    mats.push({ key: "mean", label: heads.length ? "mean over heads" : "mean (from the daemon)", m: mean });
    let lo = Infinity, hi = -Infinity;
    for (const it of mats) {
      it.d = pool(it.m);
      it.lo = Infinity;
      it.hi = -Infinity;
      for (const v of it.d.data) if (v === v) { if (v < it.lo) it.lo = v; if (v > it.hi) it.hi = v; }
      if (it.lo > it.hi) it.lo = it.hi = 0;
      lo = Math.min(lo, it.lo);
      hi = Math.max(hi, it.hi);
    }
    return { mats: mats, lo: lo, hi: hi, rows: mean.rows, cols: mean.cols, newRow: newRow, labels: tokenLabels(), row0: 0, of: 0 };
  }

  /* An answer of /v1/attention as a view of sequence b. */
  function viewOfAnswer(req, res, b) {
    if (!res.attention) throw new Error("The answer holds no attention (the body asked for \"" + req.attention + "\").");
    const t = tensorOf(res.attention, "attention");
    const batched = shapeOf(res.output).length === 3;
    const heads = req.attention === "heads";
    const shape = t.shape.slice(batched ? 1 : 0);
    const B = batched ? t.shape[0] : 1;
    seqSelector(B, b);
    const H = heads ? shape[0] : 1, L = shape[heads ? 1 : 0], S = shape[heads ? 2 : 1];
    const base = b * H * L * S;
    const mats = [];
    for (let h = 0; h < H; h++) mats.push(matrix(t.data.subarray(base + h * L * S, base + (h + 1) * L * S), L, S));
    const v = heads ? makeView(mats, meanOf(mats), -1) : makeView([], mats[0], -1);
    if (req.attention_rows) {
      v.row0 = req.attention_rows[0];
      v.of = shapeOf(req.query).slice(-2)[0];
    }
    return v;
  }

  function seqSelector(B, b) {
    $("seq-line").hidden = B < 2;
    const sel = $("seq");
    if (sel.options.length !== B) {
      sel.replaceChildren();
      for (let i = 0; i < B; i++) {
        const o = document.createElement("option");
        o.value = String(i);
        o.textContent = String(i + 1) + " of " + B;
        sel.append(o);
      }
    }
    sel.value = String(b);
  }

  /* ---- drawing ---- */

  /* The color scale, light for small weights and dark for large: 256 RGB
   * entries interpolated between five stops chosen for this page. */
  const LUT = (function () {
    const stops = [[250, 250, 245], [250, 215, 130], [235, 130, 60], [185, 45, 75], [60, 15, 80]];
    const lut = new Uint8ClampedArray(256 * 3);
    for (let i = 0; i < 256; i++) {
      const x = (i / 255) * (stops.length - 1), k = Math.min(stops.length - 2, Math.floor(x)), f = x - k;
      for (let c = 0; c < 3; c++) lut[i * 3 + c] = Math.round(stops[k][c] * (1 - f) + stops[k + 1][c] * f);
    }
    return lut;
  })();

  /* Paints matrix d one pixel per cell on canvas (which CSS scales). */
  function paint(canvas, d, lo, hi) {
    canvas.width = d.cols;
    canvas.height = d.rows;
    const ctx = canvas.getContext("2d");
    const img = ctx.createImageData(d.cols, d.rows);
    const px = img.data, span = hi > lo ? 255 / (hi - lo) : 0;
    for (let k = 0; k < d.data.length; k++) {
      const v = d.data[k], o = k * 4;
      if (v !== v) continue; /* transparent: no weight */
      const c = Math.max(0, Math.min(255, Math.round((v - lo) * span))) * 3;
      px[o] = LUT[c];
      px[o + 1] = LUT[c + 1];
      px[o + 2] = LUT[c + 2];
      px[o + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
  }

  /* A weight as the page prints it: 6 significant digits, no trailing zeros. */
  function fmt(v) {
    return v === v ? String(Number(v.toPrecision(6))) : "–";
  }

  function draw() {
    const v = st.view;
    const pooled = v.mats.some((it) => it.d.fr > 1 || it.d.fc > 1);
    const d0 = v.mats[0].d, part = v.of > 0;
    const notes = [];
    if (part)
      notes.push("Rows " + v.row0 + "–" + (v.row0 + v.rows - 1) + " of " + v.of + ": all " + v.of +
        " rows are over the daemon's limit on returned attention (limits.max_attention_floats = " +
        st.limits.max_attention_floats + "), so only the last rows that fit were asked for (attention_rows).");
    if (pooled)
      notes.push("Down-sampled: the " + v.rows + " × " + v.cols + " matrices are drawn as " + d0.rows + " × " + d0.cols +
        " by max-pooling (each cell is the largest weight of a block of " + d0.fr + " rows × " + d0.fc +
        " keys), as more than " + MAX_CELLS + " rows or keys do not fit a screen.");
    $("note").hidden = notes.length === 0;
    $("note").textContent = notes.join(" ");
    const grid = $("grid");
    grid.replaceChildren();
    v.mats.forEach((it, idx) => grid.append(thumb(it, idx)));
    if (st.large >= v.mats.length) st.large = 0;
    showLarge(st.large);
  }

  function thumb(it, idx) {
    const fig = document.createElement("figure");
    const btn = document.createElement("button");
    btn.type = "button";
    btn.className = "thumb";
    btn.setAttribute("aria-pressed", "false");
    btn.setAttribute("aria-label", "show " + it.label + " large");
    const c = document.createElement("canvas");
    c.dataset.head = String(it.key);
    c.setAttribute("role", "img");
    c.setAttribute("aria-label", it.label + ": " + it.m.rows + " query rows by " + it.m.cols + " keys");
    const sc = scaleOf(it);
    paint(c, it.d, sc[0], sc[1]);
    it.canvas = c;
    btn.append(c);
    btn.addEventListener("click", () => showLarge(idx));
    const cap = document.createElement("figcaption");
    cap.textContent = it.label;
    fig.append(btn, cap);
    return fig;
  }

  /* The color scale of a heatmap: [lo, hi], shared by all or its own. */
  function scaleOf(it) {
    return $("scale").value === "each" ? [it.lo, it.hi] : [st.view.lo, st.view.hi];
  }

  function legend(lo, hi) {
    const c = $("legend-bar"), ctx = c.getContext("2d");
    const img = ctx.createImageData(256, 1);
    for (let i = 0; i < 256; i++) {
      img.data[i * 4] = LUT[i * 3];
      img.data[i * 4 + 1] = LUT[i * 3 + 1];
      img.data[i * 4 + 2] = LUT[i * 3 + 2];
      img.data[i * 4 + 3] = 255;
    }
    ctx.putImageData(img, 0, 0);
    $("legend-min").textContent = fmt(lo);
    $("legend-max").textContent = fmt(hi);
  }

  /* ---- the large view: axes, labels, the weight under the cursor ---- */

  const MARGIN = { left: 84, top: 12, right: 12, bottom: 84 };

  /* The large canvas's plot area in CSS pixels and its cell size. */
  function geometry() {
    const c = $("large"), it = st.view.mats[st.large], d = it.d;
    const W = parseFloat(c.style.width), H = parseFloat(c.style.height);
    const w = W - MARGIN.left - MARGIN.right, h = H - MARGIN.top - MARGIN.bottom;
    return { x: MARGIN.left, y: MARGIN.top, w: w, h: h, cw: w / d.cols, ch: h / d.rows, d: d };
  }

  function showLarge(idx) {
    st.large = idx;
    st.focus = null;
    const it = st.view.mats[idx];
    document.querySelectorAll("button.thumb").forEach((b, k) => b.setAttribute("aria-pressed", String(k === idx)));
    $("large-title").textContent = it.label + ": " + it.m.rows + " query rows × " + it.m.cols + " keys" +
      (st.view.newRow >= 0 ? " (the newest row marked ▶)" : "");
    const c = $("large");
    const size = Math.max(320, Math.min(680, c.parentElement.clientWidth || 680));
    c.style.width = size + "px";
    c.style.height = size + "px";
    const dpr = window.devicePixelRatio || 1;
    c.width = Math.round(size * dpr);
    c.height = Math.round(size * dpr);
    c.dataset.largeHead = String(it.key);
    legend(scaleOf(it)[0], scaleOf(it)[1]);
    drawLarge();
    $("readout").textContent = "Point at a cell (or focus the picture and use the arrow keys) to read its weight.";
  }

  /* The label of row or key index i of the drawn grid (a block when pooled);
   * off: the index of its first row or key in the request. */
  function axisLabel(i, f, n, off) {
    const lab = st.view.labels;
    const a = i * f + (off || 0), b = Math.min(n + (off || 0), a + f) - 1;
    const one = (k) => (lab[k] !== undefined ? lab[k] : String(k));
    return a === b ? one(a) : a + "–" + b;
  }

  function drawLarge() {
    const c = $("large"), g = geometry(), d = g.d, it = st.view.mats[st.large];
    const ctx = c.getContext("2d"), dpr = c.width / parseFloat(c.style.width);
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, c.width, c.height);
    ctx.imageSmoothingEnabled = false;
    ctx.fillStyle = "#e9e6ee";
    ctx.fillRect(g.x, g.y, g.w, g.h);
    ctx.drawImage(it.canvas, g.x, g.y, g.w, g.h);
    ctx.fillStyle = "#1d1b22";
    ctx.font = "11px system-ui, sans-serif";
    const rstep = Math.ceil(13 / g.ch), cstep = Math.ceil(13 / g.cw);
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i < d.rows; i += rstep)
      ctx.fillText(clip(axisLabel(i, d.fr, it.m.rows, st.view.row0)), g.x - 4, g.y + (i + 0.5) * g.ch);
    for (let j = 0; j < d.cols; j += cstep) {
      ctx.save();
      ctx.translate(g.x + (j + 0.5) * g.cw, g.y + g.h + 4);
      ctx.rotate(-Math.PI / 2);
      ctx.fillText(clip(axisLabel(j, d.fc, it.m.cols)), 0, 0);
      ctx.restore();
    }
    ctx.font = "600 12px system-ui, sans-serif";
    ctx.textAlign = "center";
    ctx.fillText("keys →", g.x + g.w / 2, g.y + g.h + MARGIN.bottom - 8);
    ctx.save();
    ctx.translate(12, g.y + g.h / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText("query rows →", 0, 0);
    ctx.restore();
    marks(ctx, g);
  }

  function clip(s) {
    return s.length > 11 ? s.slice(0, 10) + "…" : s;
  }

  /* The newest session row (▶) and the focused cell's outline. */
  function marks(ctx, g) {
    const nr = st.view.newRow;
    if (nr >= 0) {
      const i = Math.floor(nr / g.d.fr);
      ctx.fillStyle = "#5a2a82";
      ctx.textAlign = "left";
      ctx.fillText("▶", 18, g.y + (i + 0.5) * g.ch);
      ctx.strokeStyle = "#5a2a82";
      ctx.lineWidth = 1.5;
      ctx.strokeRect(g.x, g.y + i * g.ch, g.w, g.ch);
    }
    if (st.focus) {
      ctx.strokeStyle = "#0b6bcb";
      ctx.lineWidth = 2;
      ctx.strokeRect(g.x + st.focus.j * g.cw, g.y + st.focus.i * g.ch, g.cw, g.ch);
    }
  }

  /* The cell under CSS pixel (x, y) of the large canvas, or null. */
  function cellAt(x, y) {
    const g = geometry();
    const j = Math.floor((x - g.x) / g.cw), i = Math.floor((y - g.y) / g.ch);
    if (i < 0 || j < 0 || i >= g.d.rows || j >= g.d.cols) return null;
    return { i: i, j: j };
  }

  /* Shows the weight of drawn cell (i, j) of the large view. */
  function readCell(i, j) {
    const it = st.view.mats[st.large], d = it.d;
    const v = d.data[i * d.cols + j];
    const pooled = d.fr > 1 || d.fc > 1;
    const r0 = i * d.fr + st.view.row0, c0 = j * d.fc;
    const lab = st.view.labels;
    const name = (k) => (lab[k] !== undefined ? " “" + lab[k] + "”" : "");
    const where = pooled
      ? "query rows " + axisLabel(i, d.fr, it.m.rows, st.view.row0) + " × keys " + axisLabel(j, d.fc, it.m.cols) + " (largest of the block)"
      : "query row " + r0 + name(r0) + " × key " + c0 + name(c0);
    const out = $("readout");
    out.textContent = it.label + ", " + where + ": " + (v === v ? fmt(v) : "no weight (not computed yet)");
    out.dataset.head = String(it.key);
    out.dataset.row = String(i);
    out.dataset.col = String(j);
    out.dataset.value = fmt(v);
    st.focus = { i: i, j: j };
    drawLarge();
  }

  function onPointer(ev) {
    if (!st.view) return;
    const c = $("large"), r = c.getBoundingClientRect();
    const sx = parseFloat(c.style.width) / r.width, sy = parseFloat(c.style.height) / r.height;
    const cell = cellAt((ev.clientX - r.left) * sx, (ev.clientY - r.top) * sy);
    if (cell) readCell(cell.i, cell.j);
  }

  function onKey(ev) {
    if (!st.view) return;
    const d = st.view.mats[st.large].d, f = st.focus || { i: 0, j: 0 };
    const moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1] };
    let i = f.i, j = f.j;
    if (moves[ev.key]) {
      if (st.focus) {
        i = Math.max(0, Math.min(d.rows - 1, i + moves[ev.key][0]));
        j = Math.max(0, Math.min(d.cols - 1, j + moves[ev.key][1]));
      }
    } else if (ev.key === "Home") {
      i = 0; j = 0;
    } else if (ev.key === "End") {
      i = d.rows - 1; j = d.cols - 1;
    } else return;
    ev.preventDefault();
    readCell(i, j);
  }

  /* ---- a KV-cache session, row by row ---- */

  /* The session's rows so far as a view: row r holds its weights over keys
   * 0..r and NaN past them. */
  function sessionView() {
    const s = st.session, n = s.n;
    const heads = [];
    for (let h = 0; h < s.heads.length; h++) {
      const data = new Float32Array(n * n).fill(NaN);
      s.heads[h].forEach((row, r) => data.set(row, r * n));
      heads.push(matrix(data, n, n));
    }
    return s.mode === "heads" ? makeView(heads, meanOf(heads), n - 1) : makeView([], heads[0], n - 1);
  }

  /* Appends the rows of an answer's attention ((H,) rows, cached) to the
   * session's. */
  function sessionTake(res) {
    const s = st.session, t = tensorOf(res.attention, "attention");
    const heads = s.mode === "heads";
    const H = heads ? t.shape[0] : 1, R = t.shape[heads ? 1 : 0], S = t.shape[heads ? 2 : 1];
    if (!s.heads.length) for (let h = 0; h < H; h++) s.heads.push([]);
    for (let h = 0; h < H; h++)
      for (let r = 0; r < R; r++) {
        const at = (h * R + r) * S, pos = S - R + r;
        s.heads[h].push(t.data.slice(at, at + pos + 1));
      }
    s.n = res.cached_tokens;
  }

  async function sessionCall(label, fn) {
    setState("running", "");
    status(label);
    try {
      await fn();
      st.view = sessionView();
      draw();
      status($("sess-info").textContent);
      setState("done", "");
    } catch (err) {
      fail(err);
    }
    sessionButtons();
  }

  function sessionOpen() {
    return sessionCall("Opening a session…", async () => {
      await sessionClose(true);
      const m = currentModel();
      const p = intField("prefix", 1, 16384);
      const rows = randomRows(intField("seed", 0, 4294967295), m.embed_dim);
      const req = requestBody({ model: m.name, query: tensorObject([p, m.embed_dim], rows(0, p)) });
      hooks.lastRequest = req;
      const res = await api("POST", "v1/sessions", req);
      hooks.lastResponse = res;
      st.session = { id: res.session, model: m.name, mode: req.attention, heads: [], n: 0, rows: rows, width: m.embed_dim };
      sessionTake(res);
      $("sess-info").textContent = "Session " + res.session.slice(0, 8) + "… on " + m.name + ": " + res.cached_tokens + " tokens cached.";
    });
  }

  function sessionStep() {
    return sessionCall("Stepping…", async () => {
      const s = st.session;
      const req = requestBody({ query: tensorObject([1, s.width], s.rows(s.n, s.n + 1)), attention: s.mode });
      hooks.lastRequest = req;
      const res = await api("POST", "v1/sessions/" + s.id + "/attention", req);
      hooks.lastResponse = res;
      sessionTake(res);
      $("sess-info").textContent = "Session " + s.id.slice(0, 8) + "…: row " + (s.n - 1) + " stepped, " + s.n + " tokens cached.";
    });
  }

  /* Closes the open session, if any (quiet: a failure only says so). */
  async function sessionClose(quiet) {
    const s = st.session;
    st.session = null;
    sessionButtons();
    if (!s) return;
    try {
      await api("DELETE", "v1/sessions/" + s.id);
      if (!quiet) $("sess-info").textContent = "Session closed.";
    } catch (err) {
      $("sess-info").textContent = "Closing the session: " + explain(err);
    }
  }

  function sessionButtons() {
    $("sess-step").disabled = !st.session;
    $("sess-close").disabled = !st.session;
  }

  /* ---- the load panel ---- */

  /* Prometheus text as {name: [{labels, value}]}. */
  function parseMetrics(text) {
    const out = {};
    for (const line of text.split("\n")) {
      if (!line || line[0] === "#") continue;
      const m = /^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)/.exec(line);
      if (!m) continue;
      const labels = {};
      for (const l of (m[2] || "").matchAll(/([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
      const v = m[3] === "+Inf" ? Infinity : m[3] === "-Inf" ? -Infinity : parseFloat(m[3]);
      (out[m[1]] = out[m[1]] || []).push({ labels: labels, value: v });
    }
    return out;
  }

  /* A histogram's cumulative buckets, ascending: [{le, count}]. */
  function buckets(mt, name) {
    return (mt[name + "_bucket"] || [])
      .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : parseFloat(s.labels.le), count: s.value }))
      .sort((a, b) => a.le - b.le);
  }

  /* The q-quantile of cumulative buckets, linear within a bucket as
   * Prometheus's histogram_quantile does; NaN when they count nothing. */
  function quantile(bk, q) {
    if (!bk.length || !(bk[bk.length - 1].count > 0)) return NaN;
    const rank = q * bk[bk.length - 1].count;
    let prevLe = 0, prevCount = 0;
    for (const b of bk) {
      if (b.count >= rank) {
        if (b.le === Infinity) return prevLe;
        if (b.count === prevCount) return b.le;
        return prevLe + ((b.le - prevLe) * (rank - prevCount)) / (b.count - prevCount);
      }
      prevLe = b.le;
      prevCount = b.count;
    }
    return prevLe;
  }

  const SELF_ROUTES = new Set(["/metrics", "/ui", "/ui/:name"]);

  function sum(mt, name, keep) {
    return (mt[name] || []).filter((s) => !keep || keep(s.labels)).reduce((a, s) => a + s.value, 0);
  }

  /* What the panel shows, from two scrapes a and b (b the later). */
  function loadBetween(a, b) {
    const dt = (b.t - a.t) / 1000;
    const reqs = (mt) => sum(mt, "attnd_requests_total", (l) => !SELF_ROUTES.has(l.route));
    const ba = buckets(a.mt, "attnd_request_duration_seconds"), bb = buckets(b.mt, "attnd_request_duration_seconds");
    const win = bb.map((x, k) => ({ le: x.le, count: x.count - (ba[k] ? ba[k].count : 0) }));
    const bs = (mt, s) => sum(mt, "attnd_batch_size_" + s);
    const nb = bs(b.mt, "count") - bs(a.mt, "count");
    const model = $("model").value;
    return {
      rps: dt > 0 ? (reqs(b.mt) - reqs(a.mt)) / dt : NaN,
      p50: quantile(win, 0.5),
      p99: quantile(win, 0.99),
      queue: sum(b.mt, "attnd_queue_depth", (l) => !model || l.model === model),
      queueAll: sum(b.mt, "attnd_queue_depth"),
      batch: nb > 0 ? (bs(b.mt, "sum") - bs(a.mt, "sum")) / nb : NaN,
      running: sum(b.mt, "attnd_requests_running"),
    };
  }

  function ms(s) {
    return s === s ? (s * 1000).toPrecision(3) + " ms" : "idle";
  }

  let lastScrape = null;

  async function scrape() {
    if (document.hidden) return;
    let text;
    try {
      const res = await fetch("metrics", { cache: "no-store" });
      if (!res.ok) throw new Error(String(res.status));
      text = await res.text();
    } catch (err) {
      $("load-rps").textContent = "unreachable";
      return;
    }
    const now = { t: performance.now(), mt: parseMetrics(text) };
    if (lastScrape) {
      const l = (hooks.load = loadBetween(lastScrape, now));
      $("load-rps").textContent = l.rps === l.rps ? l.rps.toFixed(1) : "–";
      $("load-p50").textContent = ms(l.p50);
      $("load-p99").textContent = ms(l.p99);
      $("load-queue").textContent = l.queue + (l.queueAll !== l.queue ? " (" + l.queueAll + " over all models)" : "");
      $("load-batch").textContent = l.batch === l.batch ? l.batch.toFixed(1) + " requests" : "no batch";
      $("load-running").textContent = String(l.running);
      $("load").dataset.updated = String(Number($("load").dataset.updated || 0) + 1);
    }
    lastScrape = now;
  }

  /* ---- start ---- */

  function wire() {
    $("run-form").addEventListener("submit", run);
    $("key-form").addEventListener("submit", useKey);
    $("key-forget").addEventListener("click", () => {
      sessionStorage.removeItem(KEY_STORE);
      $("key").value = "";
      $("key-msg").textContent = "Forgotten.";
    });
    $("model").addEventListener("change", () => modelChanged(true));
    $("src-random").addEventListener("change", sourceChanged);
    $("src-body").addEventListener("change", sourceChanged);
    $("fill-body").addEventListener("click", () => {
      try {
        const b = JSON.parse(JSON.stringify(runBodyRandom()));
        $("body").value = JSON.stringify(b, null, 1);
      } catch (err) {
        fail(err);
      }
    });
    $("scale").addEventListener("change", () => {
      if (st.view) draw();
    });
    $("seq").addEventListener("change", () => {
      st.view = viewOfAnswer(hooks.lastRequest, hooks.lastResponse, Number($("seq").value));
      draw();
    });
    const large = $("large");
    large.addEventListener("mousemove", onPointer);
    large.addEventListener("click", onPointer);
    large.addEventListener("keydown", onKey);
    $("sess-open").addEventListener("click", sessionOpen);
    $("sess-step").addEventListener("click", sessionStep);
    $("sess-close").addEventListener("click", () => sessionClose(false));
    window.addEventListener("pagehide", () => {
      if (st.session) {
        const key = sessionStorage.getItem(KEY_STORE);
        fetch("v1/sessions/" + st.session.id, {
          method: "DELETE", keepalive: true, headers: key ? { Authorization: "Bearer " + key } : {},
        }).catch(() => {});
      }
    });
    document.addEventListener("visibilitychange", () => {
      lastScrape = null;
      scrape();
    });
  }

  /* The random rows as a body, whichever source is chosen (for the
   * pasted-body field's "fill" button). */
  function runBodyRandom() {
    const body = $("src-body").checked;
    $("src-body").checked = false;
    $("src-random").checked = true;
    try {
      return runBody();
    } finally {
      $("src-body").checked = body;
      $("src-random").checked = !body;
    }
  }

  /* Test hooks: the center of drawn cell (i, j) of the large view in
   * pixels of the page from the large canvas's top-left corner, and the
   * helpers the load panel uses. */
  hooks.cellCenter = function (i, j) {
    const g = geometry(), c = $("large"), r = c.getBoundingClientRect();
    const sx = r.width / parseFloat(c.style.width), sy = r.height / parseFloat(c.style.height);
    return { x: (g.x + (j + 0.5) * g.cw) * sx, y: (g.y + (i + 0.5) * g.ch) * sy };
  };
  hooks.parseMetrics = parseMetrics;
  hooks.quantile = quantile;
  hooks.buckets = buckets;
  hooks.randomRows = (seed, width, n) => Array.from(randomRows(seed, width)(0, n));

  async function start() {
    const p = readParams();
    applyParams(p);
    wire();
    sourceChanged();
    setInterval(scrape, LOAD_EVERY_MS);
    scrape();
    st.pendingRun = p.run;
    if ((await loadModels()) && st.pendingRun) await run();
  }

  start();
})();
