"""clusterproof: conformance and load checks for large ML clusters on Kubernetes.

The library is grouped by domain (``core``, ``config``, ``kube``, ``cluster``,
``apf``, ``burst``, ``gang``, ``taints``, ``preflight``, ``watch``,
``prometheus``, ``report``); ``docs/architecture.md`` is the map.

The repository's top-level ``suites/``, ``fixtures/`` and ``load/`` are this
package's ``clusterproof.suites``, ``clusterproof.fixtures`` and
``clusterproof.load`` (``pyproject.toml``'s ``package-dir``): the wheel puts
them inside the package, and a checkout's editable install (``make setup``)
maps the same names onto its folders. Each module has that one name; the
checkout's ``conftest.py`` collects ``suites/`` under it too.
"""
from __future__ import annotations

from pathlib import Path

__version__ = "0.22.0"

PACKAGE_DIR = Path(__file__).resolve().parent
# The directory that holds the package: PYTHONPATH of the processes the
# harness starts (locust, the preflight agent and checker).
IMPORT_ROOT = PACKAGE_DIR.parent
MAPPED = ("suites", "fixtures", "load")
CHECKOUT = IMPORT_ROOT if (IMPORT_ROOT / "pyproject.toml").is_file() and not (PACKAGE_DIR / "fixtures").is_dir() \
    else None

