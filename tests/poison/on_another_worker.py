"""The check of on_a_worker.py in a second module, so that two workers each take one (for
tests/test_outputs.py's parallel-workers test; not collected by itself)."""
from tests.poison.on_a_worker import test_where_this_worker_runs  # noqa: F401  (collected here too)
