"""The one exception type for user-facing mistakes.

Why: a wrong kubeconfig, a missing binary or a malformed profile must end the
run with one readable line (what is wrong, how to fix it), not a traceback.
Everything that raises HarnessError promises that its message is such a line;
conftest turns it into ``pytest.exit(..., returncode=4)`` before any test runs.
The line never carries a URL's credentials: whatever URL a message quotes (a
user's, or one inside a library's exception text), its ``user:pass@`` is
masked here (``clusterproof.core.redact``).

A command of ours ends the same way: ``one_line_main`` turns a HarnessError
into its line and an exit code, and ``ArgumentParser`` makes a bad argument
one line and exit 4 (argparse's own is a usage block and exit 2, which is
pytest's "interrupted": ``clusterproof.core.exitcodes``).
"""
import argparse
import sys
from typing import Callable, NoReturn

from clusterproof.core import exitcodes, redact


class HarnessError(Exception):
    """A problem the user can fix; str(e) is the whole message."""

    def __init__(self, message: object = ""):
        super().__init__(redact.text(str(message)))


def one_line_main(body: Callable[[], int], code: int = exitcodes.USAGE) -> int:
    """A command's body, run: a HarnessError is its one line on stderr (``clusterproof: ...``) and exit ``code``
    (4, bad input, unless the command says otherwise: 8 for a set-up command's failed build)."""
    try:
        return body()
    except HarnessError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return code


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser whose errors are one line (``clusterproof: PROG: what is wrong``) and exit 4."""

    def error(self, message: str) -> NoReturn:
        print(f"clusterproof: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(exitcodes.USAGE)
