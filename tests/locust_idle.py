"""A locustfile that only waits (for tests/test_cleanup.py: stopping locust as a whole process group)."""
from locust import User, constant, task


class Idle(User):
    wait_time = constant(1)

    @task
    def nothing(self):
        pass
