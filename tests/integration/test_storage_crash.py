"""Crash recovery of the storage stack with real processes and SIGKILL.

A child process (storage_crash_child) runs the core, the WAL's group commit and the store
at full speed; the test kills it at random moments and, after every kill, checks what
The durable log's promise (docs/ARCHITECTURE.md, "consensus.log"): every entry acknowledged
as durable is in the log with its term,
the store holds exactly the replay of the log up to its applied index (nothing lost,
nothing applied twice), and the next start recovers and goes on.
"""

from __future__ import annotations

import os
import random
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from raftlet.consensus.log.raft_storage import LogStorage
from raftlet.tserver.bootstrap import STORE_FILE, apply_entries
from raftlet.tserver.store import TabletStore
from tests.integration.storage_crash_child import SCHEMA

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
KILLS = int(os.environ.get("RAFTLET_CRASH_KILLS", "20"))
SEED = int(os.environ.get("RAFTLET_CRASH_SEED", str(random.SystemRandom().randrange(1 << 30))))
LINE_TIMEOUT_S = 30.0


class ChildLines:
    """Lines from a child's stdout, each waited for with a deadline."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self._fd = proc.stdout.fileno()
        self._proc = proc
        self._buf = b""

    def next(self, timeout: float = LINE_TIMEOUT_S) -> str | None:
        """The next line; None at end of stream.  Raises TimeoutError past the deadline."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no line from child within {timeout} s")
                if not sel.select(left):
                    continue
                chunk = os.read(self._fd, 65536)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode()


def _start(directory: Path) -> tuple[subprocess.Popen[bytes], ChildLines]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.integration.storage_crash_child", str(directory)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    return proc, ChildLines(proc)


def _child_failure(proc: subprocess.Popen[bytes], what: str) -> str:
    stderr = ""
    if proc.stderr is not None and proc.poll() is not None:
        stderr = proc.stderr.read().decode(errors="replace")
    return f"child failed (seed {SEED}, {what}); its stderr:\n{stderr}"


def _record_ack(line: str, acked: dict[int, int]) -> None:
    kind, index, term = line.split()
    assert kind == "ACK", line
    acked[int(index)] = int(term)


def _verify(directory: Path, acked: dict[int, int], scratch: Path) -> int:
    storage = LogStorage.open(directory)
    try:
        last = storage.last_index()
        for index, term in sorted(acked.items()):
            assert index <= last, f"acknowledged entry {index} lost: log ends at {last}"
            assert storage.term(index) == term, f"entry {index} changed term"
        with TabletStore.open(directory / STORE_FILE) as store:
            applied = store.applied_index()
            assert applied <= last
            replay_path = scratch / f"replay-{len(acked)}.sqlite"
            with TabletStore.open(replay_path, SCHEMA) as replay:
                lo = 1
                while lo <= applied:
                    chunk = storage.entries(lo, min(applied + 1, lo + 500))
                    for result in apply_entries(replay, chunk):
                        assert not result.row_errors, result
                    lo = chunk[-1].index + 1
                assert replay.applied_index() == applied
                assert replay.applied_term() == store.applied_term()
                ours = store.scan().rows
                assert ours == replay.scan().rows, "store differs from the replay of its log"
            replay_path.unlink()
        return applied
    finally:
        storage.close()


def test_sigkill_at_random_moments_loses_nothing_acknowledged(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    replica = tmp_path / "replica"
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    acked: dict[int, int] = {}
    total_replayed = 0
    for kill in range(KILLS):
        proc, lines = _start(replica)
        try:
            ready = lines.next() or ""
            assert ready.startswith("READY"), _child_failure(proc, f"kill {kill}: {ready!r}")
            total_replayed += int(ready.split()[1])
            for _ in range(rng.randint(1, 150)):
                line = lines.next()
                assert line is not None, f"child exited early (seed {SEED}, kill {kill})"
                _record_ack(line, acked)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=LINE_TIMEOUT_S)
        # Acknowledgements printed before the kill landed count too.
        while (line := lines.next()) is not None:
            _record_ack(line, acked)
        assert proc.returncode == -signal.SIGKILL, proc.returncode
        if proc.stderr is not None:
            proc.stderr.close()
        if proc.stdout is not None:
            proc.stdout.close()
        _verify(replica, acked, scratch)
    assert len(acked) > KILLS, f"too few acknowledgements to mean anything (seed {SEED})"
    # One last clean start must recover and make progress past everything acknowledged.
    proc, lines = _start(replica)
    try:
        assert (lines.next() or "").startswith("READY")
        line = lines.next()
        assert line is not None
        _record_ack(line, acked)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=LINE_TIMEOUT_S)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    applied = _verify(replica, acked, scratch)
    assert applied > 0, "nothing was ever applied"
    print(
        f"\nstorage crash test: seed {SEED}, {KILLS} kills, {len(acked)} entries acknowledged, "
        f"{applied} applied, {total_replayed} replayed from the log while opening"
    )
