"""Which XIDs make a node unfit for work, and what they mean.

Policy: NVIDIA's own Kubernetes device plugin (k8s-device-plugin, its health
check) marks a GPU unhealthy on every XID except the ones that are caused by
the application rather than the GPU -- 13, 31, 43, 45, 68 and 109 (graphics
engine exception, memory page fault, GPU stopped processing, preemptive
cleanup, video decoder exception, context-switch timeout: a user's kernel
crashed; the next job is fine). This checker uses the same rule, because a
preflight that is laxer than the device plugin would release nodes the
device plugin then withdraws GPUs from, and a stricter one would quarantine
nodes for user bugs. ``--ignore-xids`` changes the set (the harness's
negative control ignores 79 this way).

The ones that matter most on training clusters, all fatal here:
48 (double-bit ECC error), 63/64 (row remapping recorded / failed: the GPU
needs a reset, or an RMA), 74 (NVLink error), 79 (GPU has fallen off the
bus), 92 (high single-bit ECC rate), 94/95 (contained / uncontained ECC
error: reset required), 119/120 (GSP timeout / error).
"""
from __future__ import annotations

# k8s-device-plugin's application-error XIDs (NOTES.md "NVML (GPU preflight)").
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})

DESCRIPTIONS = {
    13: "graphics engine exception", 31: "GPU memory page fault", 43: "GPU stopped processing",
    45: "preemptive cleanup", 48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remapping recorded",
    64: "ECC page retirement or row remapper recording failure", 68: "video decoder exception",
    69: "graphics engine class error", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate", 94: "contained ECC error", 95: "uncontained ECC error",
    109: "context switch timeout", 119: "GSP RPC timeout", 120: "GSP error", 140: "unrecovered ECC error",
}


def is_fatal(xid: int, ignored: frozenset[int] = APPLICATION_XIDS) -> bool:
    return xid not in ignored


def describe(xid: int) -> str:
    return f"XID {xid} ({DESCRIPTIONS.get(xid, 'see NVIDIA XID catalog')})"
