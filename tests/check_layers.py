#!/usr/bin/env python3
"""The shape of the code, checked from the build (docs/architecture.md).

  tests/check_layers.py BUILD_DIR

Reads which file calls which from the objects under BUILD_DIR (nm: the
symbols each object defines and the ones it needs) and which file includes
which from the sources, over core/, config/ and server/. A header and the
.c file of the same name in the same folder are one module (the header
declares what the .c defines). Fails, naming the files, when:

  - modules call or include each other in a cycle, in the whole tree, in
    server/ alone or in core/ alone;
  - a file calls or includes one of a higher layer: core/ below config/
    below server/, and inside core/ the folders in LAYERS' order;
  - a function is longer than MAX_FUNCTION lines, or a file than MAX_FILE
    (production C only: core/, config/, server/).

Prints the layers it found, so a reader sees the stack as built.
"""
import os
import re
import subprocess
import sys

ROOTS = ("core", "config", "server")
# core/'s layers, lowest first. A file directly in core/ (attn.h, sizes.h)
# is the API: types every layer may include, layer 0.
CORE_LAYERS = ["platform", "prim", "kernels", "ops", "select", "tasks", "forward"]
MAX_FUNCTION = 60
MAX_FILE = 900


def sources(top):
    out = []
    for root in ROOTS:
        for d, _, files in os.walk(os.path.join(top, root)):
            out += [os.path.relpath(os.path.join(d, f), top) for f in files if f.endswith((".c", ".h"))]
    return sorted(out)


def module(path):
    return os.path.splitext(path)[0]


def layer(path):
    """(tree rank, core rank): compared as a tuple, lower is lower."""
    parts = path.split(os.sep)
    tree = ROOTS.index(parts[0])
    if parts[0] != "core" or len(parts) == 2:
        return (tree, 0)
    return (tree, 1 + CORE_LAYERS.index(parts[1]))


def include_edges(top, files):
    edges = set()
    known = set(files)
    for f in files:
        text = open(os.path.join(top, f), errors="replace").read()
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            target = os.path.normpath(os.path.join(os.path.dirname(f), inc))
            if target in known:
                edges.add((f, target, "includes"))
            elif not inc.endswith((".inc",)):
                # a file given by its path from the root would be found too
                alt = os.path.normpath(inc)
                if alt in known:
                    edges.add((f, alt, "includes"))
    return edges


def nm(obj, *flags):
    r = subprocess.run(["nm", *flags, obj], capture_output=True, text=True, check=True)
    return r.stdout.splitlines()


def call_edges(top, build, files):
    defined, needed = {}, {}
    for f in files:
        if not f.endswith(".c"):
            continue
        obj = os.path.join(build, os.path.splitext(f)[0] + ".o")
        if not os.path.exists(obj):
            sys.exit(f"check_layers: {obj} is missing: build first (make all)")
        needed[f] = set()
        for line in nm(obj):
            parts = line.split()
            if len(parts) == 2 and parts[0] == "U":
                needed[f].add(parts[1])
            elif len(parts) == 3 and parts[1] in "TDBRVWGS" and parts[1].isupper():
                defined.setdefault(parts[2], f)
    edges = set()
    for f, syms in needed.items():
        for s in syms:
            g = defined.get(s)
            if g and g != f:
                edges.add((f, g, "calls " + s))
    return edges


def cycles(edges, keep):
    """Strongly connected components of more than one module among the
    modules for which keep(module) holds, with one edge of each as proof."""
    graph = {}
    why = {}
    for a, b, how in edges:
        ma, mb = module(a), module(b)
        if ma == mb or not (keep(a) and keep(b)):
            continue
        graph.setdefault(ma, set()).add(mb)
        graph.setdefault(mb, set())
        why.setdefault((ma, mb), f"{a} {how} ({b})")
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                inside = set(comp)
                proof = [why[(x, y)] for x in sorted(inside) for y in sorted(graph[x]) if y in inside]
                out.append((sorted(comp), proof))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def upward(edges):
    bad = []
    for a, b, how in sorted(edges):
        if module(a) != module(b) and layer(a) < layer(b):
            bad.append(f"{a} {how} ({b}), a higher layer")
    return bad


def strip_c(src):
    """Comments and string contents blanked, newlines kept."""
    def blank(m):
        return re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', blank, src, flags=re.S)


def long_functions(top, files):
    bad = []
    for f in files:
        raw = open(os.path.join(top, f), errors="replace").read()
        lines = raw.split("\n")
        if len(lines) - (1 if raw.endswith("\n") else 0) > MAX_FILE:
            bad.append(f"{f}: {len(lines) - 1} lines, more than {MAX_FILE}")
        if not f.endswith(".c"):
            continue
        code = strip_c(raw).split("\n")
        depth, start = 0, None
        for n, line in enumerate(code):
            if line.lstrip().startswith("#"):
                continue
            for ch in line:
                if ch == "{":
                    if depth == 0:
                        before = " ".join(code[max(0, n - 6):n] + [line[: line.index("{")]])
                        is_fn = re.search(r"\)\s*(__attribute__\s*\(\(.*\)\)\s*)?$", before) and not re.search(r"=\s*$", before)
                        if is_fn:
                            s = n
                            while s > 0 and code[s - 1].strip() and not code[s - 1].rstrip().endswith((";", "}", "*/")) \
                                    and not code[s - 1].lstrip().startswith("#"):
                                s -= 1
                            start = s
                        else:
                            start = None
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0 and start is not None:
                        length = n - start + 1
                        if length > MAX_FUNCTION:
                            name = re.findall(r"(\w+)\s*\(", " ".join(code[start:n + 1]))
                            name = next((x for x in name if x not in ("__attribute__", "target")), "?")
                            bad.append(f"{f}:{start + 1}: {name} is {length} lines, more than {MAX_FUNCTION}")
                        start = None
    return bad


def main():
    top = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    build = sys.argv[1] if len(sys.argv) > 1 else os.path.join(top, "build")
    files = sources(top)
    edges = include_edges(top, files) | call_edges(top, build, files)
    problems = []
    for name, keep in (("the tree", lambda f: True),
                       ("server/", lambda f: f.startswith("server" + os.sep)),
                       ("core/", lambda f: f.startswith("core" + os.sep))):
        for comp, proof in cycles(edges, keep):
            problems.append(f"a cycle in {name}: {' -> '.join(comp)}\n    " + "\n    ".join(proof))
    problems += upward(edges)
    problems += long_functions(top, files)
    layers = {}
    for f in files:
        layers.setdefault(layer(f), []).append(f)
    for key in sorted(layers):
        print(f"layer {key}: {len(layers[key])} files")
    print(f"{len(edges)} calls and includes between {len(files)} files")
    for p in problems:
        print("FAIL:", p)
    print(f"{0 if problems else 1} passed, {1 if problems else 0} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
