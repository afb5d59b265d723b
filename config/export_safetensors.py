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
loads that file by its path with safetensors_header.load, without running
the package's __init__ (which needs numpy and httpx).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from safetensors_header import load  # noqa: E402  (its neighbour: the one loader)

_impl = load("_export_safetensors")

export = _impl.export
write_safetensors = _impl.write_safetensors
main = _impl.main

if __name__ == "__main__":
    sys.exit(main())
