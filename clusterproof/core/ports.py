"""Free TCP ports on this machine, for the servers the harness starts (kwokctl's components, the extra
schedulers, a real node's kubelet, Prometheus, locust's local master): chosen up front, so runs side by
side on one machine (the self-tests in parallel) never contend for a fixed port.

Why not the OS's pick (bind to port 0): it comes from the ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 here), where every outgoing
connection on the machine also takes its source port. Between choosing a
port and the component binding it (kwokctl starts the components seconds
later) any new connection may take it -- four self-test workers talk to four
clusters -- and the component then dies on "bind: address already in use"
while kwokctl, which waits for the apiserver only, reports the cluster up.
Below that range only listeners take ports. Runs side by side draw from one
counter under a lock (``STATE``), so no two are handed the same port; a port
something listens on now is skipped. If the ephemeral range leaves too little
room below it, the OS's pick it is.
"""
from __future__ import annotations

import random
import socket
import tempfile
from pathlib import Path

from clusterproof.core.filelock import held

LOW = 11000                          # the lowest port handed out (clear of Kubernetes' defaults, 10248-10260)
MIN_SPAN = 2000                      # fewer ports than this below the ephemeral range: take the OS's pick
STATE = Path(tempfile.gettempdir()) / "clusterproof-ports"   # the next port to hand out, machine-wide
RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_low(path: Path = RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range (32768, Linux's default, if it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def bindable(port: int) -> bool:
    """Can a server bind ``port`` now (as Go's listeners do, with SO_REUSEADDR)?"""
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def free_ports(n: int, state: Path = STATE, low: int = LOW) -> list[int]:
    """``n`` distinct TCP ports below the ephemeral range that nothing listens on now, handed out in turn."""
    high = ephemeral_low() - 1
    span = high - low + 1
    if span < MIN_SPAN:
        return _os_picks(n)
    out: list[int] = []
    with held(state.with_name(state.name + ".lock")):
        try:
            port = int(state.read_text())
        except (OSError, ValueError):
            port = low + random.randrange(span)
        for _ in range(span):
            port = low + (port - low) % span
            if bindable(port):
                out.append(port)
            port += 1
            if len(out) == n:
                break
        state.write_text(str(port))
    if len(out) < n:
        return _os_picks(n)
    return out


def _os_picks(n: int) -> list[int]:
    """``n`` distinct ports the OS picks (all held open together while it does)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("0.0.0.0", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    """A TCP port free now (``free_ports``)."""
    return free_ports(1)[0]
