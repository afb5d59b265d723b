"""Fixtures of the black-box suites: the real daemon (ATTND_BIN, default
build/attnd; run under ATTND_WRAP when set, e.g. valgrind, its timeouts
times ATTND_SLOW: support.py) on 127.0.0.1 with a free port and a config
written to a temporary folder. Every daemon a module starts is stopped with
SIGTERM at the module's end, and must exit 0 with no sanitizer (or
memcheck) report on stderr.
"""
import pytest

import support


def pytest_configure(config):
    # schemathesis 3.39 imports a name jsonschema deprecates; not ours to fix
    config.addinivalue_line("filterwarnings",
                            "ignore:jsonschema.exceptions.RefResolutionError:DeprecationWarning")


@pytest.fixture(scope="session", autouse=True)
def _binary_exists():
    assert support.BIN.exists(), "attnd binary %s is missing: run make" % support.BIN


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    """Module-scoped factory: daemons(config=None, env=None, args=None) -> Daemon."""
    f = support.DaemonFactory(tmp_path_factory.mktemp("attnd"))
    yield f
    f.finish()


@pytest.fixture(scope="function")
def fresh_daemons(tmp_path):
    """The same factory for a daemon that lives only as long as one test."""
    f = support.DaemonFactory(tmp_path)
    yield f
    f.finish()


@pytest.fixture(scope="session")
def goldens():
    g = support.load_goldens()
    assert g, "no golden files in %s (run /usr/bin/python3 tests/gen_golden.py)" % support.GOLDEN_DIR
    return g


@pytest.fixture(scope="module")
def golden_config(goldens):
    """A config serving every golden model, by its golden name."""
    return {"models": [m.config() for _, m in goldens]}
