"""A real node's one road out: a TCP relay from the node's own loopback to the API server on the host's.

Why: a real node's kubelet runs in the node's own network namespace (``clusterproof.cluster.nodehost``),
where 127.0.0.1 is the node's; kube-apiserver listens on the host's loopback only. This relay -- one more
kwokctl component per real node, started before its kubelet -- listens on 127.0.0.1:PORT inside the
node's namespace and joins each connection to 127.0.0.1:PORT in the host's. The kubelet's kubeconfig names
the URL every other component's does, so the API server's certificate holds, and TLS passes through
untouched: the relay moves bytes and never sees a credential. Nothing else leaves the node's namespace.

Run as ``python3 -S noderelay.py NETNS PORT [TARGET_PORT]`` (kwokctl starts it; standard library only).
The listening socket is made in the node's namespace (``setns`` in this thread; a socket keeps the
namespace it was made in), every outgoing one back in the relay's own.
"""
from __future__ import annotations

import ctypes
import os
import socket
import sys
import threading

CLONE_NEWNET = 0x40000000
CHUNK = 65536


def _setns(fd: int, what: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"cannot enter the network namespace {what}: {os.strerror(err)}")


def listen_in(netns: str, port: int) -> socket.socket:
    """A socket listening on 127.0.0.1:``port`` of the network namespace bound at ``netns``."""
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        target = os.open(netns, os.O_RDONLY)
        try:
            _setns(target, netns)
            try:
                return socket.create_server(("127.0.0.1", port))
            finally:
                _setns(own, "of the relay")
        finally:
            os.close(target)
    finally:
        os.close(own)


def pump(src: socket.socket, dst: socket.socket) -> None:
    """Bytes from ``src`` to ``dst`` until either end closes; then both ends are shut (waking the other pump)."""
    try:
        while data := src.recv(CHUNK):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()


def _serve(client: socket.socket, target_port: int) -> None:
    try:
        upstream = socket.create_connection(("127.0.0.1", target_port), timeout=10)
    except OSError as e:   # the API server is down or restarting: the kubelet retries
        print(f"relay: cannot reach 127.0.0.1:{target_port}: {e}", flush=True)
        client.close()
        return
    upstream.settimeout(None)
    for s in (client, upstream):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    pump(client, upstream)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not all(a.isdigit() for a in argv[1:]):
        print("usage: noderelay.py NETNS PORT [TARGET_PORT]", file=sys.stderr)
        return 4   # clusterproof.core.exitcodes.USAGE (not imported: this file runs on the standard library only)
    netns, port = argv[0], int(argv[1])
    target_port = int(argv[2]) if len(argv) == 3 else port
    try:
        server = listen_in(netns, port)
    except OSError as e:
        print(f"relay: {e}", file=sys.stderr)
        return 1
    print(f"relay: 127.0.0.1:{port} in {netns} -> 127.0.0.1:{target_port} of the host", flush=True)
    while True:
        client, _ = server.accept()
        threading.Thread(target=_serve, args=(client, target_port), daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
