"""safetensors_header.py - the head of a .safetensors file, in the Python
standard library alone (safetensors_header, safetensors_bytes), for the
scripts that import it with config/ on sys.path: the tests' and benches'
weight writers.

The code is the Python client's, clients/python/attnd/_safetensors_header.py,
so that every .safetensors file written in the project has the same bytes
and the package holds its own files. load() brings a module of that folder
in by its path (config/export_safetensors.py uses it too), without running
the package's __init__: it needs no numpy, httpx or torch.
"""
import importlib
import os
import sys
import types

ATTND = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      os.pardir, "clients", "python", "attnd"))



def load(name):
    """The module `name` of clients/python/attnd, as a module of a package
    named attnd_source whose folder that is (its relative imports resolve
    as in the package; the package's __init__ does not run)."""
    if "attnd_source" not in sys.modules:
        package = types.ModuleType("attnd_source", "clients/python/attnd, loaded by path")
        package.__path__ = [ATTND]
        sys.modules["attnd_source"] = package
    return importlib.import_module("attnd_source." + name)


_impl = load("_safetensors_header")

safetensors_header = _impl.safetensors_header
safetensors_bytes = _impl.safetensors_bytes
