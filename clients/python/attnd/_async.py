"""AsyncClient and AsyncSession: Client and Session as coroutines, for
asyncio servers (FastAPI, aiohttp, ...), on httpx's AsyncClient (one
connection pool, kept alive). The arguments, results and errors are those
of Client (see its docstrings); only waiting differs."""
from __future__ import annotations

import asyncio
from typing import Any, Dict, Generator, List, Optional

import httpx

from . import _wire
from ._wire import Error, Result


class AsyncClient:
    """Client's methods as coroutines. Use `async with AsyncClient(...) as
    c:` or `await c.close()` (or aclose()); calls may run concurrently on
    one client."""

    def __init__(self, url: str = "http://127.0.0.1:8080", api_key: Optional[str] = None,
                 timeout: float = 30.0, retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.timeout, self.retries = _wire.check_retries(timeout, retries)
        self._http = httpx.AsyncClient(base_url=self.url, headers=_wire.headers(api_key),
                                       timeout=self.timeout)

    async def attention(self, query: Any, key: Any = None, value: Any = None, *,
                        model: Optional[str] = None, causal: Optional[bool] = None,
                        key_padding_mask: Any = None, attn_mask: Any = None,
                        attention: Optional[str] = None, attention_heads: Any = None,
                        **fields: Any) -> Result:
        """Client.attention, awaited."""
        body = _wire.attention_body(query, key, value, model=model, causal=causal,
                                    key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                    attention=attention, attention_heads=attention_heads,
                                    fields=fields)
        r = await self._send("POST", "/v1/attention", body)
        return _wire.result(_wire.parse_json(r.content, r.status_code),
                            r.headers.get("x-request-id"))

    async def models(self) -> List[Dict[str, Any]]:
        """Client.models, awaited."""
        r = await self._send("GET", "/v1/models")
        return _wire.model_list(_wire.parse_json(r.content, r.status_code))

    async def health(self) -> Dict[str, Any]:
        """Client.health, awaited (once, without retries)."""
        r = await self._send("GET", "/health", retry=False)
        return _wire.parse_json(r.content, r.status_code)

    def session(self, query: Any = None, *, model: Optional[str] = None,
                attention: Optional[str] = None, **fields: Any) -> "_Opening":
        """Opens a KV-cache session, as Client.session: either
        `s = await client.session(...)` (then `await s.close()`), or
        `async with client.session(...) as s:`, which closes it."""
        body = _wire.session_body(query, model=model, attention=attention, fields=fields)
        return _Opening(self, body)

    async def close(self) -> None:
        """Closes the connections; the client is not used after (Client.close,
        awaited)."""
        await self._http.aclose()

    async def aclose(self) -> None:
        """close(), under httpx's and contextlib.aclosing's name."""
        await self.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return "attnd.AsyncClient(%r)" % self.url

    async def _send(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, *,
                    retry: bool = True) -> httpx.Response:
        """Client._send, awaited: the waits between tries are asyncio.sleep."""
        content = None if body is None else _wire.dumps(body)
        attempt = 0
        while True:
            try:
                r = await self._http.request(method, path, content=content)
            except httpx.TimeoutException as e:
                raise Error(None, "%s %s%s: no answer within %g s" % (
                    method, self.url, path, self.timeout)) from e
            except httpx.RequestError as e:
                raise Error(None, "%s %s%s: %s" % (method, self.url, path, e)) from e
            if r.status_code < 400:
                return r
            err = _wire.error_from(r.status_code, r.content, r.headers)
            delay = _wire.retry_delay(err, attempt, self.retries if retry else 0, self.timeout)
            if delay is None:
                raise err
            await asyncio.sleep(delay)
            attempt += 1


class _Opening:
    """What AsyncClient.session returns: awaited, the open session; as an
    async context manager, the same, closed at the block's end."""

    def __init__(self, client: AsyncClient, body: Dict[str, Any]) -> None:
        self._client, self._body, self._session = client, body, None

    async def _open(self) -> "AsyncSession":
        r = await self._client._send("POST", "/v1/sessions", self._body)
        self._session = AsyncSession(self._client, _wire.parse_json(r.content, r.status_code),
                                     r.headers.get("x-request-id"))
        return self._session

    def __await__(self) -> Generator[Any, None, "AsyncSession"]:
        return self._open().__await__()

    async def __aenter__(self) -> "AsyncSession":
        return await self._open()

    async def __aexit__(self, *exc: Any) -> None:
        if self._session is not None:
            await self._session.close()


class AsyncSession:
    """Session's methods as coroutines (id, model, cached_tokens, prefix as
    there). Steps of one session must not overlap: the daemon answers 409
    to a step sent while the previous one is still running."""

    def __init__(self, client: AsyncClient, ans: Dict[str, Any],
                 request_id: Optional[str]) -> None:
        self._client = client
        self.id, self.model, self.cached_tokens, self.prefix = _wire.session_fields(ans,
                                                                                   request_id)
        self.closed = False

    async def step(self, rows: Any, attention: Optional[str] = None, *,
                   attention_heads: Any = None, **fields: Any) -> Result:
        """Session.step, awaited."""
        body = _wire.session_body(rows, attention=attention, attention_heads=attention_heads,
                                  fields=fields, name="rows")
        r = await self._client._send("POST", _wire.step_path(self.id, self.closed), body)
        ans = _wire.parse_json(r.content, r.status_code)
        self.cached_tokens = ans.get("cached_tokens", self.cached_tokens)
        return _wire.result(ans, r.headers.get("x-request-id"))

    async def close(self) -> None:
        """Session.close, awaited."""
        if self.closed:
            return
        try:
            await self._client._send("DELETE", "/v1/sessions/" + self.id)
        except Error as e:
            if e.status != 404:
                raise
        self.closed = True

    async def __aenter__(self) -> "AsyncSession":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def __repr__(self) -> str:
        return "attnd.AsyncSession(%r, model=%r, cached_tokens=%d)" % (
            self.id, self.model, self.cached_tokens)
