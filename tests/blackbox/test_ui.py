"""The viewer, GET /ui (SPEC section 9, docs/ui.md), in a real browser:
Debian's headless Chromium driven by selenium through Debian's chromedriver,
against the real daemon. The page is loaded with URL parameters, and what it
draws and shows is checked against the daemon's own answers: every head and
the mean drawn and not blank, the weight under the cursor equal to the API's
for the same body, no console error and no request to another host, the key
prompt, a KV-cache session stepped row by row, down-sampling of long
sequences, the last rows of a matrix over max_attention_floats (and the
413 when not one row fits), the load panel's
reading of /metrics; and the routes themselves over plain HTTP (types,
caching, the Content-Security-Policy, 304, server.ui: false)."""
import base64
import json
import math
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import requests

import support

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_S = 120.0  # a bound on waiting for the page, not a measure of it
DEC_DIR = support.GOLDEN_DIR / "decoder"
KEY = "ui-test-key-7"


# ------------------------------------------------------------------ the browser

@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module, with its own empty profile and
    none of its background traffic (the machine has no other network)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    assert Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists(), \
        "chromium and chromium-driver are missing: run make deps (tests/deps.sh test)"
    profile = tempfile.mkdtemp(prefix="attnd-ui-chromium-")
    o = webdriver.ChromeOptions()
    o.binary_location = CHROMIUM
    for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
              "--disable-background-networking", "--disable-component-update", "--disable-sync",
              "--user-data-dir=" + profile, "--window-size=1280,1000"):
        o.add_argument(a)
    o.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(service=Service(CHROMEDRIVER), options=o)
    drv.set_script_timeout(60)
    try:
        yield drv
    finally:
        drv.quit()
        shutil.rmtree(profile, ignore_errors=True)


def js(drv, script, *args):
    return drv.execute_script(script, *args)


def state(drv):
    return js(drv, "return document.body.dataset.state")


def wait_for(drv, cond, what):
    """Polls cond(drv) until it is truthy; fails naming what after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        v = cond(drv)
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("the page never %s (state %r, message %r)"
                         % (what, state(drv), message(drv)))


def message(drv):
    return js(drv, "return document.getElementById('message').textContent")


def wait_drawn(drv, want="done"):
    """Waits for the end of a run ("done" or "error") and checks it is want."""
    s = wait_for(drv, lambda d: (lambda s: s in ("done", "error") and s)(state(d)), "finished its run")
    assert s == want, "state %s, message: %s" % (s, message(drv))


def load(drv, d, query=""):
    drv.get_log("browser")  # drop what earlier pages logged
    drv.get_log("performance")
    drv.get(d.url + "/ui" + query)


def canvases(drv):
    """[data-head, width, height, distinct colors] of every heatmap."""
    return js(drv, """
        return Array.from(document.querySelectorAll('canvas[data-head]')).map(c => {
          const p = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
          const seen = new Set();
          for (let k = 0; k < p.length; k += 4) seen.add(p[k] + ',' + p[k+1] + ',' + p[k+2] + ',' + p[k+3]);
          return [c.dataset.head, c.width, c.height, seen.size];
        });""")


def last_request(drv):
    return js(drv, "return window.attnd.lastRequest")


def last_response(drv):
    return js(drv, "return window.attnd.lastResponse")


def tensor(x):
    """A tensor of a request or answer (base64 object or nested arrays) as numpy."""
    if isinstance(x, dict):
        return support.from_b64_tensor(x)
    return np.asarray(x, dtype=np.float32)


def point_at(drv, i, j):
    """Moves the real pointer over drawn cell (i, j) of the large view and
    returns the readout's (head, row, col, printed value)."""
    from selenium.webdriver.common.action_chains import ActionChains
    c = drv.find_element("id", "large")
    js(drv, "arguments[0].scrollIntoView({block: 'center'})", c)
    at = js(drv, "return window.attnd.cellCenter(arguments[0], arguments[1])", i, j)
    rect = js(drv, "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", c)
    ActionChains(drv).move_to_element_with_offset(
        c, int(round(at["x"] - rect[0] / 2)), int(round(at["y"] - rect[1] / 2))).perform()
    out = drv.find_element("id", "readout")
    # the pointer's event may be handled just after the move returns
    wait_for(drv, lambda _: (out.get_attribute("data-row"), out.get_attribute("data-col"))
             == (str(i), str(j)), "read cell (%d, %d) under the pointer" % (i, j))
    return (out.get_attribute("data-head"), int(out.get_attribute("data-row")),
            int(out.get_attribute("data-col")), out.get_attribute("data-value"))


def same_printed(shown, value):
    """The page prints 6 significant digits of the float32 it drew; the
    API's float32, printed the same way, must read back the same."""
    return float(shown) == float("%.6g" % float(value))


def console_errors(drv):
    return [e for e in drv.get_log("browser") if e.get("level") == "SEVERE"]


def requested_urls(drv):
    """Every URL the page asked for: the DevTools network log, and the
    page's own resource timing entries."""
    urls = []
    for e in drv.get_log("performance"):
        m = json.loads(e["message"])["message"]
        if m.get("method") == "Network.requestWillBeSent":
            urls.append(m["params"]["request"]["url"])
    urls += js(drv, """return performance.getEntriesByType('navigation')
        .concat(performance.getEntriesByType('resource')).map(e => e.name)""")
    return urls


# ------------------------------------------------------------ the random rows

def mulberry32(seed):
    """The page's generator (app.js, docs/ui.md), over 32-bit words."""
    a = seed & 0xFFFFFFFF
    while True:
        a = (a + 0x6D2B79F5) & 0xFFFFFFFF
        t = a
        t = ((t ^ (t >> 15)) * (t | 1)) & 0xFFFFFFFF
        t ^= (t + ((t ^ (t >> 7)) * (t | 61))) & 0xFFFFFFFF
        yield ((t ^ (t >> 14)) & 0xFFFFFFFF) / 4294967296


def random_rows(seed, rows, width):
    """docs/ui.md's recipe: Box-Muller on pairs of draws, float32."""
    g = mulberry32(seed)
    out = []
    while len(out) < rows * width:
        u1, u2 = next(g), next(g)
        r = math.sqrt(-2 * math.log(1 - u1))
        out += [r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)]
    return np.asarray(out[:rows * width], dtype=np.float32).reshape(rows, width)


# ------------------------------------------------------------------ daemons

@pytest.fixture(scope="module")
def d(daemons):
    """The embedded default model (E 512, 8 heads)."""
    return daemons()


def decoder_golden():
    """A decoder golden with grouped key/value heads and rotary positions."""
    for p in sorted(DEC_DIR.glob("*.json")):
        g = json.loads(p.read_text())
        c = g["config"]
        if c.get("rope") and c.get("num_kv_heads", c["num_heads"]) < c["num_heads"]:
            c = dict(c, weights=str(DEC_DIR / c["weights"]))
            return c
    raise AssertionError("no decoder golden with rope and grouped heads in %s" % DEC_DIR)


# ------------------------------------------------------------------ HTTP

def test_routes_types_caching_and_policy(d):
    """/ui, /ui/app.js and /ui/style.css: their types, no-cache with an ETag
    and 304 for a current copy, the Content-Security-Policy, HEAD; an unknown
    file is 404 and a POST 405."""
    types = {"/ui": "text/html", "/ui/app.js": "text/javascript", "/ui/style.css": "text/css"}
    for path, ctype in types.items():
        r = d.get(path)
        assert r.status_code == 200, (path, r.status_code, r.text[:200])
        assert r.headers["Content-Type"].startswith(ctype), (path, r.headers["Content-Type"])
        assert r.headers["Cache-Control"] == "no-cache", r.headers
        csp = r.headers["Content-Security-Policy"]
        assert csp.startswith("default-src 'self';") and "unsafe" not in csp, csp
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        tag = r.headers["ETag"]
        again = d.get(path, headers={"If-None-Match": tag})
        assert again.status_code == 304 and again.content == b"", (path, again.status_code)
        assert again.headers["ETag"] == tag
        assert d.get(path, headers={"If-None-Match": '"0123456789abcdef"'}).status_code == 200
        h = d.request("HEAD", path)
        assert h.status_code == 200 and h.content == b"", path
    page = d.get("/ui").text
    assert page.lower().startswith("<!doctype html>")
    # nothing the page names lives on another host
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert 'src="ui/app.js"' in page and 'href="ui/style.css"' in page
    assert d.get("/ui/nothing.js").status_code == 404
    assert d.post("/ui", {}).status_code == 405
    assert d.get("/v1/models").headers["Cache-Control"] == "no-store"  # the API's stay so


def test_off_gives_404(fresh_daemons):
    """server.ui: false: the page and its files are 404, the API is as before."""
    d = fresh_daemons({"server": {"ui": False}})
    for path in ("/ui", "/ui/app.js", "/ui/style.css"):
        r = d.get(path)
        assert r.status_code == 404, (path, r.status_code)
        assert "error" in r.json()
    assert d.get("/v1/models").status_code == 200
    e = fresh_daemons(env={"ATTND_UI": "false"})
    assert e.get("/ui").status_code == 404
    assert fresh_daemons(env={"ATTND_UI": "true"}).get("/ui").status_code == 200


# ------------------------------------------------------------------ the page

def test_run_draws_every_head_and_the_mean(browser, d):
    """A linked view runs by itself: each of the 8 heads and the mean is an
    element with data-head, drawn L x S, and not one color; the rows sent are
    the documented PRNG's; nothing is down-sampled."""
    L, seed = 12, 7
    load(browser, d, "?model=default&len=%d&seed=%d&causal=1&attention=heads&run=1" % (L, seed))
    wait_drawn(browser)
    got = canvases(browser)
    assert [g[0] for g in got] == [str(h) for h in range(8)] + ["mean"], got
    for head, w, h, colors in got:
        assert (w, h) == (L, L), (head, w, h)
        assert colors > 1, "heatmap %s is blank" % head
    req = last_request(browser)
    assert req["model"] == "default" and req["causal"] is True and req["attention"] == "heads"
    assert req["encoding"] == "base64"
    q = tensor(req["query"])
    assert q.shape == (L, 512)
    np.testing.assert_allclose(q, random_rows(seed, L, 512), rtol=1e-6, atol=1e-6)
    res = last_response(browser)
    assert tensor(res["attention"]).shape == (8, L, L)
    assert not browser.find_element("id", "note").is_displayed()
    assert js(browser, "return document.getElementById('legend-max').textContent") != "–"
    # the address (and the page's link) hold the view drawn
    link = browser.find_element("id", "permalink").get_attribute("href")
    for part in ("model=default", "len=%d" % L, "seed=%d" % seed, "causal=1", "attention=heads",
                 "run=1"):
        assert part in link and part in js(browser, "return location.search"), (part, link)


def test_accessible_basics(browser, d):
    """Every control has a label, the heatmaps are buttons a keyboard
    reaches, the large view takes focus, the legend gives both ends."""
    load(browser, d, "?len=5&seed=2&run=1")
    wait_drawn(browser)
    unlabelled = js(browser, """
        return Array.from(document.querySelectorAll('input, select, textarea'))
          .filter(e => !e.labels || e.labels.length === 0).map(e => e.id || e.name);""")
    assert not unlabelled, unlabelled
    thumbs = browser.find_elements("css selector", "button.thumb")
    assert len(thumbs) == 9 and all(t.get_attribute("aria-label") for t in thumbs)
    thumbs[4].send_keys("\n")  # Enter on the focused heatmap shows it large
    assert browser.find_element("id", "large").get_attribute("data-large-head") == "4"
    assert browser.find_element("id", "large").get_attribute("tabindex") == "0"
    # one scale for all: from the smallest weight of any head to the largest
    w = tensor(last_response(browser)["attention"])
    assert same_printed(browser.find_element("id", "legend-min").text, w.min())
    assert same_printed(browser.find_element("id", "legend-max").text, w.max())


def test_value_under_the_cursor_is_the_api_s(browser, d):
    """The weight the page shows under the pointer, for a head and for the
    mean, equals the API's own answer to window.attnd.lastRequest re-sent,
    to the printed precision; token labels name the cell; arrow keys move."""
    labels = "the cat sat on a mat and it was very happy"
    load(browser, d, "?len=11&seed=3&attention=heads&run=1&labels=" + labels.replace(" ", ","))
    wait_drawn(browser)
    req = last_request(browser)
    r = requests.post(d.url + "/v1/attention", json=req, timeout=support.HTTP_TIMEOUT)
    assert r.status_code == 200, r.text[:300]
    api = tensor(r.json()["attention"])  # (8, 11, 11)
    browser.find_element("css selector", "button.thumb canvas[data-head='2']").click()
    for i, j in ((0, 0), (3, 5), (10, 10), (7, 1)):
        head, row, col, shown = point_at(browser, i, j)
        assert (head, row, col) == ("2", i, j)
        assert same_printed(shown, api[2, i, j]), (i, j, shown, api[2, i, j])
    text = browser.find_element("id", "readout").text
    assert "“it”" in text and "“cat”" in text, text  # row 7, key 1
    # the mean the page computes over the heads
    browser.find_element("css selector", "canvas[data-head='mean']").click()
    head, row, col, shown = point_at(browser, 4, 9)
    assert head == "mean"
    assert same_printed(shown, np.float32(api[:, 4, 9].astype(np.float64).mean()))
    # the keyboard moves over the cells
    from selenium.webdriver.common.keys import Keys
    browser.find_element("id", "large").send_keys(Keys.ARROW_DOWN, Keys.ARROW_LEFT)
    out = browser.find_element("id", "readout")
    assert (out.get_attribute("data-row"), out.get_attribute("data-col")) == ("5", "8")
    # and the daemon's own mean, asked for
    load(browser, d, "?len=9&seed=4&attention=mean&run=1")
    wait_drawn(browser)
    req = last_request(browser)
    assert req["attention"] == "mean"
    assert [g[0] for g in canvases(browser)] == ["mean"]
    api = tensor(requests.post(d.url + "/v1/attention", json=req,
                               timeout=support.HTTP_TIMEOUT).json()["attention"])
    head, row, col, shown = point_at(browser, 8, 2)
    assert head == "mean" and same_printed(shown, api[8, 2])


def test_no_console_error_and_no_other_host(browser, d):
    """A run, a pasted body, the load panel's refresh: nothing in the console
    (a missing favicon's 404 would be there), every request to the daemon."""
    load(browser, d, "?len=6&seed=1&run=1")
    wait_drawn(browser)
    wait_for(browser, lambda b: int(b.find_element("id", "load").get_attribute("data-updated")
                                    or 0) >= 1, "refreshed its load panel")
    urls = requested_urls(browser)
    assert any(u.endswith("/v1/attention") for u in urls), urls
    assert any(u.endswith("/metrics") for u in urls), urls
    others = [u for u in urls if not (u.startswith(d.url + "/") or u.startswith("data:"))]
    assert not others, "requests to another host: %s" % others
    assert not console_errors(browser)


def test_pasted_body(browser, d):
    """A pasted body of nested arrays, answered as JSON text because it says
    so: the page adds only what it leaves out (the attention to draw)."""
    load(browser, d)
    wait_for(browser, lambda b: state(b) == "ready", "loaded the models")
    body = {"query": random_rows(5, 5, 512).tolist(), "causal": True, "encoding": "json"}
    browser.find_element("id", "src-body").click()
    js(browser, "document.getElementById('body').value = arguments[0]", json.dumps(body))
    browser.find_element("id", "run").click()
    wait_drawn(browser)
    req = last_request(browser)
    assert req["encoding"] == "json" and req["attention"] == "heads" and req["causal"] is True
    assert [g[0] for g in canvases(browser)] == [str(h) for h in range(8)] + ["mean"]
    api = np.asarray(last_response(browser)["attention"], dtype=np.float32)
    assert api.shape == (8, 5, 5) and np.all(np.triu(api[0], 1) == 0)
    browser.find_element("css selector", "canvas[data-head='0']").click()
    assert same_printed(point_at(browser, 4, 1)[3], api[0, 4, 1])
    # a body that is not JSON is an error on the page, not a request
    js(browser, "document.getElementById('body').value = '{\"query\": ['")
    browser.find_element("id", "run").click()
    wait_drawn(browser, "error")
    assert "not JSON" in message(browser)
    assert not console_errors(browser)


def test_key_prompt(browser, daemons):
    """With an API key: the page itself needs none, asks for the key, says
    401 for a wrong one, and draws with the right one."""
    d = daemons(env={"ATTND_API_KEY": KEY})
    assert d.get("/ui").status_code == 200 and d.get("/ui/app.js").status_code == 200
    assert d.get("/v1/models").status_code == 401
    load(browser, d, "?len=5&seed=2&run=1")
    wait_drawn(browser, "error")
    assert "401" in message(browser) and "API key" in message(browser)
    panel = browser.find_element("id", "key-panel")
    assert panel.is_displayed()
    field = browser.find_element("id", "key")
    field.send_keys("not-the-key")
    browser.find_element("css selector", "#key-form button[type=submit]").click()
    wait_for(browser, lambda b: "refused" in b.find_element("id", "key-msg").text,
             "said the key was refused")
    assert state(browser) == "error" and "401" in message(browser)
    field.clear()
    field.send_keys(KEY)
    browser.find_element("css selector", "#key-form button[type=submit]").click()
    wait_drawn(browser)
    assert not panel.is_displayed()
    assert len(canvases(browser)) == 9
    assert js(browser, "return sessionStorage.getItem('attnd.apiKey')") == KEY
    # every browser log line is one of the two 401s
    errs = console_errors(browser)
    assert all("401" in e["message"] for e in errs), errs


def test_long_sequence_is_down_sampled(browser, d):
    """600 rows: drawn max-pooled to 300 x 300, and the page says so."""
    load(browser, d, "?len=600&seed=9&attention=mean&run=1")
    wait_drawn(browser)
    note = browser.find_element("id", "note")
    assert note.is_displayed() and "Down-sampled" in note.text and "max-pooling" in note.text
    assert "600 × 600" in note.text, note.text
    (head, w, h, colors), = canvases(browser)
    assert (head, w, h) == ("mean", 300, 300) and colors > 1
    # a drawn cell is the largest weight of its 2 x 2 block
    api = tensor(last_response(browser)["attention"])
    assert api.shape == (600, 600)
    head, row, col, shown = point_at(browser, 150, 40)
    assert same_printed(shown, api[300:302, 80:82].max())


def test_too_large_is_said(browser, daemons):
    """Not even one row of every head under limits.max_attention_floats
    (8 x 16 floats over 100): the page says 413 and names the limit."""
    d = daemons({"limits": {"max_attention_floats": 100}})
    load(browser, d, "?len=16&seed=1&attention=heads&run=1")
    wait_drawn(browser, "error")
    msg = message(browser)
    assert "413" in msg and "max_attention_floats" in msg and "100" in msg, msg
    assert "attention_rows" not in last_request(browser)


def test_long_sequence_over_the_limit_draws_its_last_rows(browser, daemons):
    """A matrix over limits.max_attention_floats is asked for in part: the
    last rows that fit (attention_rows), drawn with their own indices, the
    note saying so; the weights are the API's for those rows of the full
    request, and the same body without the rows is the daemon's 413."""
    limit = 200_000
    d = daemons({"limits": {"max_attention_floats": limit}})
    L, H = 600, 8
    load(browser, d, "?len=%d&seed=9&causal=1&attention=heads&run=1" % L)
    wait_drawn(browser)
    req = last_request(browser)
    rows = limit // (H * L)  # 41
    assert req["attention_rows"] == [L - rows, L], req.get("attention_rows")
    got = canvases(browser)
    assert [g[0] for g in got] == [str(h) for h in range(H)] + ["mean"], got
    assert all((w, h) == (300, rows) and colors > 1 for _, w, h, colors in got), got
    note = browser.find_element("id", "note").text
    assert "Rows %d–%d of %d" % (L - rows, L - 1, L) in note and str(limit) in note, note
    assert "Down-sampled" in note, note
    api = tensor(last_response(browser)["attention"])
    assert api.shape == (H, rows, L)
    # the rows drawn are rows L - rows .. L - 1 of the full matrix (causal:
    # row r has weights over keys 0..r alone)
    for i, r in ((0, L - rows), (rows - 1, L - 1)):
        assert np.all(api[:, i, r + 1:] == 0) and np.all(api[:, i, :r + 1].sum(-1) > 0.999)
    full = dict(req)
    del full["attention_rows"]
    r = requests.post(d.url + "/v1/attention", json=full, timeout=support.HTTP_TIMEOUT)
    assert r.status_code == 413 and "max_attention_floats" in r.text, (r.status_code, r.text[:200])
    browser.find_element("css selector", "canvas[data-head='3']").click()
    head, row, col, shown = point_at(browser, 20, 100)
    assert (head, row, col) == ("3", 20, 100)
    assert same_printed(shown, api[3, 20, 200:202].max())
    text = browser.find_element("id", "readout").text
    assert "query rows %d" % (L - rows + 20) in text, text
    # the daemon's mean fits more rows
    load(browser, d, "?len=%d&seed=9&causal=1&attention=mean&run=1" % L)
    wait_drawn(browser)
    assert last_request(browser)["attention_rows"] == [L - limit // L, L]
    assert tensor(last_response(browser)["attention"]).shape == (limit // L, L)
    assert not console_errors(browser)


def test_session_steps_row_by_row(browser, daemons):
    """A decoder model (grouped heads, rotary positions): a session opened
    with 3 rows, then stepped twice; each step sends the next row of the
    seed's stream alone, the state is done after each, and the new row is
    drawn (its keys up to itself, none past) with the API's weights."""
    c = decoder_golden()
    d = daemons({"models": [c]})
    E, H = c["embed_dim"], c["num_heads"]
    from selenium.webdriver.support.ui import Select
    load(browser, d, "?len=8&seed=11&attention=heads")
    wait_for(browser, lambda b: state(b) == "ready", "loaded the models")
    Select(browser.find_element("id", "model")).select_by_value(c["name"])
    prefix = browser.find_element("id", "prefix")
    prefix.clear()
    prefix.send_keys("3")
    browser.find_element("id", "sess-open").click()
    wait_for(browser, lambda b: (last_response(b) or {}).get("cached_tokens") == 3, "opened")
    wait_drawn(browser)
    rows = random_rows(11, 5, E)
    np.testing.assert_allclose(tensor(last_request(browser)["query"]), rows[:3], rtol=1e-6,
                               atol=1e-6)
    for n in (4, 5):
        browser.find_element("id", "sess-step").click()
        wait_for(browser, lambda b: (last_response(b) or {}).get("cached_tokens") == n,
                 "stepped to %d tokens" % n)
        wait_drawn(browser)
        sent = tensor(last_request(browser)["query"])
        np.testing.assert_allclose(sent, rows[n - 1:n], rtol=1e-6, atol=1e-6)
        got = canvases(browser)
        assert [g[0] for g in got] == [str(h) for h in range(H)] + ["mean"]
        assert all((w, h) == (n, n) for _, w, h, _ in got), got
        # the newest row has all n cells drawn, the one before it n - 1
        alpha = js(browser, """
            const c = document.querySelector("canvas[data-head='0']"), n = c.width;
            const p = c.getContext('2d').getImageData(0, 0, n, n).data, rows = [];
            for (let i = 0; i < n; i++) {
              let k = 0;
              for (let j = 0; j < n; j++) if (p[(i * n + j) * 4 + 3] === 255) k++;
              rows.push(k);
            }
            return rows;""")
        assert alpha == list(range(1, n + 1)), alpha
        step = tensor(last_response(browser)["attention"])  # (H, 1, n)
        assert step.shape == (H, 1, n)
        browser.find_element("css selector", "canvas[data-head='0']").click()
        head, row, col, shown = point_at(browser, n - 1, 1)
        assert (head, row, col) == ("0", n - 1, 1) and same_printed(shown, step[0, 0, 1])
    sid = last_response(browser)["session"]
    browser.find_element("id", "sess-close").click()
    wait_for(browser, lambda b: "closed" in b.find_element("id", "sess-info").text, "closed it")
    r = d.post("/v1/sessions/%s/attention" % sid, {"query": [[0.0] * E]})
    assert r.status_code == 404, r.status_code


def test_load_panel_reads_metrics(browser, d):
    """The panel's reader of /metrics agrees with the suites' Prometheus
    parser sample by sample; its quantile interpolates within a bucket as
    histogram_quantile does; what it shows is read from the daemon."""
    load(browser, d, "?len=4&seed=1&run=1")
    wait_drawn(browser)
    text = d.get("/metrics").text
    _, samples = support.parse_prometheus(text)
    page = js(browser, "return window.attnd.parseMetrics(arguments[0])", text)
    for name, labels, value in samples:
        match = [s for s in page.get(name, []) if s["labels"] == labels]
        assert len(match) == 1, (name, labels, page.get(name))
        v = match[0]["value"]
        assert v == value or (math.isinf(value) and v is None), (name, labels, v, value)
    assert sum(len(v) for v in page.values()) == len(samples)
    bk = [{"le": 0.1, "count": 0}, {"le": 0.5, "count": 10}, {"le": 1.0, "count": 20},
          {"le": None, "count": 20}]
    q = lambda p: js(browser, """
        const b = arguments[0].map(x => ({le: x.le === null ? Infinity : x.le, count: x.count}));
        return window.attnd.quantile(b, arguments[1]);""", bk, p)
    assert abs(q(0.5) - 0.5) < 1e-12 and abs(q(0.25) - 0.3) < 1e-12 and abs(q(0.99) - 0.99) < 1e-12
    wait_for(browser, lambda b: int(b.find_element("id", "load").get_attribute("data-updated")
                                    or 0) >= 1, "refreshed its load panel")
    assert browser.find_element("id", "load-queue").text.split()[0] == "0"
    rps = browser.find_element("id", "load-rps").text
    assert float(rps) >= 0, rps
    assert browser.find_element("id", "load-p50").text.endswith(("ms", "idle"))


def test_screenshot_is_small_png():
    """docs/ui.md shows docs/ui.png (tests/ui_screenshot.py makes it)."""
    p = support.REPO / "docs" / "ui.png"
    data = p.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and 5_000 < len(data) < 200_000, len(data)
