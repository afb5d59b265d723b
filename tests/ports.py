"""ports.py - free TCP ports on 127.0.0.1 for the daemons and peers the test
suites start.

A port taken with bind(0) comes from the kernel's ephemeral range, the same
range its outgoing connections take their local ports from: between the test
reading the port and the daemon binding it, any client connection on the
machine may take it, and the daemon then exits "address in use". So ports
come from below that range, where only a listener can hold them, and never
twice from one process.
"""

import random
import socket

_given = set()


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A port nobody listens on now, outside the ephemeral range, not given
    before by this process; bind(0) where no such port is found."""
    low, high = 20000, min(_ephemeral_low(), 65536)
    rng = random.SystemRandom()
    for _ in range(200 if high - low > 1000 else 0):
        p = rng.randrange(low, high)
        if p in _given:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        _given.add(p)
        return p
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        p = s.getsockname()[1]
    _given.add(p)
    return p


def address_in_use(text, port):
    """Whether a daemon's output says it could not listen on port."""
    return (":%d (address in use" % port) in text
