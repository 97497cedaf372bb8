"""What the burst suite creates, phase by phase, and the locust arguments that carry it.

Two phases, as ClusterLoader2 splits them:

- ``steady``: ``burst_steady_pods`` whole-node pods at a bounded rate
  (``burst_steady_rate`` pods/s) -- the load the Kubernetes SLOs are defined
  for (mutating calls p99 <= 1 s, pod startup p99 <= 5 s);
- ``burst``: ``burst_jobs`` training jobs of ``burst_job_size`` whole-node
  pods, created back to back as fast as the users can -- where completeness,
  per-job bind time and "no 429 / no 5xx" are what must hold (no scheduler
  binds thousands of pods within 5 s).

Importable by pytest (no locust import): the suite, the benchmarks and the
profile checks share one reading of the ``burst_*`` keys.
"""
from __future__ import annotations

from dataclasses import dataclass

PHASE_LABEL = "clusterproof.io/burst-phase"


@dataclass(frozen=True)
class Phase:
    name: str            # "steady" | "burst": pod and job name prefix, and PHASE_LABEL value
    jobs: int
    job_size: int
    rate: float          # pods/s over all users; 0: as fast as they can

    @property
    def pods(self) -> int:
        return self.jobs * self.job_size

    def job_names(self) -> list[str]:
        return [f"{self.name}-{j}" for j in range(self.jobs)]


def steady(profile, rate: float | None = None, pods: int | None = None) -> Phase:
    return Phase("steady", 1, pods or profile.burst_steady_pods, rate or profile.burst_steady_rate)


def burst(profile) -> Phase:
    return Phase("burst", profile.burst_jobs, profile.burst_job_size, 0)


def job_bound_s(profile, job_index: int) -> float:
    """How long after the burst's first create job ``job_index`` may take to be bound completely.

    Jobs are created back to back and the scheduler takes pods in order, so job
    j waits for jobs 0..j-1: (j+1) * job_size pods at the required scheduling
    rate, plus the slack the profile states.
    """
    return (job_index + 1) * profile.burst_job_size / profile.burst_bind_rate_min + profile.burst_bind_slack_s


def locust_args(phase: Phase, profile, namespace: str, run_id: str, identity) -> list[str]:
    """Custom arguments of load/burst.py (and load/kube_user.py); no secret, only the token's path."""
    args = ["--kube-token-file", str(identity.token_file),
            "--burst-namespace", namespace, "--burst-run-id", run_id,
            "--burst-jobs", str(phase.jobs), "--burst-job-size", str(phase.job_size),
            "--burst-gpus", str(profile.node_gpus), "--burst-job-prefix", phase.name,
            "--burst-rate", f"{phase.rate:g}",
            "--burst-node-selector", f"{profile.pool_label}=shared"]
    if identity.ca_file:
        args += ["--kube-ca-file", identity.ca_file]
    return args
