"""The GPU preflight suite's profile keys (suites/test_gpu_preflight.py); defaults in base.yaml."""
from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from clusterproof.core.keygroup import Fraction, KeyGroup, Pos, PosFloat, QualifiedName


class PreflightKeys(KeyGroup):
    preflight_label_key: QualifiedName
    preflight_reason_label_key: QualifiedName
    preflight_condition_type: Annotated[str, Field(pattern=r"^([A-Z][A-Za-z0-9]{0,62})?$")]
    preflight_event_reason: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]{0,127}$")]
    preflight_agent: Literal["auto", "harness", "cluster", "ignore-xid79", "untaint-early", "ignore-cap",
                             "ignore-pdb"]
    preflight_join_nodes: Pos
    preflight_fault_fraction: Fraction
    preflight_waiting_pods: Annotated[int, Field(ge=3)]
    preflight_xid_window_ms: Annotated[int, Field(ge=0)]
    preflight_quarantine_timeout_s: Pos
    preflight_active_period_s: PosFloat
    preflight_max_unavailable: Pos
    preflight_inservice_faults: Pos
    preflight_drain_timeout_s: Pos
    preflight_remediation_timeout_s: Pos
    preflight_fault_file: str
    preflight_image: str
    preflight_pod_timeout_s: Pos

    @staticmethod
    def rules(p) -> None:
        """Marks that do not collide, a cohort big enough for its pods."""
        if p.preflight_label_key == p.preflight_reason_label_key:
            raise ValueError(f"preflight_label_key and preflight_reason_label_key are both "
                             f"{p.preflight_label_key!r}; they must differ")
        if p.preflight_inservice_faults <= p.preflight_max_unavailable:
            raise ValueError(f"preflight_inservice_faults ({p.preflight_inservice_faults}) must be larger than "
                             f"preflight_max_unavailable ({p.preflight_max_unavailable}), or the cap is never tested")
        healthy = p.preflight_join_nodes - (max(1, round(p.preflight_join_nodes * p.preflight_fault_fraction))
                                            if p.preflight_fault_fraction > 0 else 0)
        # The in-service check runs a ReplicaSet of faults+3 whole-node pods and needs as many spare nodes.
        need = max(p.preflight_waiting_pods, 2 * (p.preflight_inservice_faults + 3))
        if healthy < need:
            raise ValueError(f"preflight_join_nodes={p.preflight_join_nodes} leaves {healthy} healthy node(s) after "
                             f"faults, fewer than the {need} the checks place pods on; raise preflight_join_nodes or "
                             "lower preflight_waiting_pods/preflight_inservice_faults")
        if p.preflight_image and any(c.isspace() for c in p.preflight_image):
            raise ValueError(f"preflight_image {p.preflight_image!r} is not an image reference (it contains spaces)")


KEYS = PreflightKeys
