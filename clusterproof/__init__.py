"""clusterproof: conformance and load checks for large ML clusters on Kubernetes.

The library is grouped by domain (``core``, ``config``, ``kube``, ``cluster``,
``apf``, ``burst``, ``gang``, ``taints``, ``preflight``, ``watch``,
``prometheus``, ``report``); ``docs/architecture.md`` is the map.

The repository's top-level ``suites/``, ``fixtures/`` and ``load/`` are this
package's ``clusterproof.suites``, ``clusterproof.fixtures`` and
``clusterproof.load``: the wheel puts them inside the package
(``pyproject.toml``); in a source checkout, the finder below maps the same
names onto the checkout's folders, so both import the same code.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from pathlib import Path

__version__ = "0.22.0"

PACKAGE_DIR = Path(__file__).resolve().parent
# The directory that holds the package: PYTHONPATH of the processes the
# harness starts (locust, the preflight agent and checker).
IMPORT_ROOT = PACKAGE_DIR.parent
MAPPED = ("suites", "fixtures", "load")
CHECKOUT = IMPORT_ROOT if (IMPORT_ROOT / "pyproject.toml").is_file() and not (PACKAGE_DIR / "fixtures").is_dir() \
    else None


class _CheckoutFolders(importlib.abc.MetaPathFinder):
    """``clusterproof.suites``/``.fixtures``/``.load`` from a checkout's top-level folders."""

    def find_spec(self, fullname, path=None, target=None):
        pkg, _, name = fullname.rpartition(".")
        if pkg != __name__ or name not in MAPPED:
            return None
        folder = CHECKOUT / name
        return importlib.util.spec_from_file_location(fullname, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])


if CHECKOUT is not None and not any(isinstance(f, _CheckoutFolders) for f in sys.meta_path):
    sys.meta_path.insert(0, _CheckoutFolders())
