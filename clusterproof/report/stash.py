"""Keys for what the session keeps in ``config.stash`` (shared by conftest and reports)."""
import pytest

PROFILE = pytest.StashKey()
RUN_ID = pytest.StashKey()
CLUSTER = pytest.StashKey()
REAL_HARDWARE = pytest.StashKey()  # --kubeconfig names a cluster with real (non-kwok) nodes
MANIFEST = pytest.StashKey()       # --kubeconfig: the RBAC manifest the identity was checked against
CALLS = pytest.StashKey()          # every request of the harness's identity (clusterproof.kube.apicalls.Recorder)
BRINGUP_S = pytest.StashKey()   # seconds the embedded cluster took to come up (clusterproof.report.timing)
EXTRA_ENV = pytest.StashKey()   # {key: value} a suite adds to the report's environment (clusterproof.report.allure)
