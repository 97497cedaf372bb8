"""A real node's own host: mount and network namespaces of its own, so this machine is left as it was found.

Why: a kubelet and containerd take the machine they run on for theirs. The kubelet sets six kernel
tunables (``vm.overcommit_memory=1``, ``kernel.panic=10``...) unless told to refuse to start instead,
makes iptables chains and links its containers' logs into ``/var/log/containers``; containerd keeps
its shims' sockets in the fixed ``/run/containerd/s`` and the CNI library its cache in
``/var/lib/cni``; a bridge plugin acting as gateway turns on IP forwarding; and the kubelet listens on
the node's address. Run on this machine as they are, each of those outlives the run. So each real node
(``clusterproof.cluster.realnodes``) runs its containerd, kubelet and their children in a host of its own:

- **a network namespace** (``ns/net`` under the node's directory, not ``/run/netns``) holding the node's
  bridge and address, its pods' veths, its own loopback (the kubelet's healthz, containerd's stream
  server, the relay to the API server: ``clusterproof.cluster.noderelay``), and its own sysctls and
  iptables. One veth pair joins it to the host: the host end holds the last address of the node's /24
  and routes the /24 through it, so kube-apiserver reaches the kubelet (logs, exec); from the LAN the
  node's address is reachable only by forwarding, which the host does not do. Neighbours are written
  statically on both ends (no ARP), so the host's ARP sysctls, which a new namespace inherits, do not matter.
- **a mount namespace** (``ns/mnt``, private propagation): the kubelet's and containerd's mounts (root
  dir, rootfs overlays, pods' network namespaces) never enter the host's mount table and go with it.
  ``/run``, ``/var/lib`` and ``/var/log`` are the node's own directories (``host/``): every entry the host
  had when the node was made is bound back in (``/etc/resolv.conf``'s target in ``/run``, a home or a
  checkout under ``/var/lib``), except ``PRIVATE`` -- the ones a node writes -- which are always its own;
  whatever new the node makes there lands in its directory. The six ``/proc/sys`` files the kubelet
  checks are read-only files holding the values it requires (``KUBELET_TUNABLES``), so a kubelet with
  ``protectKernelDefaults: true`` finds them as it wants them and writes nothing.

Both namespaces live while their bind mounts (or a process in them) do: ``realnodes.teardown`` kills what
runs inside, unmounts the node's directory and ``remove`` deletes the host's end of the veth. The node's
components enter them with ``nsenter`` (``wrapper``).

Run as ``python3 -S nodehost.py PLAN`` inside a new mount namespace (``unshare``, see ``create``), this
file makes the mounts the plan lists with ``mount(2)`` -- the mount command would first create
``/run/mount`` for its utab on the host. Standard library only.
"""
from __future__ import annotations

import ctypes
import json
import os
import sys

NS = "ns"                    # under the node's directory: the namespaces' bind mounts (mnt, net)
HOST = "host"                # under the node's directory: its own /run, /var/lib, /var/log, /proc/sys files
UPLINK = "uplink"            # the node's end of its veth (inside its network namespace)
# What the kubelet requires of the kernel (k8s.io/kubernetes v1.35 pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables), as /proc/sys paths: with protectKernelDefaults it refuses to start when one differs.
KUBELET_TUNABLES = {"vm/overcommit_memory": 1, "vm/panic_on_oom": 0, "kernel/panic": 10, "kernel/panic_on_oops": 1,
                    "kernel/keys/root_maxkeys": 1000000, "kernel/keys/root_maxbytes": 25000000}
# The host directories that are the node's own in its mount namespace, and the entries of each that are the
# node's even where the host has them: containerd's shim sockets (/run/containerd/s), the mount command's
# utab, the CNI library's cache, the kubelet's container log links.
PRIVATE = {"/run": ("containerd", "mount"), "/var/lib": ("cni",), "/var/log": ("containers",)}

MS_RDONLY, MS_REMOUNT, MS_BIND, MS_REC = 1, 32, 4096, 16384
MNT_DETACH = 2


# --- inside the new mount namespace (python3 -S nodehost.py PLAN) ------------------------------------------

def _mount(libc, source: str | None, target: str, flags: int) -> None:
    if libc.mount(source.encode() if source else None, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source} on {target}: {os.strerror(err)}")


def _shadow(libc, target: str, own: str, private: list[str]) -> None:
    """``target`` becomes ``own``, with every entry ``target`` had bound back in but ``private``."""
    below = f"{own}.below"             # the host's ``target``, while its entries are bound back
    os.makedirs(below, exist_ok=True)
    _mount(libc, target, below, MS_BIND | MS_REC)
    # Held open: if the node's directory lies under ``target`` (a home in /var/lib), its path leads nowhere
    # until its entry is bound back.
    fd = os.open(below, os.O_RDONLY | os.O_DIRECTORY)
    held = f"/proc/self/fd/{fd}"
    _mount(libc, own, target, MS_BIND)
    for name in sorted(os.listdir(fd)):
        src, dst = f"{held}/{name}", os.path.join(target, name)
        if name in private:
            continue
        try:
            if os.path.islink(src):
                os.symlink(os.readlink(src), dst)
                continue
            if os.path.isdir(src):
                os.mkdir(dst)
            else:
                open(dst, "w").close()
            _mount(libc, src, dst, MS_BIND | MS_REC)
        except FileNotFoundError:      # gone from the host meanwhile
            continue
    libc.umount2(held.encode(), MNT_DETACH)
    os.close(fd)
    os.rmdir(below)


def apply(plan: dict) -> None:
    """Make ``plan``'s mounts in this (new, private) mount namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    for s in plan["shadows"]:
        _shadow(libc, s["target"], s["own"], s["private"])
    for f in plan["files"]:            # a file over a /proc/sys file, read-only
        _mount(libc, f["source"], f["target"], MS_BIND)
        _mount(libc, None, f["target"], MS_BIND | MS_REMOUNT | MS_RDONLY)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: nodehost.py PLAN (run by clusterproof.cluster.nodehost.create inside a new mount namespace)",
              file=sys.stderr)
        return 4   # clusterproof.core.exitcodes.USAGE (not imported: this file runs on the standard library only)
    with open(argv[0]) as f:
        plan = json.load(f)
    try:
        apply(plan)
    except OSError as e:
        print(f"nodehost: {e}", file=sys.stderr)
        return 1
    return 0


# --- the harness's side ----------------------------------------------------------------------------------

def _own_dir(directory, target: str):
    from pathlib import Path
    return Path(directory) / HOST / target.strip("/").replace("/", "-")


def own_path(directory, path: str):
    """Where ``path``, as the node sees it under one of its own directories (``PRIVATE``), lies on the host."""
    for target in PRIVATE:
        if path == target or path.startswith(target + "/"):
            return _own_dir(directory, target) / path[len(target):].lstrip("/")
    raise ValueError(f"{path} is the host's, not under a real node's own directories ({', '.join(PRIVATE)})")


def mount_plan(directory) -> dict:
    """What the node's mount namespace is made of (pure): its own directories over the host's, and its
    read-only kernel tunables."""
    return {"shadows": [{"target": t, "own": str(_own_dir(directory, t)), "private": list(p)}
                        for t, p in PRIVATE.items()],
            "files": [{"source": str(_own_dir(directory, "/proc/sys") / k), "target": f"/proc/sys/{k}", "value": v}
                      for k, v in KUBELET_TUNABLES.items()]}


def host_address(subnet) -> str:
    """The host's end of a node's veth: the last address of the node's /24 (its pods get .2 to .253)."""
    return str(subnet.broadcast_address - 1)


def macs(seed: str) -> tuple[str, str]:
    """Fixed, locally administered MAC addresses of a node's veth (host end, node end), from 8 hex digits."""
    tail = ":".join(seed[i:i + 2] for i in range(0, 8, 2))
    return f"02:c0:{tail}", f"02:c1:{tail}"


def _tool(name: str) -> str:
    import shutil

    from clusterproof.core.errors import HarnessError
    path = shutil.which(name)
    if path is None:
        pkg = "iproute2" if name == "ip" else "util-linux"
        raise HarnessError(f"real nodes need the `{name}` command (apt-get install {pkg}) or set real_nodes: 0")
    return path


def require() -> None:
    """One line if this host lacks a command a node's own host is made with."""
    from clusterproof.core.errors import HarnessError
    for name in ("ip", "unshare", "nsenter"):
        _tool(name)
    if not os.access("/usr/bin/python3", os.X_OK):
        raise HarnessError("real nodes need /usr/bin/python3 (their GPU runtime and mounts run on it; "
                           "apt-get install python3) or set real_nodes: 0")


def _run(what: str, args: list[str], stdin: str | None = None) -> None:
    import subprocess

    from clusterproof.core.errors import HarnessError
    proc = subprocess.run(args, input=stdin, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        said = (proc.stderr or proc.stdout).strip().replace("\n", "; ")
        raise HarnessError(f"real node: {what} failed: {said[:300] or f'exit {proc.returncode}'}")


def _bind_private(path) -> None:
    """``path`` bind-mounted onto itself, private: a mount namespace's file may only be bound on a mount
    that does not propagate (util-linux unshare(1); / is shared where systemd runs)."""
    from pathlib import Path
    path = Path(path)
    libc = ctypes.CDLL(None, use_errno=True)
    for source, flags in ((str(path), MS_BIND), (None, 1 << 18)):      # MS_PRIVATE
        _mount(libc, source, str(path), flags)


def mount_namespace(directory) -> None:
    """The node's mount namespace alone (bound at ``directory``/ns/mnt): its own ``/run``, ``/var/lib``,
    ``/var/log`` and kernel tunables (``mount_plan``). Also what a self-test's private containerd runs in, so
    that its shims' sockets (containerd 1.6: the fixed ``/run/containerd/s``) never land on the host."""
    from pathlib import Path
    d = Path(directory)
    ns = d / NS
    plan = mount_plan(d)
    for s in plan["shadows"]:
        Path(s["own"]).mkdir(parents=True, exist_ok=True)
    for f in plan["files"]:
        Path(f["source"]).parent.mkdir(parents=True, exist_ok=True)
        Path(f["source"]).write_text(f"{f['value']}\n")
    (d / HOST / "mounts.json").write_text(json.dumps(plan, indent=1))
    ns.mkdir(parents=True, exist_ok=True)
    _bind_private(ns)
    (ns / "mnt").touch()
    _run("making its mount namespace", [_tool("unshare"), f"--mount={ns / 'mnt'}", "--propagation", "private",
                                        "--", "/usr/bin/python3", "-S", os.path.abspath(__file__),
                                        str(d / HOST / "mounts.json")])


def create(directory, subnet, veth: str, bridge: str, seed: str) -> None:
    """The node's namespaces (bound under ``directory``/ns), its bridge holding the subnet's first address
    inside, and the veth pair and route that join it to the host. The namespaces are made first, so a failure
    halfway leaves only what ``remove`` and the node's teardown take."""
    from pathlib import Path
    d = Path(directory)
    ns, addr, host_addr = d / NS, str(subnet.network_address + 1), host_address(subnet)
    # The mount namespace before the network one: it then holds no copy of the node's own netns binding.
    mount_namespace(d)
    (ns / "net").touch()
    _run("making its network namespace", [_tool("unshare"), f"--net={ns / 'net'}", "true"])
    host_mac, node_mac = macs(seed)
    ip = _tool("ip")
    _run("making its veth", [ip, "link", "add", veth, "address", host_mac, "type", "veth",
                             "peer", "name", UPLINK, "address", node_mac, "netns", str(ns / "net")])
    _run("configuring its network", [_tool("nsenter"), f"--net={ns / 'net'}", ip, "-batch", "-"], "\n".join([
        "link set lo up", f"link set {UPLINK} up",
        f"link add {bridge} type bridge", f"addr add {addr}/{subnet.prefixlen} dev {bridge}", f"link set {bridge} up",
        f"route add {host_addr}/32 dev {UPLINK}",
        f"neigh replace {host_addr} lladdr {host_mac} dev {UPLINK} nud permanent"]) + "\n")
    _run("joining it to the host", [ip, "-batch", "-"], "\n".join([
        f"addr add {host_addr}/32 dev {veth}", f"link set {veth} up",
        f"route add {subnet} dev {veth} src {host_addr}",
        f"neigh replace {addr} lladdr {node_mac} dev {veth} nud permanent"]) + "\n")


def wrapper(path, directory, workdir, binary: str, node: str, after_socket: str | None = None) -> None:
    """An executable at ``path`` that runs ``binary`` (with its arguments) inside the node's namespaces: what
    kwokctl starts for the node's containerd and kubelet (it names the pid file after ``path``).

    ``after_socket``: first wait (60 s at most) until that unix socket exists -- the kubelet's containerd's.
    kwokctl starts the components one after the other without waiting for any, and a kubelet of 1.37 checks
    the CRI once at start and exits when nothing answers ("validate service connection"), where 1.35's waited."""
    import shlex
    from pathlib import Path
    ns = Path(directory) / NS
    cmd = [_tool("nsenter"), f"--mount={ns / 'mnt'}", f"--net={ns / 'net'}", f"--wd={workdir}", "--", binary]
    wait = (f"i=0\nwhile [ ! -S {shlex.quote(after_socket)} ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done\n"
            if after_socket else "")
    Path(path).write_text(f"#!/bin/sh\n# {Path(path).name}: in real node {node}'s own mount and network namespaces "
                          f"(clusterproof.cluster.nodehost)\n{wait}exec {shlex.join(cmd)} \"$@\"\n")
    Path(path).chmod(0o755)


def _bound(f) -> bool:
    """``f`` is a namespace's bind mount (while it is, its inode names that namespace and no other)."""
    from clusterproof.core.processes import mounts_under
    return os.path.realpath(f) in mounts_under(f)


def inside(directory) -> list:
    """Live processes in the node's namespaces (psutil.Process), while they are bound under ``directory``
    (a namespace's inode number is reused once it is gone: only a bound one identifies the node's)."""
    from pathlib import Path

    import psutil
    marks = set()
    for kind in ("mnt", "net"):
        f = Path(directory) / NS / kind
        if f.exists() and _bound(f):
            marks.add(f"{kind}:[{os.stat(f).st_ino}]")
    out = []
    if not marks:
        return out
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            if {os.readlink(f"/proc/{p.pid}/ns/{k}") for k in ("mnt", "net")} & marks:
                out.append(p)
        except OSError:
            continue
    return out


def _links_present(names) -> list[str]:
    import subprocess
    out = []
    for name in names:
        if name and subprocess.run([_tool("ip"), "link", "show", name], capture_output=True,
                                   timeout=30).returncode == 0:
            out.append(name)
    return out


def remove(links) -> list[str]:
    """Delete the host's ends of a node's links (its namespaces and everything in them go with their mounts
    and processes); returns what is still there."""
    import subprocess
    for name in _links_present(links):
        subprocess.run([_tool("ip"), "link", "del", name], capture_output=True, timeout=30)
    return [f"link {n}" for n in _links_present(links)]


def leftovers(directory, links) -> list[str]:
    """What of a node's own host is still on this machine: its links on the host, processes in its namespaces
    (mounts under its directory are the caller's to count)."""
    return ([f"link {n}" for n in _links_present(links)]
            + [f"process {p.pid} in the node's namespaces" for p in inside(directory)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
