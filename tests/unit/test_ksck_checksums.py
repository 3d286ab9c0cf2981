"""``raftlet cluster ksck --checksum`` over tablets that cannot all be checked: without a
leader a tablet is not asked (nothing could place its point, and asking would wait out the
deadline), the others are asked at once, and the verdict tells "no replica gave one" from
"some did and agree"."""

from __future__ import annotations

import re
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from raftlet.cli.cluster_cmd import _checksums, _print_checksums
from raftlet.client import Timeout
from raftlet.client.checksum import ReplicaChecksum, TabletChecksum

TABLETS = ("kv-p0", "kv-p1", "kv-p2", "kv-p3")


class _Client:
    def __init__(self) -> None:
        self.asked: list[str] = []
        self.refreshed = 0
        self._lock = threading.Lock()
        self._all_in = threading.Barrier(3, timeout=10)

    def __enter__(self) -> _Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        pass

    def leader_of(self, tablet: str, *, refresh: bool = False) -> str:
        assert refresh
        with self._lock:
            self.refreshed += 1
        return "ts1"

    def checksum(self, tablet: str, *, timeout_s: float, refresh: bool = True) -> TabletChecksum:
        assert not refresh, "each tablet refreshed the replicas again"
        with self._lock:
            self.asked.append(tablet)
        # The three led tablets must be in flight together (one at a time would wait here
        # until the barrier's timeout breaks it).
        self._all_in.wait()
        if tablet == "kv-p3":
            raise Timeout("checksum point of tablet kv-p3: leader ts1 stepped down")
        if tablet == "kv-p2":
            return TabletChecksum(
                tablet,
                7,
                (
                    ReplicaChecksum("ts1", 5, "ab"),
                    ReplicaChecksum("ts2", error="UNAVAILABLE"),
                    ReplicaChecksum("ts3", 5, "ab"),
                ),
            )
        return TabletChecksum(tablet, 7, tuple(ReplicaChecksum(s, 5, "ab") for s in "123"))


def test_tablets_are_checked_at_once_and_leaderless_ones_not_at_all(
    capsys: pytest.CaptureFixture[str],
) -> None:
    client = _Client()
    placements = [SimpleNamespace(tablet_id=t, replicas=("ts1", "ts2", "ts3")) for t in TABLETS]
    target: Any = SimpleNamespace(
        config=SimpleNamespace(placements=lambda: placements), client=lambda **_k: client
    )
    health = SimpleNamespace(
        tablets=[
            SimpleNamespace(tablet_id=t, leader=None if t == "kv-p1" else "ts1") for t in TABLETS
        ]
    )
    checks = _checksums(target, 3.0, health)

    assert sorted(client.asked) == ["kv-p0", "kv-p2", "kv-p3"]
    assert client.refreshed == 1
    assert [c.tablet_id for c in checks] == list(TABLETS)
    by_id = {c.tablet_id: c for c in checks}
    assert by_id["kv-p0"].ok
    assert by_id["kv-p1"].not_checked.startswith("no ready leader")
    assert by_id["kv-p3"].not_checked.startswith("no checksum point: ")
    assert not any(by_id[t].ok or by_id[t].diverged for t in ("kv-p1", "kv-p2", "kv-p3"))

    _print_checksums(checks)
    out = " ".join(capsys.readouterr().out.split())
    assert "CHECKSUMS INCOMPLETE: kv-p2 (a replica gave none; those that did agree)" in out
    assert "CHECKSUMS MISSING: kv-p1, kv-p3 (no replica gave one)" in out
    assert "leader ts1 stepped down" in out
    # The table's word for each tablet is the summary's.
    assert re.search(r"kv-p1 +MISSING", out), out
    assert re.search(r"kv-p2 +INCOMPLETE", out), out
    assert "MISMATCH" not in out


def test_a_mismatch_names_the_replica_that_differs_and_how_to_rebuild_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """CHECKSUM MISMATCH said nothing of what to do."""
    minority = TabletChecksum(
        "kv-p0",
        7,
        (
            ReplicaChecksum("ts1", 5, "ab"),
            ReplicaChecksum("ts2", 5, "ff"),
            ReplicaChecksum("ts3", 5, "ab"),
        ),
    )
    # No majority (ts3 gave none): the leader's rows are what a new replica is copied from.
    split = TabletChecksum(
        "kv-p1",
        7,
        (
            ReplicaChecksum("ts1", 5, "ab"),
            ReplicaChecksum("ts2", 5, "ff"),
            ReplicaChecksum("ts3", error="UNAVAILABLE"),
        ),
    )
    _print_checksums([minority, split], {"kv-p0": "ts1", "kv-p1": "ts2"})
    out = " ".join(capsys.readouterr().out.split())
    assert "CHECKSUM MISMATCH: kv-p0, kv-p1" in out
    assert (
        "kv-p0: the replica on ts2 differs from the majority of its replicas: `raftlet tablet "
        "remove-replica kv-p0 ts2 --wait`, then `raftlet tablet add-replica kv-p0 ts2 --wait`, "
        "which fills it by a copy from the leader (one replica at a time)"
    ) in out
    assert "kv-p0: the replica on ts1" not in out
    assert (
        "kv-p1: the replica on ts1 differs from the leader's (ts2; no majority agrees: check "
        "its rows): `raftlet tablet remove-replica kv-p1 ts1 --wait`"
    ) in out
