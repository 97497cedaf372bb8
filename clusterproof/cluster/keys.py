"""The cluster's profile keys (the core group): size and shape of the nodes, pools and taints, the
embedded control plane, real nodes, the API SLOs, and the harness's own liveness and sweeping.
Defaults and the reasons for them: ``clusterproof/config/profiles/base.yaml``."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from clusterproof.cluster.node_plan import node_plan, node_pod_cidrs
from clusterproof.core.keygroup import Fraction, KeyGroup, LabelValues, Pos, PosFloat, QualifiedName


class ClusterKeys(KeyGroup):
    # the cluster
    nodes: Pos
    node_name_prefix: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")]
    node_gpus: Pos
    node_cpu: Pos
    node_memory: str
    node_max_pods: Pos
    node_ephemeral_storage: str
    node_pod_cidr: str
    # pools and taints
    pool_label: QualifiedName
    teams: LabelValues
    team_fraction: Fraction
    team_taint_key: QualifiedName
    preflight_fraction: Fraction
    preflight_taint_key: QualifiedName
    # embedded control plane
    kubernetes_version: Annotated[str, Field(pattern=r"^v1\.\d+\.\d+$")]
    heartbeat_factor: PosFloat
    node_lease_duration_s: Pos
    kcm_api_qps: Pos
    kcm_api_burst: Pos
    kwok_parallelism: Pos
    node_create_concurrency: Pos
    scheduler_api_qps: Pos
    scheduler_api_burst: Pos
    cluster_start_timeout_s: Pos
    bringup_timeout_s: Pos
    kube_feature_gates: str
    kube_runtime_config: str
    component_identities: bool
    real_nodes: Annotated[int, Field(ge=0, le=8)]
    real_node_nvml: bool
    real_node_identity: bool
    # SLOs of the API server
    slo_mutating_p99_s: PosFloat
    slo_list_p99_s: PosFloat
    # harness: liveness and sweeping
    run_lease_duration_s: Annotated[int, Field(ge=10)]
    claim_wait_s: Pos
    sweep_real_clusters: bool

    @staticmethod
    def rules(p) -> None:
        """Pools that exist and do not overlap; a pod range that fits the nodes; distinct taints."""
        if p.team_fraction + p.preflight_fraction > 1:
            raise ValueError("team_fraction + preflight_fraction must not exceed 1")
        if p.team_fraction > 0 and not p.teams:
            raise ValueError(f"team_fraction is {p.team_fraction} but teams is empty")
        empty = [pool.name for pool in node_plan(p) if pool.count == 0 and pool.name.startswith("team-")]
        if empty:
            raise ValueError(f"{', '.join(empty)} would get no nodes with nodes={p.nodes}; "
                             "raise nodes or team_fraction, or drop teams")
        if p.team_taint_key == p.preflight_taint_key:
            raise ValueError(f"team_taint_key and preflight_taint_key are both {p.team_taint_key!r}; they must differ")
        if p.node_pod_cidr:
            node_pod_cidrs(p.node_pod_cidr, p.nodes)   # raises ValueError with the reason


KEYS = ClusterKeys
