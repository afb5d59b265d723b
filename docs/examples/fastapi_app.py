"""A web backend that calls attnd: FastAPI, with one attnd.AsyncClient
shared by every request (its connections kept alive), opened and closed
with the app.

    ATTND_URL=http://127.0.0.1:8080 uvicorn fastapi_app:app --app-dir docs/examples --port 8000

POST /contextualize {"rows": [[...E numbers...], ...]} answers the rows
after attention ("rows"), their mean ("pooled") and, per row, the share of
attention it receives from all rows ("salience", averaged over heads).
attnd's refusals of the caller's input (400, 413) keep their status and
sentence (a 400 names the field and index); an attnd that cannot answer
now (429, 503, unreachable, timed out) is a 503 with Retry-After, so that
the caller's own retry logic applies; anything else is the backend's
fault, a 502.
docs/clients.md walks through it; tests/client/test_fastapi_example.py runs
it against a real daemon.
"""
import os
from contextlib import asynccontextmanager
from typing import List, Optional

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel

import attnd

ATTND_URL = os.environ.get("ATTND_URL", "http://127.0.0.1:8080")
ATTND_MODEL = os.environ.get("ATTND_MODEL") or None  # None: the daemon's only model


@asynccontextmanager
async def lifespan(app: FastAPI):
    async with attnd.AsyncClient(ATTND_URL, api_key=os.environ.get("ATTND_API_KEY") or None,
                                 timeout=10.0, retries=2) as client:
        app.state.attnd = client
        yield


app = FastAPI(title="contextualize", lifespan=lifespan)


class Rows(BaseModel):
    rows: List[List[float]]  # L rows of E numbers (E: the model's embed_dim)


class Contextualized(BaseModel):
    rows: List[List[float]]
    pooled: List[float]
    salience: List[float]
    attnd_request_id: Optional[str]


@app.post("/contextualize", response_model=Contextualized)
async def contextualize(body: Rows) -> Contextualized:
    try:
        r = await app.state.attnd.attention(body.rows, model=ATTND_MODEL, attention="mean")
    except (TypeError, ValueError) as e:  # ragged rows: refused before sending
        raise HTTPException(status_code=422, detail=str(e)) from e
    except attnd.Error as e:
        if e.status in (400, 413):
            raise HTTPException(status_code=e.status, detail=e.message) from e
        if e.status in (None, 429, 503):
            wait = max(1, round(e.retry_after or 1))
            raise HTTPException(status_code=503, detail="attnd: %s" % e.message,
                                headers={"Retry-After": "%d" % wait}) from e
        raise HTTPException(status_code=502, detail="attnd: %s" % e.message) from e
    return Contextualized(rows=r.output.tolist(), pooled=r.output.mean(axis=0).tolist(),
                          salience=r.attention.mean(axis=0).tolist(),
                          attnd_request_id=r.request_id)
