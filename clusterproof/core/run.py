"""The run id and the labels and annotations on everything a run creates.

Why: on a shared real cluster the harness is a guest. Everything it creates
carries ``clusterproof.io/run=<run id>``, so it can be deleted at the end and
so a later run's sweeper (``clusterproof.kube.sweep``) can remove what an interrupted
run left -- and nothing else. Whether a run is still alive is not guessed
from host names or pids: every run holds a Lease (``clusterproof.kube.liveness``).

Pure (no Kubernetes client import): the locust process imports it too.
"""
from __future__ import annotations

import datetime as dt
import re
import secrets
import socket

from clusterproof.core.timeparse import format_time, parse_time

RUN_LABEL = "clusterproof.io/run"
# Informational: where the run came from, and when the object was made. The
# creation time bounds how long an object whose run left no Lease may stay.
OWNER_HOST = "clusterproof.io/owner-host"
CREATED = "clusterproof.io/created"
# Nodes a run created for one check (cluster-scoped, so not removed with a
# namespace); also the taint that claims a borrowed real node for one run.
SCRATCH_LABEL = "clusterproof.io/scratch"
# A run id is a label value and part of annotation keys and object names.
RUN_ID = re.compile(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?")


def new_run_id() -> str:
    # Sortable by time, unique across hosts; a valid label value (<= 63 chars).
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(2)


def owner_annotations() -> dict[str, str]:
    return {OWNER_HOST: socket.gethostname()[:63],
            CREATED: format_time()}


def created_at(annotations: dict | None) -> dt.datetime | None:
    return parse_time((annotations or {}).get(CREATED))


def metadata(name: str, run_id: str, labels: dict | None = None) -> dict:
    return {"name": name, "labels": {RUN_LABEL: run_id, **(labels or {})},
            "annotations": owner_annotations()}
