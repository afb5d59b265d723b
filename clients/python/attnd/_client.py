"""Client and Session: attnd's native API from blocking code, on one httpx
connection pool (kept alive between calls; safe to share between threads).
What goes on the wire and what comes back is _wire.py's; this file sends,
waits and retries."""
from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import httpx

from . import _wire
from ._wire import Error, Result


class Client:
    """A connection to one attnd daemon (or a load balancer in front of
    several).

    url: the daemon's base URL.
    api_key: sent as `Authorization: Bearer <key>` when the daemon has one.
    timeout: seconds for each attempt (connect, send, answer), and the
        longest Retry-After worth waiting for.
    retries: how many times a 429 or 503 answer is sent again, each after
        the wait its Retry-After asks (1 s when it names none); past them,
        or when the wait would exceed timeout, the Error is raised.

    Use it as a context manager, or call close(), to release its
    connections.
    """

    def __init__(self, url: str = "http://127.0.0.1:8080", api_key: Optional[str] = None,
                 timeout: float = 30.0, retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.timeout, self.retries = _wire.check_retries(timeout, retries)
        self._http = httpx.Client(base_url=self.url, headers=_wire.headers(api_key),
                                  timeout=self.timeout)

    def attention(self, query: Any, key: Any = None, value: Any = None, *,
                  model: Optional[str] = None, causal: Optional[bool] = None,
                  key_padding_mask: Any = None, attn_mask: Any = None,
                  attention: Optional[str] = None, attention_heads: Any = None,
                  **fields: Any) -> Result:
        """Multi-head attention by the daemon (POST /v1/attention).

        query: (L, E) rows, or (B, L, E) for B sequences; numpy arrays,
            nested lists or CPU torch tensors, converted to float32.
        key, value: (S, kdim) and (S, vdim) (B first for a batch); key
            alone is cross-attention with value = key; neither is
            self-attention.
        model: the model's name; optional when the daemon serves one.
        causal: hide keys after each query row; None is the model's default.
        key_padding_mask: booleans (S,) or (B, S), True = hidden key.
        attn_mask: (L, S) or (B, L, S): booleans (True = hidden) or numbers
            added to the scores (-inf hides).
        attention: "mean" or "heads" to have the attention weights back in
            Result.attention; None or "none" for the output alone.
        attention_heads: head indices whose attention to return ("mean"
            then averages over them); sent only when given, and a daemon
            that does not take it yet refuses it (Error, status 400).
        **fields: further fields of the native request, sent as given
            (numpy arrays as lists): SPEC section 9's selection
            (attention_rows=[0, 4], attention_top_k=5, attention_dtype=
            "float16"), a decoder model's positions, timeout_ms. The daemon
            checks them; one it does not know is a 400 naming it.

        Returns a Result; raises Error when the daemon refuses or cannot be
        reached, TypeError or ValueError (naming the argument) for an
        argument of the wrong dtype or rank, before anything is sent.
        """
        body = _wire.attention_body(query, key, value, model=model, causal=causal,
                                    key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                                    attention=attention, attention_heads=attention_heads,
                                    fields=fields)
        return self._result("POST", "/v1/attention", body)

    def models(self) -> List[Dict[str, Any]]:
        """The models the daemon serves (GET /v1/models): one dict each,
        with name, embed_dim, num_heads, kdim, vdim, causal, ..."""
        return _wire.model_list(self._json("GET", "/v1/models"))

    def health(self) -> Dict[str, Any]:
        """GET /health once, without retries: {"status": "ok"} while the
        daemon serves; Error (503) while it starts or drains, Error (None)
        when it cannot be reached."""
        return self._json("GET", "/health", retry=False)

    def session(self, query: Any = None, *, model: Optional[str] = None,
                attention: Optional[str] = None, **fields: Any) -> "Session":
        """Opens a KV-cache session (POST /v1/sessions), with query as its
        prefix rows (n, E) when given; a context manager that closes it.
        The prefix's own answer is Session.prefix (None without a prefix)."""
        body = _wire.session_body(query, model=model, attention=attention, fields=fields)
        r = self._send("POST", "/v1/sessions", body)
        return Session(self, _wire.parse_json(r.content, r.status_code),
                       r.headers.get("x-request-id"))

    def close(self) -> None:
        """Closes the connections; the client is not used after."""
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "attnd.Client(%r)" % self.url

    # -- sending

    def _send(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, *,
              retry: bool = True) -> httpx.Response:
        """One request, sent again after a 429 or 503 as _wire.retry_delay
        says. Returns a response below 400; raises Error otherwise."""
        content = None if body is None else _wire.dumps(body)
        attempt = 0
        while True:
            try:
                r = self._http.request(method, path, content=content)
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
            time.sleep(delay)
            attempt += 1

    def _json(self, method: str, path: str, body: Optional[Dict[str, Any]] = None, *,
              retry: bool = True) -> Dict[str, Any]:
        r = self._send(method, path, body, retry=retry)
        return _wire.parse_json(r.content, r.status_code)

    def _result(self, method: str, path: str, body: Dict[str, Any]) -> Result:
        r = self._send(method, path, body)
        return _wire.result(_wire.parse_json(r.content, r.status_code),
                            r.headers.get("x-request-id"))


class Session:
    """A KV-cache session on the daemon (docs/api.md, "KV-cache sessions"):
    each step sends only its new rows, which attend causally over every
    row sent before.

    id: the session's id (32 hex digits).
    model: the model that holds it.
    cached_tokens: rows in its cache, after the last step.
    prefix: the Result of the prefix rows given to Client.session, or None.
    """

    def __init__(self, client: Client, ans: Dict[str, Any], request_id: Optional[str]) -> None:
        self._client = client
        self.id, self.model, self.cached_tokens, self.prefix = _wire.session_fields(ans,
                                                                                   request_id)
        self.closed = False

    def step(self, rows: Any, attention: Optional[str] = None, *,
             attention_heads: Any = None, **fields: Any) -> Result:
        """A decoding step (POST /v1/sessions/{id}/attention): rows (n, E),
        or one row (E,), attend over the cache and join it. attention,
        attention_heads and **fields as in Client.attention; the attention
        is over every cached token: (n, cached) or (H, n, cached).
        A step that fails (Error) leaves the session as it was."""
        body = _wire.session_body(rows, attention=attention, attention_heads=attention_heads,
                                  fields=fields, name="rows")
        r = self._client._send("POST", _wire.step_path(self.id, self.closed), body)
        ans = _wire.parse_json(r.content, r.status_code)
        self.cached_tokens = ans.get("cached_tokens", self.cached_tokens)
        return _wire.result(ans, r.headers.get("x-request-id"))

    def close(self) -> None:
        """Ends the session (DELETE /v1/sessions/{id}) and frees its cache on
        the daemon. A session the daemon no longer holds (idle timeout,
        restart) is closed already: no error. Closing twice does nothing. A
        close that failed (no answer, a refusal) leaves the session open, as
        the daemon still holds it: close() again ends it."""
        if self.closed:
            return
        try:
            self._client._send("DELETE", "/v1/sessions/" + self.id)
        except Error as e:
            if e.status != 404:
                raise
        self.closed = True

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return "attnd.Session(%r, model=%r, cached_tokens=%d)" % (self.id, self.model,
                                                                  self.cached_tokens)
