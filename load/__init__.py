"""What load to apply (locust users and shapes), kept apart from what is measured.

Nothing in this package that the pytest process imports may import locust:
locust monkey-patches the standard library with gevent at import time, so it
only ever runs as its own process (``clusterproof.core.locust.run_locust``).
"""
