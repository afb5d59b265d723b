"""Failures raise attnd.Error with the status and the daemon's sentence;
429 and 503 are sent again after their Retry-After, up to `retries` times,
and nothing else is. A small real HTTP server (scripted.py) answers from a
script, then relays to a real daemon, and counts what the client sent.

No test here asserts a speed. Two read the clock as a mechanism: a retry
arrives no sooner than the Retry-After it follows (a lower bound, which
no slowness can break), and a client whose timeout is far below the
server's delay gets no answer."""
import email.utils
import pickle
import time

import numpy as np
import pytest
import requests

import attnd
import support
from scripted import Scripted
import tools
from tools import TOL, ref, rel_err

Q = np.random.default_rng(3).standard_normal((4, 64), dtype=np.float32)


def draining(retry_after="0"):
    return (503, {"Retry-After": retry_after}, {"error": "draining"}, 0)


def test_503_with_retry_after_then_200(served):
    """The 503's Retry-After is waited, the request sent again, and the
    daemon's answer (relayed) is the result."""
    with Scripted(served.url, [draining("1")]) as srv, attnd.Client(srv.url) as c:
        r = c.attention(Q, model="self64", attention="mean")
    out, w = ref(served.layers["self64"], Q[None])
    assert rel_err(r.output, out[0]) <= TOL and rel_err(r.attention, w[0]) <= TOL
    assert len(srv.seen) == 2 and srv.seen[0][2] == srv.seen[1][2]  # the same body again
    assert srv.seen[1][3] - srv.seen[0][3] >= 1.0, "sent again before Retry-After: 1"


def test_429_without_retry_after_and_http_date(served):
    """A 429 with no Retry-After waits one second; Retry-After may be an
    HTTP date."""
    when = email.utils.formatdate(time.time() + 1, usegmt=True)
    script = [(429, {}, {"error": "queue full"}, 0),
              (429, {"Retry-After": when}, {"error": "queue full"}, 0)]
    with Scripted(served.url, script) as srv, attnd.Client(srv.url) as c:
        r = c.attention(Q, model="self64")
    assert rel_err(r.output, ref(served.layers["self64"], Q[None])[0][0]) <= TOL
    assert len(srv.seen) == 3
    assert srv.seen[1][3] - srv.seen[0][3] >= 1.0


@pytest.mark.parametrize("retries", [0, 2])
def test_retries_run_out(retries):
    """retries + 1 requests, then the last answer's Error."""
    script = [draining()] * (retries + 2)
    with Scripted(None, script) as srv, attnd.Client(srv.url, retries=retries) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(Q)
    assert (e.value.status, e.value.message, e.value.retry_after) == (503, "draining", 0.0)
    assert len(srv.seen) == retries + 1


def test_wait_longer_than_timeout_is_not_waited():
    """A Retry-After beyond the client's timeout: the Error at once, saying
    when to come back."""
    with Scripted(None, [draining("120")]) as srv, attnd.Client(srv.url, timeout=5) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(Q)
    assert e.value.status == 503 and e.value.retry_after == 120.0
    assert len(srv.seen) == 1


def test_health_is_asked_once():
    with Scripted(None, [draining()]) as srv, attnd.Client(srv.url) as c:
        with pytest.raises(attnd.Error) as e:
            c.health()
    assert e.value.status == 503 and len(srv.seen) == 1


def test_not_attnds_error_body():
    """An error that is not attnd's JSON (a proxy's page) keeps its text."""
    page = (502, {"Content-Type": "text/html"}, b"<html>502 Bad Gateway</html>", 0)
    with Scripted(None, [page]) as srv, attnd.Client(srv.url) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(Q)
    assert e.value.status == 502 and "502 Bad Gateway" in e.value.message
    assert len(srv.seen) == 1


@pytest.mark.parametrize("case", ["width", "model", "field", "value_without_key"])
def test_refusals_are_not_retried(served, case):
    """400 and 404 from the daemon: attnd.Error with its status and its
    sentence, sent once."""
    kw = {"width": dict(query=np.ones((2, 63)), model="self64"),
          "model": dict(query=Q, model="nope"),
          "field": dict(query=Q, model="self64", attention_top_kk=3),
          "value_without_key": dict(query=Q, value=Q, model="self64")}[case]
    with Scripted(served.url) as srv, attnd.Client(srv.url) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(**kw)
    status = 404 if case == "model" else 400
    raw = requests.post(served.url + "/v1/attention", data=srv.seen[0][2], timeout=60)
    assert e.value.status == status == raw.status_code
    assert e.value.message == raw.json()["error"], (e.value.message, raw.text)
    assert e.value.request_id and e.value.retry_after is None
    assert str(e.value) == "%d: %s" % (status, e.value.message)
    copy = pickle.loads(pickle.dumps(e.value))
    assert (copy.status, copy.message, copy.request_id) == (status, e.value.message,
                                                            e.value.request_id)
    assert len(srv.seen) == 1


def test_413_over_the_limits(daemons, tmp_path):
    s = tools.serve(daemons, tmp_path, {"small": tools.mha(16, 2, 5)},
                    limits={"max_tokens_per_request": 8})
    with attnd.Client(s.url) as c:
        assert c.attention(np.ones((4, 16))).output.shape == (4, 16)
        with pytest.raises(attnd.Error) as e:
            c.attention(np.ones((5, 16)))
    assert e.value.status == 413 and "8" in e.value.message


def test_api_key(daemons):
    d = daemons(env={"ATTND_API_KEY": "k3y"})
    with attnd.Client(d.url, api_key="k3y") as c:
        assert c.attention(np.ones((2, 512))).output.shape == (2, 512)
        assert c.health() == {"status": "ok"}
    for key in (None, "wrong"):
        with attnd.Client(d.url, api_key=key) as c:
            with pytest.raises(attnd.Error) as e:
                c.attention(np.ones((2, 512)))
            assert e.value.status == 401 and e.value.message
            with pytest.raises(attnd.Error):
                c.models()


def test_unreachable_and_timeout():
    """No daemon: Error with status None naming the URL; an answer slower
    than the timeout: Error with status None, not retried."""
    url = "http://127.0.0.1:%d" % support.free_port()
    with attnd.Client(url) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(Q)
    assert e.value.status is None and url in e.value.message
    slow = (200, {}, {"output": None}, 5)
    with Scripted(None, [slow]) as srv, attnd.Client(srv.url, timeout=0.5) as c:
        with pytest.raises(attnd.Error) as e:
            c.attention(Q)
    assert e.value.status is None and "no answer within 0.5 s" in e.value.message
    assert len(srv.seen) == 1


def test_bad_settings():
    with pytest.raises(ValueError, match="timeout"):
        attnd.Client(timeout=0)
    with pytest.raises(ValueError, match="retries"):
        attnd.Client(retries=-1)


def test_full_session_table_is_retried(fresh_daemons):
    """The daemon's own 429: a second session past max_sessions 1 waits the
    Retry-After (until the first one's idle timeout), then opens."""
    d = fresh_daemons(env={"ATTND_MAX_SESSIONS": "1", "ATTND_SESSION_IDLE_S": "1"})
    with attnd.Client(d.url, retries=0) as once, attnd.Client(d.url, retries=5) as c:
        first = once.session(np.ones((2, 512)))
        with pytest.raises(attnd.Error) as e:
            once.session(np.ones((2, 512)))
        assert e.value.status == 429 and e.value.retry_after >= 1
        second = c.session(np.ones((3, 512)))
        assert second.cached_tokens == 3 and second.id != first.id
        second.close()
        first.close()  # timed out on the daemon: closed already, no error
