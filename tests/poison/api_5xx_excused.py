"""A module that makes the apiserver answer 504 once and declares it (for tests/test_api_health_guard.py;
not collected by itself): the API health guard reports the 5xx as excused and does not fail it."""
import pytest

from tests.poison.gateway_timeout import gateway_timeout


@pytest.mark.cluster
def test_a_declared_write_timeout(cluster, namespace, api_guard):
    with api_guard.excuse("etcd stopped on purpose (self-test)"):
        assert gateway_timeout(cluster, namespace) == 504
