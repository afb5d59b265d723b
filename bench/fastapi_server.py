"""fastapi_server.py - the plain way to serve the same layer, for
bench/bench_json.sh to compare attnd against: FastAPI on uvicorn, one
torch.nn.MultiheadAttention(512, 8, batch_first=True) (the default model's
shape, torch's own initialisation), the native API's body
{"query": [[...512...], ...]} read with the standard json module and the
answer {"output": [...]} written with it, no batching. torch runs one
thread per process; bench_json.sh starts one uvicorn worker per core.

    python fastapi_server.py PORT WORKERS   (Debian's torch, FastAPI and
    uvicorn from bench/requirements.txt)
"""
import sys

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response
import json

torch.set_num_threads(1)
torch.manual_seed(0)
layer = torch.nn.MultiheadAttention(512, 8, batch_first=True).eval()
app = FastAPI()


@app.post("/v1/attention")
async def attention(request: Request):
    body = await request.json()
    q = torch.tensor(body["query"], dtype=torch.float32).unsqueeze(0)
    with torch.no_grad():
        out, _ = layer(q, q, q, need_weights=False)
    return Response(json.dumps({"output": out[0].tolist()}), media_type="application/json")


@app.get("/health")
async def health():
    return {"status": "ok"}


if __name__ == "__main__":
    uvicorn.run("fastapi_server:app", host="127.0.0.1", port=int(sys.argv[1]),
                workers=int(sys.argv[2]), log_level="warning", access_log=False)
