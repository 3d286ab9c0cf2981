"""The in-memory exactly-once cache: admission states, and that every replica -- not only
the leader, which alone sees ``admit`` -- forgets what a client no longer needs."""

from __future__ import annotations

import pytest

from raftlet.proto import tablet_pb2
from raftlet.tserver.errors import InvalidRequest
from raftlet.tserver.result_tracker import (
    ANONYMOUS_PREFIX,
    MAX_CLIENT_ID_BYTES,
    Admission,
    ResultTracker,
    check_client_id,
)


def _response(index: int) -> tablet_pb2.WriteResponse:
    return tablet_pb2.WriteResponse(op_index=index)


def _ignore(_: object) -> None:
    pass


def test_new_attached_completed_and_stale() -> None:
    tracker = ResultTracker()
    answers: list[tablet_pb2.WriteResponse] = []
    assert tracker.admit(("c", 1), 0, answers.append, _ignore) == (Admission.NEW, None)
    assert tracker.admit(("c", 1), 0, answers.append, _ignore) == (Admission.ATTACHED, None)
    assert tracker.complete(("c", 1), _response(7)) == 2
    assert [a.op_index for a in answers] == [7, 7]
    state, stored = tracker.admit(("c", 1), 0, answers.append, _ignore)
    assert state is Admission.COMPLETED
    assert stored is not None
    assert stored.op_index == 7
    assert tracker.admit(("c", 1), 2, answers.append, _ignore)[0] is Admission.STALE


def test_a_follower_forgets_completed_requests_below_first_incomplete() -> None:
    # A follower only ever calls complete(), with the first_incomplete_seq_no each applied
    # entry carried; its table must stay as small as the leader's.
    tracker = ResultTracker()
    for seq in range(10_000):
        tracker.complete(("c", seq), _response(seq), first_incomplete_seq_no=seq)
    assert list(tracker._clients["c"].done) == [9_999]
    # What is forgotten stays forgotten: a late duplicate below the mark is not stored.
    tracker.complete(("c", 5), _response(5), first_incomplete_seq_no=0)
    assert 5 not in tracker._clients["c"].done
    assert tracker.memory_bytes() == _bytes_of(tracker)


def _bytes_of(tracker: ResultTracker) -> int:
    """The tracker's memory as counted from scratch (its running total must agree)."""
    return sum(c.size for c in tracker._clients.values())


def _admitted(tracker: ResultTracker, key: tuple[str, int], first: int = 0) -> Admission:
    return tracker.admit(key, first, _ignore, _ignore)[0]


def test_clients_beyond_the_bound_are_forgotten_least_recently_used_first() -> None:
    tracker = ResultTracker(max_clients=3)
    for c in ("a", "b", "c"):
        tracker.complete((c, 1), _response(1))
    # "a" is used again (a retry answered from memory): "b" is now the oldest.
    assert _admitted(tracker, ("a", 1)) is Admission.COMPLETED
    tracker.complete(("d", 1), _response(2))
    assert tracker.clients() == 3
    assert tracker.evictions() == 1
    assert _admitted(tracker, ("a", 1)) is Admission.COMPLETED
    # "b" was forgotten: its retry is new to the tracker (the replica asks the store).
    assert _admitted(tracker, ("b", 1)) is Admission.NEW
    assert tracker.clients() == 3
    assert tracker.evictions() == 2  # "c", the oldest when "b" came back
    assert tracker.memory_bytes() == _bytes_of(tracker)


def test_thousands_of_clients_stay_within_both_bounds() -> None:
    tracker = ResultTracker(max_clients=100, max_bytes=64 << 10)
    errors = tablet_pb2.WriteResponse(op_index=1)
    for i in range(20):
        errors.row_errors.add(row_index=i, message="x" * 100)
    for i in range(5000):
        tracker.complete((f"client-{i}", 1), errors if i % 2 else _response(i))
        assert tracker.clients() <= 100
        assert tracker.memory_bytes() <= 64 << 10
    assert tracker.evictions() == 5000 - tracker.clients()
    assert tracker.memory_bytes() == _bytes_of(tracker)
    # The most recent clients are the ones kept.
    assert _admitted(tracker, ("client-4999", 1)) is Admission.COMPLETED
    assert _admitted(tracker, ("client-0", 1)) is Admission.NEW


def test_one_client_over_the_byte_bound_keeps_its_newest_responses() -> None:
    big = tablet_pb2.WriteResponse(op_index=1)
    big.row_errors.add(row_index=0, message="x" * 1000)
    tracker = ResultTracker(max_bytes=5000)
    for seq in range(20):
        tracker.complete(("c", seq), big)
    assert tracker.clients() == 1
    assert tracker.evictions() == 0
    assert tracker.memory_bytes() <= 5000
    assert _admitted(tracker, ("c", 19)) is Admission.COMPLETED
    assert _admitted(tracker, ("c", 0)) is Admission.NEW


def test_in_flight_requests_survive_their_clients_eviction() -> None:
    tracker = ResultTracker(max_clients=1)
    answers: list[tablet_pb2.WriteResponse] = []
    assert tracker.admit(("a", 1), 0, answers.append, _ignore)[0] is Admission.NEW
    tracker.complete(("b", 1), _response(1))  # evicts "a"
    assert tracker.evictions() == 1
    assert tracker.complete(("a", 1), _response(2)) == 1
    assert [a.op_index for a in answers] == [2]


def test_bounds_must_be_positive() -> None:
    for kwargs in ({"max_clients": 0}, {"max_bytes": 0}):
        try:
            ResultTracker(**kwargs)
        except ValueError:
            continue
        raise AssertionError(f"{kwargs} accepted")


def test_anonymous_writes_are_answered_and_not_remembered() -> None:
    tracker = ResultTracker(max_clients=2)
    tracker.complete(("real", 1), _response(1))
    for i in range(100):
        answers: list[tablet_pb2.WriteResponse] = []
        key = (f"{ANONYMOUS_PREFIX}{i}", 0)
        assert tracker.admit(key, 0, answers.append, _ignore)[0] is Admission.NEW
        assert tracker.complete(key, _response(i)) == 1
        assert [a.op_index for a in answers] == [i]
    assert tracker.clients() == 1
    assert tracker.evictions() == 0
    assert tracker.in_flight() == 0
    assert _admitted(tracker, ("real", 1)) is Admission.COMPLETED


def test_learning_what_another_replica_proposed_keeps_no_response() -> None:
    # A follower applies requests some leader proposed: it learns that they were applied
    # and how far each client got (so it answers STALE once it leads), but keeps no
    # response -- a retry is APPLIED, and the store's record answers it.
    tracker = ResultTracker()
    assert tracker.learn_applied([(("c", seq), seq) for seq in range(1, 6)]) == []
    assert _admitted(tracker, ("c", 2)) is Admission.STALE
    answers: list[tablet_pb2.WriteResponse] = []
    assert tracker.admit(("c", 5), 0, answers.append, _ignore) == (Admission.APPLIED, None)
    # In flight, as a NEW one is: a second retry waits for the first one's answer.
    assert _admitted(tracker, ("c", 5)) is Admission.ATTACHED
    assert _admitted(tracker, ("c", 6)) is Admission.NEW
    assert tracker.memory_bytes() == _bytes_of(tracker)
    # The response read back for the retry answers both, and is kept from then on; the
    # first answer stands.
    assert tracker.complete(("c", 5), _response(5)) == 2
    assert [a.op_index for a in answers] == [5]
    tracker.complete(("c", 5), _response(8))
    state, stored = tracker.admit(("c", 5), 0, _ignore, _ignore)
    assert state is Admission.COMPLETED
    assert stored is not None
    assert stored.op_index == 5
    assert tracker.memory_bytes() == _bytes_of(tracker)
    # Learning again what was answered changes nothing.
    tracker.learn_applied([(("c", 5), 0)])
    assert tracker.admit(("c", 5), 0, _ignore, _ignore)[0] is Admission.COMPLETED


def test_learning_is_bounded_like_completing() -> None:
    tracker = ResultTracker(max_completed_per_client=100, max_bytes=20_000)
    tracker.learn_applied([(("c", seq), 0) for seq in range(1_000)])
    assert len(tracker._clients["c"].done) <= 100
    assert tracker.memory_bytes() == _bytes_of(tracker) <= 20_000
    assert _admitted(tracker, ("c", 999)) is Admission.APPLIED


def test_learning_reports_the_requests_that_wait_here() -> None:
    # A retry admitted here while the entry another leader proposed was on its way: the
    # caller must complete it, or its waiters would wait for the retry's own entry.
    tracker = ResultTracker()
    answers: list[tablet_pb2.WriteResponse] = []
    anonymous = (f"{ANONYMOUS_PREFIX}7", 0)
    tracker.admit(("c", 3), 0, answers.append, _ignore)
    tracker.admit(anonymous, 0, answers.append, _ignore)
    waiting = tracker.learn_applied([(("c", 2), 0), (("c", 3), 0), (anonymous, 0)])
    assert waiting == [("c", 3), anonymous]
    assert tracker.in_flight() == 2  # learning answers nobody: complete does
    for key in waiting:
        tracker.complete(key, _response(9))
    assert [a.op_index for a in answers] == [9, 9]
    assert tracker.in_flight() == 0


def test_a_clients_id_counts_toward_the_byte_bound() -> None:
    """Ids are kept as long as their clients: a long one (up to the server's bound on them)
    costs its length, rather than passing for a fixed 400 bytes."""
    short, long = ResultTracker(), ResultTracker()
    short.complete(("c", 1), _response(1))
    long.complete(("c" * MAX_CLIENT_ID_BYTES, 1), _response(1))
    assert long.memory_bytes() - short.memory_bytes() == MAX_CLIENT_ID_BYTES - 1
    bounded = ResultTracker(max_bytes=100 * MAX_CLIENT_ID_BYTES)
    for i in range(1000):
        bounded.complete((f"{i:04d}" + "c" * (MAX_CLIENT_ID_BYTES - 4), 1), _response(i))
        assert bounded.memory_bytes() <= 100 * MAX_CLIENT_ID_BYTES
    assert bounded.memory_bytes() == _bytes_of(bounded)


def test_reserved_and_overlong_client_ids_are_refused() -> None:
    with pytest.raises(InvalidRequest, match="reserved"):
        check_client_id(f"{ANONYMOUS_PREFIX}7")
    with pytest.raises(InvalidRequest, match=f"longer than {MAX_CLIENT_ID_BYTES} bytes"):
        check_client_id("é" * (MAX_CLIENT_ID_BYTES // 2 + 1))  # two bytes each in UTF-8
    check_client_id("é" * (MAX_CLIENT_ID_BYTES // 2))
    check_client_id("anonymous-7")
