"""A Node object's state, read from its body: Ready, and schedulable (free of the lifecycle taints)."""
from __future__ import annotations

# Taints the node lifecycle controller manages; a Ready node must not keep them.
LIFECYCLE_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


def has_ready_condition(node: dict) -> bool:
    conds = node.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def is_ready(node: dict) -> bool:
    """Ready=True and free of the lifecycle taints, i.e. schedulable."""
    taints = node.get("spec", {}).get("taints") or []
    return has_ready_condition(node) and not any(t.get("key") in LIFECYCLE_TAINTS for t in taints)
