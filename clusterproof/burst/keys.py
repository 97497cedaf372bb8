"""The burst pod-creation suite's profile keys (suites/test_burst_pod_creation.py); defaults in base.yaml."""
from __future__ import annotations

from typing import Annotated

from pydantic import Field

from clusterproof.cluster.node_plan import node_plan
from clusterproof.core.keygroup import KeyGroup, NonNeg, NonNegFloat, Pos, PosFloat, worker_names


class BurstKeys(KeyGroup):
    burst_steady_pods: Pos
    burst_steady_rate: PosFloat
    burst_bind_rate_min: PosFloat
    burst_bind_slack_s: NonNegFloat
    burst_jobs: Pos
    burst_job_size: Pos
    burst_users: Pos
    burst_locust_processes: Pos
    burst_locust_workers: NonNeg
    burst_locust_worker_names: list[str]
    # locust's master for remote workers (clusterproof.core.locust.Master); the flood's too
    load_master_bind: str
    load_master_port: Annotated[int, Field(ge=1, le=65535)]
    load_workers_wait_s: PosFloat
    burst_stall_timeout_s: Pos
    burst_timeout_s: Pos
    slo_pod_startup_p99_s: PosFloat

    @staticmethod
    def rules(p) -> None:
        """Every locust worker has a user; remote workers or local processes, and their names; the burst fits
        the shared pool."""
        if p.burst_users < p.burst_locust_processes:
            raise ValueError(f"burst_users ({p.burst_users}) must be >= burst_locust_processes "
                             f"({p.burst_locust_processes}): every locust worker needs a user")
        if p.burst_users < p.burst_locust_workers:
            raise ValueError(f"burst_users ({p.burst_users}) must be >= burst_locust_workers "
                             f"({p.burst_locust_workers}): every locust worker needs a user")
        if p.burst_locust_workers and p.burst_locust_processes > 1:
            raise ValueError(f"burst_locust_workers ({p.burst_locust_workers}) and burst_locust_processes "
                             f"({p.burst_locust_processes}) are both set: remote workers or local processes, "
                             "not both (a remote host runs several with `clusterproof load-worker` each)")
        worker_names(p.burst_locust_workers, p.burst_locust_worker_names, "burst_locust")
        shared = sum(pool.count for pool in node_plan(p) if pool.name == "shared")
        if p.burst_steady_pods > shared:
            raise ValueError(f"the steady phase ({p.burst_steady_pods} whole-node pods) is larger than the {shared} "
                             "nodes of the shared pool; lower burst_steady_pods or raise nodes")
        if p.burst_jobs * p.burst_job_size > shared:
            raise ValueError(f"the burst ({p.burst_jobs} jobs x {p.burst_job_size} whole-node pods "
                             f"= {p.burst_jobs * p.burst_job_size}) is larger than the {shared} nodes of the "
                             "shared pool; lower burst_jobs/burst_job_size or raise nodes")


KEYS = BurstKeys
