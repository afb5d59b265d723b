#!/bin/sh
# bench_json.sh - small JSON requests (L=16, E=512, the default model, the
# body as curl or a web backend sends it: decimal numbers) over HTTP on
# 127.0.0.1, printed as tables:
#   1. attnd with batching on (the defaults) and off (max_batch_requests 1),
#      a layer of the same shape drawn here as an fp32 model and as a bf16
#      one ("precision": "bf16"; the same weights, so the two compare on the
#      same numbers), batching on, and the plain FastAPI + torch way of
#      serving the same layer
#      (bench/fastapi_server.py, one uvicorn worker per core), each with wrk
#      at 64 connections: requests/s, p50, p99; then the ratios;
#   2. where attnd's CPU goes for those requests, by phase (HTTP, parse,
#      validate, queue, pack, compute, write, libc, kernel), from `perf
#      record` (cpu-clock samples) of the daemon during a batching-on run,
#      each sampled function put in its phase by its source file and name.
# Numbers only; nothing is asserted. Run by `make bench-http`.
# Env: ATTND_BIN (build/attnd), BENCH_SECONDS (10), BENCH_VENV
# (build/bench-venv: made with Debian's python so that it sees Debian's
# torch, FastAPI and uvicorn pinned in bench/requirements.txt).
set -eu

BIN=${ATTND_BIN:-build/attnd}
DUR=${BENCH_SECONDS:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${BENCH_VENV:-build/bench-venv}
TMP=$(mktemp -d)
PID=""

cleanup() {
    if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

for tool in wrk curl /usr/bin/python3; do
    command -v "$tool" >/dev/null 2>&1 || { echo "bench_json: $tool is missing" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "bench_json: $BIN is missing: run make" >&2; exit 1; }
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import fastapi, uvicorn, torch' 2>/dev/null; then
    /usr/bin/python3 -m venv --system-site-packages "$VENV"
    "$VENV/bin/pip" install -q -r "$HERE/requirements.txt"
fi
PY="$(cd "$VENV/bin" && pwd)/python"

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# wait_up: until GET /health answers, or fail
wait_up() {
    i=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 600 ] || ! kill -0 "$PID" 2>/dev/null; then
            echo "bench_json: the server did not start:" >&2
            cat "$TMP/server.log" >&2
            exit 1
        fi
        sleep 0.1
    done
}

# start_attnd [VAR=value ...] [-- FLAG ...]: the daemon, its environment,
# then its flags
start_attnd() {
    PORT=$(free_port)
    vars=""
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do vars="$vars $1"; shift; done
    [ $# -gt 0 ] && shift
    # shellcheck disable=SC2086
    env $vars "$BIN" --host 127.0.0.1 --port "$PORT" --grpc-port 0 "$@" >"$TMP/server.log" 2>&1 &
    PID=$!
    wait_up
}

start_fastapi() {
    PORT=$(free_port)
    (cd "$HERE" && exec "$PY" fastapi_server.py "$PORT" "$(nproc)") >"$TMP/server.log" 2>&1 &
    PID=$!
    wait_up
}

stop() {
    kill -TERM "$PID"
    wait "$PID" || true
    PID=""
}

"$PY" - "$TMP" <<'EOF'
import json, random, sys
rnd = random.Random(1234)
q = [[round(rnd.uniform(-1, 1), 6) for _ in range(512)] for _ in range(16)]
open(sys.argv[1] + "/small.json", "w").write(json.dumps({"query": q}))
EOF

# a layer of the default model's shape (E=512, H=8), one config as fp32 and
# one as bf16
"$PY" - "$TMP" "$HERE/../config" <<'EOF'
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[2])
from safetensors_header import safetensors_bytes
rng = np.random.default_rng(5)
E = 512
t = [("in_proj_weight", rng.uniform(-1, 1, (3 * E, E)) * (1.5 / E) ** 0.5),
     ("in_proj_bias", np.zeros(3 * E)), ("out_proj.weight", rng.uniform(-1, 1, (E, E)) / E ** 0.5),
     ("out_proj.bias", np.zeros(E))]
data = safetensors_bytes([(n, "F32", a.shape, a.astype("<f4").tobytes()) for n, a in t])
open(sys.argv[1] + "/layer.safetensors", "wb").write(data)
for p in ("bf16", "fp32"):
    m = {"name": "layer", "embed_dim": E, "num_heads": 8, "weights": "layer.safetensors",
         "precision": p}
    open(sys.argv[1] + "/%s.json" % p, "w").write(json.dumps({"models": [m]}))
EOF

# run LABEL: warm-up, then the measured run; one table row
run() {
    BODY="$TMP/small.json" wrk -t2 -c64 -d2s --timeout 10s -s "$HERE/wrk_post.lua" \
        "http://127.0.0.1:$PORT/v1/attention" >/dev/null
    if [ "${PROFILE:-0}" = 1 ] && command -v perf >/dev/null 2>&1; then
        perf record -e cpu-clock -F 999 -p "$PID" -o "$TMP/perf.data" -- sleep "$DUR" \
            >/dev/null 2>&1 &
        PERF=$!
    fi
    out=$(BODY="$TMP/small.json" wrk -t2 -c64 -d"${DUR}s" --timeout 10s -s "$HERE/wrk_post.lua" \
        "http://127.0.0.1:$PORT/v1/attention" | grep '^RESULT')
    if [ -n "${PERF:-}" ]; then wait "$PERF" || true; PERF=""; fi
    echo "$out" | awk -v l="$1" '{
        printf "| %-26s | %8.1f | %7.2f | %7.2f | %7.2f | %6d |\n",
            l, $2, $3, $4, ($3 > 0 ? $4 / $3 : 0), $5 }' | tee -a "$TMP/rows"
}

echo "small JSON requests (16×512, $(wc -c <"$TMP/small.json") bytes), $(nproc) cores," \
    "wrk 64 connections, ${DUR}s per row"
echo
echo "| server                     | req/s    | p50 ms  | p99 ms  | p99/p50 | errors |"
echo "|----------------------------|----------|---------|---------|---------|--------|"
: >"$TMP/rows"
start_attnd
PROFILE=1 run "attnd, batching on"
stop
start_attnd ATTND_MAX_BATCH_REQUESTS=1
run "attnd, batching off"
stop
start_attnd -- --config "$TMP/fp32.json"
run "attnd, drawn layer, fp32"
stop
start_attnd -- --config "$TMP/bf16.json"
KERNELS=$(grep -o 'on [a-z0-9-]* kernels' "$TMP/server.log" | head -1 | cut -d' ' -f2)
run "attnd, drawn layer, bf16 (${KERNELS:-fp32})"
stop
start_fastapi
run "FastAPI + torch ($(nproc) workers)"
stop
echo
awk '{ gsub(/\|/, " "); r[NR] = $0; n = split($0, f, " "); v[NR] = f[n - 4] }
     END { printf "attnd (batching on) / FastAPI + torch: %.1fx\n", v[1] / v[5];
           printf "batching on / off: %.2fx\n", v[1] / v[2];
           printf "drawn layer, bf16 / fp32: %.2fx\n", v[4] / v[3] }' "$TMP/rows"

if [ -f "$TMP/perf.data" ]; then
    echo
    echo "where attnd's CPU went in the batching-on run (perf cpu-clock samples)"
    echo
    perf report -i "$TMP/perf.data" --no-children --sort dso,sym --stdio 2>/dev/null \
        | grep -E '^ +[0-9.]+%' >"$TMP/syms" || true
    nm -l --defined-only "$BIN" 2>/dev/null >"$TMP/nm" || true
    "$PY" - "$TMP/syms" "$TMP/nm" <<'EOF'
import re, sys
files = {}
for line in open(sys.argv[2]):
    p = line.split()
    if len(p) >= 4 and ":" in p[3]:
        files[p[2]] = p[3].split(":")[0]
PARSE = ("jsonin.c", "tensor.c", "base64.c")
def phase(dso, sym):
    if "kernel" in dso:
        return "kernel (network, scheduling)"
    if "microhttpd" in dso:
        return "HTTP (libmicrohttpd)"
    if "openblas" in dso or "libgomp" in dso:
        return "compute"
    if "libc" in dso or "libm" in dso:
        return "libc (malloc, memcpy: body copy, buffers)"
    f = files.get(sym, "")
    if "/core/" in f:
        return "compute"
    if f.endswith(PARSE) or re.match(r"(parse_|scan_|f32_at|decode_lines|jin_)", sym):
        return "parse"
    if f.endswith("floattext.c"):
        return "write" if re.match(r"(attnd_fmt_|attnd_sb_floats|tensor_json|attnd_sb_tensor)", sym) else "parse"
    if f.endswith("request.c"):
        if re.match(r"(attnd_write_answer|write_|put_)", sym):
            return "write"
        if re.match(r"(build_job|resolve_model|file_v2_input|take_binary)", sym):
            return "validate"
        return "parse"
    if f.endswith(("buffer.c", "utf8.c")):
        return "write"
    if f.endswith("sched.c"):
        if re.match(r"(pack|describe_sequences|alloc_attention|reserve|measure)", sym):
            return "pack"
        if re.match(r"(answer_|deliver)", sym):
            return "write"
        return "queue"
    if f.endswith(("http.c", "guard.c", "httperr.c", "log.c", "metrics.c", "routes.c")):
        return "HTTP (attnd's handler, log, metrics)"
    return "other"
total = {}
for line in open(sys.argv[1]):
    m = re.match(r"\s*([0-9.]+)%\s+(\S+)\s+\[.\]\s+(.*)$", line)
    if not m:
        continue
    pct, dso, sym = float(m.group(1)), m.group(2), m.group(3).strip()
    ph = phase(dso, sym)
    total[ph] = total.get(ph, 0) + pct
print("| phase | % of attnd's CPU |")
print("|---|---|")
for ph, pct in sorted(total.items(), key=lambda x: -x[1]):
    print("| %s | %.1f |" % (ph, pct))
EOF
fi
