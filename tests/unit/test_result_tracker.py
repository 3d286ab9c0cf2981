"""The in-memory exactly-once cache: admission states, and that every replica -- not only
the leader, which alone sees ``admit`` -- forgets what a client no longer needs."""

from __future__ import annotations

from raftlet.proto import tablet_pb2
from raftlet.tserver.result_tracker import Admission, ResultTracker


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
    assert len(tracker._completed["c"]) == 1
    # What is forgotten stays forgotten: a late duplicate below the mark is not stored.
    tracker.complete(("c", 5), _response(5), first_incomplete_seq_no=0)
    assert 5 not in tracker._completed["c"]
