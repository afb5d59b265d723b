"""attnd's native API on the wire, with no I/O: arguments checked and
turned into request bodies, answers turned into results, errors and their
retry rule. Client (sync) and AsyncClient share every line of it; they only
send and wait.

Tensors travel as tensor objects both ways (docs/api.md, "Tensors in
base64"): {"shape": [...], "dtype": "float32" | "bool", "b64": "..."},
little-endian and row-major, made and read by numpy and binascii in one
pass, never a Python loop per element. The base64 text itself never
becomes a Python str: a request's is written into the body as bytes
(dumps), an answer's is cut out of the bytes before the rest is parsed
(parse_json), so a large tensor is not copied through the JSON codec.
"""
from __future__ import annotations

import binascii
import email.utils
import json
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np

ATTENTION_MODES = ("none", "mean", "heads")

# Fields a request body is built from by the client itself; `**fields`
# passthrough may not name them (encoding is always base64).
CLIENT_FIELDS = frozenset({"model", "query", "key", "value", "causal", "key_padding_mask",
                           "attn_mask", "attention", "encoding"})

# Wire dtypes of an answer's tensor objects -> numpy dtypes read from the
# bytes; float16 and bfloat16 (SPEC section 9, attention_dtype) are widened
# to float32 after reading.
_WIRE_DTYPES = {"float32": "<f4", "float16": "<f2", "bfloat16": "<u2", "int32": "<i4",
                "bool": "u1"}


class Error(Exception):
    """A request attnd refused or could not answer.

    status: the HTTP status (400, 404, 413, 429, 503, ...), or None when no
        answer came (the daemon could not be reached, or the timeout passed).
    message: the daemon's sentence (the "error" of its answer), or what
        went wrong on the way.
    retry_after: seconds the daemon asked to wait (429 and 503), else None.
    request_id: the answer's X-Request-Id (also in attnd's access log).
    """

    def __init__(self, status: Optional[int], message: str, *,
                 retry_after: Optional[float] = None, request_id: Optional[str] = None):
        super().__init__("%s: %s" % (status, message) if status is not None else message)
        self.status = status
        self.message = message
        self.retry_after = retry_after
        self.request_id = request_id

    def __reduce__(self) -> Any:  # pickles whole (multiprocessing, logging queues)
        return (self.__class__, (self.status, self.message),
                {"retry_after": self.retry_after, "request_id": self.request_id})


@dataclass
class Result:
    """One answer of attnd's native API.

    output: float32, the query's rank: (L, E), or (B, L, E) for a batch.
    attention: None unless asked; "mean": (L, S) or (B, L, S); "heads":
        (H, L, S) or (B, H, L, S), float32. A selection that answers
        otherwise (SPEC section 9's attention_top_k: a dict of arrays
        "indices" and "values") comes back decoded the same way.
    usage: the answer's usage (batch, sequences, query_tokens, key_tokens,
        queue_us, compute_us).
    model: the model that answered.
    request_id: X-Request-Id of the answer (the access log's id).
    """
    output: np.ndarray
    attention: Any = None
    usage: Dict[str, Any] = field(default_factory=dict)
    model: Optional[str] = None
    request_id: Optional[str] = None


# ---------------------------------------------------------------- arguments

def _array(name: str, x: Any) -> np.ndarray:
    """x as a numpy array, or a ValueError naming the argument."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # a torch tensor: leave autograd and GPU
        x = x.detach().cpu()
        if str(x.dtype) == "torch.bfloat16":  # numpy has no bfloat16; float32 holds it exactly
            x = x.float()
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nested lists
        raise ValueError("%s: not a rectangular array (%s)" % (name, e)) from None
    if a.dtype == object:
        raise ValueError("%s: not a rectangular array of numbers" % name)
    return a


def _check_rank(name: str, a: np.ndarray, ranks: Tuple[int, ...], what: str) -> None:
    if a.ndim not in ranks:
        raise ValueError("%s: rank %d (shape %s), expected %s" % (name, a.ndim, a.shape, what))
    if 0 in a.shape:
        raise ValueError("%s: shape %s holds no element" % (name, a.shape))


def float_tensor(name: str, x: Any, ranks: Tuple[int, ...] = (2, 3),
                 what: str = "rows (L, width) or a batch (B, L, width)") -> np.ndarray:
    """A tensor argument (query, key, value) as contiguous little-endian
    float32: lists and other number dtypes are converted (float64 ->
    float32), booleans, strings and complex numbers refused (TypeError),
    other ranks refused (ValueError)."""
    a = _array(name, x)
    if a.dtype.kind not in "fiu":
        raise TypeError("%s: dtype %s is not real numbers; give float32 (or any float or "
                        "integer dtype, converted to float32)" % (name, a.dtype))
    _check_rank(name, a, ranks, what)
    return np.ascontiguousarray(a, dtype="<f4")


def bool_mask(name: str, x: Any, ranks: Tuple[int, ...], what: str) -> np.ndarray:
    """A boolean mask (True = hidden). Numbers are refused: a tokenizer's
    0/1 attention_mask means the opposite (1 = keep), so guessing would
    hide the wrong keys."""
    a = _array(name, x)
    if a.dtype != np.bool_:
        raise TypeError("%s: dtype %s; give booleans (True = hidden), e.g. "
                        "attention_mask == 0 for a tokenizer's 0/1 mask" % (name, a.dtype))
    _check_rank(name, a, ranks, what)
    return np.ascontiguousarray(a)


def attn_mask_tensor(x: Any) -> np.ndarray:
    """attn_mask: booleans (True = hidden) or numbers added to the scores
    (float32; -inf hides), (L, S) or one per sequence (B, L, S)."""
    a = _array("attn_mask", x)
    if a.dtype == np.bool_:
        return bool_mask("attn_mask", a, (2, 3), "(L, S) or (B, L, S)")
    return float_tensor("attn_mask", a, (2, 3), "(L, S) or (B, L, S)")


def head_list(name: str, x: Any) -> List[int]:
    """A list of head indices (attention_heads) as Python ints."""
    a = _array(name, x)
    if a.ndim != 1 or a.dtype.kind not in "iu":
        raise TypeError("%s: expected a list of head indices (integers), got %s of %s"
                        % (name, a.dtype, a.shape))
    return [int(v) for v in a]


def jsonable(x: Any) -> Any:
    """A passthrough field's value as JSON: numpy arrays become nested
    lists, numpy scalars Python numbers; anything else goes as given."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    return x


class Blob:
    """Base64 text kept as bytes (or a memoryview of an answer's bytes): a
    tensor object's "b64" on its way into a body or out of an answer."""
    __slots__ = ("data",)

    def __init__(self, data: Any) -> None:
        self.data = data

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, Blob) and bytes(self.data) == bytes(other.data)


def encode(a: np.ndarray) -> Dict[str, Any]:
    """A checked array (float32 or bool, C-contiguous) as a tensor object."""
    dtype = "bool" if a.dtype == np.bool_ else "float32"
    return {"shape": list(a.shape), "dtype": dtype,
            "b64": Blob(binascii.b2a_base64(a, newline=False))}


# ---------------------------------------------------------------- bodies

def attention_body(query: Any, key: Any = None, value: Any = None, *, model: Optional[str],
                   causal: Optional[bool], key_padding_mask: Any, attn_mask: Any,
                   attention: Optional[str], attention_heads: Any,
                   fields: Mapping[str, Any]) -> Dict[str, Any]:
    """The body of POST /v1/attention; every argument checked (TypeError,
    ValueError naming it) before anything is sent."""
    body: Dict[str, Any] = {"query": encode(float_tensor("query", query))}
    if key is not None:
        body["key"] = encode(float_tensor("key", key))
    if value is not None:
        body["value"] = encode(float_tensor("value", value))
    if causal is not None:
        body["causal"] = bool(causal)
    if key_padding_mask is not None:
        body["key_padding_mask"] = encode(bool_mask("key_padding_mask", key_padding_mask,
                                                    (1, 2), "(S,) or (B, S)"))
    if attn_mask is not None:
        body["attn_mask"] = encode(attn_mask_tensor(attn_mask))
    return _common(body, model, attention, attention_heads, fields)


def session_body(rows: Any, *, model: Optional[str] = None, attention: Optional[str] = None,
                 attention_heads: Any = None, fields: Mapping[str, Any] = {},
                 name: str = "query") -> Dict[str, Any]:
    """The body of a session open (rows: the prefix, or None) or step.
    A single row (E,) is taken as one row (1, E). An open without a prefix
    has no answer to encode: the daemon takes only "model" then (and
    refuses any other field by name)."""
    body: Dict[str, Any] = {}
    if rows is not None:
        a = float_tensor(name, rows, (1, 2), "rows (n, E) or one row (E,)")
        body["query"] = encode(a.reshape(1, -1) if a.ndim == 1 else a)
    body = _common(body, model, attention, attention_heads, fields)
    if rows is None:
        del body["encoding"]
    return body


def _common(body: Dict[str, Any], model: Optional[str], attention: Optional[str],
            attention_heads: Any, fields: Mapping[str, Any]) -> Dict[str, Any]:
    if model is not None:
        body["model"] = str(model)
    if attention is not None:
        if attention not in ATTENTION_MODES:
            raise ValueError("attention: %r is not one of %s" % (attention,
                                                                 ", ".join(ATTENTION_MODES)))
        body["attention"] = attention
    if attention_heads is not None:  # sent only when given: older daemons refuse the field
        body["attention_heads"] = head_list("attention_heads", attention_heads)
    for k, v in fields.items():
        if k in CLIENT_FIELDS:
            raise TypeError("%s: set by the client itself, not a passthrough field" % k)
        body[k] = jsonable(v)
    body["encoding"] = "base64"
    return body


def dumps(body: Mapping[str, Any]) -> bytes:
    """body as compact JSON (UTF-8 bytes). A Blob's base64 is written as it
    is (its alphabet needs no escaping): one copy into the body."""
    out: List[Any] = []
    _write(body, out)
    return b"".join(out)


def _write(v: Any, out: List[Any]) -> None:
    if isinstance(v, Blob):
        out += (b'"', v.data, b'"')
    elif isinstance(v, dict) and any(isinstance(x, (Blob, dict)) for x in v.values()):
        out.append(b"{")
        for i, (k, x) in enumerate(v.items()):
            out += (b"," if i else b"", json.dumps(str(k)).encode(), b":")
            _write(x, out)
        out.append(b"}")
    else:
        out.append(json.dumps(v, separators=(",", ":"), allow_nan=False).encode())


# ---------------------------------------------------------------- answers

def decode(obj: Any) -> Any:
    """A tensor object of an answer as a writable numpy array (float16 and
    bfloat16 widened to float32); a dict of tensor objects (top-k) as a dict
    of arrays; None as None; anything else as it came."""
    if isinstance(obj, dict) and "b64" in obj and "shape" in obj:
        dtype = obj.get("dtype", "float32")
        if dtype not in _WIRE_DTYPES:
            raise Error(None, "the answer holds a tensor of dtype %r, which this client "
                              "does not read" % dtype)
        text = obj["b64"]
        raw = bytearray(binascii.a2b_base64(text.data if isinstance(text, Blob) else text))
        a = np.frombuffer(raw, dtype=_WIRE_DTYPES[dtype]).reshape(obj["shape"])
        if dtype == "float16":
            return a.astype(np.float32)
        if dtype == "bfloat16":
            return (a.astype("<u4") << 16).view("<f4")
        if dtype == "bool":
            return a.view(np.bool_)
        return a
    if isinstance(obj, dict):
        return {k: decode(v) for k, v in obj.items()}
    if isinstance(obj, list):  # JSON numbers (a daemon that ignored encoding)
        return np.asarray(obj, dtype=np.float32)
    return obj


_B64_KEY = b'"b64":"'


def parse_json(content: bytes, status: int) -> Dict[str, Any]:
    """An answer's JSON object. Each "b64":"<text>" is first cut out of the
    bytes (outside JSON strings the key can only be a key, and base64 holds
    no quote) and put back after parsing as a Blob viewing those bytes."""
    blobs: List[memoryview] = []
    view, pieces, pos = memoryview(content), [], 0
    while True:
        i = content.find(_B64_KEY, pos)
        end = content.find(b'"', i + len(_B64_KEY)) if i >= 0 else -1
        if end < 0:
            break
        pieces += (view[pos:i + len(_B64_KEY)], b"%d" % len(blobs))
        blobs.append(view[i + len(_B64_KEY):end])
        pos = end
    try:
        ans = json.loads(b"".join(pieces + [view[pos:]]) if blobs else content)
    except ValueError:
        raise Error(status, "the answer is not JSON: %r" % bytes(content[:200])) from None
    if not isinstance(ans, dict):
        raise Error(status, "the answer is not a JSON object: %r" % bytes(content[:200]))
    if blobs:
        _put_back(ans, blobs)
    return ans


def _put_back(obj: Dict[str, Any], blobs: List[memoryview]) -> None:
    """Blobs in place of the indices parse_json left in tensor objects."""
    for k, v in obj.items():
        if k == "b64" and isinstance(v, str) and v.isdigit() and int(v) < len(blobs):
            obj[k] = Blob(blobs[int(v)])
        elif isinstance(v, dict):
            _put_back(v, blobs)


def result(ans: Dict[str, Any], request_id: Optional[str]) -> Result:
    """The Result of a decoded answer of /v1/attention or a session route."""
    if "output" not in ans:
        raise Error(None, "the answer holds no output: %s" % sorted(ans))
    return Result(output=decode(ans["output"]), attention=decode(ans.get("attention")),
                  usage=ans.get("usage", {}), model=ans.get("model"), request_id=request_id)


def session_fields(ans: Dict[str, Any], request_id: Optional[str]
                   ) -> Tuple[str, Optional[str], int, Optional[Result]]:
    """(id, model, cached_tokens, prefix Result or None) of an open's answer."""
    sid = ans.get("session")
    if not isinstance(sid, str):
        raise Error(None, "the session's open answered no session id: %s" % sorted(ans))
    prefix = result(ans, request_id) if "output" in ans else None
    return sid, ans.get("model"), int(ans.get("cached_tokens", 0)), prefix


def step_path(session_id: str, closed: bool) -> str:
    if closed:  # nothing is sent: no status, as for a request that got no answer
        raise Error(None, "session %s is closed; open a new one" % session_id)
    return "/v1/sessions/%s/attention" % session_id


def error_from(status: int, content: bytes, headers: Mapping[str, str]) -> Error:
    """The Error of a refused request: the daemon's sentence, its
    Retry-After and X-Request-Id."""
    message = None
    try:
        ans = json.loads(content)
        if isinstance(ans, dict) and isinstance(ans.get("error"), str):
            message = ans["error"]
    except ValueError:
        pass
    if message is None:  # not attnd's form (a proxy in between): what came
        message = content[:300].decode("utf-8", "replace").strip() or "HTTP %d" % status
    return Error(status, message, retry_after=retry_after(headers.get("retry-after")),
                 request_id=headers.get("x-request-id"))


def retry_after(value: Optional[str]) -> Optional[float]:
    """Retry-After in seconds: a number of seconds or an HTTP date."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


# Statuses worth the same request again after a wait: 429 (a full queue or
# session table) and 503 (starting or draining); a step that fails keeps
# nothing (docs/api.md), so a session step is safe to send again too.
RETRY_STATUSES = (429, 503)
DEFAULT_RETRY_AFTER = 1.0  # seconds, when a 429 or 503 carries no Retry-After


def retry_delay(err: Error, attempt: int, retries: int, timeout: float) -> Optional[float]:
    """Seconds to wait before sending again, or None to raise err now: not a
    429/503, retries used up, or a wait longer than the timeout (the daemon
    says it will not be ready in time; err.retry_after says when)."""
    if err.status not in RETRY_STATUSES or attempt >= retries:
        return None
    wait = DEFAULT_RETRY_AFTER if err.retry_after is None else err.retry_after
    return wait if wait <= timeout else None


def headers(api_key: Optional[str]) -> Dict[str, str]:
    h = {"Content-Type": "application/json", "Accept": "application/json"}
    if api_key:
        h["Authorization"] = "Bearer " + api_key
    return h


def model_list(ans: Dict[str, Any]) -> List[Dict[str, Any]]:
    models = ans.get("models")
    if not isinstance(models, list):
        raise Error(None, "GET /v1/models answered no models list")
    return models


def check_retries(timeout: float, retries: int) -> Tuple[float, int]:
    if not timeout > 0:
        raise ValueError("timeout: %r seconds; give a positive number" % (timeout,))
    if int(retries) != retries or retries < 0:
        raise ValueError("retries: %r; give a whole number from 0" % (retries,))
    return float(timeout), int(retries)
