"""Reading kwok's log for node deletions it missed (clusterproof.cluster.lost_deletions): pure helpers, a file.

The repair itself was measured on a 7,500-node cluster (the module's doc); here: which lines count, and that
the log is read once, whole lines only, across scans and a log that starts again.
"""
from __future__ import annotations

import json

import pytest

from clusterproof.cluster.lost_deletions import LostDeletions, lease_mentions, parked_lease

pytestmark = pytest.mark.unit


def _line(msg: str, node: str, **more) -> bytes:
    return json.dumps({"time": "2026-11-28T01:59:07Z", "level": "INFO", "msg": msg, "node": node, **more}).encode()


def test_a_joining_node_counts_once_a_lost_worker_more():
    lines = [_line("Creating lease", "joined"),                        # a node joining: once
             _line("Creating lease", "lost"), _line("Creating lease", "lost"),
             _line("Failed to sync lease", "failing", level="ERROR"),
             _line("Syncing lease", "renewing"), _line("Patch node", "joined"),
             b'{"msg":"Creating lease","node":"cut-off', b"not json at all"]
    assert lease_mentions(lines) == {"joined": 1, "lost": 2, "failing": 2}


def test_the_log_is_read_once_whole_lines_only_and_again_from_the_start_when_it_is_new(tmp_path):
    log = tmp_path / "kwok-controller.log"
    log.write_bytes(_line("Creating lease", "a") + b"\n" + _line("Creating lease", "b")[:20])
    lost = LostDeletions(log)
    lost.scan()
    assert lost.seen == {"a": 1}
    log.write_bytes(log.read_bytes() + _line("Creating lease", "b")[20:] + b"\n")
    lost.scan()
    lost.scan()                                   # nothing new: nothing counted twice
    assert lost.seen == {"a": 1, "b": 1}
    log.write_bytes(_line("Failed to sync lease", "a") + b"\n")   # shorter than the offset: a new log
    lost.scan()
    assert lost.seen == {"a": 3, "b": 1}


def test_a_missing_log_counts_nothing(tmp_path):
    lost = LostDeletions(tmp_path / "absent.log")
    lost.scan()
    assert not lost.seen


def test_the_parked_lease_is_held_by_the_harness_for_longer_than_any_run():
    body = parked_lease("cp-gpu-join-x-00001", "20261128-000000-abcd", "2026-11-28T02:00:00.000000Z")
    assert body["metadata"]["namespace"] == "kube-node-lease"
    assert body["spec"]["holderIdentity"].startswith("clusterproof")
    assert body["spec"]["leaseDurationSeconds"] >= 30 * 24 * 3600
    assert "ownerReferences" not in body["metadata"]      # the garbage collector keeps it
