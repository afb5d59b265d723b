"""attnd: the Python client of attnd, the HTTP daemon that serves multi-head
attention layers (SPEC section 10; docs/clients.md).

    import numpy as np, attnd
    with attnd.Client("http://127.0.0.1:8080") as client:
        r = client.attention(np.ones((4, 512), np.float32), attention="mean")
        r.output, r.attention, r.usage      # (4, 512), (4, 4), {...}

- Client: attention, models, health, session (KV-cache sessions);
- AsyncClient: the same as coroutines;
- Error: what a refused or unanswered request raises (.status, .message);
- attnd.torch (needs torch): RemoteMultiheadAttention, export.
"""
from ._async import AsyncClient, AsyncSession
from ._client import Client, Session
from ._wire import Error, Result

# the package's version, and only here: pyproject.toml reads it (dynamic)
__version__ = "0.1.0"
__all__ = ["Client", "AsyncClient", "Session", "AsyncSession", "Error", "Result"]
