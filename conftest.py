"""clusterproof's checkout: the harness is a pytest plugin (``fixtures/``).

Installed (``pip install clusterproof``, or ``make setup`` here) it is found
through its ``pytest11`` entry point; a checkout run without installing it
registers the same plugin here, so both run the very same code. Nothing else
lives in this file: fixtures live with their domains in ``fixtures/``.
"""
from importlib.metadata import entry_points

if not any(ep.value == "clusterproof.fixtures" for ep in entry_points(group="pytest11")):
    pytest_plugins = ["clusterproof.fixtures"]
