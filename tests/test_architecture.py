"""The map cannot drift, and the layering it states holds (pure AST: no cluster, a second or so).

``docs/architecture.md`` is what ``clusterproof architecture`` prints from the
tree; the rules are checked on the same imports (``clusterproof.architecture``).
Each violation is one line: file:line and what it imports.
"""
from __future__ import annotations

import re

import pytest

from clusterproof import architecture as arch


@pytest.fixture(scope="module")
def known():
    return arch.modules()


@pytest.mark.cluster
def test_the_committed_map_is_what_the_command_prints():
    committed = (arch.clusterproof.CHECKOUT / "docs" / "architecture.md").read_text()
    assert committed == arch.render(), f"docs/architecture.md is stale: run `{arch.COMMAND}`"


@pytest.mark.cluster
def test_every_suite_locustfile_and_bench_is_on_the_map(known):
    """A new suite, locustfile or bench shows up under a domain (or, importing none, around them)."""
    text = arch.render()
    missing = [arch.display(m.path) for name, m in known.items()
               if name.split(".")[1:2] in (["suites"], ["load"], ["bench"]) and not m.is_package
               and f"`{arch.display(m.path)}`" not in text]
    assert not missing, "\n".join(f"{p}: not on the map" for p in missing)


@pytest.mark.cluster
def test_no_import_cycles(known):
    v = arch.cycles(known)
    assert not v, "\n".join(v)


@pytest.mark.cluster
def test_no_two_domains_depend_on_each_other(known):
    v = arch.domain_cycles(known)
    assert not v, "\n".join(v)


@pytest.mark.cluster
def test_the_base_layers_import_no_domain_above_them(known):
    """core imports no other domain; kube and config only core (and each other); provision only core."""
    v = arch.layer_violations(known)
    assert not v, "\n".join(v)


@pytest.mark.cluster
def test_report_imports_no_domain(known):
    v = arch.report_violations(known)
    assert not v, "\n".join(v)


@pytest.mark.unit
def test_only_fixtures_and_suites_import_pytest(known):
    v = arch.pytest_violations(known)
    assert not v, "\n".join(v)


@pytest.mark.unit
def test_only_report_imports_allure(known):
    """A domain hands its attachments over as data (clusterproof.core.attachment); report/ attaches them."""
    v = arch.allure_violations(known)
    assert not v, "\n".join(v)


@pytest.mark.cluster
def test_load_imports_no_fixtures_or_suites(known):
    v = arch.load_violations(known)
    assert not v, "\n".join(v)


@pytest.mark.cluster
def test_no_private_names_imported_across_modules():
    v = arch.private_violations()
    assert not v, "\n".join(v)


@pytest.mark.unit
def test_the_life_of_a_run_names_only_what_exists(known):
    """Every module, function, class or constant the hand-written life of a run names is in the tree."""
    v = arch.unknown_names(arch.LIFE_OF_A_RUN, known)
    assert not v, "\n".join(v)


@pytest.mark.cluster
def test_namespaces_are_created_in_one_place():
    """``clusterproof.kube.namespaces.create_namespace`` is the one POST of a Namespace."""
    post = re.compile(r"""["']POST["']\s*,\s*["']/api/v1/namespaces["']""")
    where = arch.modules(with_tests=True)
    found = [f"{arch.display(m.path)}: creates a namespace by hand (use kube.namespaces.create_namespace)"
             for name, m in where.items()
             if name != "clusterproof.kube.namespaces" and post.search(m.path.read_text())]
    assert not found, "\n".join(found)


@pytest.mark.unit
def test_the_rules_catch_what_they_state(tmp_path, monkeypatch):
    """Negative control: a planted cycle, a private import, a pytest import, an Allure import outside report/,
    a base-layer import and a name the life of a run might cite that is not in the tree are each reported in
    one line."""
    pkg = tmp_path / "clusterproof"
    for d in ("core", "kube", "provision", "report", "gang", "suites", "fixtures", "load"):
        (pkg / d).mkdir(parents=True)
        (pkg / d / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "core" / "a.py").write_text('"""A."""\nfrom clusterproof.gang import b\n')
    (pkg / "gang" / "b.py").write_text('"""B."""\nimport pytest\nfrom clusterproof.core.a import _hidden\n')
    (pkg / "gang" / "d.py").write_text('"""D."""\ndef f():\n    from allure import attach\n')
    (pkg / "report" / "r.py").write_text('"""R."""\nimport allure\ndef f():\n    from clusterproof.gang import b\n')
    (pkg / "gang" / "c.py").write_text('"""C."""\nfrom clusterproof.report import r\n')
    (pkg / "load" / "l.py").write_text('"""L."""\nfrom clusterproof.fixtures import x\n')
    (pkg / "fixtures" / "x.py").write_text('"""X."""\nimport pytest\nimport allure\n')
    (pkg / "provision" / "p.py").write_text('"""P."""\nfrom clusterproof.cluster import kwok\n')
    monkeypatch.setattr(arch.clusterproof, "PACKAGE_DIR", pkg)
    monkeypatch.setattr(arch.clusterproof, "CHECKOUT", None)
    planted = arch.modules()
    assert arch.cycles(planted) == ["import cycle: clusterproof.core.a <-> clusterproof.gang.b"]
    assert [v.split(": ", 1)[1] for v in arch.layer_violations(planted)] == \
        ["core imports clusterproof.gang.b (domain gang)", "provision imports clusterproof.cluster (domain cluster)"]
    assert [v.split(": ", 1)[1] for v in arch.report_violations(planted)] == ["report imports clusterproof.gang.b"]
    [domains] = arch.domain_cycles(planted)
    assert domains.startswith("domain cycle: core <-> gang <-> report: core -> gang ("), domains
    assert [v.split(": ", 1)[1] for v in arch.pytest_violations(planted)] == ["imports pytest"]
    assert [v.split(": ", 1)[1] for v in arch.allure_violations(planted)] == ["imports allure"]
    assert arch.allure_violations(planted)[0].endswith("gang/d.py:3: imports allure")
    assert [v.split(": ", 1)[1] for v in arch.load_violations(planted)] == ["load imports clusterproof.fixtures.x"]
    assert [v.split(": ", 1)[1] for v in arch.private_violations(planted)] == ["imports clusterproof.core.a._hidden"]
    assert arch.unknown_names("`clusterproof.gang.b` `clusterproof.gang.b.gone` `clusterproof.gang.z.f`", planted) == \
        ["clusterproof.gang.b.gone: clusterproof.gang.b defines no gone",
         "clusterproof.gang.z.f: clusterproof.gang defines no z.f"]
