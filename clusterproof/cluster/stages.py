"""What the kwok controller does to simulated nodes and pods (its Stages): kwokctl's own defaults, read from the
kwok module, with one change -- a pod that says so runs until it is deleted.

Why: given no Stage, kwokctl v0.8.0 hands kwok its "fast" presets (``pkg/kwokctl/runtime/cluster.go``,
getDefaultNodeStages/getDefaultPodStages), and in them a pod owned by a Job completes the moment it runs
(``pod-complete``). A training job's ranks run for hours; the Kueue checks hold quota with a running JobSet and
wait for its pods Ready, which a JobSet that finishes at once never shows. Given any Stage, kwokctl passes only
those, so this module gives it all of them, built exactly as kwokctl builds its defaults (the node heartbeat's
delay stretched to the status update frequency), and adds one selector term to ``pod-complete``: a pod annotated
``RUNS_UNTIL_DELETED`` never completes. Every other pod, Job-owned or not, is simulated as before.
"""
from __future__ import annotations

from pathlib import Path

import yaml

from clusterproof.core.errors import HarnessError

RUNS_UNTIL_DELETED = "clusterproof.io/runs-until-deleted"
PRESETS = "kustomize/stage"
# kwokctl v0.8.0's defaults, in its order (node-heartbeat-with-lease when nodes hold Leases).
NODE = ("node/fast/node-initialize.yaml",)
HEARTBEAT = {True: "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
             False: "node/heartbeat/node-heartbeat.yaml"}
POD = ("pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml")
# kwokctl's default --node-status-update-frequency (KwokctlConfiguration options, before --heartbeat-factor).
STATUS_UPDATE_MS = 10000


def _read(module_dir: Path, rel: str) -> dict:
    path = module_dir / PRESETS / rel
    if not path.is_file():
        raise HarnessError(f"kwok's stage preset {path} is missing: is {module_dir.name} the kwok module version "
                           "the toolchain pins?")
    return yaml.safe_load(path.read_text())


def stages(module_dir: Path, heartbeat_factor: float, node_lease_duration_s: int) -> list[dict]:
    """The Stage objects for the cluster's kwok configuration (pure but for reading ``module_dir``)."""
    heartbeat = _read(module_dir, HEARTBEAT[node_lease_duration_s != 0])
    factor = heartbeat_factor if heartbeat_factor not in (0, 1) else 1
    update_ms = int(STATUS_UPDATE_MS * factor)
    delay = heartbeat["spec"]["delay"]
    # kwokctl: the heartbeat comes no sooner than the status update frequency, jittered by a tenth of it.
    delay["durationMilliseconds"] = max(delay.get("durationMilliseconds", 0), update_ms)
    delay["jitterDurationMilliseconds"] = max(delay.get("jitterDurationMilliseconds", 0), update_ms + update_ms // 10)
    pods = [_read(module_dir, rel) for rel in POD]
    complete = next(p for p in pods if p["metadata"]["name"] == "pod-complete")
    complete["spec"]["selector"]["matchExpressions"].append(
        {"key": f'.metadata.annotations["{RUNS_UNTIL_DELETED}"]', "operator": "DoesNotExist"})
    return [*(_read(module_dir, rel) for rel in NODE), heartbeat, *pods]
