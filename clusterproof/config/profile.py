"""Profiles: flat YAML data that sizes a run, and the node plan derived from it.

Why flat: a user changes one number in a file (or ``--set key=value``), never
code (ClusterLoader2 overrides). Every key has a default in
``clusterproof/config/profiles/base.yaml``; a profile file overrides some of them and an unknown
key is an error, so a typo cannot silently fall back to a default.

The node plan (pools, counts, labels, taints, capacity) is derived from the
profile by one function, used both to create simulated nodes and to check any
cluster against what the profile declares.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError,
                      model_validator)

from clusterproof.config import rules
from clusterproof.core.errors import HarnessError
from clusterproof.cluster.node_plan import node_plan

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
BASE = PROFILES_DIR / "base.yaml"

# RFC 1123 label value / qualified-name checks, as the apiserver applies them.
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = rules.DNS_LABEL


def _is_qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(_LABEL_VALUE.match(name))


def _qualified(v: str) -> str:
    if not _is_qualified_name(v):
        raise ValueError(f"{v!r} is not a valid label/taint key (e.g. example.com/team)")
    return v


def _label_values(v: list[str]) -> list[str]:
    for team in v:
        if not _LABEL_VALUE.match(team) or len(team) > 63:
            raise ValueError(f"team name {team!r} is not a valid label value")
    return v


def _prom_duration(v: str) -> str:
    from clusterproof.prometheus.client import duration_s
    if duration_s(v) <= 0:
        raise ValueError(f"{v!r} must be a positive duration")
    return v


def _priority_class(v: str) -> str:
    if not _DNS_SUBDOMAIN.match(v) or len(v) > 253 or v.startswith("system-"):
        raise ValueError(f"{v!r} is not a valid PriorityClass name (lower-case DNS name, not starting with system-)")
    return v


def _k8s_name(v: str) -> str:
    if not _DNS_SUBDOMAIN.match(v) or len(v) > 253:
        raise ValueError(f"{v!r} is not an object name (lower-case DNS name, e.g. system-node-high)")
    return v


def _k8s_name_or_empty(v: str) -> str:
    return _k8s_name(v) if v else v


def _k8s_names(v: list[str]) -> list[str]:
    for x in v:
        _k8s_name(str(x))
    return v


Pos = Annotated[int, Field(ge=1)]
PosFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
QualifiedName = Annotated[str, AfterValidator(_qualified)]


class Profile(BaseModel):
    """Every profile key, typed; the defaults and the reasons for them are in clusterproof/config/profiles/base.yaml.

    Validation is pydantic's (types, bounds, literals) plus the cross-key
    rules below; ``load_profile`` turns the first error into one line that
    names the key, where its value came from, and what is wanted.
    """
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # the cluster
    nodes: Pos
    node_name_prefix: Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")]
    node_gpus: Pos
    node_cpu: Pos
    node_memory: str
    node_max_pods: Pos
    node_ephemeral_storage: str
    # pools and taints
    pool_label: QualifiedName
    teams: Annotated[list[str], AfterValidator(_label_values)]
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
    # gang scheduling
    gang_scheduler_name: str
    gang_scheduler_qps: Pos
    gang_scheduler_burst: Pos
    gang_unschedulable_flush_s: Pos
    gang_nodes: Annotated[int, Field(ge=2)]
    gang_schedule_timeout_s: Pos
    gang_observe_s: Pos
    gang_bind_timeout_s: Pos
    gang_scale_size: Pos
    gang_scale_timeout_s: Pos
    gang_native: bool
    # team taint isolation
    team_namespace_label: QualifiedName
    team_namespaces: list[str]
    team_admission: Literal["auto", "harness", "cluster", "wildcard"]
    team_foreign_toleration: Literal["reject", "correct"]
    low_priority_class: Annotated[str, AfterValidator(_priority_class)]
    low_priority_value: int
    taint_untolerated_pods: Pos
    taint_borrow_nodes: Pos
    taint_observe_s: Pos
    taint_timeout_s: Pos
    # comparison with a baseline (clusterproof.report.compare)
    baseline_tolerance_pct: PosFloat
    baseline_tolerance_overrides: dict[str, PosFloat]
    baseline_min_change: dict[str, Annotated[float, Field(ge=0)]]
    # SLOs
    slo_mutating_p99_s: PosFloat
    slo_list_p99_s: PosFloat
    # burst pod creation
    burst_steady_pods: Pos
    burst_steady_rate: PosFloat
    burst_bind_rate_min: PosFloat
    burst_bind_slack_s: Annotated[float, Field(ge=0)]
    burst_jobs: Pos
    burst_job_size: Pos
    burst_users: Pos
    burst_locust_processes: Pos
    burst_stall_timeout_s: Pos
    burst_timeout_s: Pos
    slo_pod_startup_p99_s: PosFloat
    # GPU preflight (suites/test_gpu_preflight.py)
    preflight_label_key: QualifiedName
    preflight_reason_label_key: QualifiedName
    preflight_condition_type: Annotated[str, Field(pattern=r"^([A-Z][A-Za-z0-9]{0,62})?$")]
    preflight_event_reason: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,127}$")]
    preflight_agent: Literal["auto", "harness", "cluster", "ignore-xid79", "untaint-early", "ignore-cap",
                             "ignore-pdb"]
    preflight_join_nodes: Pos
    preflight_fault_fraction: Fraction
    preflight_waiting_pods: Annotated[int, Field(ge=3)]
    preflight_xid_window_ms: Annotated[int, Field(ge=0)]
    preflight_quarantine_timeout_s: Pos
    preflight_active_period_s: PosFloat
    preflight_max_unavailable: Pos
    preflight_inservice_faults: Pos
    preflight_drain_timeout_s: Pos
    preflight_remediation_timeout_s: Pos
    preflight_fault_file: str
    preflight_image: str
    preflight_pod_timeout_s: Pos
    # API overload: API Priority and Fairness (suites/test_api_overload.py)
    apf_node_flow_schema: Annotated[str, AfterValidator(_k8s_name)]
    apf_controller_flow_schemas: Annotated[list[str], AfterValidator(_k8s_names)]
    apf_max_queue_depth: Pos
    apf_flood_priority_level: Annotated[str, AfterValidator(_k8s_name_or_empty)]
    apf_flood_shares: Annotated[int, Field(ge=1, le=1000)]
    apf_flood_queues: Annotated[int, Field(ge=0, le=512)]
    apf_flood_hand_size: Annotated[int, Field(ge=1, le=512)]
    apf_flood_queue_length: Annotated[int, Field(ge=1, le=100000)]
    apf_flood_user: str
    apf_flood_group: str
    apf_flood_users: Annotated[int, Field(ge=2)]
    apf_flood_s: PosFloat
    apf_flood_pods: Pos
    apf_flood_impatient_fraction: Annotated[float, Field(ge=0, lt=1)]
    apf_flood_max_attempts: Pos
    apf_flood_timeout_s: Pos
    apf_probe_rate: Annotated[float, Field(gt=0, le=50)]
    apf_probe_pods: Pos
    apf_baseline_s: PosFloat
    apf_heartbeat_slack_s: Annotated[float, Field(ge=0)]
    apf_recovery_s: PosFloat
    apf_recovery_factor: Annotated[float, Field(ge=1)]
    apf_join_nodes: Pos
    apf_join_rate: PosFloat
    apf_join_concurrency: Pos
    apf_join_timeout_s: Pos
    # Prometheus query limits (suites/test_prometheus_limits.py)
    prometheus_query_timeout: Annotated[str, AfterValidator(_prom_duration)]
    prometheus_max_samples: Pos
    prometheus_max_concurrency: Pos
    prometheus_gomaxprocs: Annotated[int, Field(ge=0)]
    prometheus_timeout_slack_s: Annotated[float, Field(ge=0)]
    prometheus_scrape_interval_s: Pos
    prometheus_backfill_nodes: Annotated[int, Field(ge=0)]
    prometheus_backfill_minutes: Annotated[int, Field(ge=2, le=118)]
    prometheus_backfill_interval_s: Pos
    prometheus_series_limit: Pos
    prometheus_rss_factor: Annotated[float, Field(ge=1)]
    # EndpointSlice watch bandwidth (suites/test_watch_bandwidth.py)
    node_pod_cidr: str
    watch_service: str
    watch_pool: str
    watch_sizes: list[Annotated[int, Field(ge=1)]]
    watch_watchers: Pos
    watch_churn: Pos
    watch_churn_rate: PosFloat
    watch_churn_kinds: list[Literal["replace", "ready", "drain"]]
    watch_max_endpoints_per_slice: Annotated[int, Field(ge=1, le=1000)]
    watch_budget_slices: PosFloat
    watch_agreement_tolerance: Annotated[float, Field(gt=0, lt=1)]
    watch_kcm_max_endpoints_per_slice: Annotated[int, Field(ge=0, le=1000)]
    watch_slice_resource: Literal["endpointslices", "endpoints"]
    watch_metric_resource: Literal["own", "other"]
    watch_window_s: Pos
    watch_settle_timeout_s: Pos
    watch_create_concurrency: Pos
    watch_projection_nodes: Pos
    watch_projection_changes_per_node_hour: PosFloat
    # harness: liveness and sweeping
    run_lease_duration_s: Annotated[int, Field(ge=10)]
    claim_wait_s: Pos
    sweep_real_clusters: bool
    # time budgets (clusterproof.report.timing)
    budget_total_s: Annotated[int, Field(ge=0)]
    budget_bringup_s: Annotated[int, Field(ge=0)]
    budget_cluster_scale_s: Annotated[int, Field(ge=0)]
    budget_burst_pod_creation_s: Annotated[int, Field(ge=0)]
    budget_gang_scheduling_s: Annotated[int, Field(ge=0)]
    budget_taint_isolation_s: Annotated[int, Field(ge=0)]
    budget_gpu_preflight_s: Annotated[int, Field(ge=0)]
    budget_api_overload_s: Annotated[int, Field(ge=0)]
    budget_watch_bandwidth_s: Annotated[int, Field(ge=0)]
    budget_prometheus_limits_s: Annotated[int, Field(ge=0)]
    budget_real_nodes_s: Annotated[int, Field(ge=0)]

    _name: str = PrivateAttr("?")

    @property
    def name(self) -> str:
        return self._name

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        _validate(self)
        return self


def _load_yaml(path: Path) -> dict:
    try:
        # Decoded explicitly: the locale's encoding is not the file's, and a decode error inside
        # yaml or pathlib would be a traceback, not a line.
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise HarnessError(f"cannot read profile {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise HarnessError(f"profile {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start} "
                           "is not valid UTF-8): save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise HarnessError(f"profile {path} is not valid YAML{where}: "
                           f"{getattr(e, 'problem', e)}; fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HarnessError(f"profile {path} must be a mapping of flat key: value pairs")
    return data


def _base_type(key: str) -> type:
    t = Profile.model_fields[key].annotation
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    return get_origin(t) or t


def _element_type(key: str) -> type | None:
    args = get_args(Profile.model_fields[key].annotation)
    t = args[0] if args else None
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    return t


def _number(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        return v


def _from_text(key: str, value: str) -> Any:
    """A ``--set`` value (always text) read as the key's type: YAML scalars, comma lists."""
    want = _base_type(key)
    if want is str or want is Literal:
        return value
    if want is list:
        items = [v.strip() for v in value.split(",") if v.strip()]
        # A list of numbers (watch_sizes) is read like its YAML form; a list of names stays text.
        return [_number(v) for v in items] if _element_type(key) is int else items
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def _widen(key: str, value: Any) -> Any:
    """YAML writes 1 for 1.0: an int is a valid float."""
    if _base_type(key) is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


_TYPE_NAMES = {"int_type": "int", "float_type": "float", "string_type": "str", "list_type": "list",
               "bool_type": "bool", "int_from_float": "int"}


def _one_line(err: dict, origin_of: dict[str, str], base: dict, name: str) -> str:
    """pydantic's first error as the harness's one line: where, which key, what is wanted."""
    loc = [x for x in err["loc"] if isinstance(x, str)]
    key = loc[0] if loc else None
    origin = origin_of.get(key, f"profile {name}") if key else f"profile {name}"
    value, kind, ctx = err.get("input"), err["type"], err.get("ctx") or {}
    if kind == "extra_forbidden":
        return f"{origin}: unknown key {key!r}; the keys are listed in {BASE}"
    if kind in _TYPE_NAMES or kind.endswith("_type"):
        want = _TYPE_NAMES.get(kind, kind.removesuffix("_type"))
        return f"{origin}: {key} must be {want} (like {base.get(key)!r}), got {value!r}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        if key in ("team_fraction", "preflight_fraction"):
            return f"{origin}: {key} must be between 0 and 1, got {value:g}"
        return f"{origin}: {key} must be {op} {bound:g}, got {value:g}"
    if kind == "literal_error":
        return f"{origin}: {key} must be one of {ctx.get('expected', '').replace(chr(39), '').replace(' or ', ', ')}, got {value!r}"
    if kind == "string_pattern_mismatch":
        return f"{origin}: {key} {value!r} must match {ctx.get('pattern')}"
    msg = str(ctx.get("error") or err["msg"]).removeprefix("Value error, ")
    return f"{origin}: {key} {msg}" if key else f"{origin}: {msg}"


def resolve_profile_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not p.exists():
            raise HarnessError(f"profile file {p} does not exist")
        return p
    p = PROFILES_DIR / f"{name_or_path}.yaml"
    if not p.exists() or name_or_path == "base":
        known = sorted(x.stem for x in PROFILES_DIR.glob("*.yaml") if x.stem != "base")
        raise HarnessError(f"unknown profile {name_or_path!r}: use one of {', '.join(known)} "
                           f"or a path to a YAML file")
    return p


def load_profile(name_or_path: str, overrides: list[str] | None = None) -> Profile:
    base = _load_yaml(BASE)
    path = resolve_profile_path(name_or_path)
    merged = dict(base)
    origin_of = {k: str(BASE) for k in base}
    layers = [(str(path), _load_yaml(path))]
    for item in overrides or []:
        if "=" not in item:
            raise HarnessError(f"--set {item!r}: write it as key=value (e.g. --set nodes=500)")
        k, v = item.split("=", 1)
        k = k.strip()
        if k not in Profile.model_fields:
            raise HarnessError(f"--set {item}: unknown key {k!r}; the keys are listed in {BASE}")
        layers.append((f"--set {item}", {k: _from_text(k, v)}))
    for origin, data in layers:
        for k, v in data.items():
            if k not in Profile.model_fields:
                raise HarnessError(f"{origin}: unknown key {k!r}; the keys are listed in {BASE}")
            merged[k] = _widen(k, v)
            origin_of[k] = origin
    try:
        profile = Profile(**merged)
    except ValidationError as e:
        raise HarnessError(_one_line(e.errors()[0], origin_of, base, path.stem)) from None
    profile._name = path.stem
    return profile


def _validate(p: Profile) -> None:
    """Rules between keys (pydantic checks each key alone). A ValueError here is one line."""
    if p.team_fraction + p.preflight_fraction > 1:
        raise ValueError("team_fraction + preflight_fraction must not exceed 1")
    if p.team_fraction > 0 and not p.teams:
        raise ValueError(f"team_fraction is {p.team_fraction} but teams is empty")
    plan = node_plan(p)
    empty = [pool.name for pool in plan if pool.count == 0 and pool.name.startswith("team-")]
    if empty:
        raise ValueError(f"{', '.join(empty)} would get no nodes with nodes={p.nodes}; "
                         "raise nodes or team_fraction, or drop teams")
    rules.validate_burst(p, plan)
    rules.validate_taints(p, plan)
    rules.validate_preflight(p)
    rules.validate_watch(p, plan)
    rules.validate_prometheus(p)
    from clusterproof.apf.apf import validate_profile   # the overload suite's keys, next to what they describe
    validate_profile(p)
