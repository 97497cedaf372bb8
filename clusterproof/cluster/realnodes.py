"""Real nodes in the embedded cluster: a real kubelet on a real container runtime, beside the kwok nodes.

Why: every pod the harness placed on a kwok node only ever existed in etcd.
A real node runs containers: image, sandbox, container start, the kubelet's
own admission of taints, NoExecute eviction, node Lease renewals under its
own identity -- and the GPU preflight checker as a pod from an image, the
exact path of a real GPU node, minus the silicon (the node's "GPUs" are the
project's mock ``libnvidia-ml.so.1``, handed into containers the way the
NVIDIA container toolkit hands in the real one; see ``clusterproof.cluster.gpu_runtime``).

Each real node (profile key ``real_nodes``) is three extra components of the
kwokctl cluster, so kwokctl starts, logs (``logs/<component>.log``), records
and stops them with the control plane and the supervisor restarts them like
kube-scheduler (``clusterproof.cluster.health``):

- ``containerd-<node>``: Debian's containerd (pinned in ``clusterproof.provision.hostpkgs``),
  with its own root, state, socket, runc root, CNI configuration and network
  namespaces (``netns_mounts_under_state_dir``), all under the node's directory
  inside the cluster's;
- ``relay-<node>``: the node's road to the API server (``clusterproof.cluster.noderelay``);
- ``kubelet-<node>``: the kubelet built at the cluster's version
  (``clusterproof.provision.toolchain.KUBELET``), its own root dir, ports, log dir and
  cgroup root (``/clusterproof/<cluster>/<node>`` in every v1 hierarchy), a
  client certificate ``system:node:<node>`` in ``system:nodes`` signed by the
  cluster CA, so the Node authorizer and API Priority and Fairness
  (``system-node-high``/``system-nodes``) treat it as any kubelet.

containerd and the kubelet (and so the shims, runc, the CNI plugins and the
containers) run in the node's own mount and network namespaces
(``clusterproof.cluster.nodehost``): what they do to "the host" -- kernel
tunables, mounts, ``/run/containerd``, ``/var/lib/cni``, ``/var/log/containers``,
links, sysctls, iptables -- happens to the node's, and the machine is left as
it was found. The kubelet runs with ``protectKernelDefaults: true`` (it finds
the tunables it wants in the node's read-only ``/proc/sys`` files, and writes
none) and ``makeIPTablesUtilChains: false`` (no chain at all).

Each node has a bridge of its own (in its namespace) and a /24 of ``POD_NET``:
the bridge holds the first address, the node's own (the kubelet refuses a
loopback address); its pods get an on-link route to it, no gateway (so nothing
turns IP forwarding on), no masquerade and no port maps. The host reaches the
node's /24 through a veth whose host end holds the /24's last address. Real
nodes register with the taint
``REAL_NODE_TAINT`` (NoSchedule): the suites' kwok workloads (fake images)
never land on them; the real-node checks tolerate it. kwok is told to leave
them alone (``--manage-nodes-with-annotation-selector``: only nodes the
harness created as kwok nodes).

What each node is told (its containerd, CNI and kubelet configuration, the audit rules of its heartbeats) is
rendered in ``clusterproof.cluster.realnode_config``; here the node is planned, started, confined and removed.

Clean-up (``teardown``) runs wherever the cluster is deleted -- the end of a
run, Ctrl-C, and the sweep of a run killed with SIGKILL -- and takes exactly
what the node's own files name: the shims, containers and every other process
in the node's cgroups or namespaces, every mount under the node's directory
(the namespaces' bindings with them), the cgroups, the host's end of the veth.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import shutil
import signal
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

import psutil
import yaml

from clusterproof.cluster import gpu_runtime, identities, nodehost, noderelay
from clusterproof.cluster.realnode_config import (
    CNI_BIN,
    REAL_NODE_LABEL,
    REAL_NODE_TAINT,
    RealNode,
    cni_config,
    containerd_config,
    kubelet_config,
)
from clusterproof.core import filelock
from clusterproof.core.errors import HarnessError
from clusterproof.core.processes import mounts_under, unmount_under
from clusterproof.provision import hostpkgs, toolchain

NODE_PREFIX = "cp-real-"
DIR = "rn"                          # under the cluster's directory (short: unix socket paths are <108 bytes)
# A /24 per node: its bridge holds .1 (the node's address), the host's end of its veth .254; pods get .2-.253.
POD_NET = ipaddress.ip_network("172.31.0.0/16")
CGROUP_V1 = Path("/sys/fs/cgroup")
STATE_FILE = "node.json"            # what teardown needs: links, cgroup root, socket


def containerd_component(node: str) -> str:
    return f"containerd-{node}"


def kubelet_component(node: str) -> str:
    return f"kubelet-{node}"


def relay_component(node: str) -> str:
    return f"relay-{node}"


def _short(cluster: str, i: int) -> str:
    return hashlib.sha256(f"{cluster}/{i}".encode()).hexdigest()[:8]


def _used_networks() -> set[ipaddress.IPv4Network]:
    used = set()
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            try:
                ip = ipaddress.ip_address(a.address.split("%")[0])
            except ValueError:
                continue
            if ip.version == 4:
                used.add(ipaddress.ip_network(f"{ip}/24", strict=False))
    return used


def require_host() -> None:
    """One line naming what this host lacks to run real nodes (root, cgroups, overlayfs, the runtime)."""
    if os.geteuid() != 0:
        raise HarnessError("real_nodes needs root (a kubelet and containerd manage mounts, cgroups and network "
                           "namespaces): run as root or set real_nodes: 0")
    missing_cg = [c for c in ("cpu", "cpuacct", "memory", "pids", "cpuset")
                  if not (CGROUP_V1 / c / "cgroup.procs").exists()]
    if missing_cg:
        raise HarnessError(f"real_nodes needs the cgroup v1 hierarchies {', '.join(missing_cg)} mounted under "
                           f"{CGROUP_V1} (this harness runs the kubelet with failCgroupV1: false); set real_nodes: 0")
    if "overlay" not in Path("/proc/filesystems").read_text():
        raise HarnessError("real_nodes needs overlayfs (modprobe overlay) or set real_nodes: 0")
    hostpkgs.require()
    nodehost.require()
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).exists():
            raise HarnessError(f"CNI plugin {CNI_BIN / plugin} is missing (apt-get install "
                               f"containernetworking-plugins) or set real_nodes: 0")


def plan(cluster_dir: Path, cluster: str, n: int, ports: list[int]) -> list[RealNode]:
    """``n`` real nodes with addresses and subnets no interface on this host uses (chosen under a lock,
    so two runs starting together do not pick the same), each in a host of its own (``nodehost.create``;
    its state file is written first: a failure halfway is torn down like a whole node)."""
    nodes = []
    with filelock.held(toolchain.cache_root() / "real-nodes.lock"):
        used = _used_networks() | _claimed_networks()
        free = [net for net in POD_NET.subnets(new_prefix=24) if net not in used][:n]
        if len(free) < n:
            raise HarnessError(f"no free /24 left in {POD_NET} for {n} real node(s): other runs hold them")
        for i, net in enumerate(free):
            h = _short(cluster, i)
            node = RealNode(name=f"{NODE_PREFIX}{i}", index=i, directory=cluster_dir / DIR / str(i),
                            address=str(net.network_address + 1), pod_subnet=str(net),
                            bridge=f"cpb{h}", veth=f"cpv{h}",
                            cgroup_root=f"/clusterproof/{cluster}/{NODE_PREFIX}{i}",
                            kubelet_port=ports[2 * i], healthz_port=ports[2 * i + 1])
            node.directory.mkdir(parents=True, exist_ok=True)
            (node.directory / STATE_FILE).write_text(json.dumps(node.state()))
            nodes.append(node)
            nodehost.create(node.directory, net, node.veth, node.bridge, h)
    return nodes


def _claimed_networks() -> set[ipaddress.IPv4Network]:
    """Subnets recorded by real nodes of clusters on this machine (a node whose link is not up yet)."""
    out = set()
    root = toolchain.cache_root() / "kwok" / "clusters"
    for f in root.glob(f"*/{DIR}/*/{STATE_FILE}"):
        try:
            out.add(ipaddress.ip_network(f"{json.loads(f.read_text())['address']}/24", strict=False))
        except (OSError, ValueError, KeyError):
            continue
    return out


# the real nodes' simulated GPUs' faults (clusterproof.preflight.mock_nvml.FaultFile)
FAULTS_FILE = "nvml-faults.json"


def faults_file(cluster_dir: Path) -> Path:
    return cluster_dir / DIR / FAULTS_FILE


def components(cluster_dir: Path, server: str, nodes: list[RealNode], sandbox_image: str,
               nvml_library: str | None, node_identity: bool = True,
               kubernetes_version: str = toolchain.KUBERNETES_VERSION) -> list[dict]:
    """The kwokctl extra components of each real node (containerd and the relay to the API server, then its
    kubelet).

    ``nvml_library``: the library the node's GPU runtime hands to containers that ask for GPUs
    (``clusterproof.cluster.gpu_runtime``); None: a node whose driver library is missing (a negative control)."""
    kubelet = toolchain.ensure(toolchain.kubelet(kubernetes_version))
    bindir = cluster_dir / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    pki = cluster_dir / "pki"
    faults = faults_file(cluster_dir)
    if not faults.exists():
        faults.parent.mkdir(parents=True, exist_ok=True)
        faults.write_text(json.dumps({"machines": {}}))
    out = []
    for node in nodes:
        d = node.directory
        for sub in ("containerd", "cni", "pod-logs", "kubelet", "ipam"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        runtime = gpu_runtime.write_wrapper(d, node.name, nvml_library, str(faults), hostpkgs.binary("runc"))
        (d / "containerd.toml").write_text(containerd_config(node, sandbox_image, runtime))
        (d / "cni" / "10-clusterproof.conflist").write_text(json.dumps(cni_config(node), indent=1))
        (d / "kubelet.yaml").write_text(yaml.safe_dump(kubelet_config(node, pki / "ca.crt")))
        if node_identity:
            identities.sign_client(pki, node.name, f"system:node:{node.name}", (identities.NODES_GROUP,))
            kubeconfig = identities.write_kubeconfig(d / "kubelet.kubeconfig", server, pki, node.name)
        else:   # the negative control: the kubelet as the admin (APF-exempt, not a node identity)
            kubeconfig = identities.write_kubeconfig(d / "kubelet.kubeconfig", server, pki, "admin")
        make_cgroups(node.cgroup_root)
        # kwokctl names a component's pid file after its binary's name: containerd and the kubelet are started
        # as a wrapper of that name, which enters the node's namespaces and runs the binary through a link of
        # that name (the process then reads as the component in ps, as every other one does).
        wrappers = d / "enter"
        wrappers.mkdir(exist_ok=True)
        for name, binary in ((containerd_component(node.name), hostpkgs.binary("containerd")),
                             (kubelet_component(node.name), kubelet.path("kubelet"))):
            _fresh(bindir / name).symlink_to(binary)
            nodehost.wrapper(_fresh(wrappers / name), d, cluster_dir, str(bindir / name), node.name,
                             after_socket=str(node.socket) if name == kubelet_component(node.name) else None)
        relay = _fresh(bindir / relay_component(node.name))
        relay.symlink_to("/usr/bin/python3")     # standard library only, as the node's GPU runtime
        out.append({"name": containerd_component(node.name), "binary": str(wrappers / containerd_component(node.name)),
                    "workDir": str(cluster_dir), "args": ["--config", str(d / "containerd.toml")]})
        out.append({"name": relay_component(node.name), "binary": str(relay), "workDir": str(cluster_dir),
                    "links": ["kube-apiserver"],
                    "args": ["-S", noderelay.__file__, str(d / nodehost.NS / "net"),
                             str(urllib.parse.urlsplit(server).port)]})
        out.append({"name": kubelet_component(node.name), "binary": str(wrappers / kubelet_component(node.name)),
                    "workDir": str(cluster_dir),
                    "links": ["kube-apiserver", containerd_component(node.name), relay_component(node.name)],
                    "args": [f"--config={d / 'kubelet.yaml'}", f"--kubeconfig={kubeconfig}",
                             f"--root-dir={d / 'kubelet'}", f"--cert-dir={d / 'kubelet' / 'pki'}",
                             f"--hostname-override={node.name}", f"--node-ip={node.address}",
                             f"--node-labels={REAL_NODE_LABEL}=real", "--v=1",
                             # client-go logs each response's headers, among them the flow schema and
                             # priority level API Priority and Fairness put the request in (the
                             # classification check's instrument; ~2 KB/s of log per node)
                             "--vmodule=round_trippers=8"]})
    return out


def _fresh(path: Path) -> Path:
    if path.is_symlink() or path.exists():
        path.unlink()
    return path


FLOW_SCHEMA_HEADER = "X-Kubernetes-Pf-Flowschema-Uid"
UNCLASSIFIED = "(none yet: the API server's first seconds)"


def flow_schema_uids(kubelet_log: Path) -> dict[str, int]:
    """How many of a kubelet's responses named each FlowSchema uid (its log, ``--vmodule=round_trippers=8``)."""
    counts: dict[str, int] = {}
    try:
        text = kubelet_log.read_text(errors="replace")
    except OSError:
        return counts
    for line in text.splitlines():
        line = line.strip()
        if line.startswith(FLOW_SCHEMA_HEADER + ":"):
            # empty: answered before the API server had made its stock flow schemas (its first seconds)
            uid = line.split(":", 1)[1].strip() or UNCLASSIFIED
            counts[uid] = counts.get(uid, 0) + 1
    return counts


def hierarchies() -> list[Path]:
    """Every cgroup v1 hierarchy the kubelet makes its ``kubepods`` in (and the unified one)."""
    if not CGROUP_V1.exists():
        return []
    return [p for p in sorted(CGROUP_V1.iterdir()) if (p / "cgroup.procs").exists()]


def make_cgroups(root: str) -> None:
    """The kubelet's cgroupRoot must exist in every hierarchy before it starts."""
    for h in hierarchies():
        path = h / root.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        if h.name == "cpuset":   # a new cpuset cgroup has no cpus and mems until given its parent's
            for p in [*reversed(path.relative_to(h).parents), path.relative_to(h)]:
                cg = h / p
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if (cg / f).exists() and not (cg / f).read_text().strip():
                        (cg / f).write_text((cg.parent / f).read_text())


# --- clean-up: everything a real node's own files name -------------------------------------------------

def _cgroup_dirs(base: Path) -> list[Path]:
    """``base`` and every cgroup below it; one that vanishes meanwhile (another sweeper, the kubelet) is skipped."""
    out = []
    for top, _dirs, _ in os.walk(base, onerror=lambda e: None):
        out.append(Path(top))
    return out


def cgroup_pids(root: str) -> set[int]:
    pids = set()
    for h in hierarchies():
        base = h / root.lstrip("/")
        if not base.exists():
            continue
        for d in _cgroup_dirs(base):
            try:
                pids.update(int(x) for x in (d / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
    return pids


def _remove_cgroups(root: str) -> list[str]:
    left = []
    for h in hierarchies():
        base = h / root.lstrip("/")
        if not base.exists():
            continue
        for d in sorted(_cgroup_dirs(base), key=lambda p: -len(p.parts)):
            for attempt in range(20):   # a process just killed leaves its cgroup a moment later (EBUSY)
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    if attempt == 19:
                        left.append(f"cgroup {d}")
                    else:
                        time.sleep(0.1)
        # the empty parents the harness made (/clusterproof/<cluster>)
        for parent in base.parents:   # /clusterproof/<cluster>, then /clusterproof (if no other run uses it)
            if parent == h:
                break
            try:
                parent.rmdir()
            except OSError:
                break
    return left


def shims_of(socket: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if cmd and "containerd-shim" in os.path.basename(cmd[0]) and socket in cmd:
            out.append(p)
    return out


def _naming(directory: Path) -> list[psutil.Process]:
    """Live processes whose command line names the node's own directory (a kubelet or containerd the pid files
    no longer name, e.g. started again by hand): the node's, and nothing else's."""
    out = []
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.info["status"] != psutil.STATUS_ZOMBIE and any(str(directory) in a for a in p.info["cmdline"] or []):
            out.append(p)
    return out


SHIM_SOCKETS = "/run/containerd/s"


def shim_socket(proc: psutil.Process) -> Path | None:
    """Where the socket a containerd 1.6 shim serves on lies: /run/containerd/s/sha256(<address>/<namespace>/<id>),
    fixed by containerd, which in the node's mount namespace is the node's own /run (``nodehost``), under the
    node's directory (its containerd's socket's)."""
    try:
        cmd = proc.cmdline()
        opt = {cmd[i]: cmd[i + 1] for i in range(1, len(cmd) - 1) if cmd[i].startswith("-")}
        key = f"{opt['-address']}/{opt['-namespace']}/{opt['-id']}"
    except (psutil.Error, KeyError):
        return None
    return nodehost.own_path(Path(opt["-address"]).parent, SHIM_SOCKETS) / hashlib.sha256(key.encode()).hexdigest()


def _links(st: dict) -> list[str]:
    """A node's links that may be on the host: its veth's end (and its bridge, there in states written before
    nodes had namespaces of their own)."""
    return [n for n in (st.get("veth"), st.get("bridge")) if n]


def teardown(cluster_dir: Path) -> list[str]:
    """Remove every real node of ``cluster_dir`` (its containerd and kubelet must be dead already:
    ``processes.kill_owned``). Returns what could not be removed (empty: nothing is left)."""
    left = []
    for state_file in sorted((cluster_dir / DIR).glob(f"*/{STATE_FILE}")):
        try:
            st = json.loads(state_file.read_text())
        except (OSError, ValueError):
            continue
        d = state_file.parent
        # Shims first (they would restart nothing, but hold mounts), then every process in the node's cgroups
        # or namespaces. Once none is left and their bindings are unmounted, the namespaces go, and with
        # them every mount, link and sysctl the node made inside.
        for _ in range(3):
            victims = (shims_of(st["socket"]) + _naming(d) + nodehost.inside(d)
                       + [psutil.Process(p) for p in cgroup_pids(st["cgroup_root"]) if psutil.pid_exists(p)])
            if not victims:
                break
            for p in victims:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.Error:
                    pass
            psutil.wait_procs(victims, timeout=5)
        left += unmount_under(d)
        left += _remove_cgroups(st["cgroup_root"])
        left += nodehost.remove(_links(st))
        if not left:
            shutil.rmtree(d, ignore_errors=True)
    return left


def leftovers(cluster_dir: Path, states: list[dict]) -> list[str]:
    """What of these real nodes still exists on the host (processes, mounts, cgroups, links, processes in
    their namespaces): for the self-tests that kill a run and look."""
    out = []
    for st in states:
        out += [f"process {p.pid} ({p.name()})" for p in shims_of(st["socket"])]
        out += [f"process {p}" for p in cgroup_pids(st["cgroup_root"])]
        out += [f"cgroup {h / st['cgroup_root'].lstrip('/')}" for h in hierarchies()
                if (h / st["cgroup_root"].lstrip("/")).exists()]
        out += nodehost.leftovers(Path(st["socket"]).parent, _links(st))
    out += [f"mount {m}" for m in mounts_under(cluster_dir)]
    for p in psutil.process_iter(["cmdline"]):
        if any(str(cluster_dir) in a for a in (p.info["cmdline"] or [])):
            out.append(f"process {p.pid} ({' '.join(p.info['cmdline'][:2])[:80]})")
    return out


def wait_registered(api, nodes: list[RealNode], timeout: float, kwok_dir: Path) -> None:
    """Every real node registered and Ready (its kubelet's log is named if not)."""
    from clusterproof.core.waiting import wait_for
    from clusterproof.kube.client import get_if_present

    def ready(node: RealNode) -> bool:
        obj = get_if_present(api, f"/api/v1/nodes/{node.name}")
        conds = {c["type"]: c["status"] for c in ((obj or {}).get("status") or {}).get("conditions") or []}
        return conds.get("Ready") == "True"
    for node in nodes:
        wait_for(lambda n=node: ready(n), timeout=timeout, interval=1,
                 what=f"real node {node.name} Ready "
                      f"(log: {kwok_dir / 'logs' / (kubelet_component(node.name) + '.log')})")


def is_component(name: str) -> bool:
    """A kwokctl component name of a real node (containerd-cp-real-0, relay-cp-real-0, kubelet-cp-real-0)."""
    return name.startswith(tuple(f(NODE_PREFIX) for f in (containerd_component, relay_component, kubelet_component)))


def sample_usage(nodes: list[RealNode]) -> dict[str, dict]:
    """Per real node: CPU seconds and resident memory of its containerd, kubelet, shims and containers
    (the processes naming the node's directory or socket, and those in its cgroups): what it costs."""
    out = {}
    for node in nodes:
        cpu, rss, procs = 0.0, 0, 0
        in_cgroups = cgroup_pids(node.cgroup_root)
        for p in psutil.process_iter(["cmdline"]):
            cmd = p.info["cmdline"] or []
            if p.pid in in_cgroups or any(str(node.directory) in a for a in cmd) or str(node.socket) in cmd:
                try:
                    t = p.cpu_times()
                    cpu += t.user + t.system
                    rss += p.memory_info().rss
                    procs += 1
                except psutil.Error:
                    continue
        out[node.name] = {"cpu_s": round(cpu, 2), "rss_mib": round(rss / 2**20, 1), "processes": procs}
    return out


def pod_on(name: str, run_id: str, node: str, image: str, tolerations: list[dict] | None = None) -> dict:
    """A small pod for a real node (its taint tolerated unless ``tolerations`` says otherwise), image by digest."""
    from clusterproof.kube.pod_spec import pod_body
    tol = tolerations if tolerations is not None else [{"key": REAL_NODE_TAINT["key"], "operator": "Exists"}]
    body = pod_body(name, run_id, tolerations=tol, hostnames=[node])
    c = body["spec"]["containers"][0]
    c["image"], c["imagePullPolicy"] = image, "IfNotPresent"
    # Requests only: a real container under the simulated pods' 10m CPU limit gets 1 ms of CPU per 100 ms,
    # and runc's own start-up inside the pod's cgroup then takes 5-6 s (measured here).
    c["resources"].pop("limits", None)
    body["spec"]["terminationGracePeriodSeconds"] = 5
    return body


@dataclass
class Joined:
    """The real nodes of a running embedded cluster, and what their joining cost."""
    nodes: list[RealNode]
    images: dict                      # name -> clusterproof.provision.images.Built (imported into every node)
    seconds_to_ready: dict[str, float]
    gpus: int
    nvml: str | None                  # the library handed to GPU containers (None: missing, a control)

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]


def join(api, cluster_dir: Path, nodes: list[RealNode], built: dict, gpus: int, nvml: str | None,
         started_at: float, timeout: float, progress) -> Joined:
    """After ``kwokctl create cluster`` started them: each node's images imported, the node Ready, and its
    GPUs advertised (``nvidia.com/gpu``: what the NVIDIA device plugin would advertise; the harness writes
    it, as no device plugin runs without a driver)."""
    from clusterproof.core.waiting import wait_for
    from clusterproof.kube.client import get_if_present, raw_request
    from clusterproof.provision import images
    for node in nodes:
        for b in built.values():
            images.import_into(b, str(node.socket))
    ready = {}
    for node in nodes:
        wait_registered(api, [node], timeout, cluster_dir)
        ready[node.name] = round(time.monotonic() - started_at, 1)
        raw_request(api, "PATCH", f"/api/v1/nodes/{node.name}/status",
                    headers={"Content-Type": "application/merge-patch+json"},
                    body={"status": {"capacity": {"nvidia.com/gpu": str(gpus)}}}).data
    for node in nodes:   # the kubelet derives allocatable from capacity at its next status update (~10 s)
        wait_for(lambda n=node: get_if_present(api, f"/api/v1/nodes/{n.name}"),
                 until=lambda obj: ((obj or {}).get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu")
                 == str(gpus), timeout=60, interval=1, what=f"real node {node.name} allocating {gpus} GPUs")
    kubelets = sorted({((get_if_present(api, f"/api/v1/nodes/{n.name}") or {}).get("status") or {})
                       .get("nodeInfo", {}).get("kubeletVersion", "?") for n in nodes})
    progress(f"{len(nodes)} real node(s) Ready ({', '.join(f'{k} {v:.0f} s' for k, v in ready.items())} after "
             f"the cluster start; kubelet {', '.join(kubelets)} as the node reports it, containerd from Debian)")
    return Joined(nodes, built, ready, gpus, nvml)
