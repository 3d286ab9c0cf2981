"""cli/leader_balance.py's plan: the moves that spread tablets' leaders over the servers."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from raftlet.cli.leader_balance import plan_moves

SERVERS = ["ts1", "ts2", "ts3"]
ANY = [*SERVERS, "ts4"]  # ts4 is no member of the cluster above
EVERYWHERE = {f"kv-p{i}": SERVERS for i in range(4)}


def _after(leaders: dict[str, str], moves: list[tuple[str, str, str]]) -> dict[str, str]:
    led = dict(leaders)
    for tablet, src, dst in moves:
        assert led[tablet] == src
        led[tablet] = dst
    return led


def test_four_leaders_on_one_server_are_spread_two_one_one() -> None:
    """What a long-running review ended with: every leader on one server."""
    leaders = dict.fromkeys(EVERYWHERE, "ts2")
    moves = plan_moves(leaders, EVERYWHERE, SERVERS)
    assert moves == [("kv-p0", "ts2", "ts1"), ("kv-p1", "ts2", "ts3")]
    assert Counter(_after(leaders, moves).values()) == Counter({"ts2": 2, "ts1": 1, "ts3": 1})


def test_a_balanced_cluster_needs_no_move() -> None:
    leaders = {"kv-p0": "ts1", "kv-p1": "ts2", "kv-p2": "ts3", "kv-p3": "ts1"}
    assert plan_moves(leaders, EVERYWHERE, SERVERS) == []


def test_a_server_that_does_not_answer_takes_no_leader_and_its_own_stay() -> None:
    leaders = {"kv-p0": "ts3", "kv-p1": "ts1", "kv-p2": "ts1", "kv-p3": "ts1"}
    moves = plan_moves(leaders, EVERYWHERE, ["ts1", "ts2"])
    assert moves == [("kv-p1", "ts1", "ts2")]


def test_a_leader_moves_only_to_a_voter_of_its_tablet() -> None:
    leaders = {"kv-p0": "ts1", "kv-p1": "ts1", "kv-p2": "ts1"}
    voters = {"kv-p0": ["ts1"], "kv-p1": ["ts1", "ts2"], "kv-p2": ["ts1"]}
    assert plan_moves(leaders, voters, SERVERS) == [("kv-p1", "ts1", "ts2")]


@given(
    st.lists(
        st.tuples(st.sampled_from(ANY), st.sets(st.sampled_from(ANY))),
        max_size=12,
    ),
    st.sets(st.sampled_from(ANY), min_size=1),
)
def test_after_the_moves_no_move_is_left_that_would_even_them_out(
    tablets: list[tuple[str, set[str]]], up: set[str]
) -> None:
    leaders = {f"t{i}": leader for i, (leader, _) in enumerate(tablets)}
    voters = {f"t{i}": sorted(others | {leader}) for i, (leader, others) in enumerate(tablets)}
    servers = sorted(up)
    moves = plan_moves(leaders, voters, servers)
    for tablet, src, dst in moves:
        assert dst in voters[tablet]
        assert dst in up
        assert src != dst
    led = _after(leaders, moves)
    counts = Counter(s for s in led.values() if s in up)
    for tablet, src in led.items():
        if src not in up:
            assert leaders[tablet] == src  # leaders on servers not up stay
            continue
        for v in voters[tablet]:
            assert not (v in up and counts[v] <= counts[src] - 2), (tablet, src, v, counts)
