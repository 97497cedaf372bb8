"""Rewrite tests/durations.json from the JUnit XML of a ./proof test (each module's seconds).

    python tests/durations.py out/runs/<run id>/junit.xml [more junit.xml ...]

Give it every junit.xml the gate's steps wrote (the self-tests on their workers, the host-state and guest-run
steps: ``ls out/runs/*/junit.xml`` after ./proof test): a module's seconds are the sum of its tests' own,
the same on workers as in a serial run. tests/conftest.py orders the modules by these figures on parallel
workers (the longest first); a module missing from it counts as long, and tests/test_tiers.py fails until
every self-test module is in it: a new one is run alone (``--junitxml=FILE``) and merged (modules the files
do not hold keep their seconds). Refresh it after a module grows or shrinks by minutes.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).with_name("durations.json")


def module_seconds(*junits: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in (c for junit in junits for c in ET.parse(junit).getroot().iter("testcase")):
        module = case.get("classname", "").split(".")
        if module[0] != "tests":          # the suites' runs beside the self-tests
            continue
        name = next((f"{m}.py" for m in module if m.startswith("test_")), None)
        if name:
            seconds[name] += float(case.get("time") or 0)
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if not argv or not all(Path(a).is_file() for a in argv):
        print("usage: python tests/durations.py JUNIT_XML [JUNIT_XML ...] (the junit.xml of each step of "
              "./proof test)", file=sys.stderr)
        return 4
    # Modules the given files do not hold keep their seconds (a module added since is run alone, then merged);
    # modules that no longer exist are dropped.
    kept = json.loads(OUT.read_text())["seconds"] if OUT.exists() else {}
    exist = {p.name for p in OUT.parent.glob("test_*.py")}
    seconds = {k: v for k, v in {**kept, **module_seconds(*map(Path, argv))}.items() if k in exist}
    seconds = dict(sorted(seconds.items(), key=lambda kv: -kv[1]))
    OUT.write_text(json.dumps({"source": "the steps of a ./proof test (python tests/durations.py junit.xml ...)",
                               "seconds": seconds}, indent=1) + "\n")
    print(f"{OUT}: {len(seconds)} modules, {sum(seconds.values()) / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
