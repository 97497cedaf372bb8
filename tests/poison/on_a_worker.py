"""A module that says where it ran (for tests/test_outputs.py's parallel-workers test; not collected by
itself): its worker's run id and embedded cluster, in a file named by CLUSTERPROOF_WHERE_DIR."""
import json
import os
from pathlib import Path

import pytest


@pytest.mark.cluster
def test_where_this_worker_runs(cluster, run_id):
    out = Path(os.environ["CLUSTERPROOF_WHERE_DIR"]) / f"{os.environ.get('PYTEST_XDIST_WORKER', 'main')}.json"
    out.write_text(json.dumps({"run_id": run_id, "cluster": cluster.kwok.name, "dir": str(cluster.kwok.directory)}))
