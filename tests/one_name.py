"""A pytest plugin for tests/test_imports.py: at the end of the session, which of the project's source
files this process imported under more than one module name, and every name it gave them, written as JSON to
``$CLUSTERPROOF_IMPORT_PROBE``. Loaded with ``-p tests.one_name``; does nothing without the variable."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ENV = "CLUSTERPROOF_IMPORT_PROBE"


def names_by_file(modules: dict) -> dict[str, list[str]]:
    """{source file: [module names]} of every module loaded from a file (pure: ``sys.modules``-shaped)."""
    out: dict[str, list[str]] = {}
    for name, mod in list(modules.items()):
        f = getattr(mod, "__file__", None)
        if f:
            out.setdefault(str(Path(f).resolve()), []).append(name)
    return out


def pytest_sessionfinish(session) -> None:
    target = os.environ.get(ENV)
    if not target:
        return
    by_file = names_by_file(sys.modules)
    root = str(Path(__file__).resolve().parent.parent)
    ours = {f: sorted(n) for f, n in by_file.items() if f.startswith(root + os.sep) and "/.venv/" not in f}
    Path(target).write_text(json.dumps({"twice": {f: n for f, n in ours.items() if len(n) > 1}, "ours": ours},
                                       indent=1))
