#!/bin/sh
# bench_http.sh - attnd over HTTP on 127.0.0.1, at its defaults, as tables:
#   1. small requests (L=16, E=512, the default model) at 64 connections with
#      wrk: requests/s, p50, p99, mean batch; JSON and base64 bodies, and
#      batching off; with BASELINE_BIN (an older build, which split the CPUs
#      as workers x blas_threads) also its 2 x 1 and 1 x 2 splits;
#   2. a lone small request on a kept-alive connection: round trip, queue
#      wait and compute time (usage);
#   3. lone large requests (B=1, L=512, E=1024, H=16 in base64; L=4096 on
#      the default model in base64 and in JSON): round trip against the
#      core's all-thread compute time (usage.compute_us), medians of 9;
#   4. twins: one 512-wide, 8-head layer served as fp32, bf16 and int8
#      models (the same weights), small requests in base64 at 64 connections,
#      with the kernels each ran (GET /v1/models);
#   5. the codec costs on their own (build/bench/bench_codec).
# Numbers only; nothing is asserted. Run by `make bench-http`.
# Env: ATTND_BIN (build/attnd), BENCH_SECONDS (10), PYTHON (python3),
# BASELINE_BIN (optional).
set -eu

BIN=${ATTND_BIN:-build/attnd}
PY=${PYTHON:-python3}
DUR=${BENCH_SECONDS:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d)
PID=""

cleanup() {
    if [ -n "$PID" ]; then kill -TERM "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

for tool in wrk curl "$PY"; do
    command -v "$tool" >/dev/null 2>&1 || { echo "bench_http: $tool is missing" >&2; exit 1; }
done
[ -x "$BIN" ] || { echo "bench_http: $BIN is missing: run make" >&2; exit 1; }

free_port() {
    "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start ENV... -- ARGS...: starts the daemon, waits for /health
start() {
    PORT=$(free_port)
    env "$@" "$BIN" --host 127.0.0.1 --port "$PORT" --grpc-port 0 >"$TMP/daemon.log" 2>&1 &
    PID=$!
    i=0
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 300 ] || ! kill -0 "$PID" 2>/dev/null; then
            echo "bench_http: the daemon did not start:" >&2
            cat "$TMP/daemon.log" >&2
            exit 1
        fi
        sleep 0.1
    done
}

stop() {
    kill -TERM "$PID"
    wait "$PID" || true
    PID=""
}

# The bodies and the large model's weights, from a fixed seed.
"$PY" - "$TMP" "$HERE/../config" <<'EOF'
import array, base64, json, random, sys
tmp = sys.argv[1]
sys.path.insert(0, sys.argv[2])
from safetensors_header import safetensors_bytes
rnd = random.Random(1234)
q = [[round(rnd.uniform(-1, 1), 6) for _ in range(512)] for _ in range(16)]
open(tmp + "/small.json", "w").write(json.dumps({"query": q}))
flat = array.array("f", (x for row in q for x in row))
open(tmp + "/small.base64", "w").write(json.dumps({
    "query": {"shape": [16, 512], "dtype": "float32", "b64": base64.b64encode(flat.tobytes()).decode()},
    "encoding": "base64"}))
# large: (1, 512, 1024) float32 in base64
big = array.array("f", (rnd.uniform(-1, 1) for _ in range(512 * 1024)))
open(tmp + "/large.json", "w").write(json.dumps({
    "query": {"shape": [1, 512, 1024], "dtype": "float32",
              "b64": base64.b64encode(big.tobytes()).decode()},
    "encoding": "base64"}))
# long: (1, 4096, 512) on the default model, as JSON numbers and in base64
lq = [round(rnd.uniform(-1, 1), 6) for _ in range(4096 * 512)]
open(tmp + "/long.json", "w").write(json.dumps({"query": [lq[i:i + 512] for i in range(0, len(lq), 512)]}))
open(tmp + "/long.base64", "w").write(json.dumps({
    "query": {"shape": [4096, 512], "dtype": "float32",
              "b64": base64.b64encode(array.array("f", lq).tobytes()).decode()},
    "encoding": "base64"}))
# weights of a 1024-wide, 16-head layer as safetensors (torch's names)
E = 1024
def tensor(n, bound):
    return array.array("f", (rnd.uniform(-bound, bound) for _ in range(n))).tobytes()
parts = [("in_proj_weight", [3 * E, E], tensor(3 * E * E, (6 / (4 * E)) ** 0.5)),
         ("in_proj_bias", [3 * E], bytes(4 * 3 * E)),
         ("out_proj.weight", [E, E], tensor(E * E, 1 / E ** 0.5)),
         ("out_proj.bias", [E], bytes(4 * E))]
with open(tmp + "/large.safetensors", "wb") as f:
    f.write(safetensors_bytes([(name, "F32", shape, data) for name, shape, data in parts]))
json.dump({"models": [{"name": "large", "embed_dim": E, "num_heads": 16,
                       "weights": tmp + "/large.safetensors"}]},
          open(tmp + "/large_config.json", "w"))
# twins: one 512-wide, 8-head layer as fp32, bf16 and int8 models
E = 512
parts = [("in_proj_weight", [3 * E, E], tensor(3 * E * E, (6 / (4 * E)) ** 0.5)),
         ("in_proj_bias", [3 * E], tensor(3 * E, 0.1)),
         ("out_proj.weight", [E, E], tensor(E * E, 1 / E ** 0.5)),
         ("out_proj.bias", [E], tensor(E, 0.1))]
with open(tmp + "/twin.safetensors", "wb") as f:
    f.write(safetensors_bytes([(name, "F32", shape, data) for name, shape, data in parts]))
json.dump({"models": [{"name": "twin-" + p, "embed_dim": E, "num_heads": 8, "precision": p,
                       "weights": tmp + "/twin.safetensors"} for p in ("fp32", "bf16", "int8")]},
          open(tmp + "/twin_config.json", "w"))
EOF

echo "attnd HTTP benchmark: $(nproc) cores, $BIN, wrk 64 connections for ${DUR}s per row"
echo
echo "| small requests (16×512, default model)   | req/s    | p50 ms  | p99 ms  | p99/p50 | errors | mean batch |"
echo "|------------------------------------------|----------|---------|---------|---------|--------|------------|"
# small_row LABEL ENCODING [VAR=value...]: one wrk row against a fresh daemon
small_row() {
    label=$1 enc=$2
    shift 2
    start "$@"
    # warm-up, then the measured run
    BODY="$TMP/small.$enc" wrk -t2 -c64 -d2s --timeout 10s -s "$HERE/wrk_post.lua" \
        "http://127.0.0.1:$PORT/v1/attention" >/dev/null
    b0=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^attnd_batch_size_(sum|count) /{printf "%s ", $2}')
    out=$(BODY="$TMP/small.$enc" wrk -t2 -c64 -d"${DUR}s" --timeout 10s -s "$HERE/wrk_post.lua" \
        "http://127.0.0.1:$PORT/v1/attention" | grep '^RESULT')
    b1=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '/^attnd_batch_size_(sum|count) /{printf "%s ", $2}')
    stop
    echo "$out $b0 $b1" | awk -v label="$label" '{
        mb = ($10 - $8) > 0 ? ($9 - $7) / ($10 - $8) : 0;
        printf "| %-40s | %8.1f | %7.2f | %7.2f | %7.2f | %6d | %10.1f |\n",
            label, $2, $3, $4, ($3 > 0 ? $4 / $3 : 0), $5, mb }'
}
small_row "defaults, json" json
small_row "defaults, base64" base64
small_row "batching off, json" json ATTND_MAX_BATCH_REQUESTS=1
# the old static split, when an older build is given (it had no single pool):
# workers x blas_threads = 2 x 1 (its default) and 1 x 2
if [ -n "${BASELINE_BIN:-}" ]; then
    NEWBIN=$BIN
    BIN=$BASELINE_BIN
    small_row "older build: workers 2 x blas 1, json" json ATTND_WORKERS=2 ATTND_BLAS_THREADS=1
    small_row "older build: workers 1 x blas 2, json" json ATTND_WORKERS=1 ATTND_BLAS_THREADS=2
    BIN=$NEWBIN
fi

echo
echo "| lone small request (16×512, json), keep-alive | round trip ms | queue µs | compute ms | round trip / compute |"
echo "|-----------------------------------------------|---------------|----------|------------|----------------------|"
start
"$PY" - "$PORT" "$TMP/small.json" <<'PYEOF2'
import http.client, json, statistics, sys, time
port, path = int(sys.argv[1]), sys.argv[2]
body = open(path, "rb").read()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
rt, q, c = [], [], []
for i in range(41):
    t0 = time.perf_counter()
    conn.request("POST", "/v1/attention", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    t = time.perf_counter() - t0
    assert r.status == 200, data[:200]
    u = json.loads(data)["usage"]
    if i:
        rt.append(t * 1e3); q.append(u["queue_us"]); c.append(u["compute_us"] / 1e3)
m = statistics.median
print("| median of %d, defaults %-23s | %13.2f | %8.0f | %10.3f | %20.1f |" % (len(rt), "", m(rt), m(q), m(c), m(rt) / m(c)))
PYEOF2
stop
echo
echo "| lone large request, defaults              | round trip ms | compute ms (usage) | ratio |"
echo "|--------------------------------------------|---------------|--------------------|-------|"
# large_row LABEL BODY [VAR=value...]: ten requests on a kept-alive client
large_row() {
    label=$1 body=$2
    shift 2
    start "$@"
    # a keep-alive client, as a backend would hold one; the first answer warms up
    "$PY" - "$PORT" "$body" "$label" <<'PYEOF'
import http.client, json, sys, time
port, path, label = int(sys.argv[1]), sys.argv[2], sys.argv[3]
body = open(path, "rb").read()
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
runs = []
for i in range(10):
    t0 = time.perf_counter()
    conn.request("POST", "/v1/attention", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    t = time.perf_counter() - t0
    assert r.status == 200, data[:200]
    c = json.loads(data)["usage"]["compute_us"] / 1e6
    if i:
        runs.append((t / c, t * 1e3, c * 1e3))
runs.sort()
ratio, rt, cu = runs[len(runs) // 2]
print("| %-42s | %13.1f | %18.1f | %5.2f |" % (label, rt, cu, ratio))
PYEOF
    stop
}
large_row "1×512×1024, H=16, base64" "$TMP/large.json" ATTND_CONFIG="$TMP/large_config.json"
large_row "1×4096×512, default model, base64" "$TMP/long.base64"
large_row "1×4096×512, default model, json" "$TMP/long.json"

echo
echo "| twins, small requests (16×512, base64), 64 conns | req/s    | p50 ms  | p99 ms  | errors | kernels        |"
echo "|--------------------------------------------------|----------|---------|---------|--------|----------------|"
# one daemon serves the three twins; each row a warm-up and a measured run
start ATTND_CONFIG="$TMP/twin_config.json"
models=$(curl -s "http://127.0.0.1:$PORT/v1/models")
for prec in fp32 bf16 int8; do
    url="http://127.0.0.1:$PORT/v1/models/twin-$prec/attention"
    BODY="$TMP/small.base64" wrk -t2 -c64 -d2s --timeout 10s -s "$HERE/wrk_post.lua" "$url" >/dev/null
    out=$(BODY="$TMP/small.base64" wrk -t2 -c64 -d"${DUR}s" --timeout 10s -s "$HERE/wrk_post.lua" "$url" | grep '^RESULT')
    kern=$(echo "$models" | "$PY" -c '
import json, sys
root = json.load(sys.stdin)
m = {x["name"]: x for x in root["models"]}[sys.argv[1]]
eff, c = m.get("effective_precision", "?"), root.get("compute", {})
print(eff + {"int8": " " + c.get("int8_kernels", "?"), "bf16": " " + c.get("bf16_kernels", "?")}.get(eff, ""))
' "twin-$prec")
    echo "$out" | awk -v label="twin-$prec" -v k="$kern" '{
        printf "| %-48s | %8.1f | %7.2f | %7.2f | %6d | %-14s |\n", label, $2, $3, $4, $5, k }'
done
stop

echo
if [ -x "${BENCH_CODEC:-build/bench/bench_codec}" ]; then
    "${BENCH_CODEC:-build/bench/bench_codec}"
fi
