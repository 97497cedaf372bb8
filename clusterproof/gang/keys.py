"""The gang-scheduling suite's profile keys (suites/test_gang_scheduling.py); defaults in base.yaml."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from clusterproof.core.keygroup import KeyGroup, Pos
from clusterproof.core.kubeversions import NATIVE_GANG_APIS


class GangKeys(KeyGroup):
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
    gang_native_scheduler_name: Annotated[str, Field(min_length=1)]
    gang_native_api: Literal[("", *NATIVE_GANG_APIS)]
    # Kueue and JobSet (clusterproof/cluster/kueue.py)
    kueue_admission: bool
    kueue_api_qps: Pos
    kueue_api_burst: Pos
    kueue_pods_ready_timeout_s: Pos
    kueue_wait_for_pods_ready: bool
    kueue_webhook_failure_policy: Literal["Fail", "Ignore"]
    kueue_preemption: Literal["LowerPriority", "Never"]
    kueue_queueing: Literal["StrictFIFO", "BestEffortFIFO"]
    # The admission-at-scale bench (clusterproof/bench/kueue.py)
    kueue_bench_workloads: Pos
    kueue_bench_pods: Pos
    kueue_bench_queues: Pos
    kueue_bench_create_concurrency: Pos
    kueue_bench_timeout_s: Pos
    kueue_bench_admit_p99_s: Pos
    kueue_bench_min_admitted_per_s: Pos
    kueue_bench_pods_ready_timeout_s: Pos
    kueue_backoff_base_s: Pos
    kueue_backoff_max_s: Pos


KEYS = GangKeys
