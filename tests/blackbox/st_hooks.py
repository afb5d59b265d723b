"""schemathesis hooks for test_openapi.py (loaded through SCHEMATHESIS_HOOKS).

A request's own deadline (the body's timeout_ms, the Request-Timeout-Ms
header) may be as short as 1 ms by the document, and a request that misses
it is answered 504, as documented. Whether a generated 1 ms deadline is met
depends on the machine's load, not on the daemon, and schemathesis counts
every 5xx as a server error; so a valid deadline shorter than FLOOR_MS is
raised to FLOOR_MS before the call. Invalid ones (0, negative, not a
number) are left as generated: their 400s stay checked. Deadlines
themselves are tested in test_lifecycle.py."""
import schemathesis

FLOOR_MS = 60000


def _raise_deadlines(node):
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "timeout_ms" and type(v) is int and 1 <= v < FLOOR_MS:
                node[k] = FLOOR_MS
            else:
                _raise_deadlines(v)
    elif isinstance(node, list):
        for v in node:
            _raise_deadlines(v)


@schemathesis.hook
def before_call(context, case):
    _raise_deadlines(case.body)
    for name in list(case.headers or {}):
        if name.lower() == "request-timeout-ms":
            v = str(case.headers[name]).strip()
            if v.isdigit() and 1 <= int(v) < FLOOR_MS:
                case.headers[name] = str(FLOOR_MS)
