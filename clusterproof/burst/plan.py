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

from clusterproof.kube.pod_spec import pod_body

JOB_LABEL = "clusterproof.io/job"        # = clusterproof.kube.podtimeline.JOB_LABEL (not imported: locust imports this)
PHASE_LABEL = "clusterproof.io/burst-phase"
# Who created a pod: the locust process (``w<index>`` a worker of the distributed mode, ``local`` one
# process) or ``harness`` (a lost worker's share, completed after the load). Read from the cluster,
# it is the per-worker split, by the objects themselves.
CREATOR_LABEL = "clusterproof.io/created-by"
HARNESS = "harness"


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

    def share(self, workers: int = 1, index: int = 0) -> list[tuple[str, int]]:
        """(job, rank) of worker ``index`` of ``workers``, in job order: pod ``i`` of job ``j`` is that
        worker's when ``(j * job_size + i) % workers == index``, so the workers' shares never overlap and
        together are the whole phase."""
        return [(f"{self.name}-{j}", i) for j in range(self.jobs) for i in range(self.job_size)
                if (j * self.job_size + i) % max(1, workers) == index]

    def pod_names(self, workers: int = 1, index: int = 0) -> list[str]:
        return [pod_name(job, i) for job, i in self.share(workers, index)]


def pod_name(job: str, index: int) -> str:
    """A rank's pod name: fixed by the plan, so a create sent twice (a lost worker's share completed by
    someone else) meets 409 AlreadyExists and can never make a second pod."""
    return f"{job}-{index:05d}"


def rank_pod(phase_name: str, job: str, index: int, run_id: str, gpus: int, node_selector: dict | None,
             creator: str) -> dict:
    """One rank of ``job``: the harness's one pod (clusterproof.kube.pod_spec), a whole node of the shared pool --
    the same body whoever creates it (a locust user of load/burst.py, or the harness completing a lost share)."""
    return pod_body(pod_name(job, index), run_id, gpus=gpus, node_selector=node_selector, restart_policy="Never",
                    labels={JOB_LABEL: job, PHASE_LABEL: phase_name, CREATOR_LABEL: creator})


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
