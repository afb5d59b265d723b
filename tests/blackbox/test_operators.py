"""What an operator sees of the daemon, treated the way operators'
other daemons treat them: every log line timestamped and levelled, in text or JSON
lines, the access log switchable, and every signal a container runtime or
systemd sends with its documented outcome (docs/config.md, "Signals and exit
codes")."""
import json
import re
import signal

import pytest

import support

TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (debug|info|warn|error) \S")


def lines(d):
    return [l for l in (d.stdout() + d.stderr()).splitlines() if l.strip()]


def hello(d):
    r = d.post("/v1/attention", {"query": [[0.25] * 512, [-0.5] * 512]})
    assert r.status_code == 200, r.text[:200]
    return r


def test_text_lines_all_timestamped(fresh_daemons):
    d = fresh_daemons()
    hello(d)
    d.get("/no/such/route")
    assert d.stop() == 0
    got = lines(d)
    assert any("listening on" in l for l in got), got
    assert any("status=404" in l for l in got), got
    for l in got:
        assert TEXT_LINE.match(l), "line without a timestamp and level: %r" % l


def test_json_lines(fresh_daemons):
    d = fresh_daemons(args=["--log-format", "json"])
    hello(d)
    assert d.stop() == 0
    got = [json.loads(l) for l in lines(d)]  # every line is one JSON object
    for o in got:
        assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", o["ts"]), o
        assert o["level"] in ("debug", "info", "warn", "error"), o
        assert isinstance(o["msg"], str), o
    access = [o for o in got if o["msg"] == "access" and o["method"] == "POST"]
    assert access and access[0]["method"] == "POST" and access[0]["status"] == 200, got
    assert access[0]["path"] == "/v1/attention" and access[0]["batch"] >= 1, access


BAD_STARTS = [
    ("bad config, flag", {"server": {"prot": 1}}, {}, ["--log-format", "json"], "server.prot"),
    ("bad config, variable", {"models": [{"name": "x"}]}, {"ATTND_LOG_FORMAT": "json"}, [],
     "models[0]"),
    ("bad flag, variable", None, {"ATTND_LOG_FORMAT": "json"}, ["--workers", "-1"],
     "--workers"),
    ("bad variable, flag", None, {"ATTND_PORT": "80x"}, ["--log-format=json"], "ATTND_PORT"),
    ("missing weights, flag", {"models": [{"name": "m", "embed_dim": 8, "num_heads": 2,
                                           "weights": "/nonexistent/w.safetensors"}]},
     {}, ["--log-format", "json"], "w.safetensors"),
]


@pytest.mark.parametrize("case", BAD_STARTS, ids=[c[0] for c in BAD_STARTS])
def test_refused_start_logs_json_from_the_first_line(fresh_daemons, case):
    """With --log-format json or ATTND_LOG_FORMAT=json, a config, flag,
    variable or weights error is already one JSON object per line."""
    _, config, env, args, names = case
    d = fresh_daemons(config, env=env, args=args, wait=False)
    rc = d.wait_exit(60)
    assert rc in (2, 3), (rc, d.logs())
    got = lines(d)
    assert got, "nothing logged"
    objs = []
    for l in got:
        try:
            objs.append(json.loads(l))
        except ValueError:
            raise AssertionError("not a JSON line: %r" % l)
    errors = [o for o in objs if o["level"] == "error"]
    assert errors and names in errors[0]["msg"], objs
    assert all(re.match(r"^\d{4}-\d\d-\d\dT", o["ts"]) for o in objs), objs


def test_access_log_off_and_level(fresh_daemons):
    d = fresh_daemons({"server": {"access_log": False}})
    hello(d)
    assert d.stop() == 0
    got = lines(d)
    assert not [l for l in got if "status=" in l], got
    assert any("listening on" in l for l in got), got
    q = fresh_daemons(env={"ATTND_LOG_LEVEL": "warn", "ATTND_ACCESS_LOG": "true"})
    hello(q)
    q.send_signal(signal.SIGUSR1)  # a warning ("ignored"), which the level lets through
    assert support.wait_until(lambda: "SIGUSR1" in q.stdout(), 10)
    assert q.stop() == 0
    got = lines(q)
    assert not [l for l in got if " info " in l], got


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2])
def test_reload_signals_are_ignored(fresh_daemons, sig):
    """SIGHUP (systemd's reload, a closed terminal) and the user signals
    never kill a serving daemon: logged, ignored, still serving."""
    d = fresh_daemons()
    d.send_signal(sig)
    name = signal.Signals(sig).name
    assert support.wait_until(lambda: name in d.stdout(), 10), d.logs()
    assert d.alive()
    hello(d)
    assert d.get("/health").status_code == 200
    assert d.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGQUIT])
def test_stop_signals_drain_and_exit_0(fresh_daemons, sig):
    d = fresh_daemons()
    hello(d)
    assert d.stop(sig) == 0
    assert "draining" in d.stdout() and "stopped" in d.stdout(), d.logs()


@pytest.mark.parametrize("sig", [signal.SIGCONT, signal.SIGWINCH], ids=["SIGCONT", "SIGWINCH"])
def test_harmless_signals_leave_it_serving(fresh_daemons, sig):
    """SIGCONT (systemd sends it after SIGTERM) and SIGWINCH change nothing.
    A SIGUSR1 sent after it is logged, so the first has been delivered by
    the time the daemon is asked again."""
    d = fresh_daemons()
    hello(d)
    d.send_signal(sig)
    d.send_signal(signal.SIGUSR1)
    assert support.wait_until(lambda: "SIGUSR1" in d.stdout() or not d.alive(), 10), d.logs()
    assert d.alive(), d.logs()
    assert d.get("/health").status_code == 200
    hello(d)
    assert d.stop() == 0


def test_sigcont_after_sigterm_still_drains(fresh_daemons):
    """systemd's stop: SIGTERM, then SIGCONT at once; the drain goes on and
    ends with exit 0."""
    d = fresh_daemons()
    hello(d)
    d.send_signal(signal.SIGTERM)
    d.send_signal(signal.SIGCONT)
    assert d.wait_exit(60) == 0, d.logs()
    assert "draining" in d.stdout() and "stopped" in d.stdout(), d.logs()
