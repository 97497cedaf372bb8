"""The node plan: the pools, counts, labels, taints and capacity a profile declares.

Why one function: the same plan creates the embedded cluster's simulated
nodes and is what any cluster is checked against (suites/test_cluster_scale.py).
Pure (no client); ``Profile`` only for its type.
"""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clusterproof.config.profile import Profile


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"

    def as_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True)
class NodePool:
    """A set of identical nodes: what the profile asks the cluster to have."""
    name: str
    count: int
    labels: dict[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    capacity: dict[str, str] = field(default_factory=dict)


def kubelet_labels(name: str) -> dict[str, str]:
    """The labels a real kubelet registers its Node with (pkg/kubelet/kubelet_node_status.go): hostname, and
    OS and architecture under both the stable and the beta keys. Without the beta pair the node lifecycle
    controller adds it to every new node (reconcileNodeLabels: a GET and a PATCH in one of its 8 workers,
    the same workers that lift the not-ready taint), work a real cluster's bring-up does not have."""
    return {"kubernetes.io/hostname": name,
            "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64"}


def topology_labels(p: Profile, index: int) -> dict[str, str]:
    """The rack and block of the ``index``-th node of the plan (profile keys topology_*): consecutive nodes
    share a rack, consecutive racks a block; none when ``topology_nodes_per_rack`` is 0."""
    if not p.topology_nodes_per_rack:
        return {}
    rack = index // p.topology_nodes_per_rack
    return {p.topology_block_label: f"block-{rack // p.topology_racks_per_block}",
            p.topology_rack_label: f"rack-{rack}"}


def node_capacity(p: Profile) -> dict[str, str]:
    return {"cpu": str(p.node_cpu), "memory": p.node_memory, "pods": str(p.node_max_pods),
            "nvidia.com/gpu": str(p.node_gpus), "ephemeral-storage": p.node_ephemeral_storage}


def node_plan(p: Profile) -> list[NodePool]:
    """Split ``nodes`` into team pools, a preflight pool and the shared pool.

    Team pools share ``team_fraction`` of the nodes evenly (remainder to the
    first teams); ``preflight_fraction`` are new nodes that still carry the
    preflight taint; the rest is the untainted shared pool.
    """
    cap = node_capacity(p)
    n_team = int(p.nodes * p.team_fraction)
    n_pre = int(p.nodes * p.preflight_fraction)
    pools = []
    teams = list(p.teams) if n_team else []
    for i, team in enumerate(teams):
        count = n_team // len(teams) + (1 if i < n_team % len(teams) else 0)
        pools.append(NodePool(f"team-{team}", count,
                              {p.pool_label: f"team-{team}", p.team_taint_key: team},
                              (Taint(p.team_taint_key, team),), cap))
    pools.append(NodePool("preflight", n_pre, {p.pool_label: "preflight"},
                          (Taint(p.preflight_taint_key, "pending"),), cap))
    pools.append(NodePool("shared", p.nodes - n_team - n_pre, {p.pool_label: "shared"}, (), cap))
    return [pool for pool in pools if pool.count or pool.name.startswith("team-")]


def node_pod_cidrs(cidr: str, count: int) -> list[str]:
    """One /24 per node out of ``cidr`` (a node holds at most 254 pod IPs), in plan order.

    Why: kwok gives a pod an IP from its node's ``spec.podCIDR``, else from
    one small default range; per-node ranges are what a real cluster has and
    let 7,500 nodes' pods have distinct addresses.
    """
    try:
        net = ipaddress.ip_network(cidr)
    except ValueError:
        raise ValueError(f"node_pod_cidr {cidr!r} is not a network like 10.128.0.0/9") from None
    if net.version != 4 or net.prefixlen > 24 or 2 ** (24 - net.prefixlen) < count:
        raise ValueError(f"node_pod_cidr {cidr} must be an IPv4 range holding one /24 per node ({count} nodes "
                         f"need a /{24 - max(0, (count - 1).bit_length())} or larger)")
    base = int(net.network_address)
    return [f"{ipaddress.IPv4Address(base + (i << 8))}/24" for i in range(count)]
