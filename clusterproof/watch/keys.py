"""The EndpointSlice watch-bandwidth suite's profile keys (suites/test_watch_bandwidth.py); defaults in base.yaml."""
from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field

from clusterproof.cluster.node_plan import node_plan
from clusterproof.core.keygroup import KeyGroup, Pos, PosFloat


class WatchKeys(KeyGroup):
    watch_service: str
    watch_pool: str
    watch_sizes: list[Annotated[int, Field(ge=1)]]
    watch_watchers: Pos
    watch_churn: Pos
    watch_churn_rate: PosFloat
    watch_churn_kinds: list[Literal["replace", "ready", "drain"]]
    watch_max_endpoints_per_slice: Annotated[int, Field(ge=1, le=1000)]
    watch_budget_slices: PosFloat
    watch_agreement_tolerance: Annotated[float, Field(gt=0, lt=1)]
    watch_kcm_max_endpoints_per_slice: Annotated[int, Field(ge=0, le=1000)]
    watch_slice_resource: Literal["endpointslices", "endpoints"]
    watch_metric_resource: Literal["own", "other"]
    watch_window_s: Pos
    watch_settle_timeout_s: Pos
    watch_create_concurrency: Pos
    watch_projection_nodes: Pos
    watch_projection_changes_per_node_hour: PosFloat

    @staticmethod
    def rules(p) -> None:
        """A known pool, sizes that rise, at least one kind of churn."""
        if p.watch_service and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                                                p.watch_service):
            raise ValueError(f"watch_service {p.watch_service!r} must be <namespace>/<service> (an existing "
                             "Service to watch read-only) or empty")
        pools = {pool.name: pool.count for pool in node_plan(p)}
        if p.watch_pool and p.watch_pool not in pools:
            raise ValueError(f"watch_pool {p.watch_pool!r} is not a pool of the plan; use one of "
                             f"{', '.join(sorted(pools))} or empty (every node)")
        sizes = list(p.watch_sizes)
        if not sizes or sizes != sorted(set(sizes)):
            raise ValueError(f"watch_sizes {sizes} must be one or more endpoint counts, strictly rising "
                             "(e.g. 100,400,1100)")
        if not p.watch_churn_kinds:
            raise ValueError("watch_churn_kinds is empty: name at least one of replace, ready, drain")


KEYS = WatchKeys
