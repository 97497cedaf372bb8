"""The API overload suite's profile keys (suites/test_api_overload.py): API Priority and Fairness,
the flood and the node-join storm; defaults in base.yaml."""
from __future__ import annotations

import math
from typing import Annotated

from pydantic import Field

from clusterproof.core.keygroup import (
    KeyGroup,
    NonNeg,
    NonNegFloat,
    ObjectName,
    ObjectNameOrEmpty,
    ObjectNames,
    Pos,
    PosFloat,
    worker_names,
)


class ApfKeys(KeyGroup):
    apf_node_flow_schema: ObjectName
    apf_controller_flow_schemas: ObjectNames
    apf_max_queue_depth: Pos
    apf_flood_priority_level: ObjectNameOrEmpty
    apf_flood_shares: Annotated[int, Field(ge=1, le=1000)]
    apf_flood_queues: Annotated[int, Field(ge=0, le=512)]
    apf_flood_hand_size: Annotated[int, Field(ge=1, le=512)]
    apf_flood_queue_length: Annotated[int, Field(ge=1, le=100000)]
    apf_flood_user: str
    apf_flood_group: str
    apf_flood_users: Annotated[int, Field(ge=2)]
    apf_flood_s: PosFloat
    apf_flood_pods: Pos
    apf_flood_impatient_fraction: Annotated[float, Field(ge=0, lt=1)]
    apf_flood_max_attempts: Pos
    apf_flood_timeout_s: Pos
    apf_flood_locust_workers: NonNeg
    apf_flood_locust_worker_names: list[str]
    apf_probe_rate: Annotated[float, Field(gt=0, le=50)]
    apf_probe_pods: Pos
    apf_baseline_s: PosFloat
    apf_heartbeat_slack_s: NonNegFloat
    apf_recovery_s: PosFloat
    apf_recovery_factor: Annotated[float, Field(ge=1)]
    apf_join_nodes: Pos
    apf_join_rate: PosFloat
    apf_join_concurrency: Pos
    apf_join_timeout_s: Pos

    @staticmethod
    def rules(p) -> None:
        """A flood identity APF does not exempt, a valid queuing configuration; both kinds of client on every
        remote worker."""
        if p.apf_flood_locust_workers and p.apf_flood_users < 2 * p.apf_flood_locust_workers:
            raise ValueError(f"apf_flood_users ({p.apf_flood_users}) must be >= 2 x apf_flood_locust_workers "
                             f"({p.apf_flood_locust_workers}): every worker runs both kinds of client")
        worker_names(p.apf_flood_locust_workers, p.apf_flood_locust_worker_names, "apf_flood_locust")
        privileged = "system:masters"
        if privileged in (p.apf_flood_group, p.apf_flood_user):
            raise ValueError(f"the flood identity is in {privileged} (apf_flood_user/apf_flood_group), which API "
                             "Priority and Fairness exempts: it would never be queued or rejected; name an ordinary "
                             "user and group, or leave both empty for the run's ServiceAccount")
        if p.apf_flood_group and not p.apf_flood_user:
            raise ValueError("apf_flood_group is set but apf_flood_user is empty: the flood impersonates a user "
                             "(in that group); name the user")
        if p.apf_flood_queues:
            if p.apf_flood_hand_size > p.apf_flood_queues:
                raise ValueError(f"apf_flood_hand_size ({p.apf_flood_hand_size}) must not exceed apf_flood_queues "
                                 f"({p.apf_flood_queues})")
            bits = math.ceil(math.log2(p.apf_flood_queues) * p.apf_flood_hand_size)
            if bits > 60:   # the apiserver's shuffle-sharding limit (MaxHashBits)
                raise ValueError(f"apf_flood_queues {p.apf_flood_queues} with apf_flood_hand_size "
                                 f"{p.apf_flood_hand_size} needs {bits} bits of entropy; the apiserver allows 60: "
                                 "lower the hand size")
        if p.apf_flood_priority_level and p.apf_flood_queues:
            raise ValueError("apf_flood_priority_level names an existing level, so apf_flood_queues (the run's own "
                             "level's queuing) would be ignored: set one of them")


KEYS = ApfKeys
