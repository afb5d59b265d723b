"""attnd._safetensors_header - the head of a .safetensors file, in the
Python standard library alone: 8 bytes of little-endian header length, then
the JSON header padded with spaces to a multiple of 8. The tensors' raw
little-endian bytes follow it, in the order given.

config/safetensors.c reads this layout; attnd.torch.export (through
_export_safetensors), config/export_safetensors.py and the tests' weight
writers write it through this one function, so that a file written anywhere
in the project has the same bytes. Outside the package it is
config/safetensors_header.py, which loads this file by its path.
"""
import json
import struct


def safetensors_header(entries, metadata=None):
    """entries: (name, dtype, shape, nbytes) per tensor, in file order.
    Returns the bytes that precede the first tensor's data."""
    header, off = {}, 0
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    for name, dtype, shape, nbytes in entries:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h


def safetensors_bytes(tensors, metadata=None):
    """tensors: (name, dtype, shape, data) per tensor, data its raw bytes.
    Returns the whole file."""
    head = safetensors_header([(n, d, s, len(b)) for n, d, s, b in tensors], metadata)
    return head + b"".join(b for _, _, _, b in tensors)
