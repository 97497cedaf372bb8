"""The team-taint isolation suite's profile keys (suites/test_taint_isolation.py); defaults in base.yaml."""
from __future__ import annotations

from typing import Literal

from clusterproof.cluster.node_plan import node_plan
from clusterproof.core.keygroup import DNS_LABEL, KeyGroup, Pos, PriorityClassName, QualifiedName


class TaintKeys(KeyGroup):
    team_namespace_label: QualifiedName
    team_namespaces: list[str]
    team_admission: Literal["auto", "harness", "cluster", "wildcard"]
    team_foreign_toleration: Literal["reject", "correct"]
    low_priority_class: PriorityClassName
    low_priority_value: int
    taint_untolerated_pods: Pos
    taint_borrow_nodes: Pos
    taint_observe_s: Pos
    taint_timeout_s: Pos

    @staticmethod
    def rules(p) -> None:
        """Team namespaces of known teams, each team once; team pools big enough to borrow from."""
        seen = set()
        for entry in p.team_namespaces:
            team, sep, ns = str(entry).partition("=")
            if not sep or team not in p.teams or not DNS_LABEL.match(ns):
                raise ValueError(f"team_namespaces entry {entry!r} must be <team>=<namespace> with a team of teams "
                                 f"({', '.join(map(str, p.teams)) or 'none'}) and a namespace name")
            if ns == "default" or ns.startswith("kube-") or ns == "clusterproof" or ns.startswith("clusterproof-"):
                # team-bindings would bind the harness's pod rights there: any ServiceAccount of kube-system runs
                # as a pod it creates; default is everybody's; its own home and pool are not a team's.
                raise ValueError(f"team_namespaces entry {entry!r}: {ns} is not a team's namespace (kube-*, default "
                                 "and the harness's own clusterproof, clusterproof-* are refused)")
            if team in seen:
                raise ValueError(f"team_namespaces names team {team} twice")
            seen.add(team)
        small = [pool for pool in node_plan(p) if pool.name.startswith("team-") and pool.count < p.taint_borrow_nodes]
        if small:
            raise ValueError(f"taint_borrow_nodes={p.taint_borrow_nodes} is more than the {small[0].count} nodes of "
                             f"{small[0].name}; lower it or raise nodes")


KEYS = TaintKeys
