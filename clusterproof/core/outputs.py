"""Where a run's outputs go: one directory per run, outside the source tree.

Why: results, summary and comparison used to land in the checkout's
``reports/``, shared by every run -- two runs from one checkout overwrote
each other, and a checkout filled with files git had to be told to ignore.
Now every run writes under its own run id::

    out/                        the output directory (--cp-output-dir, $CLUSTERPROOF_OUTPUT_DIR; default ./out)
      runs/<run id>/            one run: nothing else writes here
        allure-results/         Allure's raw results (unless --alluredir names another place)
        junit.xml               JUnit XML of every check (unless --junitxml names another place)
        summary.json            the run's checks and figures (a run of the suites)
        comparison.json         against --cp-baseline, when given
        perfdata.json           --cp-export perfdata: the figures as ClusterLoader2 PerfData (perfdash)
        openmetrics.txt         --cp-export openmetrics: the figures as OpenMetrics text (Prometheus)
        html/                   the report ``./proof report`` built from this run
        upgrade.txt             the upgrade check's table (the TO run of ``make upgrade-check``)
      latest -> runs/<run id>   the run that started last (a symlink, replaced atomically)
      history/                  Allure's trend history, carried from one ``./proof report`` to the next
      pytest-cache/             pytest's cache (--lf, --ff): pytest.ini's cache_dir, set by the plugin
      bench/                    bench JSON when clusterproof is installed, not run from a checkout
      suites-on-smoke.log       ``./proof test``: the console of the suites it runs alongside the
                                self-tests (printed after theirs)

Pure (no pytest import): the plugin, the upgrade job, the benches and
``./proof report`` (``python -m clusterproof.core.outputs``) share it.
"""
from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

from clusterproof.core import exitcodes
from clusterproof.core.errors import HarnessError, one_line_main
from clusterproof.core.run import RUN_ID

ENV = "CLUSTERPROOF_OUTPUT_DIR"
DEFAULT = "out"
LATEST = "latest"
# pytest.ini: ``cache_dir = ${CLUSTERPROOF_PYTEST_CACHE}``; the plugin sets it to ``pytest_cache()`` first.
PYTEST_CACHE_ENV = "CLUSTERPROOF_PYTEST_CACHE"


def root(explicit: str | os.PathLike | None = None) -> Path:
    """The output directory: ``explicit`` (--cp-output-dir), else $CLUSTERPROOF_OUTPUT_DIR, else ./out."""
    return Path(explicit or os.environ.get(ENV) or DEFAULT).expanduser().absolute()


@dataclass(frozen=True)
class RunOutputs:
    """The files of one run (paths only; nothing is created until ``create``)."""
    base: Path      # the output directory
    run_id: str

    @property
    def dir(self) -> Path:
        return self.base / "runs" / self.run_id

    @property
    def allure_results(self) -> Path:
        return self.dir / "allure-results"

    @property
    def summary(self) -> Path:
        return self.dir / "summary.json"

    @property
    def junit(self) -> Path:
        return self.dir / "junit.xml"

    @property
    def api_work(self) -> Path:
        return self.dir / "api-work.json"

    @property
    def comparison(self) -> Path:
        return self.dir / "comparison.json"

    @property
    def perfdata(self) -> Path:
        return self.dir / "perfdata.json"

    @property
    def openmetrics(self) -> Path:
        return self.dir / "openmetrics.txt"

    @property
    def html(self) -> Path:
        return self.dir / "html"

    def create(self) -> "RunOutputs":
        self.dir.mkdir(parents=True, exist_ok=True)
        return self

    def shown(self) -> str:
        """The run's directory as the user should type it (relative to cwd when inside it)."""
        return shown(self.dir) + "/"


def shown(path: Path) -> str:
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def for_run(run_id: str, base: str | os.PathLike | None = None) -> RunOutputs:
    """The outputs of run ``run_id`` (a run id is a DNS label: never a path)."""
    if not RUN_ID.fullmatch(run_id or ""):
        raise HarnessError(f"run id {run_id!r} is not a run id (a short DNS label, e.g. 20260101-120000-ab12)")
    return RunOutputs(root(base), run_id)


def mark_latest(run: RunOutputs) -> None:
    """Point ``<output dir>/latest`` at this run. Concurrent-safe: a new link is made under a name of its
    own and renamed over the old one (rename is atomic), so ``latest`` always names a whole run."""
    link = run.base / LATEST
    tmp = run.base / f".{LATEST}-{uuid.uuid4().hex[:8]}"
    try:
        tmp.symlink_to(Path("runs") / run.run_id)
        os.replace(tmp, link)
    except OSError:           # a file system without symlinks: no latest, the run itself is unharmed
        tmp.unlink(missing_ok=True)


def runs(base: str | os.PathLike | None = None) -> list[str]:
    """The run ids that have a directory, oldest first (by the directory's modification time)."""
    d = root(base) / "runs"
    if not d.is_dir():
        return []
    return [p.name for p in sorted(d.iterdir(), key=lambda p: p.stat().st_mtime) if p.is_dir()]


def latest(base: str | os.PathLike | None = None) -> RunOutputs:
    """The run ``latest`` names (else the newest run directory); HarnessError when there is none."""
    b = root(base)
    link = b / LATEST
    if link.is_symlink():
        run_id = Path(os.readlink(link)).name
        if (b / "runs" / run_id).is_dir():
            return RunOutputs(b, run_id)
    found = runs(b)
    if not found:
        raise HarnessError(f"no run in {shown(b)}/runs: run the suites first (./proof run), or name the output "
                           f"directory (--cp-output-dir, ${ENV})")
    return RunOutputs(b, found[-1])


def pick(run_id: str | None = None, base: str | os.PathLike | None = None) -> RunOutputs:
    """The run named (it must exist), or the latest."""
    if not run_id:
        return latest(base)
    run = for_run(run_id, base)
    if not run.dir.is_dir():
        known = runs(base)[-5:]
        raise HarnessError(f"no run {run_id} in {shown(run.base)}/runs"
                           + (f" (the newest: {', '.join(reversed(known))})" if known else " (no run there yet)"))
    return run


def pytest_cache(base: str | os.PathLike | None = None) -> Path:
    """pytest's cache directory (``--lf``, ``--ff``): shared by the runs of one output directory."""
    return root(base) / "pytest-cache"


def history(base: str | os.PathLike | None = None) -> Path:
    """Allure's trend history kept between reports."""
    return root(base) / "history"


def bench_dir(checkout: Path | None) -> Path:
    """Where bench JSON goes: the checkout's committed figures (``reports/bench``), else the output directory."""
    return checkout / "reports" / "bench" if checkout is not None else root() / "bench"


def main(argv: list[str] | None = None) -> int:
    """``python -m clusterproof.core.outputs run-dir [RUN]`` prints the run's directory (the latest when RUN
    is empty); ``history`` prints the history directory. For the Makefile: one line, or one error line."""
    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        if args[:1] == ["run-dir"] and len(args) <= 2:
            print(pick(args[1] if len(args) == 2 else None).dir)
        elif args == ["history"]:
            print(history())
        else:
            print("clusterproof: usage: python -m clusterproof.core.outputs run-dir [RUN] | history", file=sys.stderr)
            return exitcodes.USAGE
        return 0
    return one_line_main(body, exitcodes.USAGE)

if __name__ == "__main__":
    sys.exit(main())
