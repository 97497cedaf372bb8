"""What a profile key group is made of: the base class, and the value types the groups share.

A key group is a pydantic model of one domain's profile keys (``clusterproof/<domain>/keys.py``,
module attribute ``KEYS``), with the rules between its keys in ``rules(p)``; the profile model is
assembled from the groups by ``clusterproof.config.profile``. A team adds its own group the same
way (``clusterproof.config.profile`` says how); its keys may carry defaults in the model, the
shipped keys take theirs from ``profiles/base.yaml``, where the reasons for them are written.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

# RFC 1123 label value / qualified-name checks, as the apiserver applies them.
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")   # a namespace name


class KeyGroup(BaseModel):
    """One domain's profile keys: typed fields (with defaults where the group gives them), and the
    rules between keys in ``rules``, which sees the whole assembled profile (a rule may read the
    keys of the cluster group, e.g. the node plan). A ValueError from ``rules`` is the run's one line."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    @staticmethod
    def rules(p: Any) -> None:
        """Rules between keys (pydantic checks each key alone); raise ValueError with one line."""


def worker_names(workers: int, names: list[str], prefix: str) -> None:
    """Expected worker names, if given, are one per worker, each once."""
    if names and len(names) != workers:
        raise ValueError(f"{prefix}_worker_names lists {len(names)} names but {prefix}_workers is {workers}: "
                         "name every worker, or none")
    if len(set(names)) != len(names) or any(not n.strip() for n in names):
        raise ValueError(f"{prefix}_worker_names {names}: each name once, none empty")


def is_qualified_name(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix)):
        return False
    return 0 < len(name) <= 63 and bool(LABEL_VALUE.match(name))


def _qualified(v: str) -> str:
    if not is_qualified_name(v):
        raise ValueError(f"{v!r} is not a valid label/taint key (e.g. example.com/team)")
    return v


def _label_values(v: list[str]) -> list[str]:
    for team in v:
        if not LABEL_VALUE.match(team) or len(team) > 63:
            raise ValueError(f"team name {team!r} is not a valid label value")
    return v


def _priority_class(v: str) -> str:
    if not DNS_SUBDOMAIN.match(v) or len(v) > 253 or v.startswith("system-"):
        raise ValueError(f"{v!r} is not a valid PriorityClass name (lower-case DNS name, not starting with system-)")
    return v


def _k8s_name(v: str) -> str:
    if not DNS_SUBDOMAIN.match(v) or len(v) > 253:
        raise ValueError(f"{v!r} is not an object name (lower-case DNS name, e.g. system-node-high)")
    return v


def _k8s_name_or_empty(v: str) -> str:
    return _k8s_name(v) if v else v


def _k8s_names(v: list[str]) -> list[str]:
    for x in v:
        _k8s_name(str(x))
    return v


Pos = Annotated[int, Field(ge=1)]
NonNeg = Annotated[int, Field(ge=0)]
PosFloat = Annotated[float, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
QualifiedName = Annotated[str, AfterValidator(_qualified)]
LabelValues = Annotated[list[str], AfterValidator(_label_values)]
PriorityClassName = Annotated[str, AfterValidator(_priority_class)]
ObjectName = Annotated[str, AfterValidator(_k8s_name)]
ObjectNameOrEmpty = Annotated[str, AfterValidator(_k8s_name_or_empty)]
ObjectNames = Annotated[list[str], AfterValidator(_k8s_names)]


def parse_team_namespaces(entries: list[str]) -> dict[str, str]:
    """``["research=ml-research", ...]`` -> {team: namespace} (validated by the taints group's rules)."""
    return dict(e.split("=", 1) for e in entries)
