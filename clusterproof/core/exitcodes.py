"""Every exit code clusterproof ends with, and what it means: pytest's own 0-5, and ours from 6 on.

Why: a CI pipeline branches on the code (``.ci/nightly`` passes it through
unchanged), so one code means one thing wherever it comes from. pytest owns
0-5; no command of ours gives 2, 3 or 5 another meaning, and 4 means what it
means to pytest: bad input (a usage error, a profile value, a cluster or a
kubeconfig the harness cannot use), said in one line on stderr. Ours start at 6.
``docs/exit-codes.md`` is the table for a reader (who returns each code, what to
do); tests/test_exit_codes.py keeps it, this module and the source in step.

``./proof`` and ``.ci/nightly`` (bash) return ``SETUP_FAILED`` and
``REPORT_FAILED`` by number; the self-test checks their numbers against these.
"""
from __future__ import annotations

OK = 0                # every check passed (pytest), or the command did its job
CHECK_FAILED = 1      # pytest: a check failed or errored (the report's categories say which kind)
INTERRUPTED = 2       # pytest: interrupted (Ctrl-C, SIGTERM or SIGHUP), or a suite file failed to import
INTERNAL_ERROR = 3    # pytest: an internal error of pytest or of a plugin (a traceback: a bug)
USAGE = 4             # pytest's usage error, and ours: bad input, one line on stderr saying what to fix
NO_TESTS = 5          # pytest: no check was collected (-k / -m / a path selected nothing)
REGRESSION = 6        # the checks passed, but the run regressed against its --cp-baseline
LEASE_LOST = 7        # the run lost its lease on the cluster (clusterproof.kube.liveness) and stopped
SETUP_FAILED = 8      # the set-up failed: the venv, a binary, the Prometheus history or an image was not built
REPORT_FAILED = 9     # .ci/nightly: the run passed but its Allure report could not be built

VERDICTS = {
    OK: "passed",
    CHECK_FAILED: "a check failed",
    INTERRUPTED: "interrupted",
    INTERNAL_ERROR: "internal error (pytest or a plugin)",
    USAGE: "bad input (one line on stderr says what to fix)",
    NO_TESTS: "no check selected",
    REGRESSION: "regressed against the baseline",
    LEASE_LOST: "lost its lease on the cluster",
    SETUP_FAILED: "set-up failed",
    REPORT_FAILED: "the report could not be built",
}


def verdict(code: int) -> str:
    """The short meaning of ``code`` (``exit N`` for one this table does not know)."""
    return VERDICTS.get(int(code), f"exit {int(code)}")
