"""Fixtures of the Python client's suite (make test-client): the black-box
suites' own (the real daemon on 127.0.0.1: tests/blackbox/conftest.py and
support.py) and torch layers exported and served (tools.py). It runs in a
venv of Debian's python that sees python3-torch, with the client installed
from clients/python (tests/requirements-client.txt), never imported from
the source tree: what is tested is what `pip install ./clients/python`
installs."""
import importlib.util

import pytest
import torch

import attnd
import tools

# the black-box suites' fixtures (daemons, fresh_daemons, the binary's
# check), loaded under a name of their own: both files are conftest.py
_spec = importlib.util.spec_from_file_location("blackbox_conftest",
                                               tools.support.REPO / "tests" / "blackbox"
                                               / "conftest.py")
_blackbox = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_blackbox)
daemons = _blackbox.daemons
fresh_daemons = _blackbox.fresh_daemons
_binary_exists = _blackbox._binary_exists


def pytest_report_header(config):
    return "attnd client: %s (torch %s)" % (attnd.__file__, torch.__version__)


@pytest.fixture(scope="session", autouse=True)
def _client_installed():
    assert "site-packages" in attnd.__file__, \
        "attnd imported from %s, not from an installed package" % attnd.__file__


@pytest.fixture(scope="module")
def served(daemons, tmp_path_factory):
    """Three layers: self-attention (E=64, H=4), cross-attention with other
    key and value widths (E=48, H=6, kdim=40, vdim=24), no biases (E=32,
    H=2)."""
    layers = {"self64": tools.mha(64, 4, 1), "cross48": tools.mha(48, 6, 2, kdim=40, vdim=24),
              "nobias32": tools.mha(32, 2, 3, bias=False)}
    return tools.serve(daemons, tmp_path_factory.mktemp("served"), layers)
