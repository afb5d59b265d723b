-- wrk_post.lua - POSTs the JSON file $BODY on every request and prints one
-- line: RESULT req/s p50_ms p99_ms errors requests
local f = assert(io.open(os.getenv("BODY"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
function done(summary, latency, requests)
    local e = summary.errors
    io.write(string.format("RESULT %.1f %.3f %.3f %d %d\n",
        summary.requests / (summary.duration / 1e6),
        latency:percentile(50) / 1000, latency:percentile(99) / 1000,
        e.status + e.connect + e.read + e.write + e.timeout, summary.requests))
end
