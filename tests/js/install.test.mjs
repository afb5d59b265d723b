// The package as a user gets it: `npm pack` of clients/js installed into an
// empty project holds the module, its types and its README alone, and runs
// the first JavaScript example of docs/clients.md, which prints what the
// docs show; its types compile a use of every call under tsc --strict
// (types/ok.ts) and refuse each misuse of types/misuse.ts.
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, test } from "node:test";
import { REPO, startDaemon } from "./support.mjs";

const TSC = process.env.ATTND_TSC ?? join(REPO, "clients", "js", "node_modules", ".bin", "tsc");
let project, d;

before(async () => {
  project = mkdtempSync(join(tmpdir(), "attnd-js-project-"));
  const npm = (...args) => execFileSync("npm", ["--no-audit", "--no-fund", "--loglevel=error", ...args],
    { cwd: project, encoding: "utf8" });
  npm("pack", join(REPO, "clients", "js"));
  const tarball = readdirSync(project).find((f) => f.endsWith(".tgz"));
  npm("install", "--offline", "./" + tarball);
  // an ES module project, as the docs' examples are (import, top-level await)
  const pkg = JSON.parse(readFileSync(join(project, "package.json"), "utf8"));
  writeFileSync(join(project, "package.json"), JSON.stringify({ ...pkg, type: "module" }));
  d = await startDaemon();
});
after(async () => {
  await d?.stop();
  if (project) rmSync(project, { recursive: true, force: true });
});

test("the tarball holds the module, its types and its README", () => {
  const files = readdirSync(join(project, "node_modules", "attnd")).sort();
  assert.deepEqual(files, ["README.md", "index.d.ts", "index.js", "package.json"]);
  const pkg = JSON.parse(readFileSync(join(project, "node_modules", "attnd", "package.json"), "utf8"));
  assert.deepEqual(Object.keys(pkg.dependencies ?? {}), [], "a runtime dependency");
  assert.equal(pkg.type, "module");
});

/** The first ```js block of the JavaScript part of docs/clients.md and
 * the ```text block it is shown to print. */
function firstExample() {
  const doc = readFileSync(join(REPO, "docs", "clients.md"), "utf8");
  const part = doc.slice(doc.indexOf("# JavaScript"));
  const m = /```js\n([\s\S]*?)```\s*<!-- output -->\s*```text\n([\s\S]*?)```/.exec(part);
  assert.ok(m, "no ```js block followed by its output in docs/clients.md's JavaScript part");
  return { code: m[1], shown: m[2] };
}

test("a fresh install runs the docs' first example and prints what they show", () => {
  const { code, shown } = firstExample();
  writeFileSync(join(project, "example.mjs"), code.replaceAll("127.0.0.1:8080", `127.0.0.1:${d.port}`));
  const r = spawnSync("node", ["example.mjs"], { cwd: project, encoding: "utf8", timeout: 60000 });
  assert.equal(r.status, 0, r.stderr);
  const squeeze = (t) => t.replace(/\s+/g, " ").trim();
  assert.equal(squeeze(r.stdout), squeeze(shown));
});

function tsc(file) {
  copyFileSync(join(REPO, "tests", "js", "types", file), join(project, file));
  return spawnSync(TSC, ["--noEmit", "--strict", "--target", "es2022", "--module", "nodenext",
    "--moduleResolution", "nodenext", "--lib", "es2022,dom", file], { cwd: project, encoding: "utf8" });
}

test("the documented API compiles with tsc --noEmit --strict", () => {
  const r = tsc("ok.ts");
  assert.equal(r.status, 0, r.stdout + r.stderr);
});

test("each misuse fails to compile, and nothing else in that file", () => {
  const r = tsc("misuse.ts");
  assert.notEqual(r.status, 0, "the misuses compiled");
  const lines = readFileSync(join(REPO, "tests", "js", "types", "misuse.ts"), "utf8").split("\n");
  const marked = lines.flatMap((l, i) => (/\/\/ misuse/.test(l) ? [i + 1] : []));
  const errors = [...r.stdout.matchAll(/^misuse\.ts\((\d+),\d+\): error TS\d+/gm)].map((m) => Number(m[1]));
  assert.ok(marked.length >= 10);
  for (const line of marked) assert.ok(errors.includes(line), `line ${line} compiled: ${lines[line - 1].trim()}\n${r.stdout}`);
  for (const line of errors) assert.ok(marked.includes(line), `an error on an unmarked line ${line}:\n${r.stdout}`);
});

test("npm install of the folder itself works as well", () => {
  const dir = mkdtempSync(join(tmpdir(), "attnd-js-folder-"));
  try {
    execFileSync("npm", ["--no-audit", "--no-fund", "--loglevel=error", "install", "--offline",
      join(REPO, "clients", "js")], { cwd: dir, encoding: "utf8" });
    writeFileSync(join(dir, "use.mjs"), 'import { Client, AttndError, version } from "attnd";\n' +
      "console.log(typeof Client, typeof AttndError, version);\n");
    const r = spawnSync("node", ["use.mjs"], { cwd: dir, encoding: "utf8" });
    assert.equal(r.status, 0, r.stderr);
    const pkg = JSON.parse(readFileSync(join(REPO, "clients", "js", "package.json"), "utf8"));
    assert.equal(r.stdout.trim(), `function function ${pkg.version}`);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
