"""The report's profile keys: the baseline comparison (clusterproof.report.compare) and the time
budgets per suite (clusterproof.report.timing); defaults in base.yaml."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from clusterproof.core.keygroup import KeyGroup, NonNeg, PosFloat


class ReportKeys(KeyGroup):
    # comparison with a baseline
    baseline_tolerance_pct: PosFloat
    baseline_tolerance_overrides: dict[str, PosFloat]
    baseline_min_change: dict[str, Annotated[float, Field(ge=0)]]
    # time budgets
    budget_total_s: NonNeg
    budget_bringup_s: NonNeg
    budget_cluster_scale_s: NonNeg
    budget_burst_pod_creation_s: NonNeg
    budget_gang_scheduling_s: NonNeg
    budget_kueue_admission_s: NonNeg
    budget_taint_isolation_s: NonNeg
    budget_gpu_preflight_s: NonNeg
    budget_api_overload_s: NonNeg
    budget_watch_bandwidth_s: NonNeg
    budget_prometheus_limits_s: NonNeg
    budget_real_nodes_s: NonNeg


KEYS = ReportKeys
