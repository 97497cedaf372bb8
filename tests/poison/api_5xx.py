"""A module that makes the apiserver answer 504 once, undeclared (for tests/test_api_health_guard.py;
not collected by itself): the API health guard must fail it, naming verb, resource and count."""
import pytest

from tests.poison.gateway_timeout import gateway_timeout


@pytest.mark.cluster
def test_a_write_times_out_in_the_apiserver(cluster, namespace):
    assert gateway_timeout(cluster, namespace) == 504
