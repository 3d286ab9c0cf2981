"""The scans a replica holds open between pages: at most so many, each for so long idle,
all closed when the replica stops; a page asking for another scan under an id is not
continued from it."""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import cast

from raftlet.tserver.held_scans import HeldScans
from raftlet.tserver.store import ScanCursor

CURSOR = cast(ScanCursor, object())


class Scope(AbstractContextManager[ScanCursor]):
    def __init__(self) -> None:
        self.closed = False

    def __enter__(self) -> ScanCursor:
        return CURSOR

    def __exit__(self, *exc: object) -> None:
        self.closed = True


def test_a_scan_is_taken_once_and_only_for_the_same_shape() -> None:
    scans = HeldScans()
    scope = Scope()
    sid = scans.hold(scope, CURSOR, ("k",))
    assert sid is not None
    taken = scans.take(sid, ("k",))
    assert taken is not None
    assert (taken.scope, taken.cursor) == (scope, CURSOR)
    assert scans.take(sid, ("k",)) is None  # taken: the caller's now
    assert not scope.closed
    other = Scope()
    sid = scans.hold(other, CURSOR, ("k",))
    assert sid is not None
    assert scans.take(sid, ("v",)) is None  # another scan under its id: closed
    assert other.closed
    assert len(scans) == 0


def test_an_idle_scan_is_closed_and_no_more_than_max_open_are_held() -> None:
    now = [0.0]
    scans = HeldScans(idle_s=30.0, max_open=2, clock=lambda: now[0])
    scopes = [Scope() for _ in range(3)]
    ids = [scans.hold(s, CURSOR, ()) for s in scopes]
    assert ids[2] is None  # the caller closes it: read anew next time
    assert len(scans) == 2
    now[0] = 29.0
    assert not scans.due()
    now[0] = 30.0
    assert scans.due()
    scans.expire()
    assert scopes[0].closed
    assert scopes[1].closed
    assert len(scans) == 0
    assert not scans.due()


def test_closing_closes_every_held_scan_and_holds_no_more() -> None:
    scans = HeldScans()
    scope = Scope()
    scans.hold(scope, CURSOR, ())
    scans.close()
    assert scope.closed
    assert scans.hold(Scope(), CURSOR, ()) is None


def test_a_scan_taken_for_a_page_keeps_its_place() -> None:
    """A new scan took the place between a page's take and hold: with more than 32 scans of
    a tablet, a scan held since its first page lost its read halfway and showed a batch
    half (found by a verifier)."""
    now = [0.0]
    scans = HeldScans(max_open=1, clock=lambda: now[0])
    scope = Scope()
    sid = scans.hold(scope, CURSOR, ())
    assert sid is not None
    now[0] = 5.0  # long idle: but taken for a page, it is no one's to take
    taken = scans.take(sid, ())
    assert taken is not None
    assert scans.hold(Scope(), CURSOR, ()) is None  # its place is still the taken scan's
    sid = scans.hold(scope, CURSOR, (), taken)
    assert sid is not None
    again = scans.take(sid, ())
    assert again is not None
    again.end()  # its last page: the place is free
    assert scans.hold(Scope(), CURSOR, ()) is not None


def test_with_every_place_taken_a_scan_idle_a_while_gives_way_to_a_new_one() -> None:
    """A client that opened scans and left them blocked every other multi-page scan of the
    tablet for 30 s; a scan read at full speed keeps its place."""
    now = [0.0]
    scans = HeldScans(max_open=2, yield_after_s=1.0, clock=lambda: now[0])
    left, busy = Scope(), Scope()
    assert scans.hold(left, CURSOR, ()) is not None
    now[0] = 0.5
    assert scans.hold(busy, CURSOR, ()) is not None
    now[0] = 0.9
    assert scans.hold(Scope(), CURSOR, ()) is None  # none idle for a second yet
    now[0] = 1.2
    assert scans.hold(Scope(), CURSOR, ()) is not None  # the one left for 1.2 s gives way
    assert left.closed
    assert not busy.closed


def test_a_scan_held_past_its_age_is_read_anew() -> None:
    """Read slowly but steadily, a held scan kept SQLite's WAL file growing for as long as
    it lasted."""
    now = [0.0]
    scans = HeldScans(idle_s=30.0, max_age_s=600.0, clock=lambda: now[0])
    scope = Scope()
    sid = scans.hold(scope, CURSOR, ())
    for _ in range(20):  # a page every 29 s keeps it from idling out
        now[0] += 29.0
        taken = scans.take(sid, ())  # type: ignore[arg-type]
        assert taken is not None
        sid = scans.hold(scope, CURSOR, (), taken)
    now[0] += 29.0
    assert scans.take(sid, ()) is None  # type: ignore[arg-type]
    assert scope.closed


def test_a_released_scan_is_closed_and_its_place_free_at_once() -> None:
    now = [0.0]
    scans = HeldScans(max_open=1, clock=lambda: now[0])
    first = Scope()
    sid = scans.hold(first, CURSOR, ())
    assert sid is not None
    assert scans.hold(Scope(), CURSOR, ()) is None  # its place is taken, not yet idle
    scans.release(sid)
    assert first.closed
    assert scans.take(sid, ()) is None
    assert scans.hold(Scope(), CURSOR, ()) is not None  # no idle wait for the place
    scans.release(b"unknown")  # a scan closed already, or another replica's: nothing
    assert len(scans) == 1
