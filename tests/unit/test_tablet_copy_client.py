"""The copying side of tablet copy against a fake source: chunks lost, damaged, or answered
twice are fetched again from the same offset; a session that vanished is begun anew and
resumed when it describes the same snapshot, restarted when not; a whole file that does
not match its checksum is never installed under the store's name."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import crc32c
import grpc
import pytest

from raftlet.proto import tablet_copy_pb2 as pb
from raftlet.tserver.bootstrap import STORE_FILE
from raftlet.tserver.tablet_copy_client import CopyFailed, download


class _Rpc(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._code.name

    def trailing_metadata(self) -> tuple[()]:
        return ()


class FakeSource:
    """Serves ``data`` as a snapshot; ``faults`` says what happens to each fetch."""

    def __init__(self, data: bytes, *, seed: int = 0, lose: float = 0, damage: float = 0) -> None:
        self.data = data
        self.rng = random.Random(seed)
        self.lose, self.damage = lose, damage
        self.sessions = 0
        self.live: set[str] = set()
        self.lost = self.damaged = 0
        self.expire_after: int | None = None  # fetches before the session vanishes
        self.change_snapshot_on_next_begin = False
        self.change_on_expiry = False  # the next session is of a newer snapshot
        self.fetches = 0

    def BeginTabletCopySession(self, request: Any, timeout: float) -> Any:
        self.sessions += 1
        if self.change_snapshot_on_next_begin:
            self.data = self.data[::-1]
            self.change_snapshot_on_next_begin = False
        sid = f"s{self.sessions}"
        self.live.add(sid)
        return pb.BeginTabletCopySessionResponse(
            session_id=sid,
            snapshot_index=42,
            snapshot_term=3,
            store_bytes=len(self.data),
            store_crc32c=crc32c.crc32c(self.data),
            source_term=5,
            voters=["a", "b", "c"],
        )

    def FetchTabletCopyData(self, request: Any, timeout: float) -> Any:
        self.fetches += 1
        if request.session_id not in self.live:
            raise _Rpc(grpc.StatusCode.NOT_FOUND)
        if self.expire_after is not None and self.fetches > self.expire_after:
            self.live.discard(request.session_id)
            self.expire_after = None
            self.change_snapshot_on_next_begin = self.change_on_expiry
            raise _Rpc(grpc.StatusCode.NOT_FOUND)
        if self.rng.random() < self.lose:
            self.lost += 1
            raise _Rpc(grpc.StatusCode.UNAVAILABLE)
        chunk = self.data[request.offset : request.offset + request.max_bytes]
        crc = crc32c.crc32c(chunk)
        if self.rng.random() < self.damage:
            self.damaged += 1
            chunk = bytes([chunk[0] ^ 1]) + chunk[1:]
        return pb.FetchTabletCopyDataResponse(data=chunk, crc32c=crc)


def _run(source: FakeSource, tmp_path: Path, **kwargs: Any) -> Any:
    return download(source, "t1", "b", tmp_path, chunk_bytes=1000, sleep=lambda _s: None, **kwargs)


def test_lost_and_damaged_chunks_are_fetched_again(tmp_path: Path) -> None:
    data = random.Random(1).randbytes(50_000)
    source = FakeSource(data, seed=7, lose=0.2, damage=0.2)
    got = _run(source, tmp_path, attempts=20)
    assert (tmp_path / STORE_FILE).read_bytes() == data
    assert source.lost > 0
    assert source.damaged > 0
    assert got.retries == source.lost + source.damaged
    assert (got.state.index, got.state.term, got.state.source_term) == (42, 3, 5)
    assert got.state.voters == ("a", "b", "c")


def test_a_vanished_session_resumes_on_the_same_snapshot(tmp_path: Path) -> None:
    data = random.Random(2).randbytes(20_000)
    source = FakeSource(data)
    source.expire_after = 7
    got = _run(source, tmp_path)
    assert (tmp_path / STORE_FILE).read_bytes() == data
    assert got.sessions == 2
    # 20 chunks in all, none fetched twice: the second session went on from chunk 8.
    assert got.chunks == 20


def test_a_vanished_session_starts_over_on_a_different_snapshot(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(20_000)
    source = FakeSource(data)
    source.expire_after = 7
    source.change_on_expiry = True
    got = _run(source, tmp_path)
    assert (tmp_path / STORE_FILE).read_bytes() == data[::-1]
    assert got.chunks == 7 + 20


def test_a_source_that_keeps_failing_is_given_up_on(tmp_path: Path) -> None:
    source = FakeSource(b"x" * 5000, lose=1.0)
    with pytest.raises(CopyFailed, match="giving up"):
        _run(source, tmp_path, attempts=4)
    assert not (tmp_path / STORE_FILE).exists()


def test_a_file_that_does_not_match_its_checksum_is_not_installed(tmp_path: Path) -> None:
    source = FakeSource(b"y" * 5000)
    real_begin = source.BeginTabletCopySession

    def lying_begin(request: Any, timeout: float) -> Any:
        resp = real_begin(request, timeout)
        resp.store_crc32c ^= 1
        return resp

    source.BeginTabletCopySession = lying_begin  # type: ignore[method-assign]
    with pytest.raises(CopyFailed, match="crc32c"):
        _run(source, tmp_path)
    assert not (tmp_path / STORE_FILE).exists()
