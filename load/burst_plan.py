"""The burst's sizes from the profile, and the locust arguments that carry them.

Importable by pytest (no locust import): the suite, the benchmark and the
profile checks share one reading of the ``burst_*`` keys.
"""
from __future__ import annotations

JOB_PREFIX = "burst"


def pods_planned(profile) -> int:
    return profile.burst_jobs * profile.burst_job_size


def job_names(profile) -> list[str]:
    return [f"{JOB_PREFIX}-{j}" for j in range(profile.burst_jobs)]


def burst_args(profile, namespace: str, run_id: str, identity) -> list[str]:
    """Custom arguments of load/burst.py (and load/kube_user.py); no secret, only the token's path."""
    args = ["--kube-token-file", str(identity.token_file),
            "--burst-namespace", namespace, "--burst-run-id", run_id,
            "--burst-jobs", str(profile.burst_jobs), "--burst-job-size", str(profile.burst_job_size),
            "--burst-gpus", str(profile.node_gpus), "--burst-job-prefix", JOB_PREFIX,
            "--burst-node-selector", f"{profile.pool_label}=shared"]
    if identity.ca_file:
        args += ["--kube-ca-file", identity.ca_file]
    return args
