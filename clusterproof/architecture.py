"""The map of the tree, read from its imports and docstrings: ``clusterproof architecture > docs/architecture.md``.

Why generated: a hand-written map drifts the day a module moves. This one is
printed from the source itself -- each module's place (its folder), its
purpose (the first line of its docstring) and, for a suite, a locustfile or a
bench, its domain (the domain it imports most). ``tests/test_architecture.py``
fails when the committed ``docs/architecture.md`` differs from what this
prints, and checks the layering rules below on the same imports.

Pure AST: nothing here imports the modules it reads, so it needs no cluster
and no pytest.
"""
from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import clusterproof
from clusterproof.core import exitcodes

DOMAINS = ("core", "config", "kube", "provision", "cluster", "apf", "burst", "gang", "taints", "preflight", "watch",
           "prometheus", "report")
# The layers under the domains: the others may use them, they use no other domain.
BASE = ("core", "config", "kube", "provision")
# Packages of the distribution that are not a domain of the library.
MAPPED = clusterproof.MAPPED                       # suites, fixtures, load (top-level folders of the checkout)
COMMAND = "clusterproof architecture > docs/architecture.md"

RULES = """\
- `suites/` -> `fixtures/` -> `clusterproof.<domain>` -> `clusterproof.kube`, \
`clusterproof.config` -> `clusterproof.core`:
  dependencies run one way, and no module imports another that (directly or not) imports it back;
  between domains too: no two domains depend on each other, directly or through a third.
- `clusterproof.core` imports no other domain; `clusterproof.kube` and `clusterproof.config` import only `core`
  (and each other).
- `clusterproof.provision` (obtaining binaries, images, host packages) imports only `core`: the running cluster
  (`clusterproof.cluster`) and the domains use it, it runs nothing of theirs.
- `clusterproof.report` imports no domain but `core`: it renders figures, it does not make them.
- Only `fixtures/*.py` (the pytest face of each domain), `suites/` and `tests/` import pytest.
- Only `clusterproof.report` talks to Allure (and the pytest face, `fixtures/` and `suites/`, which prefer its
  helpers): a domain hands its attachments over as data (`clusterproof.core.attachment`).
- `load/` is the locust side, run as a separate process: it imports no fixtures and no suite.
- No module imports another module's private (`_name`) names.
"""

# The life of a run, hop by hop: the one hand-written part of the map. Every dotted ``clusterproof.`` name in
# backticks must name a module, or a function, class or constant in one (``unknown_names``; the self-test
# fails on a name that moved or went), so the prose cannot drift from the code it names.
LIFE_OF_A_RUN = """\
What `./proof run` does, from the command line to its exit code. Each hop names the code that does it; this
part is written by hand (`clusterproof.architecture.LIFE_OF_A_RUN`), and `tests/test_architecture.py` fails
when a `clusterproof.` name in it no longer names anything in the tree.

1. **`./proof run [ARGS]`** (the bash script `proof`, its `run`): `make -s venv` (the pinned venv, exit 8 if
   it cannot be built), then `python -m clusterproof.prepare` (`clusterproof.prepare.main`), which builds
   what this run will use and nothing else, in the order it needs it (when something is not cached, it first
   collects the run to learn what its checks use: `clusterproof.fixtures.cluster.checks_use`): the Go-built
   components (`clusterproof.provision.toolchain.ensure_many`) the cluster's start runs, the real nodes' host
   packages and images, then what checks use later, Prometheus and its history
   (`clusterproof.prometheus.history.build`); bad input exits 4, a failed build 8.
   Then the script `exec`s `python -m pytest --cp-profile PROFILE suites ARGS`: pytest's exit code is the
   command's. (`clusterproof run`, `clusterproof.cli.main`, is the installed way in: pytest with
   `--pyargs clusterproof.suites`, no prepare step; what is not built yet is built on first use.)
2. **The plugin loads**: pytest finds `clusterproof.fixtures` through the `pytest11` entry point (the
   checkout's editable install has it too), and that module's `pytest_plugins` loads one fixtures module per
   domain (`clusterproof.fixtures.cluster`, `clusterproof.fixtures.report`, ...). In a checkout the root
   `conftest.py` collects `suites/` under the installed names (`suites/test_burst_pod_creation.py` is
   `clusterproof.suites.test_burst_pod_creation`), so a checkout run and an installed run import the same
   modules by the same names.
3. **Configure, before any test** (a mistake here is one line and exit 4):
   `clusterproof.fixtures.pytest_configure` picks the run id (`clusterproof.core.run.new_run_id`), the run's
   output directory (`clusterproof.core.outputs.RunOutputs`, `out/runs/<run id>/`: Allure results, junit.xml)
   and the bounds on every check; `clusterproof.fixtures.cluster.pytest_configure` turns SIGINT, SIGTERM and
   SIGHUP into one KeyboardInterrupt, installs the `clusterproof.fixtures.cluster.LivenessGuard` and loads
   the profile (`clusterproof.config.profile.load_profile`: YAML, `--cp-set`, a team's key groups); with
   `--cp-kubeconfig` it checks the cluster and the identity's grants
   (`clusterproof.cluster.backends.check_existing`); `clusterproof.fixtures.report.pytest_configure` opens
   the report's session state (`clusterproof.report.summary.ReportSession`) and reads `--cp-baseline`.
   At collection, destructive checks are skipped on real hardware and on a cluster the harness did not start
   unless `--cp-allow-destructive` (`clusterproof.fixtures.cluster.pytest_collection_modifyitems`).
4. **The cluster**, once per session, when the first module or check asks for it
   (`clusterproof.fixtures.cluster.cluster`): either the embedded one
   (`clusterproof.cluster.backends.start_embedded`: dead runs' leftovers on this machine swept
   (`clusterproof.cluster.backends.sweep_local`), every binary its start runs ensured
   (`clusterproof.provision.toolchain.bringup`), kwokctl's control plane started
   (`clusterproof.cluster.kwok.KwokCluster.prepare` starts the watchdog that deletes it if the run is killed,
   `clusterproof.cluster.kwok.KwokCluster.start`), the run's Lease taken
   (`clusterproof.kube.liveness.RunLease`), the simulated nodes created and Ready
   (`clusterproof.cluster.nodes.create_nodes`, `clusterproof.cluster.nodes.wait_ready`)), or the user's
   (`clusterproof.cluster.backends.connect_existing`: the Lease, the sweep of earlier runs' leftovers
   (`clusterproof.kube.sweep.sweep`), the namespace pool, the owner record). A cluster that cannot be
   started or reached ends the run: exit 4.
5. **Around each test module** (`clusterproof.fixtures.cluster.control_plane_guard`): the control plane is
   healthy when the module starts (`clusterproof.cluster.health.ModuleGuard.start`), the embedded cluster's
   components are kept running (`clusterproof.cluster.health.Supervisor`), and after the module
   `clusterproof.cluster.health.ModuleGuard.end` fails it if it broke the control plane or the API servers
   answered 5xx (`clusterproof.cluster.apiguard.ApiGuard`).
6. **The suites** (`suites/test_<behaviour>.py`): a module's fixtures (`fixtures/<domain>.py`) set up and
   measure through their domain (for instance `clusterproof.fixtures.burst.burst` runs
   `clusterproof.burst.measure.run_phase`, `clusterproof.fixtures.taints` calls
   `clusterproof.taints.isolation.set_up`) and undo it at the module's end; each check records its figures
   (the `figures` fixture, `clusterproof.core.measurement.FigureRecorder`) and asserts. What a domain has for the
   page is handed over as data (`clusterproof.core.attachment.Attachment`) and attached by
   `clusterproof.report.allure.attach`; each check's page gets its title, its figures table
   (`clusterproof.report.allure.attach_figures`) and, when it failed, the cluster's state
   (`clusterproof.report.allure.attach_cluster_state`) from `clusterproof.fixtures.report.pytest_runtest_makereport`.
7. **Teardown**: at the session's end the supervisor stops and the `cluster` fixture removes what the run
   created (`clusterproof.cluster.backends.stop`: on a cluster the harness does not own,
   `clusterproof.cluster.backends.release_owned` empties the pool namespaces and removes what the owner
   record names; the embedded cluster is deleted unless `--cp-keep-cluster`), releases the Lease and
   reports the identity's API calls (`clusterproof.cluster.backends.report_calls`). A second interrupt
   during this is ignored (`clusterproof.fixtures.cluster.tearing_down`).
8. **Figures, report, summary**: `clusterproof.fixtures.report.pytest_sessionfinish` writes Allure's
   environment (`clusterproof.report.allure.write_environment`) and `summary.json`
   (`clusterproof.report.summary.build`, `clusterproof.report.summary.write`), compares it with
   `--cp-baseline` (`comparison.json`); `clusterproof.fixtures.report.ReportHooks.pytest_sessionfinish`,
   the outermost, writes Allure's executor and the CI's step summary (`clusterproof.report.ci.session_end`).
   `./proof report` builds the HTML from `out/runs/<run id>/allure-results/` later.
9. **The exit code** is pytest's session status, which the plugin may raise: 6 when every check passed but
   a figure regressed against the baseline (`clusterproof.report.compare.REGRESSION_EXIT`), 7 when the run
   lost its Lease (`clusterproof.kube.liveness.LIVENESS_EXIT`, set by the `LivenessGuard`). Every code and
   what to do about it: [exit-codes.md](exit-codes.md) (`clusterproof.core.exitcodes`).
"""


def source_dir(name: str) -> Path:
    """Where ``clusterproof.<name>`` (suites, fixtures, load) lives: the checkout's top-level folder, or the
    installed package's subfolder."""
    return (clusterproof.CHECKOUT / name) if clusterproof.CHECKOUT is not None else clusterproof.PACKAGE_DIR / name


def display(path: Path) -> str:
    """A path as a reader of the repository finds it (``suites/x.py``, ``clusterproof/kube/client.py``)."""
    root = clusterproof.CHECKOUT or clusterproof.IMPORT_ROOT
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


# --- the modules and their imports ----------------------------------------------------------------

@dataclass(frozen=True)
class Import:
    module: str              # the importing module
    target: str              # the module imported (a package's ``__init__`` is the package's name)
    names: tuple[str, ...]   # the names taken from it (``from target import a, b``); () for ``import target``
    line: int
    in_function: bool        # inside a def (imported on first call, not on import)


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module = field(repr=False)
    is_package: bool = False

    @property
    def purpose(self) -> str:
        """The docstring's first paragraph, on one line."""
        doc = (ast.get_docstring(self.tree) or "").strip()
        return " ".join(doc.split("\n\n")[0].split()) if doc else "(no docstring)"


def modules(with_tests: bool = False) -> dict[str, Module]:
    """Every module of the distribution by its import name: the library (``clusterproof/``) and the mapped
    top-level folders (``clusterproof.suites``, ``.fixtures``, ``.load``); ``with_tests``: also a checkout's
    self-tests (``tests.*``)."""
    roots = [(clusterproof.PACKAGE_DIR, "clusterproof")] + \
            [(source_dir(m), f"clusterproof.{m}") for m in MAPPED]
    if with_tests and clusterproof.CHECKOUT is not None:
        roots.append((clusterproof.CHECKOUT / "tests", "tests"))
    out: dict[str, Module] = {}
    for root, prefix in roots:
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).with_suffix("").parts
            if "__pycache__" in rel or (prefix == "clusterproof" and rel[0] in MAPPED):
                continue
            package = rel[-1] == "__init__"
            parts = rel[:-1] if package else rel
            name = ".".join((prefix, *parts))
            out[name] = Module(name, path, ast.parse(path.read_text(), str(path)), package)
    return out


def _in_function(tree: ast.Module) -> set[int]:
    """ids of the import nodes that sit inside a function."""
    inside: set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inside


def imports(mod: Module, known: dict[str, Module]) -> list[Import]:
    """What ``mod`` imports from the distribution (relative imports resolved; other packages left out)."""
    out, inside = [], _in_function(mod.tree)
    tops = {name.split(".")[0] for name in known}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in tops:
                    out.append(Import(mod.name, alias.name, (), node.lineno, id(node) in inside))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod.name.split(".") if mod.is_package else mod.name.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            if source.split(".")[0] not in tops:
                continue
            plain = []
            for alias in node.names:
                if f"{source}.{alias.name}" in known:      # ``from package import module``
                    out.append(Import(mod.name, f"{source}.{alias.name}", (), node.lineno, id(node) in inside))
                else:
                    plain.append(alias.name)
            if plain:
                out.append(Import(mod.name, source, tuple(plain), node.lineno, id(node) in inside))
    return out


def module_aliases(mod: Module, known: dict[str, Module]) -> dict[str, str]:
    """Local names bound to a module of the distribution: ``{"kube": "clusterproof.kube.client"}``."""
    aliases: dict[str, str] = {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname and a.name in known:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                if f"{node.module}.{a.name}" in known:
                    aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def domain_of(name: str) -> str | None:
    """The domain of a library module (``clusterproof.kube.client`` -> ``kube``); None outside the domains."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in DOMAINS else None


# --- where suites, locustfiles and benches belong -----------------------------------------------

def owner(mod: Module, known: dict[str, Module]) -> str | None:
    """The domain a suite, locustfile or bench exercises: the one it imports most modules of, the base layers
    (core, config, kube) and the report only when it imports no other; None when it imports no domain."""
    counts: Counter[str] = Counter()
    for imp in imports(mod, known):
        d = domain_of(imp.target)
        if d:
            counts[d] += 1
    for pool in ([d for d in counts if d not in (*BASE, "report")], [d for d in counts if d != "core"], list(counts)):
        if pool:
            return max(pool, key=lambda d: (counts[d], -DOMAINS.index(d)))
    return None


# --- the map ------------------------------------------------------------------------------------

def _entry(mod: Module) -> str:
    return f"- `{display(mod.path)}` -- {mod.purpose}"


def render() -> str:
    known = modules()
    by_domain: dict[str, dict[str, list[Module]]] = {d: {} for d in DOMAINS}

    other: list[Module] = []

    def add(domain: str | None, kind: str, mod: Module) -> None:
        if domain is None:      # shared by every domain (the bench's common parts, the locust base User)
            other.append(mod)
        else:
            by_domain[domain].setdefault(kind, []).append(mod)

    for name, mod in sorted(known.items()):
        parts = name.split(".")
        if parts[1:2] == ["bench"] and len(parts) == 3:
            add(None if parts[2] == "common" else owner(mod, known), "bench", mod)
        elif parts[1:2] in (["suites"], ["load"]) and len(parts) == 3:
            add(owner(mod, known), "suite" if parts[1] == "suites" else "locustfile", mod)
        elif parts[1:2] == ["fixtures"] and len(parts) == 3 and parts[2] in DOMAINS:
            add(parts[2], "fixtures", mod)
        elif domain_of(name) and len(parts) == 3:
            add(parts[1], "library", mod)
        elif domain_of(name) and len(parts) == 4 and mod.is_package:   # a subpackage: one line
            add(parts[1], "library", mod)
        elif domain_of(name) is None and len(parts) <= 3 and not (len(parts) == 3 and mod.is_package) \
                and not (mod.is_package and mod.purpose == "(no docstring)"):
            other.append(mod)

    lines = [
        "# Architecture",
        "",
        f"Generated from the tree (each module's imports and the first paragraph of its docstring) by "
        f"`{COMMAND}`; `tests/test_architecture.py` fails when this file differs from what that prints, "
        "and checks the rules below. Do not edit by hand.",
        "",
        "## Layers",
        "",
        RULES.rstrip(),
        "",
        "A suite, a locustfile or a bench belongs to the domain it imports most (`clusterproof architecture` "
        "decides; the base layers only when it imports no other domain).",
        "",
        "## Life of a run",
        "",
        LIFE_OF_A_RUN.rstrip(),
        "",
        "## Domains",
    ]
    titles = (("library", "Library"), ("fixtures", "Fixtures"), ("suite", "Suites"), ("locustfile", "Locustfiles"),
              ("bench", "Bench"))
    for domain in DOMAINS:
        pkg = known.get(f"clusterproof.{domain}")
        lines += ["", f"### {domain}", ""]
        if pkg is not None and pkg.purpose != "(no docstring)":
            lines += [pkg.purpose, ""]
        for kind, title in titles:
            mods = by_domain[domain].get(kind, [])
            if not mods:
                continue
            lines += [f"{title}:", ""] + [_entry(m) for m in mods] + [""]
        lines.pop()
    lines += ["", "## Around the domains", ""]
    lines += [_entry(m) for m in sorted(other, key=lambda m: display(m.path))]
    return "\n".join(lines) + "\n"


# --- the rules, as violations (one line each) -----------------------------------------------------

def _where(imp: Import, known: dict[str, Module]) -> str:
    return f"{display(known[imp.module].path)}:{imp.line}"


def all_imports(known: dict[str, Module] | None = None) -> list[Import]:
    known = known if known is not None else modules()
    return [imp for mod in known.values() for imp in imports(mod, known)]


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """The loops of a directed graph: its strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        n = stack.pop()
                        on_stack.discard(n)
                        scc.append(n)
                        if n == node:
                            break
                    if len(scc) > 1:
                        found.append(sorted(scc))
    return sorted(found)


def cycles(known: dict[str, Module] | None = None) -> list[str]:
    """Import cycles among the distribution's modules (module-level and function-level imports alike)."""
    known = known if known is not None else modules()
    graph: dict[str, set[str]] = {name: set() for name in known}
    for imp in all_imports(known):
        if imp.target in graph and imp.target != imp.module:
            graph[imp.module].add(imp.target)
    return [f"import cycle: {' <-> '.join(scc)}" for scc in _strongly_connected(graph)]


def domain_cycles(known: dict[str, Module] | None = None) -> list[str]:
    """Domains that depend on each other (through any of their modules): the one-way rule between rooms."""
    known = known if known is not None else modules()
    graph: dict[str, set[str]] = {d: set() for d in DOMAINS}
    where: dict[tuple[str, str], str] = {}
    for imp in all_imports(known):
        src, dst = domain_of(imp.module), domain_of(imp.target)
        if src in graph and dst in graph and src != dst:
            graph[src].add(dst)
            where.setdefault((src, dst), _where(imp, known))
    out = []
    for scc in _strongly_connected(graph):
        ties = [f"{a} -> {b} ({where[(a, b)]})" for a in scc for b in sorted(graph[a]) if b in scc]
        out.append(f"domain cycle: {' <-> '.join(scc)}: " + "; ".join(ties))
    return out


def layer_violations(known: dict[str, Module] | None = None, exempt: tuple[str, ...] = ()) -> list[str]:
    """core imports no other domain; kube and config only core (and each other); provision only core;
    ``exempt``: domains not checked (yet)."""
    known = known if known is not None else modules()
    allowed = {"core": {"core"}, "kube": {"core", "kube", "config"}, "config": {"core", "config", "kube"},
               "provision": {"core", "provision"}}
    out = []
    for imp in all_imports(known):
        src, dst = domain_of(imp.module), domain_of(imp.target)
        if src in allowed and src not in exempt and dst is not None and dst not in allowed[src]:
            out.append(f"{_where(imp, known)}: {src} imports {imp.target} (domain {dst})")
    return out


def report_violations(known: dict[str, Module] | None = None) -> list[str]:
    """clusterproof.report imports no domain but core (nor the fixtures, suites or load)."""
    known = known if known is not None else modules()
    out = []
    for imp in all_imports(known):
        if domain_of(imp.module) != "report":
            continue
        dst = domain_of(imp.target)
        if (dst is not None and dst not in ("core", "report")) or imp.target.split(".")[1:2] in (
                ["fixtures"], ["suites"], ["load"]):
            out.append(f"{_where(imp, known)}: report imports {imp.target}")
    return out


def _package_imports(known: dict[str, Module], packages: tuple[str, ...], what: str,
                     allowed: Callable[[str], bool]) -> list[str]:
    """Every import of one of ``packages`` (top-level names) by a module ``allowed`` does not admit, as
    ``file:line: imports <what>``."""
    out = []
    for name, mod in sorted(known.items()):
        if allowed(name):
            continue
        for node in ast.walk(mod.tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(n.split(".")[0] in packages for n in names):
                out.append(f"{display(mod.path)}:{node.lineno}: imports {what}")
    return out


def _pytest_face(name: str) -> bool:
    return name.split(".")[1:2] in (["fixtures"], ["suites"])


def pytest_violations(known: dict[str, Module] | None = None) -> list[str]:
    """Only fixtures/*.py and the suites import pytest (tests/ are not part of the distribution)."""
    known = known if known is not None else modules()
    return _package_imports(known, ("pytest", "_pytest"), "pytest", _pytest_face)


def allure_violations(known: dict[str, Module] | None = None) -> list[str]:
    """Only clusterproof.report (and the pytest face: fixtures/*.py, the suites) imports Allure: a domain hands
    its attachments over as data (``clusterproof.core.attachment``)."""
    known = known if known is not None else modules()
    return _package_imports(known, ("allure", "allure_commons", "allure_pytest"), "allure",
                            lambda name: _pytest_face(name) or domain_of(name) == "report")


def load_violations(known: dict[str, Module] | None = None) -> list[str]:
    """load/ (the locust side) imports nothing from fixtures/ or suites/."""
    known = known if known is not None else modules()
    return [f"{_where(imp, known)}: load imports {imp.target}" for imp in all_imports(known)
            if imp.module.split(".")[1:2] == ["load"] and imp.target.split(".")[1:2] in (["fixtures"], ["suites"])]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_violations(known: dict[str, Module] | None = None) -> list[str]:
    """``from other import _name`` and ``other._name`` of another module (the distribution's and the
    self-tests': a test that needs a helper's internals makes it public)."""
    known = known if known is not None else modules(with_tests=True)
    out = []
    for imp in all_imports(known):
        if imp.target != imp.module:
            for n in imp.names:
                if _private(n):
                    out.append(f"{_where(imp, known)}: imports {imp.target}.{n}")
    for name, mod in sorted(known.items()):
        aliases = module_aliases(mod, known)
        for node in ast.walk(mod.tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                target = _dotted(node.value, aliases)
                if target in known and target != name:
                    out.append(f"{display(mod.path)}:{node.lineno}: uses {target}.{node.attr}")
    return out


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The module an expression names (``kube``, ``clusterproof.kube.client``), or None."""
    if isinstance(node, ast.Name):
        return aliases.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value, aliases)
        return f"{base}.{node.attr}" if base else None
    return None


def _defines(tree: ast.Module | ast.ClassDef, name: str) -> ast.AST | None:
    """The def, class or assignment of ``name`` directly in a module or class body, or None."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
    return None


def unknown_names(text: str, known: dict[str, Module] | None = None) -> list[str]:
    """The dotted ``clusterproof.`` names in backticks in ``text`` that name nothing in the tree: neither a
    module nor a function, class or constant of one (nor a method of such a class)."""
    known = known if known is not None else modules()
    out = []
    for name in dict.fromkeys(re.findall(r"`(clusterproof(?:\.\w+)+)`", text)):
        parts = name.split(".")
        cut = max((i for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known), default=0)
        if cut == 0:
            out.append(f"{name}: no such module")
            continue
        scope: ast.AST | None = known[".".join(parts[:cut])].tree
        for attr in parts[cut:]:
            scope = _defines(scope, attr) if isinstance(scope, (ast.Module, ast.ClassDef)) else None
            if scope is None:
                out.append(f"{name}: {'.'.join(parts[:cut])} defines no {'.'.join(parts[cut:])}")
                break
    return out


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args:
        print(f"clusterproof: architecture takes no arguments (usage: {COMMAND})", file=sys.stderr)
        return exitcodes.USAGE
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
