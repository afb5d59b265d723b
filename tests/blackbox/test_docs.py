"""The docs run as pasted: every shell, Python and JavaScript block of
README.md and docs/*.md runs against a live daemon, and what the docs say a
block prints is what it prints.

How a block is read (docs/README conventions, written once here):

- Every code block is fenced and names its language. ```sh (bash, shell),
  ```console ($ lines are commands, the others what they print), ```python
  and ```js blocks run; any other language (text, json, yaml, ...) is shown,
  not run, and must not hold a command.
- A block that cannot run here carries `<!-- not run: why -->` right before
  it; `<!-- needs python3-torch -->` runs it only where Debian's torch is
  installed (a skip says so otherwise): a shell block calls
  /usr/bin/python3 for it, a Python block so marked runs with the python
  that ATTND_TORCH_PYTHON names (make test-blackbox: the Python client's
  venv of Debian's python, which sees python3-torch and has the attnd
  client installed, as docs/clients.md tells readers to make one). Any
  other block that is not run is a failure, so new docs cannot go untested.
- `<!-- output -->` before a shown block: that text is printed by the
  block right before it, which runs. `...` stands for any text, whitespace
  may differ, and numbers are compared to 1e-6 relative (the last digit of
  a float may differ between OpenBLAS's kernels).
- `<!-- logged -->` before a shown block: each line has the form of a line
  the daemon really logs (text or JSON lines), its numbers, timestamps and
  ids left free.

The blocks of one file run in order in one bash process (shell variables
and background daemons carry from block to block, as in a reader's
terminal), with `set -e`, in a folder that holds build/attnd (the binary
under test) and the repository's folders. Ports are rewritten: 8080 is the
default model's daemon this test starts; any other 80xx a block listens on
gets a free port of its own. Python blocks run with the test's venv (numpy,
requests, tritonclient, and the attnd client from clients/python), which
the docs tell readers to make; JavaScript
blocks run as ES modules with node, in the same folder, so that they
import the `attnd` package that docs/clients.md's install block put in its
node_modules (from the `npm pack` tarball of clients/js), and the express
of clients/js's pinned dev dependencies, which node finds in the folder
above (make test-blackbox runs npm ci there first). A block's output holds no
`{"error"` unless the output the docs show for it does.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

import support

DOCS = [support.REPO / "README.md"] + sorted((support.REPO / "docs").glob("*.md"))
RUN_LANGS = {"sh": "sh", "bash": "sh", "shell": "sh", "console": "console",
             "python": "python", "py": "python", "js": "js", "javascript": "js"}
# the first line of a shown block that would be a command to paste
COMMAND = re.compile(r"^\s*(\$ |sudo |curl |python3? |/usr/bin/python3 |build/|make\b|podman |"
                     r"docker |kubectl |export |node |cd |mkdir |bash |sh |[A-Z_]+=\S)")
MARKER = re.compile(r"^<!--\s*(not run:.*\S|needs python3-torch|output|logged)\s*-->$", re.S)
FILE_TIMEOUT = 600  # seconds for one file's blocks; a generous bound, not a measure


class Block:
    def __init__(self, where, lang, text, marker):
        self.where, self.lang, self.text, self.marker = where, lang, text, marker
        self.kind = RUN_LANGS.get(lang)
        self.expected = []  # shown blocks marked <!-- output --> after it
        self.out = None     # what it printed
        self.rc = None      # None: it never ran to its end

    def runs(self, torch_ok):
        """True when this block is run here (torch_ok: a Torch, or a bool
        for both kinds)."""
        if not self.kind or (self.marker or "").startswith("not run"):
            return False
        if self.marker != "needs python3-torch":
            return True
        return torch_ok if isinstance(torch_ok, bool) else torch_ok.runs(self.kind)


def read_blocks(path):
    """The fenced blocks of a file, each with the marker right before it.
    Returns (blocks, problems): an indented block, a fence without a
    language, an unknown marker or a shown block holding a command is a
    problem."""
    tokens = MarkdownIt("commonmark").parse(path.read_text())
    blocks, problems, marker = [], [], None
    rel = path.relative_to(support.REPO)
    for t in tokens:
        line = t.map[0] + 1 if t.map else 0
        if t.type == "html_block" and t.content.strip().startswith("<!--"):
            m = MARKER.match(t.content.strip())
            if not m and re.match(r"<!--\s*(not run|needs|output|logged)", t.content.strip()):
                problems.append("%s:%d: unknown marker %r" % (rel, line, t.content.strip()))
            marker = m.group(1) if m else None
            continue
        if t.type == "code_block":
            problems.append("%s:%d: an indented code block: fence it and name its language "
                            "(sh, python, js to run it; text, json, ... to show it)" % (rel, line))
        elif t.type == "fence":
            lang = t.info.strip().split()[0] if t.info.strip() else ""
            if not lang:
                problems.append("%s:%d: a fence without a language" % (rel, line))
            b = Block("%s:%d" % (rel, line), lang, t.content, marker)
            first = next((l for l in t.content.splitlines() if l.strip()), "")
            if not b.kind and COMMAND.match(first) and not (marker or "").startswith("not run"):
                problems.append("%s:%d: a %s block that holds a command (%r): fence it as sh "
                                "so that it runs, or mark it not run" % (rel, line, lang, first))
            if marker in ("output", "logged") and b.kind:
                problems.append("%s:%d: <!-- %s --> marks a block that runs" % (rel, line, marker))
            blocks.append(b)
        marker = None  # a marker holds for the token right after it only
    for prev, b in zip([None] + blocks, blocks):
        if b.marker != "output":
            continue
        if prev is None or not prev.kind or (prev.marker or "").startswith("not run"):
            problems.append("%s: <!-- output --> does not follow a block that runs" % b.where)
        else:
            prev.expected.append(b)
    return blocks, problems


# ---------------------------------------------------------------- matching

_TS = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z"
_HEX_ID = re.compile(r"\b(?=[0-9a-f]*[a-f])[0-9a-f]{16}(?:[0-9a-f]{16})?\b")


def _literal(text, free_numbers, numbers):
    """A regex for one piece of expected text: whitespace runs may differ,
    timestamps and 16/32-hex ids are free; each number is free, or a group
    whose value must be close to the one written (appended to numbers)."""
    out, pos = [], 0
    pat = re.compile(r"(?P<ts>%s)|(?P<hex>%s)|(?P<num>\d+(?:\.\d+)?)|(?P<ws>\s+)"
                     % (_TS, _HEX_ID.pattern))
    for m in pat.finditer(text):
        out.append(re.escape(text[pos:m.start()]))
        if m.group("ts"):
            out.append(_TS)
        elif m.group("hex"):
            out.append("[0-9a-f]{%d}" % len(m.group("hex")))
        elif m.group("num") and free_numbers:
            out.append(r"[0-9.]+")
        elif m.group("num"):
            out.append(r"(?<!\d)(\d+(?:\.\d+)?)(?!\d)")
            numbers.append(float(m.group("num")))
        else:
            out.append(r"\s*")
        pos = m.end()
    out.append(re.escape(text[pos:]))
    return "".join(out)


def squeeze(text):
    """Whitespace next to JSON's punctuation dropped, so that compact and
    indented JSON (or Python's printed lists) compare equal."""
    return re.sub(r"\s*([{}\[\],:])\s*", r"\1", text)


def expected_regex(text, free_numbers=False):
    """`...` is any text; the rest is literal (see _literal). Returns the
    regex, to match against squeeze(output), and the numbers written."""
    numbers = []
    parts = [_literal(p, free_numbers, numbers) for p in squeeze(text.strip()).split("...")]
    return re.compile(r".*?".join(parts), re.S), numbers


def shows(expected, out):
    """True when out holds the expected text, its numbers within 1e-6
    relative: the last digit of a float may differ between OpenBLAS's
    kernels on other CPUs, never more."""
    rx, numbers = expected_regex(expected)
    for m in rx.finditer(squeeze(out)):
        got = [float(g) for g in m.groups()]
        if all(abs(a - b) <= 1e-6 * max(abs(a), abs(b)) for a, b in zip(got, numbers)):
            return True
    return False


def logged_line_matches(doc_line, log_lines):
    rx, _ = expected_regex(doc_line, free_numbers=True)
    return any(rx.fullmatch(squeeze(l.strip())) for l in log_lines)


# ---------------------------------------------------------------- running

class Torch:
    """Where blocks marked <!-- needs python3-torch --> run: shell blocks
    call Debian's /usr/bin/python3 (shell: it imports torch); Python blocks
    run with ATTND_TORCH_PYTHON (python: that path, when it imports torch
    and the attnd client, else None)."""

    def __init__(self):
        def imports(python, what):
            return subprocess.run([python, "-c", "import " + what], capture_output=True,
                                  timeout=120).returncode == 0
        self.shell = imports("/usr/bin/python3", "torch")
        p = os.environ.get("ATTND_TORCH_PYTHON")
        self.python = p if p and os.path.exists(p) and imports(p, "torch, attnd.torch") else None

    def runs(self, kind):
        return self.python is not None if kind == "python" else self.shell

    def __bool__(self):
        return self.shell and self.python is not None


class PortMap:
    """127.0.0.1:8080 (and localhost, --port, ATTND_PORT) -> the default
    daemon's port, 127.0.0.1:8081 (and --grpc-port, ATTND_GRPC_PORT) -> its
    gRPC port; any other 80xx -> a free port of its own."""

    PORT = re.compile(r"((?:127\.0\.0\.1|localhost):|--port[ =]|--grpc-port[ =]|ATTND_PORT=|"
                      r"ATTND_GRPC_PORT=)(80\d\d)\b")

    def __init__(self, default_port, default_grpc_port):
        self.ports = {"8080": default_port, "8081": default_grpc_port}

    def rewrite(self, text):
        def sub(m):
            if m.group(2) not in self.ports:
                self.ports[m.group(2)] = support.free_port()
            return m.group(1) + str(self.ports[m.group(2)])
        return self.PORT.sub(sub, text)


def workdir(tmp):
    """A folder like the repository's root, whose build/attnd is the binary
    under test; files the blocks write stay in it."""
    tmp.mkdir(parents=True, exist_ok=True)
    for name in ("config", "core", "server", "docs", "docker", "tests", "bench", "clients"):
        os.symlink(support.REPO / name, tmp / name)
    (tmp / "build").mkdir()
    os.symlink(support.BIN, tmp / "build" / "attnd")
    # A project of its own (npm installs into the folder that holds a
    # package.json), and above it clients/js's dev dependencies, pinned by
    # its package-lock.json, where node looks for a package the folder
    # lacks: the web-backend example's express.
    (tmp / "package.json").write_text('{"private": true}\n')
    js_deps = support.REPO / "clients" / "js" / "node_modules"
    assert (js_deps / "express").is_dir(), \
        "%s lacks express: make test-js (npm ci in clients/js) installs it" % js_deps
    os.symlink(js_deps, tmp.parent / "node_modules")
    return tmp


def console_commands(text):
    """The $ lines of a console block (a trailing \\ continues a command),
    and what the block shows they print."""
    cmds, shown, cont = [], [], False
    for l in text.splitlines():
        if cont or l.startswith("$ "):
            cmds.append(l if cont else l[2:])
            cont = l.rstrip().endswith("\\")
        else:
            shown.append(l)
    return "\n".join(cmds) + "\n", "\n".join(shown)


def script_for(blocks, ports, wd, torch_ok):
    """One bash script running the blocks in order, each between markers
    that carry its index and, at its end, its status."""
    lines = ["exec 2>&1", "set -e"]
    for i, b in enumerate(blocks):
        if not b.runs(torch_ok):
            continue
        text = ports.rewrite(b.text)
        lines.append("echo '@@docs-block %d start@@'" % i)
        if b.kind == "sh":
            lines.append(text)
        elif b.kind == "console":
            lines.append(console_commands(text)[0])
        elif b.kind == "python":
            (wd / ("block%d.py" % i)).write_text(text)
            torch_python = b.marker == "needs python3-torch" and not isinstance(torch_ok, bool)
            lines.append("%s block%d.py" % (shlex.quote(torch_ok.python) if torch_python
                                            else "python3", i))
        elif b.kind == "js":
            (wd / ("block%d.mjs" % i)).write_text(text)
            lines.append("node block%d.mjs" % i)
        lines.append("echo '@@docs-block %d end@@'" % i)
    return "\n".join(lines) + "\n"


def run_file(path, default, tmp, torch_ok):
    blocks, problems = read_blocks(path)
    wd = workdir(tmp)
    ports = PortMap(default.port, default.grpc_port)
    script = script_for(blocks, ports, wd, torch_ok)
    (wd / "docs.sh").write_text(script)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("ATTND_") and k != "OPENBLAS_CORETYPE"}
    venv_bin = str(Path(sys.executable).parent)
    env["PATH"] = venv_bin + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["VIRTUAL_ENV"] = str(Path(venv_bin).parent)
    # a daemon a block starts without naming its gRPC port picks a free one,
    # so that it never meets the default daemon's (or another's) on 8081
    env["ATTND_GRPC_PORT"] = "-1"
    # output to a file, not a pipe: a daemon a block leaves running must not
    # hold the test until it ends
    with open(wd / "docs.out", "wb") as out:
        p = subprocess.Popen(["bash", "docs.sh"], cwd=wd, env=env, stdout=out,
                             stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            p.wait(timeout=FILE_TIMEOUT)
        except subprocess.TimeoutExpired:
            problems.append("%s: the blocks did not finish within %d s" % (path.name,
                                                                           FILE_TIMEOUT))
        finally:  # whatever a block left running, in the script's own process group
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    text = (wd / "docs.out").read_bytes().decode(errors="replace")
    for m in re.finditer(r"@@docs-block (\d+) start@@\n(.*?)(?:@@docs-block \1 end@@|\Z)",
                         text, re.S):
        b = blocks[int(m.group(1))]
        b.out = m.group(2)
        b.rc = 0 if m.group(0).endswith("end@@") else p.returncode
    return blocks, problems


def check_blocks(blocks, torch_ok):
    """Every block ran, ended well and printed what the docs show."""
    problems = []
    for b in blocks:
        if not b.runs(torch_ok):
            continue
        if b.out is None:
            problems.append("%s: never ran (an earlier block failed)" % b.where)
            continue
        if b.rc != 0:
            problems.append("%s: exit status %s; it printed:\n%s" % (b.where, b.rc, b.out[-3000:]))
            continue
        shown = [e.text for e in b.expected]
        if b.kind == "console":
            shown.append(console_commands(b.text)[1])
        shown = [s for s in shown if s.strip()]
        if '{"error"' in b.out and not any('{"error"' in s for s in shown):
            problems.append('%s: printed {"error" and its docs show no error:\n%s'
                            % (b.where, b.out[-3000:]))
        for s in shown:
            if not shows(s, b.out):
                problems.append("%s: the docs show\n%s\nbut it printed\n%s"
                                % (b.where, s, b.out[-3000:]))
    return problems


# ---------------------------------------------------------------- the tests

@pytest.fixture(scope="module")
def default(daemons):
    """The embedded default model on the port the docs call 8080."""
    return daemons()


@pytest.fixture(scope="module")
def json_logs(daemons):
    """A daemon logging JSON lines, with one request and one 404 logged."""
    d = daemons(args=["--log-format", "json"])
    assert d.post("/v1/attention", {"query": [[0.25] * 512]}).status_code == 200
    assert d.get("/no/such/route").status_code == 404
    # each access line is written once its answer is sent: wait for both
    assert support.wait_until(lambda: "/no/such/route" in d.stdout()
                              and '"path":"/v1/attention"' in d.stdout(), 10), d.stdout()[-2000:]
    return d


@pytest.fixture(scope="module")
def torch_ok():
    return Torch()


def test_node_is_installed():
    """The JavaScript blocks run with node (tests/deps.sh installs nodejs)."""
    assert shutil.which("node"), "node is missing: run make deps (nodejs)"


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_blocks_run(path, default, tmp_path, torch_ok):
    blocks, problems = run_file(path, default, tmp_path / "wd", torch_ok)
    problems += check_blocks(blocks, torch_ok)
    assert not problems, "\n\n".join(problems)
    assert default.alive(), default.logs()
    if any(b.marker == "needs python3-torch" and not b.runs(torch_ok) for b in blocks):
        pytest.skip("blocks marked <!-- needs python3-torch --> were left out: "
                    "apt-get install python3-torch runs them (Python ones with "
                    "ATTND_TORCH_PYTHON, which make test-blackbox sets)")


@pytest.mark.parametrize("path", DOCS, ids=[p.name for p in DOCS])
def test_logged_lines_have_the_real_form(path, default, json_logs):
    """Each line the docs show as logged has the form of a line a daemon
    wrote: the default model's (text) and a JSON-lines one."""
    assert default.post("/v1/attention", {"query": [[0.25] * 512]}).status_code == 200
    assert support.wait_until(lambda: "path=/v1/attention" in default.stdout(), 10)
    text_lines = [l for l in (default.stdout() + default.stderr()).splitlines() if l.strip()]
    json_lines = [l for l in (json_logs.stdout() + json_logs.stderr()).splitlines() if l.strip()]
    blocks, _ = read_blocks(path)
    problems = []
    for b in blocks:
        if b.marker != "logged":
            continue
        for l in b.text.splitlines():
            if not l.strip():
                continue
            pool = json_lines if l.lstrip().startswith("{") else text_lines
            if not logged_line_matches(l, pool):
                problems.append("%s: no logged line has the form of\n  %s\namong\n  %s"
                                % (b.where, l.strip(), "\n  ".join(pool[-12:])))
    assert not problems, "\n\n".join(problems)


def test_markers_and_fences(tmp_path):
    """The reading rules themselves: an indented block, a shown command, an
    unmarked block that cannot run, and an output that differs are each
    caught (a test of this test, on a made-up page)."""
    page = tmp_path / "page.md"
    page.write_text("# t\n\n    curl -s x\n\n```text\ncurl -s x\n```\n\n```\nx\n```\n\n"
                    "<!-- not run: a reason -->\n```sh\nfalse\n```\n\n"
                    "```sh\necho 'num 1.5'\n```\n\n<!-- output -->\n```text\nnum 1.50\n```\n")
    orig = support.REPO
    try:
        support.REPO = tmp_path
        blocks, problems = read_blocks(page)
    finally:
        support.REPO = orig
    assert any("indented" in p for p in problems), problems
    assert any("holds a command" in p for p in problems), problems
    assert any("without a language" in p for p in problems), problems
    assert [b.kind for b in blocks] == [None, None, "sh", "sh", None]
    run = blocks[3]
    assert run.expected == [blocks[4]]
    run.out, run.rc = "num 1.51\n", 0
    assert check_blocks([run], True), "1.51 must not match 1.50"
    run.out = "num 11.5\n"
    assert check_blocks([run], True), "11.5 must not match 1.50"
    run.out = "num 1.5000001\n"
    assert not check_blocks([run], True)
    run.out = 'num 1.50 {"error":"x"}'
    assert any("{\"error\"" in p for p in check_blocks([run], True))
    assert logged_line_matches("2026-01-01T00:00:00.000Z info x=1 id=0123456789abcdef",
                               ["2030-12-31T23:59:59.999Z info x=250 id=fedcba9876543210"])
    assert not logged_line_matches("2026-01-01T00:00:00.000Z info x=1",
                                   ["2030-12-31T23:59:59.999Z warn x=1"])
