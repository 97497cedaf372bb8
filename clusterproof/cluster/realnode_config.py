"""What a real node is told: its containerd, CNI and kubelet configuration, and the audit rules of its
heartbeats, rendered from its plan (``RealNode``).

Why apart from ``clusterproof.cluster.realnodes``: that module starts, confines and removes a real node
(files, cgroups, namespaces, processes); this one only renders text and dicts from the plan -- pure, no
process, cgroup or file touched -- so what a node runs with reads (and is tested) on its own.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

REAL_NODE_LABEL = "clusterproof.io/node-kind"       # "real" on these nodes
REAL_NODE_TAINT = {"key": "clusterproof.io/real-node", "value": "true", "effect": "NoSchedule"}
CNI_BIN = Path("/usr/lib/cni")
LEASE_DURATION_S = 40               # the kubelet's default, said explicitly (renewed every 10 s)


@dataclass
class RealNode:
    """A real node's plan: what its configuration is rendered from (``realnodes.plan`` chooses it)."""
    name: str
    index: int
    directory: Path                  # <cluster>/rn/<index>
    address: str
    pod_subnet: str
    bridge: str                      # the node's bridge (in its namespace): holds its address
    veth: str                        # the host's end of the veth into the node's namespace
    cgroup_root: str                 # /clusterproof/<cluster>/<node>
    kubelet_port: int
    healthz_port: int

    @property
    def socket(self) -> Path:
        return self.directory / "c.sock"

    def state(self) -> dict:
        return {"name": self.name, "address": self.address, "pod_subnet": self.pod_subnet,
                "bridge": self.bridge, "veth": self.veth, "cgroup_root": self.cgroup_root,
                "socket": str(self.socket),
                "kubelet_port": self.kubelet_port}


def containerd_config(node: RealNode, sandbox_image: str, runtime_binary: str) -> str:
    d = node.directory
    return f"""\
version = 2
root = "{d / 'containerd' / 'root'}"
state = "{d / 'containerd' / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
                    "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "{node.socket}"

[ttrpc]
  address = "{node.socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'containerd' / 'opt'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  # Without it every sandbox fails: runc cannot lower oom_score_adj below the harness's own (NOTES.md).
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "{d / 'runc'}"
        SystemdCgroup = false
        # runc behind the node's GPU runtime, as nvidia-container-runtime is on a GPU node
        BinaryName = "{runtime_binary}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{d / 'cni'}"
"""


def cni_config(node: RealNode) -> dict:
    return {"cniVersion": "0.4.0", "name": f"clusterproof-{node.name}", "plugins": [
        # No gateway: the plugin would give the bridge an address and turn IP forwarding on. Pods keep an
        # on-link route to their /24 (the node's address included); nothing they run needs more.
        {"type": "bridge", "bridge": node.bridge, "isGateway": False, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": node.pod_subnet, "rangeEnd": str(
             ipaddress.ip_network(node.pod_subnet).broadcast_address - 2)}]],   # .254 is the host's
                  "dataDir": str(node.directory / "ipam")}}]}


def kubelet_config(node: RealNode, ca: Path) -> dict:
    d = node.directory
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # This host (and CI's) is cgroup v1 hybrid: 1.35 refuses v1 unless told (KEP-5573).
        "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": node.cgroup_root,
        # Refuse to start rather than set a kernel tunable: the node's /proc/sys files hold what it requires
        # (clusterproof.cluster.nodehost), the host's are never written.
        "protectKernelDefaults": True,
        "makeIPTablesUtilChains": False,   # no KUBE-FIREWALL, KUBE-KUBELET-CANARY or KUBE-IPTABLES-HINT
        "containerRuntimeEndpoint": f"unix://{node.socket}",
        "address": node.address, "port": node.kubelet_port, "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1", "healthzPort": node.healthz_port,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "registerWithTaints": [REAL_NODE_TAINT],
        "podLogsDir": str(d / "pod-logs"),
        "resolvConf": "",
        "failSwapOn": False,
        # The host's disk and memory are shared with everything else on it: the node must not evict
        # the harness's own pods because another process filled the disk.
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "maxPods": 16,
        "nodeLeaseDurationSeconds": LEASE_DURATION_S,
        "serializeImagePulls": False,
    }


def audit_rules(names: list[str]) -> list[dict]:
    """Audit policy rules for the real nodes' heartbeats: their node Lease and node status writes, at
    Metadata level (each event names the user that wrote: the identity check's instrument; how API Priority
    and Fairness classified a request is read from the kubelet's side, ``flow_schema_uids``). Nothing of the
    kwok nodes is logged."""
    if not names:
        return []
    return [{"level": "Metadata", "verbs": ["update", "patch"], "namespaces": ["kube-node-lease"],
             "resources": [{"group": "coordination.k8s.io", "resources": ["leases"], "resourceNames": list(names)}]},
            {"level": "Metadata", "verbs": ["update", "patch"],
             "resources": [{"group": "", "resources": ["nodes/status"], "resourceNames": list(names)}]}]
