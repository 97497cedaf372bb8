"""The cluster's profile keys (the core group): size and shape of the nodes, pools and taints, the
embedded control plane, real nodes, the API SLOs, and the harness's own liveness and sweeping.
Defaults and the reasons for them: ``clusterproof/config/profiles/base.yaml``."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, StringConstraints

from clusterproof.cluster.node_plan import node_plan, node_pod_cidrs
from clusterproof.core import kubeversions
from clusterproof.core.errors import HarnessError
from clusterproof.core.keygroup import Fraction, KeyGroup, LabelValues, Pos, PosFloat, QualifiedName

# The embedded cluster's Go components and the Go runtime settings a profile may give each
# (component_go_env): GOGC (a percentage, or off) and GOMEMLIMIT (bytes, with an optional IEC unit).
GoComponent = Literal["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller",
                      "coscheduling-scheduler", "podgroup-controller"]
# YAML reads GOGC: 400 as a number and GOGC: off as false: both are taken as the text written
GoSetting = Annotated[str, BeforeValidator(lambda v: "off" if v is False else str(v) if type(v) is int else v),
                      StringConstraints(pattern=r"^(off|[0-9]+(B|KiB|MiB|GiB|TiB)?)$")]
GoEnv = dict[GoComponent, dict[Literal["GOGC", "GOMEMLIMIT"], GoSetting]]


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
    topology_nodes_per_rack: Annotated[int, Field(ge=0)]
    topology_racks_per_block: Pos
    topology_rack_label: QualifiedName
    topology_block_label: QualifiedName
    # embedded control plane
    kubernetes_version: Annotated[str, Field(pattern=kubeversions.TAG.pattern)]
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
    kube_alpha_gates: bool
    kube_runtime_config: str
    component_identities: bool
    component_go_env: GoEnv
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
        if p.topology_nodes_per_rack and p.topology_rack_label == p.topology_block_label:
            raise ValueError(f"topology_rack_label and topology_block_label are both {p.topology_rack_label!r}")
        if p.team_taint_key == p.preflight_taint_key:
            raise ValueError(f"team_taint_key and preflight_taint_key are both {p.team_taint_key!r}; they must differ")
        for name, env in p.component_go_env.items():
            gogc, limit = env.get("GOGC"), env.get("GOMEMLIMIT")
            if gogc is not None and not (gogc == "off" or gogc.isdigit()):
                raise ValueError(f"component_go_env {name}: GOGC {gogc!r} is a percentage (e.g. 200) or off")
            if limit == "off" or (limit is not None and limit.isdigit() and int(limit) == 0):
                raise ValueError(f"component_go_env {name}: GOMEMLIMIT {limit!r} is a size (e.g. 4GiB)")
        if p.node_pod_cidr:
            node_pod_cidrs(p.node_pod_cidr, p.nodes)   # raises ValueError with the reason
        if kubeversions.TAG.match(p.kubernetes_version):   # else the pattern's own line
            try:
                kubeversions.release(p.kubernetes_version)
            except HarnessError as e:
                raise ValueError(str(e)) from None


KEYS = ClusterKeys
