"""The one exception type for user-facing mistakes.

Why: a wrong kubeconfig, a missing binary or a malformed profile must end the
run with one readable line (what is wrong, how to fix it), not a traceback.
Everything that raises HarnessError promises that its message is such a line;
conftest turns it into ``pytest.exit(..., returncode=4)`` before any test runs.
The line never carries a URL's credentials: whatever URL a message quotes (a
user's, or one inside a library's exception text), its ``user:pass@`` is
masked here (``clusterproof.core.redact``).
"""
import sys
from typing import Callable

from clusterproof.core import redact


class HarnessError(Exception):
    """A problem the user can fix; str(e) is the whole message."""

    def __init__(self, message: object = ""):
        super().__init__(redact.text(str(message)))


def one_line_main(body: Callable[[], int], code: int) -> int:
    """A command's body, run: a HarnessError is its one line on stderr (``clusterproof: ...``) and exit ``code``."""
    try:
        return body()
    except HarnessError as e:
        print(f"clusterproof: {e}", file=sys.stderr)
        return code
