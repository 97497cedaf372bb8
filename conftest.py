"""clusterproof's checkout: its suites are collected under the names the wheel gives them.

The harness is a pytest plugin (``clusterproof.fixtures``), found through its
``pytest11`` entry point in a checkout (``make setup`` installs it editable)
as in an installed run. ``suites/`` is the package ``clusterproof.suites``
(``pyproject.toml``); left to itself, pytest would import ``suites/test_x.py``
by its path as ``suites.test_x`` and ``suites/__init__.py`` as ``suites`` --
a second name for the same code, which the wheel never has. The two hooks
below make a checkout run import each suite as ``clusterproof.suites.test_x``,
exactly what ``clusterproof run`` imports from an installed wheel
(tests/test_imports.py holds every module of a run to one name).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
from pathlib import Path

import pytest

PACKAGE = "clusterproof.suites"


@functools.cache
def suites_dir() -> Path | None:
    """Where ``clusterproof.suites`` lives (this checkout's ``suites/`` when it is installed editable); None if
    the package is not installed, and pytest collects by path as it would anyway."""
    spec = importlib.util.find_spec(PACKAGE)
    return Path(spec.origin).resolve().parent if spec is not None and spec.origin else None


class InstalledModule(pytest.Module):
    """A suite module imported by its package name (``clusterproof.suites.<stem>``), not by its path."""

    def _getobj(self):
        name = f"{PACKAGE}.{self.path.stem}"
        try:
            return importlib.import_module(name)
        except pytest.skip.Exception as e:
            if e.allow_module_level:
                raise
            raise self.CollectError("pytest.skip outside a test: use pytest.mark.skip or allow_module_level") from e
        except (SyntaxError, ImportError) as e:
            raise self.CollectError(f"error while importing suite module {name} ({self.path}):\n"
                                    + str(pytest.ExceptionInfo.from_current().getrepr(style="short"))) from e


@pytest.hookimpl(tryfirst=True)
def pytest_collect_directory(path: Path, parent: pytest.Collector):
    """``suites/`` as a plain directory, not a Package: pytest would import its ``__init__.py`` as ``suites``."""
    if path.resolve() == suites_dir():   # never, when the package is not installed (None)
        return pytest.Dir.from_parent(parent, path=path)
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector):
    if module_path.resolve().parent == suites_dir() and module_path.name != "__init__.py":
        return InstalledModule.from_parent(parent, path=module_path)
    return None
