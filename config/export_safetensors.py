#!/usr/bin/env python3
"""export_safetensors.py - writes one attention layer of a torch model to a
.safetensors file that attnd serves, and prints the config entry for it
(docs/config.md). Needs only torch, and the repository's
clients/python/attnd/ (the package need not be installed).

    python3 config/export_safetensors.py SOURCE OUT.safetensors [options]
    python3 config/export_safetensors.py --help

From Python, with config/ on sys.path:

    from export_safetensors import export
    entry = export(model, "enc3.safetensors", attr="encoder.layers.3.self_attn")

The code is the Python client's (clients/python/attnd/_export_safetensors.py,
where the options are described), so that attnd.torch.export and this
script are one function and the package holds its own files. This script
loads that file by its path, as a module of a package of its own named
attnd_source whose folder is clients/python/attnd: the module's relative
import of _safetensors_header then resolves as it does in the package,
without running the package's __init__ (which needs numpy and httpx).
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
_impl = importlib.import_module("attnd_source._export_safetensors")

export = _impl.export
write_safetensors = _impl.write_safetensors
main = _impl.main

if __name__ == "__main__":
    sys.exit(main())
