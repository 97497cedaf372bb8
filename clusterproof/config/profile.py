"""Profiles: flat YAML data that sizes a run, checked by a model assembled from the domains' key groups.

Why flat: a user changes one number in a file (or ``--cp-set key=value``), never
code (ClusterLoader2 overrides). Every shipped key has a default in
``clusterproof/config/profiles/base.yaml``; a profile file overrides some of them and an unknown
key is an error, so a typo cannot silently fall back to a default.

Why assembled: each domain declares its own keys, a ``KeyGroup`` (``clusterproof.core.keygroup``)
named ``KEYS`` in ``clusterproof/<domain>/keys.py``, with the rules between them; the profile
model is the union of the groups found there (the cluster's first), so a new suite brings its
domain and its keys and edits nothing here. This module imports no domain: it finds the groups
by that convention. A team's own suite adds groups in one of two ways (docs/extending.md "Write your own
check"):

- a hook in its ``conftest.py`` or plugin, ``pytest_clusterproof_profile_keys()``, returning a
  ``KeyGroup`` subclass (or a list of them); its keys carry their defaults in the model;
- an entry point in the group ``clusterproof.profile_keys`` of its own distribution, naming such
  a class (found by every command, not only pytest).

A team key is set like any other (its profile YAML, ``--cp-set``); a key that two groups declare is
an error, so a team cannot shadow a shipped key.
"""
from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points
from pathlib import Path
from typing import Annotated, Any, Literal, Sequence, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, create_model, model_validator

from clusterproof.core.errors import HarnessError
from clusterproof.core.keygroup import KeyGroup

PROFILES_DIR = Path(__file__).resolve().parent / "profiles"
BASE = PROFILES_DIR / "base.yaml"
PACKAGE_DIR = Path(__file__).resolve().parent.parent
FIRST = "cluster"          # the core group: its keys (the node plan) are what other groups' rules read
ENTRY_POINTS = "clusterproof.profile_keys"


class Profile(BaseModel):
    """The base of every assembled profile model: read-only, a name, ``profile[key]``.

    The keys and their types are the key groups' (``profile_model``); the defaults of the shipped
    keys and the reasons for them are in clusterproof/config/profiles/base.yaml. Validation is
    pydantic's (types, bounds, literals) plus each group's ``rules``; ``load_profile`` turns the
    first error into one line that names the key, where its value came from, and what is wanted.
    """
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    _name: str = PrivateAttr("?")
    __key_groups__: tuple[type[KeyGroup], ...] = ()

    @property
    def name(self) -> str:
        return self._name

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    @model_validator(mode="after")
    def _consistent(self) -> "Profile":
        for group in type(self).__key_groups__:
            group.rules(self)
        return self


def shipped_groups() -> tuple[type[KeyGroup], ...]:
    """The domains' key groups: ``KEYS`` of every ``clusterproof/<domain>/keys.py``, the cluster's first."""
    domains = sorted((d.name for d in PACKAGE_DIR.iterdir() if (d / "keys.py").is_file() and d.name != "config"),
                     key=lambda name: (name != FIRST, name))
    return tuple(importlib.import_module(f"clusterproof.{d}.keys").KEYS for d in domains)


def entry_point_groups() -> tuple[type[KeyGroup], ...]:
    """Key groups that installed distributions declare in the entry point group ``clusterproof.profile_keys``."""
    groups = []
    for ep in entry_points(group=ENTRY_POINTS):
        try:
            groups.append(ep.load())
        except Exception as e:   # a team's broken plugin: one line, naming it
            raise HarnessError(f"entry point {ep.name} = {ep.value} ({ENTRY_POINTS}) cannot be loaded: "
                               f"{type(e).__name__}: {e}") from None
    return tuple(groups)


def flatten_groups(found: Sequence[Any]) -> tuple[type[KeyGroup], ...]:
    """What hooks return (a group, a list of groups, or None) as one tuple of groups."""
    out = []
    for item in found:
        for g in (item if isinstance(item, (list, tuple)) else [item]):
            if g is None:
                continue
            if not (isinstance(g, type) and issubclass(g, KeyGroup)):
                raise HarnessError(f"profile key group {g!r} is not a subclass of clusterproof.core.keygroup.KeyGroup")
            out.append(g)
    return tuple(out)


def profile_model(extra: Sequence[type[KeyGroup]] = ()) -> type[Profile]:
    """The profile model of the shipped groups, the installed entry points' and ``extra`` (a team's)."""
    # A group registered twice (hook and entry point) counts once.
    return _assemble(tuple(dict.fromkeys(shipped_groups() + entry_point_groups() + tuple(extra))))


@functools.lru_cache(maxsize=None)
def _assemble(groups: tuple[type[KeyGroup], ...]) -> type[Profile]:
    fields, owner = {}, {}
    for group in groups:
        for key, info in group.model_fields.items():
            if key in owner:
                raise HarnessError(f"profile key {key!r} is declared by both {owner[key]} and "
                                   f"{group.__module__}.{group.__qualname__}; rename one")
            owner[key] = f"{group.__module__}.{group.__qualname__}"
            fields[key] = (info.annotation, info)
    model = create_model("Profile", __base__=Profile, __module__=__name__, **fields)
    model.__key_groups__ = groups
    return model


def _load_yaml(path: Path) -> dict:
    try:
        # Decoded explicitly: the locale's encoding is not the file's, and a decode error inside
        # yaml or pathlib would be a traceback, not a line.
        data = yaml.safe_load(path.read_bytes().decode("utf-8"))
    except OSError as e:
        raise HarnessError(f"cannot read profile {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise HarnessError(f"profile {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start} "
                           "is not valid UTF-8): save it as UTF-8") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise HarnessError(f"profile {path} is not valid YAML{where}: "
                           f"{getattr(e, 'problem', e)}; fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise HarnessError(f"profile {path} must be a mapping of flat key: value pairs")
    return data


def _base_type(model: type[Profile], key: str) -> type:
    t = model.model_fields[key].annotation
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    return get_origin(t) or t


def _element_type(model: type[Profile], key: str) -> type | None:
    t = model.model_fields[key].annotation
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    args = get_args(t)
    t = args[0] if args else None
    while get_origin(t) is Annotated:
        t = get_args(t)[0]
    return t


def _number(v: str) -> Any:
    try:
        return int(v)
    except ValueError:
        return v


def _from_text(model: type[Profile], key: str, value: str) -> Any:
    """A ``--cp-set`` value (always text) read as the key's type: YAML scalars, comma lists."""
    want = _base_type(model, key)
    if want is str or want is Literal:
        return value
    if want is list:
        items = [v.strip() for v in value.split(",") if v.strip()]
        # A list of numbers (watch_sizes) is read like its YAML form; a list of names stays text.
        return [_number(v) for v in items] if _element_type(model, key) is int else items
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def _widen(model: type[Profile], key: str, value: Any) -> Any:
    """YAML writes 1 for 1.0: an int is a valid float."""
    if _base_type(model, key) is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


_TYPE_NAMES = {"int_type": "int", "float_type": "float", "string_type": "str", "list_type": "list",
               "bool_type": "bool", "int_from_float": "int"}


def _one_line(err: dict, origin_of: dict[str, str], base: dict, name: str, like: dict | None = None) -> str:
    """pydantic's first error as the harness's one line: where, which key, what is wanted."""
    like = like or {}
    loc = [x for x in err["loc"] if isinstance(x, str)]
    key = loc[0] if loc else None
    origin = origin_of.get(key, f"profile {name}") if key else f"profile {name}"
    value, kind, ctx = err.get("input"), err["type"], err.get("ctx") or {}
    if kind == "missing":
        return f"profile {name}: key {key!r} has no value; give it one in {BASE} (or a default in its key group)"
    if kind == "extra_forbidden":
        return f"{origin}: unknown key {key!r}; the keys are listed in {BASE}"
    if kind in _TYPE_NAMES or kind.endswith("_type"):
        want = _TYPE_NAMES.get(kind, kind.removesuffix("_type"))
        return f"{origin}: {key} must be {want} (like {base.get(key, like.get(key))!r}), got {value!r}"
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        op = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}[kind]
        bound = next(iter(ctx.values()))
        if key in ("team_fraction", "preflight_fraction"):
            return f"{origin}: {key} must be between 0 and 1, got {value:g}"
        return f"{origin}: {key} must be {op} {bound:g}, got {value:g}"
    if kind == "literal_error":
        return (f"{origin}: {key} must be one of "
                f"{ctx.get('expected', '').replace(chr(39), '').replace(' or ', ', ')}, got {value!r}")
    if kind == "string_pattern_mismatch":
        return f"{origin}: {key} {value!r} must match {ctx.get('pattern')}"
    msg = str(ctx.get("error") or err["msg"]).removeprefix("Value error, ")
    return f"{origin}: {key} {msg}" if key else f"{origin}: {msg}"


def resolve_profile_path(name_or_path: str) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or "/" in name_or_path:
        if not p.exists():
            raise HarnessError(f"profile file {p} does not exist")
        return p
    p = PROFILES_DIR / f"{name_or_path}.yaml"
    if not p.exists() or name_or_path == "base":
        known = sorted(x.stem for x in PROFILES_DIR.glob("*.yaml") if x.stem != "base")
        raise HarnessError(f"unknown profile {name_or_path!r}: use one of {', '.join(known)} "
                           f"or a path to a YAML file")
    return p


def load_profile(name_or_path: str, overrides: list[str] | None = None,
                 groups: Sequence[type[KeyGroup]] = ()) -> Profile:
    """The profile ``name_or_path`` over base.yaml and the groups' defaults, then ``--cp-set`` overrides;
    ``groups``: a team's key groups beside the shipped and installed ones."""
    model = profile_model(groups)
    keys = model.model_fields
    base = _load_yaml(BASE)
    path = resolve_profile_path(name_or_path)
    merged = {}
    origin_of = {}
    layers = [(str(BASE), base), (str(path), _load_yaml(path))]
    for item in overrides or []:
        if "=" not in item:
            raise HarnessError(f"--cp-set {item!r}: write it as key=value (e.g. --cp-set nodes=500)")
        k, v = item.split("=", 1)
        k = k.strip()
        if k not in keys:
            raise HarnessError(f"--cp-set {item}: unknown key {k!r}; the keys are listed in {BASE}")
        layers.append((f"--cp-set {item}", {k: _from_text(model, k, v)}))
    for origin, data in layers:
        for k, v in data.items():
            if k not in keys:
                raise HarnessError(f"{origin}: unknown key {k!r}; the keys are listed in {BASE}")
            merged[k] = _widen(model, k, v)
            origin_of[k] = origin
    try:
        profile = model(**merged)
    except ValidationError as e:
        defaults = {k: f.default for k, f in keys.items() if not f.is_required()}
        raise HarnessError(_one_line(e.errors()[0], origin_of, base, path.stem, defaults)) from None
    profile._name = path.stem
    return profile
