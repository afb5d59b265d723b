"""safetensors_header.py - the head of a .safetensors file, in the Python
standard library alone (safetensors_header, safetensors_bytes), for the
scripts that import it with config/ on sys.path: the tests' and benches'
weight writers.

The code is the Python client's, clients/python/attnd/_safetensors_header.py,
so that every .safetensors file written in the project has the same bytes
and the package holds its own files. This file loads it by its path, as
config/export_safetensors.py does its module (a package of its own named
attnd_source whose folder is clients/python/attnd), without running the
package's __init__: it needs no numpy, httpx or torch.
"""
import importlib
import os
import sys
import types

ATTND = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                      os.pardir, "clients", "python", "attnd"))

if "attnd_source" not in sys.modules:
    _package = types.ModuleType("attnd_source", "clients/python/attnd, loaded by path")
    _package.__path__ = [ATTND]
    sys.modules["attnd_source"] = _package
_impl = importlib.import_module("attnd_source._safetensors_header")

safetensors_header = _impl.safetensors_header
safetensors_bytes = _impl.safetensors_bytes
