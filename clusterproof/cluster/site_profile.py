"""A site's profile from its nodes (``clusterproof profile --from-cluster``): its pools, and what it could not infer.

Why: a profile for a cluster the harness did not build is the first thing a
new user writes, by hand, from ``kubectl get nodes``: which label splits the
nodes into pools, which NoSchedule taint names the teams, which one holds new
nodes under preflight, how many GPUs a node has. Each of those is written on
the nodes, so the harness reads them (one LIST of nodes: the shipped
ServiceAccount may, docs/rbac.md) and writes the profile keys of the node plan
(``clusterproof.cluster.node_plan``, the plan ``test_cluster_scale`` holds the
cluster to), each with a comment saying what it was read from. What it cannot
infer -- nothing on the nodes says it, or two readings fit equally -- it does
not guess: the key keeps its default and the file's last comment block says
which and why.

The rules (``infer``, pure, over node dicts):

- taints of the lifecycle and of Kubernetes itself (``*kubernetes.io/*``) are
  not the site's; of the others only ``NoSchedule`` ones split pools;
- the preflight taint: a key whose every value is ``pending`` (the preflight
  contract's, ``clusterproof.preflight.contract``);
- the team taint: a key on some but not all nodes whose values name teams
  (valid label values, not ``pending``); the node plan also labels a team node
  with ``<key>=<team>``, so a key carried as label too is the stronger reading.
  Two keys that fit alike: said, not guessed;
- the pool label: a label key (not Kubernetes' own) whose values are the pool
  names the harness's node plan uses (``team-<team>``, ``preflight``,
  ``shared``). A key that splits the nodes as the taints do but names its
  pools otherwise is said (the suites select pools by those names), not used;
- node shape (``node_gpus`` from allocatable ``nvidia.com/gpu``, CPU, memory,
  pods, ephemeral storage from capacity): written when every node agrees;
- counts: ``nodes`` (the nodes carrying the pool label) and the fractions
  whose ``int(nodes x fraction)`` gives each pool's count, teams largest
  first (the plan gives a remainder to the first teams); uneven team pools are
  said (the plan splits them evenly);
- ``real_nodes: 0``: real nodes join only an embedded cluster the harness starts.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from clusterproof.cluster.node_plan import node_plan
from clusterproof.core.keygroup import LABEL_VALUE

PENDING = "pending"                   # the preflight contract's taint value (clusterproof.preflight.contract)
SHARED, PREFLIGHT, TEAM = "shared", "preflight", "team-"
GPU = "nvidia.com/gpu"
SHAPE = (("node_cpu", "capacity", "cpu", int), ("node_memory", "capacity", "memory", str),
         ("node_max_pods", "capacity", "pods", int), ("node_ephemeral_storage", "capacity", "ephemeral-storage", str))
NAME_PREFIX = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")   # the key's own pattern (clusterproof.cluster.keys)
# The order the keys are written in (the node plan's, as base.yaml has them).
ORDER = ("nodes", "node_name_prefix", "node_gpus", "node_cpu", "node_memory", "node_max_pods", "node_ephemeral_storage",
         "pool_label", "teams", "team_fraction", "team_taint_key", "preflight_fraction", "preflight_taint_key",
         "real_nodes")
# Keys a run on a site's cluster usually needs that nothing on a node says: listed under "could not infer".
NOT_ON_NODES = {
    "gang_scheduler_name": "the schedulerName of the Coscheduling scheduler the cluster runs, if it runs one "
                           "(nodes do not say)",
    "team_namespaces": "existing namespaces of the teams, as team=namespace (nodes do not say)",
    "team_admission": "cluster, to judge the admission the cluster runs for team tolerations (nodes do not say)",
    "preflight_agent": "cluster, to judge the preflight machinery the cluster runs (nodes do not say)",
    "preflight_image": "an image your GPU nodes can pull, for the checker pod (nodes do not say)",
}


def kubernetes_own(key: str) -> bool:
    """A label or taint key of Kubernetes or its tooling itself (``kubernetes.io/hostname``,
    ``node.kubernetes.io/not-ready``, kwok's), never a site's pool or team."""
    domain = key.rpartition("/")[0]
    return domain.endswith(("kubernetes.io", "k8s.io")) or key in ("type",)


@dataclass
class Inference:
    """Keys read from the nodes (with how), and the keys left at their defaults (with why)."""
    keys: dict[str, Any] = field(default_factory=dict)
    how: dict[str, str] = field(default_factory=dict)
    unknown: dict[str, str] = field(default_factory=dict)
    nodes_seen: int = 0

    def put(self, key: str, value: Any, how: str = "") -> None:
        self.keys[key], self.how[key] = value, how

    def cannot(self, key: str, why: str) -> None:
        self.unknown[key] = f"{self.unknown[key]}; {why}" if key in self.unknown else why


def _labels(n: dict) -> dict[str, str]:
    return n["metadata"].get("labels") or {}


def _taints(n: dict) -> dict[str, str]:
    """The site's NoSchedule taints of a node: key -> value."""
    return {t["key"]: t.get("value", "") for t in (n.get("spec") or {}).get("taints") or []
            if t.get("effect") == "NoSchedule" and not kubernetes_own(t["key"])}


def _fraction(count: int, total: int) -> float:
    """The shortest fraction f with int(total x f) == count (the node plan's rounding)."""
    for digits in range(2, 8):
        f = round(count / total, digits)
        if int(total * f) == count:
            return f
    return round((count + 0.5) / total, 8)


def _names(items, n: int = 4) -> str:
    items = sorted(items)
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def _taint_keys(nodes: list[dict]) -> dict[str, dict[str, set[str]]]:
    """key -> value -> names of the nodes carrying that NoSchedule taint."""
    out: dict[str, dict[str, set[str]]] = {}
    for n in nodes:
        for k, v in _taints(n).items():
            out.setdefault(k, {}).setdefault(v, set()).add(n["metadata"]["name"])
    return out


def _preflight_key(inf: Inference, taints: dict) -> str | None:
    keys = sorted(k for k, vals in taints.items() if set(vals) == {PENDING})
    if len(keys) == 1:
        n = len(taints[keys[0]][PENDING])
        inf.put("preflight_taint_key", keys[0], f"{keys[0]}={PENDING}:NoSchedule on {n} node(s)")
        return keys[0]
    if len(keys) > 1:
        inf.cannot("preflight_taint_key", f"several NoSchedule taints have only the value {PENDING} "
                                          f"({_names(keys)}): set the one your preflight machinery writes")
    else:
        inf.cannot("preflight_taint_key", f"no NoSchedule taint has the value {PENDING} (the preflight contract's) "
                                          "on any node: no node is under preflight now, or your machinery writes "
                                          "another value")
    return None


def _team_key(inf: Inference, nodes: list[dict], taints: dict, preflight: str | None) -> str | None:
    names = {n["metadata"]["name"] for n in nodes}
    label_of = {n["metadata"]["name"]: _labels(n) for n in nodes}
    fits, strong = [], []
    for k, vals in sorted(taints.items()):
        on = set().union(*vals.values())
        if k == preflight or on == names or not all(v and LABEL_VALUE.match(v) and len(v) <= 63 and v != PENDING
                                                    for v in vals):
            continue
        fits.append(k)
        if all(label_of[node].get(k) == v for v, who in vals.items() for node in who):
            strong.append(k)
    everywhere = sorted(k for k, vals in taints.items() if set().union(*vals.values()) == names and k != preflight)
    if everywhere:
        inf.cannot("team_taint_key", f"NoSchedule taint(s) on every node ({_names(everywhere)}) split no pool: "
                                     "left out (the harness's pods do not tolerate them)")
    pick = strong if len(strong) == 1 else fits if len(fits) == 1 else []
    if not pick:
        why = (f"several NoSchedule taints could name teams ({_names(fits)}): set team_taint_key and teams to the "
               "one that does" if fits else "no NoSchedule taint on some of the nodes names teams")
        inf.cannot("team_taint_key", why)
        inf.cannot("teams", why)
        return None
    key = pick[0]
    vals = taints[key]
    label = "and the same label" if key in strong else "(without the same label, which the node plan also expects)"
    inf.put("team_taint_key", key, f"{key}=<team>:NoSchedule {label} on {len(set().union(*vals.values()))} node(s)")
    return key


def _pool_label(inf: Inference, nodes: list[dict], team_values: dict[str, set[str]],
                preflight_nodes: set[str]) -> str | None:
    """The label whose values are the node plan's pool names; else what comes closest, said."""
    keys = sorted({k for n in nodes for k in _labels(n) if not kubernetes_own(k)})
    planned = []
    for k in keys:
        vals = {_labels(n).get(k) for n in nodes} - {None}
        if vals and all(v in (SHARED, PREFLIGHT) or v.startswith(TEAM) for v in vals):
            planned.append(k)
    if len(planned) == 1:
        key = planned[0]
        per = Counter(_labels(n)[key] for n in nodes if key in _labels(n))
        inf.put("pool_label", key, "pools " + ", ".join(f"{v} ({c})" for v, c in sorted(per.items())))
        return key
    if len(planned) > 1:
        inf.cannot("pool_label", f"several labels have the node plan's pool names as values ({_names(planned)}): "
                                 "set pool_label to the one that splits your nodes into pools")
        return None
    # No label names the pools as the plan does: is there one that splits the nodes as the taints do?
    groups = [who for who in team_values.values()] + ([preflight_nodes] if preflight_nodes else [])
    alike = []
    for k in keys:
        by_value: dict[str, set[str]] = {}
        for n in nodes:
            if k in _labels(n):
                by_value.setdefault(_labels(n)[k], set()).add(n["metadata"]["name"])
        if groups and 1 < len(by_value) < len(nodes) and all(g in by_value.values() for g in groups):
            alike.append(f"{k} ({_names(by_value, 5)})")
    inf.cannot("pool_label", (
        f"{_names(alike)} split(s) the nodes as the taints do, but the harness's suites select pools by the node "
        "plan's names (team-<team>, preflight, shared): label the nodes so, e.g. <site>.io/pool=team-<team>, and "
        "set pool_label" if alike else
        "no label has the node plan's pool names (team-<team>, preflight, shared) as values: label the nodes so, "
        "e.g. <site>.io/pool=team-<team>, and set pool_label"))
    return None


def _shape(inf: Inference, nodes: list[dict]) -> None:
    gpus = Counter((n.get("status") or {}).get("allocatable", {}).get(GPU) for n in nodes)
    if len(gpus) == 1 and None not in gpus and next(iter(gpus)).isdigit() and int(next(iter(gpus))) > 0:
        inf.put("node_gpus", int(next(iter(gpus))), f"allocatable {GPU} on every node")
    else:
        inf.cannot("node_gpus", f"allocatable {GPU} differs or is missing: " + ", ".join(
            f"{v or 'none'} on {c}" for v, c in gpus.most_common()))
    for key, field_, res, kind in SHAPE:
        seen = Counter((n.get("status") or {}).get(field_, {}).get(res) for n in nodes)
        value = next(iter(seen)) if len(seen) == 1 else None
        if value is None or (kind is int and not value.isdigit()):
            inf.cannot(key, f"{field_} {res} differs between nodes or is not a whole number: " + ", ".join(
                f"{v or 'none'} on {c}" for v, c in seen.most_common(4)))
            continue
        inf.put(key, kind(value), f"{field_} {res} on every node")


def _counts(inf: Inference, nodes: list[dict], team_key: str | None, team_values: dict[str, set[str]],
            preflight_nodes: set[str]) -> None:
    """nodes, teams and the fractions. With a pool label a node's pool is its value (as the node plan matches
    them); without, its taints say."""
    total, pool = len(nodes), inf.keys.get("pool_label")
    inf.put("nodes", total, f"nodes carrying {pool}" if pool else "nodes in the cluster (no pool label inferred)")
    if pool:
        per = Counter(_labels(n)[pool] for n in nodes)
        counts = Counter({v.removeprefix(TEAM): c for v, c in per.items() if v.startswith(TEAM)})
        n_pre, read = per.get(PREFLIGHT, 0), f"{pool}={TEAM}<team>"
        tainted = set(team_values)
        if team_key and tainted != set(counts):
            inf.cannot("teams", f"the teams of the pools ({_names(counts)}) are not the values of the team taint "
                                f"{team_key} ({_names(tainted)}): test_cluster_scale will name the nodes")
    else:
        counts = Counter({v: len(who) for v, who in team_values.items()})
        n_pre, read = len(preflight_nodes), f"values of {team_key}"
    if counts:
        teams = [v for v, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
        n_team = sum(counts.values())
        inf.put("teams", teams, f"{read}: " + ", ".join(f"{t} ({counts[t]})" for t in teams))
        inf.put("team_fraction", _fraction(n_team, total), f"{n_team} of {total} nodes in team pools")
        even = [n_team // len(teams) + (1 if i < n_team % len(teams) else 0) for i in range(len(teams))]
        if [counts[t] for t in teams] != even:
            inf.cannot("team_fraction", "team pools are not of one size (" + ", ".join(
                f"{t} {counts[t]}" for t in teams) + "): the node plan splits team nodes evenly "
                f"({', '.join(map(str, even))}); test_cluster_scale will name the difference")
    else:
        inf.put("teams", [], "no team pool found")
        inf.put("team_fraction", 0.0, "no team pool found")
    inf.put("preflight_fraction", _fraction(n_pre, total), f"{n_pre} of {total} nodes under preflight")


def _name_prefix(inf: Inference, nodes: list[dict]) -> None:
    """node_name_prefix, if every name is <prefix>-<pool>-<index> (only test_cluster_scale's "missing" line uses it)."""
    pool = inf.keys.get("pool_label")
    prefixes = set()
    for n in nodes:
        name, value = n["metadata"]["name"], _labels(n).get(pool) if pool else None
        m = re.match(rf"^(.+)-{re.escape(value)}-\d+$", name) if value else None
        prefixes.add(m[1] if m else None)
    if len(prefixes) == 1 and None not in prefixes and NAME_PREFIX.match(next(iter(prefixes))):
        inf.put("node_name_prefix", next(iter(prefixes)), "node names are <prefix>-<pool>-<index>")
    else:
        inf.cannot("node_name_prefix", f"node names (e.g. {nodes[0]['metadata']['name'] if nodes else 'none'}) are "
                                       "not <prefix>-<pool>-<index>: only test_cluster_scale's line naming missing "
                                       "nodes uses it")


def infer(nodes: list[dict]) -> Inference:
    """The node plan's keys read from ``nodes`` (Node objects as the API gives them). Pure."""
    inf = Inference(nodes_seen=len(nodes))
    if not nodes:
        inf.cannot("nodes", "the cluster has no node")
        return inf
    taints = _taint_keys(nodes)
    preflight = _preflight_key(inf, taints)
    preflight_nodes = set(taints[preflight][PENDING]) if preflight else set()
    team_key = _team_key(inf, nodes, taints, preflight)
    team_values = taints[team_key] if team_key else {}
    pool = _pool_label(inf, nodes, team_values, preflight_nodes)
    scope = [n for n in nodes if pool in _labels(n)] if pool else nodes
    in_scope = {n["metadata"]["name"] for n in scope}
    team_values = {v: who & in_scope for v, who in team_values.items() if who & in_scope}
    preflight_nodes = (preflight_nodes & in_scope) - set().union(*team_values.values(), set())
    _counts(inf, scope, team_key, team_values, preflight_nodes)
    _shape(inf, scope)
    _name_prefix(inf, scope)
    inf.put("real_nodes", 0, "real nodes join only an embedded cluster the harness starts")
    for key, why in NOT_ON_NODES.items():
        inf.cannot(key, why)
    return inf


def plan_differences(profile, nodes: list[dict]) -> list[str]:
    """Where the node plan of ``profile`` differs from the nodes: pool counts by its pool label. Pure."""
    have = Counter((_labels(n)).get(profile.pool_label) for n in nodes)
    out = [f"pool {p.name}: the plan has {p.count} node(s), the cluster {have.get(p.name, 0)}"
           for p in node_plan(profile) if have.get(p.name, 0) != p.count]
    planned = {p.name for p in node_plan(profile)}
    out += [f"pool {v}: {c} node(s) the plan does not have" for v, c in sorted(
        (v, c) for v, c in have.items() if v is not None and v not in planned)]
    return out


def _scalar(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("...").strip()


def render(inf: Inference, source: str, differences: list[str] = ()) -> str:
    """The profile YAML: the inferred keys with how each was read, then the "could not infer" block."""
    lines = [f"# A profile for the cluster at {source}, read from its {inf.nodes_seen} node(s) by",
             "# `clusterproof profile --from-cluster` (clusterproof/cluster/site_profile.py). Every key not",
             "# written here keeps its default (clusterproof/config/profiles/base.yaml explains each one).",
             "# Read it, fix what the last block lists, then: ./proof run --cp-kubeconfig K --cp-profile <this file>",
             ""]
    width = max((len(f"{k}: {_scalar(v)}") for k, v in inf.keys.items()), default=0)
    for k, v in sorted(inf.keys.items(), key=lambda kv: ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER)):
        text = f"{k}: {_scalar(v)}"
        lines.append(f"{text:<{width}}   # {inf.how[k]}" if inf.how.get(k) else text)
    lines += ["", "# Could not infer (left at the default of base.yaml):"]
    lines += [f"# - {k}: {why}" for k, why in inf.unknown.items()] or ["# - nothing"]
    if differences:
        lines += ["#", "# The node plan of this profile differs from the nodes (test_cluster_scale will say so):"]
        lines += [f"# - {d}" for d in differences]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``clusterproof profile --from-cluster [--cp-kubeconfig K] [--cp-context C] [-o FILE]``: a profile for a
    cluster, read from its nodes (read-only: one LIST of nodes)."""
    from clusterproof.config.profile import load_profile
    from clusterproof.core import exitcodes
    from clusterproof.core.errors import ArgumentParser, HarnessError, one_line_main
    from clusterproof.kube.client import check_reachable, list_all, load_client, server_url
    ap = ArgumentParser(prog="clusterproof profile", description=main.__doc__.splitlines()[0])
    ap.add_argument("--from-cluster", action="store_true", required=True,
                    help="read the pools, teams, preflight taint and node shape from the cluster's nodes")
    ap.add_argument("--cp-kubeconfig", "--kubeconfig", dest="kubeconfig",
                    default=os.environ.get("KUBECONFIG") or "~/.kube/config",
                    help="the cluster's kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    ap.add_argument("--cp-context", "--context", dest="context", default=None)
    ap.add_argument("-o", "--output", default="-", help="the profile file to write (default: stdout)")
    args = ap.parse_args(argv)

    def body() -> int:
        api = load_client(args.kubeconfig, args.context)
        check_reachable(api)
        nodes = list(list_all(api, "/api/v1/nodes"))
        inf = infer(nodes)
        source = server_url(api)
        text = render(inf, source)
        with tempfile.TemporaryDirectory() as d:     # checked as a run would load it, with its node plan
            probe = Path(d) / "site.yaml"
            probe.write_text(text)
            try:
                profile = load_profile(str(probe), [])
                problem = None
            except HarnessError as e:
                profile, problem = None, str(e).replace(str(probe), "it")
        if profile is not None:
            text = render(inf, source, plan_differences(profile, nodes))
        if args.output == "-":
            sys.stdout.write(text)
        else:
            Path(args.output).write_text(text)
        where = "stdout" if args.output == "-" else args.output
        print(f"clusterproof: wrote a profile of {len(inf.keys)} keys read from {len(nodes)} node(s) to {where}; "
              f"{len(inf.unknown)} key(s) it could not infer are listed at its end"
              + (f"; it does not load yet: {problem}" if problem else ""), file=sys.stderr)
        return exitcodes.USAGE if problem else 0
    return one_line_main(body)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
