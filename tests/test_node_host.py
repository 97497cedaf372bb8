"""A real node's own host, made and removed without a cluster (``clusterproof.cluster.nodehost``), and its relay
to the API server (``clusterproof.cluster.noderelay``).

What a kubelet and containerd do to "the host" must happen to the node's: the six kernel tunables the kubelet
checks read as it requires inside and are never written on the host; what the node makes in ``/run``,
``/var/lib`` and ``/var/log`` lands in its own directory while the host's entries stay visible to it; its
loopback is its own (a listener there is out of the host's reach), its address is reached from the host
through the veth, and its one road out is the relay. Removing it leaves no link, mount or process; before
the removal ``leftovers`` names them (so the check after it can fail). Root only (namespaces and mounts).
"""
from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

from clusterproof.cluster import nodehost, noderelay, realnodes
from clusterproof.core.ports import free_ports
from clusterproof.core.processes import mounts_under, unmount_under

pytestmark = pytest.mark.host

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not all(shutil.which(c) for c in ("unshare", "nsenter", "ip")),
                                reason="a node's own host needs root and unshare, nsenter and ip")
RELAY = [sys.executable, "-S", noderelay.__file__]


# --- pure ------------------------------------------------------------------------------------------------

def test_the_mount_plan_gives_the_kubelet_its_tunables_and_the_node_its_own_run_lib_and_log(tmp_path):
    plan = nodehost.mount_plan(tmp_path)
    files = {f["target"]: f["value"] for f in plan["files"]}
    # k8s.io/kubernetes v1.35 pkg/kubelet/cm/container_manager_linux.go setupKernelTunables
    assert files == {"/proc/sys/vm/overcommit_memory": 1, "/proc/sys/vm/panic_on_oom": 0,
                     "/proc/sys/kernel/panic": 10, "/proc/sys/kernel/panic_on_oops": 1,
                     "/proc/sys/kernel/keys/root_maxkeys": 1000000, "/proc/sys/kernel/keys/root_maxbytes": 25000000}
    for f in plan["files"]:
        assert f["source"].startswith(f"{tmp_path}/"), f"{f['source']} is outside the node's directory"
    shadows = {s["target"]: s for s in plan["shadows"]}
    assert set(shadows) == {"/run", "/var/lib", "/var/log"}
    assert "containerd" in shadows["/run"]["private"], "the shims' sockets (/run/containerd/s) must be the node's own"
    assert shadows["/var/lib"]["private"] == ["cni"] and shadows["/var/log"]["private"] == ["containers"]
    assert all(s["own"].startswith(f"{tmp_path}/") for s in plan["shadows"])


def test_a_path_under_the_nodes_own_directories_lies_in_its_directory(tmp_path):
    assert nodehost.own_path(tmp_path, "/run/containerd/s") == tmp_path / nodehost.HOST / "run" / "containerd" / "s"
    assert nodehost.own_path(tmp_path, "/var/lib") == tmp_path / nodehost.HOST / "var-lib"
    for host_path in ("/etc/hosts", "/runx", "/var/cache"):
        with pytest.raises(ValueError):
            nodehost.own_path(tmp_path, host_path)


def test_a_nodes_veth_has_fixed_local_macs_and_the_host_end_takes_the_last_address():
    assert nodehost.macs("0a1b2c3d") == ("02:c0:0a:1b:2c:3d", "02:c1:0a:1b:2c:3d")
    assert nodehost.host_address(ipaddress.ip_network("172.31.9.0/24")) == "172.31.9.254"


# --- the relay -------------------------------------------------------------------------------------------

class Echo:
    """A server on the host's loopback that answers every line with its uppercase."""

    def __init__(self, port: int):
        self.server = socket.create_server(("127.0.0.1", port))
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                c, _ = self.server.accept()
            except OSError:
                return
            with c:
                while data := c.recv(4096):
                    c.sendall(data.upper())


def _ask(port: int, text: bytes, in_netns: str | None = None) -> bytes:
    """``text`` sent to 127.0.0.1:``port`` (from inside ``in_netns``, if named), and the answer."""
    code = (f"import socket; s = socket.create_connection(('127.0.0.1', {port}), timeout=5); "
            f"s.sendall({text!r}); import sys; sys.stdout.buffer.write(s.recv(65536))")
    cmd = [sys.executable, "-c", code]
    if in_netns:
        cmd = ["nsenter", f"--net={in_netns}", *cmd]
    proc = subprocess.run(cmd, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode()[-500:]
    return proc.stdout


def _relay(netns: str, port: int, target: int) -> subprocess.Popen:
    proc = subprocess.Popen([*RELAY, netns, str(port), str(target)], stdout=subprocess.PIPE, text=True)
    assert "relay: 127.0.0.1:" in proc.stdout.readline(), "the relay did not say it listens"
    return proc


@needs_root
def test_the_relay_carries_bytes_both_ways():
    listen, target = free_ports(2)
    echo = Echo(target)
    relay = _relay("/proc/self/ns/net", listen, target)
    try:
        assert _ask(listen, b"kubelet says hello") == b"KUBELET SAYS HELLO"
        assert _ask(listen, b"x" * 100_000)[:10] == b"X" * 10, "a large write must pass"
    finally:
        relay.kill()
        relay.wait()
        echo.server.close()


def test_the_relay_says_in_one_line_what_is_wrong(tmp_path):
    bad = subprocess.run([*RELAY, str(tmp_path / "no-such-netns"), "6443"], capture_output=True, text=True,
                         timeout=30)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
    assert "no-such-netns" in bad.stderr, bad.stderr
    usage = subprocess.run([*RELAY, "only-one"], capture_output=True, text=True, timeout=30)
    assert usage.returncode == 4 and usage.stderr.startswith("usage:"), usage.stderr


# --- a whole node host -----------------------------------------------------------------------------------

def _free_subnet() -> ipaddress.IPv4Network:
    """The last /24 of the real nodes' range (plan hands them out from the first), if nothing on this host uses it."""
    net = list(realnodes.POD_NET.subnets(new_prefix=24))[-1]
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            try:
                if ipaddress.ip_address(a.address.split("%")[0]) in net:
                    pytest.skip(f"{net} is in use on this host")
            except ValueError:
                continue
    return net


def _sysctls() -> dict[str, str]:
    return {k: Path(f"/proc/sys/{k}").read_text().strip() for k in (*nodehost.KUBELET_TUNABLES, "net/ipv4/ip_forward")}


def _inside(d: Path, script: str) -> subprocess.CompletedProcess:
    ns = d / nodehost.NS
    return subprocess.run(["nsenter", f"--mount={ns / 'mnt'}", f"--net={ns / 'net'}", "sh", "-c", script],
                          capture_output=True, text=True, timeout=30)


@needs_root
def test_a_node_host_keeps_what_the_node_does_to_itself_and_goes_without_a_trace(tmp_path):
    net, seed = _free_subnet(), os.urandom(4).hex()
    d, veth, bridge = tmp_path / "rn" / "0", f"cpv{seed}", f"cpb{seed}"
    d.mkdir(parents=True)
    host_sysctls, host_run = _sysctls(), sorted(os.listdir("/run"))
    # Paths the node makes, each new on this host whatever the host already has (another run's leftovers).
    made = [f"/run/containerd/s/{seed}", f"/var/lib/cni/results/{seed}", f"/var/log/containers/{seed}"]
    procs: list[subprocess.Popen] = []
    try:
        nodehost.create(d, net, veth, bridge, seed)
        ns = d / nodehost.NS
        assert sorted(mounts_under(d)) == [str(ns), str(ns / "mnt"), str(ns / "net")], \
            "the host's mount table must gain the namespaces' bindings and nothing else"
        # Inside: the kubelet's tunables, read-only; the node's own /run etc., the host's entries still there.
        tunables = " ".join(f"/proc/sys/{k}" for k in nodehost.KUBELET_TUNABLES)
        seen = _inside(d, f"cat {tunables}; echo 0 > /proc/sys/kernel/panic && echo WROTE; "
                          f"mkdir -p {' '.join(made)} && ls /run")
        assert seen.stdout.split()[:6] == [str(v) for v in nodehost.KUBELET_TUNABLES.values()], seen
        assert "WROTE" not in seen.stdout and "Read-only file system" in seen.stderr, seen
        # ... every one but those the node keeps its own (the host may have a /run/mount of its own: a
        # cold machine's set-up had one, made by debootstrap's mount, before LIBMOUNT_UTAB moved it)
        visible = set(host_run) - set(nodehost.PRIVATE["/run"])
        assert visible <= set(seen.stdout.split()[6:]), f"the host's /run entries must stay visible: {seen}"
        for path in made:
            assert nodehost.own_path(d, path).is_dir(), f"{path} made inside is not in the node's directory"
            assert not Path(path).exists(), f"{path} made inside the node appeared on the host"
        assert _sysctls() == host_sysctls, "the host's kernel tunables changed"
        # The network: the node's address from the host, its loopback not; the relay its one road out.
        addr = str(net.network_address + 1)
        kubelet_port, healthz_port, relay_port, api_port = free_ports(4)
        server = (f"import socket, time; a = socket.create_server(('{addr}', {kubelet_port})); "
                  f"b = socket.create_server(('127.0.0.1', {healthz_port})); print('up', flush=True); time.sleep(600)")
        procs.append(subprocess.Popen(["nsenter", f"--net={ns / 'net'}", sys.executable, "-c", server],
                                      stdout=subprocess.PIPE, text=True))
        assert procs[-1].stdout.readline().strip() == "up"
        socket.create_connection((addr, kubelet_port), timeout=5).close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", healthz_port), timeout=5)
        echo = Echo(api_port)
        procs.append(_relay(str(ns / "net"), relay_port, api_port))
        assert _ask(relay_port, b"get /api", in_netns=str(ns / "net")) == b"GET /API"
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", relay_port), timeout=5)
        echo.server.close()
        assert _sysctls() == host_sysctls, "the host's kernel tunables (or IP forwarding) changed"
        # Before removal every trace is named (the check below can fail).
        left = nodehost.leftovers(d, [veth])
        assert f"link {veth}" in left and any(f"process {procs[0].pid} " in s for s in left), left
    finally:
        for p in nodehost.inside(d) + [psutil.Process(p.pid) for p in procs if p.poll() is None]:
            p.kill()
        for p in procs:
            p.wait()
        still = unmount_under(d) + nodehost.remove([veth, bridge])
    assert not still, still
    assert not nodehost.leftovers(d, [veth, bridge]) and not mounts_under(d)
    assert subprocess.run(["ip", "route", "show", str(net)], capture_output=True, text=True).stdout == ""
    shutil.rmtree(d)
    assert _sysctls() == host_sysctls and not any(Path(path).exists() for path in made)
