"""cli/leader_balance.py's plan: the moves that spread tablets' leaders over the servers."""

from __future__ import annotations

import argparse
from collections import Counter
from functools import partial
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from raftlet.cli import leader_balance
from raftlet.cli.leader_balance import imbalance_left, plan_moves

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


# Review r26a's cluster: four servers, no replica on ts4 of the two tablets ts3 leads.
FOUR = ["ts1", "ts2", "ts3", "ts4"]
R26A_VOTERS = {
    "kv-p0": ["ts1", "ts2", "ts4"],
    "kv-p1": ["ts1", "ts2", "ts3"],
    "kv-p2": ["ts1", "ts2", "ts3"],
    "kv-p3": ["ts1", "ts2", "ts3"],
}
R26A_LEADERS = {"kv-p0": "ts1", "kv-p1": "ts2", "kv-p2": "ts3", "kv-p3": "ts3"}


def test_a_leadership_reaches_a_server_through_another_when_no_direct_move_can() -> None:
    """r26a ended with `leaders after: ts1 1, ts2 1, ts3 2, ts4 0` (exit 0): no tablet of
    ts3 has a replica on ts4, and only direct moves were planned. ts1 hands kv-p0 to ts4
    first, then takes kv-p2 from ts3, so ts1 never leads more than it did."""
    moves = plan_moves(R26A_LEADERS, R26A_VOTERS, FOUR)
    assert moves == [("kv-p0", "ts1", "ts4"), ("kv-p2", "ts3", "ts1")]
    after = _after(R26A_LEADERS, moves)
    assert Counter(after.values()) == Counter(dict.fromkeys(FOUR, 1))
    assert imbalance_left(after, R26A_VOTERS, FOUR) is None


def test_what_the_placement_leaves_uneven_is_said_with_the_reason() -> None:
    """ts4 holds no replica at all: nothing can reach it, and the output must say so rather
    than call the cluster balanced."""
    voters = {t: ["ts1", "ts2", "ts3"] for t in R26A_LEADERS}
    moves = plan_moves(R26A_LEADERS, voters, FOUR)
    assert moves == []
    why = imbalance_left(R26A_LEADERS, voters, FOUR)
    assert why is not None
    assert why.startswith("ts3 still leads 2 and ts4 0: no leadership can pass from ts3 to ts4")
    assert imbalance_left(R26A_LEADERS, voters, ["ts1", "ts2", "ts3"]) is None


def _reach(src: str, led: dict[str, str], voters: dict[str, list[str]], up: set[str]) -> set[str]:
    """Every server up that a leadership of ``src`` can get to by one move or a chain."""
    seen, todo = {src}, [src]
    while todo:
        server = todo.pop()
        for tablet, leader in led.items():
            if leader == server:
                for v in voters[tablet]:
                    if v in up and v not in seen:
                        seen.add(v)
                        todo.append(v)
    return seen - {src}


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
    # Nor a chain of moves: what is left uneven is what the placement allows no better.
    for src in up:
        for dst in _reach(src, led, voters, up):
            assert counts[dst] > counts[src] - 2, (src, dst, counts)
    assert (imbalance_left(led, voters, servers) is None) == (
        not counts or max(counts[s] for s in up) - min(counts[s] for s in up) < 2
    )


# --- what the command prints -------------------------------------------------------------


class _Creds:
    tls = None

    def channel_credentials(self) -> None:
        return None


def _health(leaders: dict[str, str], voters: dict[str, list[str]]) -> SimpleNamespace:
    replica = partial(SimpleNamespace, state="OK", role="FOLLOWER")
    return SimpleNamespace(
        servers=[SimpleNamespace(id=s, state="UP") for s in FOUR],
        tablets=[
            SimpleNamespace(
                tablet_id=t, leader=leaders[t], replicas=[replica(server=v) for v in voters[t]]
            )
            for t in sorted(leaders)
        ],
    )


def _dry_run(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    voters: dict[str, list[str]],
    leaders: dict[str, str] = R26A_LEADERS,
) -> tuple[int, str]:
    target = SimpleNamespace(config=object(), creds=_Creds())
    monkeypatch.setattr(leader_balance, "resolve_target", lambda args: target)
    monkeypatch.setattr(
        "raftlet.client.health.check_cluster", lambda config, options: _health(leaders, voters)
    )
    code = leader_balance.run(argparse.Namespace(dry_run=True, timeout=1.0))
    return code, capsys.readouterr().out


def test_a_dry_run_prints_the_chain_and_the_leaders_it_leaves(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _dry_run(monkeypatch, capsys, R26A_VOTERS)
    assert code == 0
    assert out.splitlines() == [
        "leaders now: ts1 1, ts2 1, ts3 2, ts4 0",
        "would move kv-p0: ts1 -> ts4",
        "would move kv-p2: ts3 -> ts1",
        "leaders after them: ts1 1, ts2 1, ts3 1, ts4 1",
    ]


def test_an_imbalance_no_move_can_fix_is_not_called_balanced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ts4 holds a voter only of the tablet it leads: no leadership can reach it."""
    leaders = {f"kv-p{i}": SERVERS[i % 3] for i in range(9)} | {"kv-p9": "ts4"}
    voters = dict.fromkeys(leaders, SERVERS) | {"kv-p9": ["ts1", "ts2", "ts4"]}
    code, out = _dry_run(monkeypatch, capsys, voters, leaders)
    assert code == 0
    assert "balanced: no move" not in out
    assert "not balanced, and no move can change that: ts1 still leads 3 and ts4 1" in out


def test_a_server_holding_no_voter_is_left_out_not_called_unbalanced(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Review r30a: after `replace-server` emptied a server, the command said it led 0,
    called that unbalanced, and advised adding replicas back to it."""
    code, out = _dry_run(monkeypatch, capsys, {t: ["ts1", "ts2", "ts3"] for t in R26A_LEADERS})
    assert code == 0
    assert out.splitlines() == [
        "leaders now: ts1 1, ts2 1, ts3 2 (ts4 holding no voter: left out)",
        "balanced: no move would even them out further",
    ]


def _probed(
    monkeypatch: pytest.MonkeyPatch, answers: list[tuple[str | None, str]]
) -> list[tuple[str | None, str]]:
    """check_cluster answers, in turn (the last for ever): kv-p0's leader, ts4's state."""

    def check(_config: object, _options: object) -> SimpleNamespace:
        leader, state = answers.pop(0) if len(answers) > 1 else answers[0]
        return SimpleNamespace(
            servers=[SimpleNamespace(id="ts4", state=state, error="UNAVAILABLE: refused")],
            tablets=[SimpleNamespace(tablet_id="kv-p0", leader=leader)],
        )

    monkeypatch.setattr("raftlet.client.health.check_cluster", check)
    return answers


def test_a_move_ends_once_its_target_leads(monkeypatch: pytest.MonkeyPatch) -> None:
    left = _probed(monkeypatch, [("ts1", "UP"), ("ts1", "DOWN"), ("ts4", "UP")])
    assert leader_balance._wait_taken_over(object(), "kv-p0", "ts4", 30.0, object()) is None
    assert left == [("ts4", "UP")]


def test_a_move_to_a_server_gone_silent_ends_saying_so_before_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Review r30a: a move whose target was killed waited out the whole timeout, and its
    message did not say the target was down."""
    _probed(monkeypatch, [("ts1", "UP"), ("ts1", "DOWN")])
    monkeypatch.setattr(leader_balance, "_SILENT_TARGET_S", 0.2)
    why = leader_balance._wait_taken_over(object(), "kv-p0", "ts4", 30.0, object())
    assert why == "ts4 stopped answering (UNAVAILABLE: refused): is it down? (ts1 leads)"


def test_a_move_its_target_does_not_take_times_out(monkeypatch: pytest.MonkeyPatch) -> None:
    _probed(monkeypatch, [(None, "UP")])
    why = leader_balance._wait_taken_over(object(), "kv-p0", "ts4", 0.2, object())
    assert why == "ts4 did not take over within 0.2 s (no replica leads)"
