"""A check whose helper raises HarnessError (tests/test_bad_input.py runs it): the failure must be the
one line, "clusterproof: <message>", with no traceback."""
import pytest

from clusterproof.core.errors import HarnessError


@pytest.mark.unit
def test_a_check_whose_helper_gives_up():
    raise HarnessError("node n1 could not be written: 10 write conflicts in a row (self-test)")
