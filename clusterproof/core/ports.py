"""Free TCP ports on this machine, for the processes the harness starts (kwokctl's components,
the extra schedulers, a real node's kubelet, locust's local master): chosen up front, so
runs side by side on one machine (the self-tests in parallel) never contend for a fixed port."""
from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free now (all held open together while the OS picks them)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("0.0.0.0", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port free now."""
    return free_ports(1)[0]
