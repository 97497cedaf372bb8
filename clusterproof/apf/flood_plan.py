"""What the flood creates, shared by the locustfile (load/flood.py) and pytest (no locust import here:
locust monkey-patches the standard library when imported)."""
from __future__ import annotations

KIND_LABEL = "clusterproof.io/flood-client"
NO_SCHEDULER = "clusterproof-unscheduled"      # no scheduler has this name: the flood's pods stay API objects
KINDS = ("honouring", "impatient")


def split(pods: int, fraction: float) -> dict[str, int]:
    """Pods per client kind, in proportion to the users (at least one impatient pod if any impatient user)."""
    impatient = min(pods, max(1 if fraction > 0 else 0, round(pods * fraction)))
    return {"honouring": pods - impatient, "impatient": impatient}


def pod_names(kind: str, count: int) -> list[str]:
    return [f"{kind}-{i:04d}" for i in range(count)]
