"""Loopback helpers for localhost clusters (tests, benchmarks, α-β fits)."""

import socket


def free_ports(count):
    """`count` distinct free TCP ports on 127.0.0.1 (bound, then released)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports
