"""Rewrite tests/durations.json from a serial self-test run's JUnit XML (each module's seconds).

    python tests/durations.py out/runs/<run id>/junit.xml

tests/conftest.py orders the modules by these figures on parallel workers (the longest first).
Refresh it after a module grows or shrinks by minutes; a module missing from it counts as long.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

OUT = Path(__file__).with_name("durations.json")


def module_seconds(junit: Path) -> dict[str, float]:
    seconds: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = next((f"{m}.py" for m in module if m.startswith("test_")), None)
        if name:
            seconds[name] += float(case.get("time") or 0)
    return {k: round(v, 1) for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])}


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python tests/durations.py JUNIT_XML (a serial run of tests/)", file=sys.stderr)
        return 4
    seconds = module_seconds(Path(argv[0]))
    OUT.write_text(json.dumps({"source": "a serial run of tests/ (python tests/durations.py junit.xml)",
                               "seconds": seconds}, indent=1) + "\n")
    print(f"{OUT}: {len(seconds)} modules, {sum(seconds.values()) / 60:.1f} min in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
