"""tserver/flag_registry.py: the runtime flag registry behind GetFlags and SetFlag."""

from __future__ import annotations

import logging
import threading
from pathlib import Path

import pytest

from raftlet.consensus.raft_consensus import TermCheckMode
from raftlet.tserver.flag_registry import FlagRegistry, render_flag_value
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.settings import FLAGS
from tests.unit.tserver_settings_helpers import MiB, parse, write_config


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


RUNTIME = ["lock_contention_trace_threshold_ms", "log_inject_latency_jitter_ms",
           "log_inject_latency_ms", "write_memory_limit_bytes"]  # fmt: skip


@pytest.fixture
def registry(config_path: Path) -> FlagRegistry:
    return FlagRegistry.from_settings(parse(config_path, "--log_inject_latency_ms", "2"))


def test_registry_lists_every_flag_as_on_the_command_line(
    registry: FlagRegistry, config_path: Path
) -> None:
    flags = registry.render()
    assert set(flags) == {spec.name for spec in FLAGS}
    assert flags["log_inject_latency_ms"] == "2"
    assert flags["group_commit_queue_size_bytes"] == str(4 * MiB)
    assert flags["term_check_mode"] == "lockfree"
    assert flags["config"] == str(config_path)
    assert flags["tick_interval_ms"] == "50"
    assert registry.render(["max_batch_rows", "--log-level"]) == {
        "max_batch_rows": "10000",
        "log_level": "INFO",
    }
    assert registry.runtime_names() == RUNTIME
    assert registry.get("term_check_mode") is TermCheckMode.LOCKFREE


def test_set_returns_the_old_value_which_restores_it(registry: FlagRegistry) -> None:
    old = registry.set("log_inject_latency_ms", "25.5")
    assert old == "2"
    assert registry.get("log_inject_latency_ms") == 25.5
    assert registry.render(["log_inject_latency_ms"]) == {"log_inject_latency_ms": "25.5"}
    assert registry.set("log_inject_latency_ms", old) == "25.5"
    assert registry.get("log_inject_latency_ms") == 2.0
    # The names a user might type work too.
    registry.set("--lock-contention-trace-threshold-ms", "0")
    assert registry.get("lock_contention_trace_threshold_ms") == 0.0


def test_a_change_is_logged_as_parsed_values_and_a_non_change_is_not(
    registry: FlagRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    logger = "raftlet.tserver.flag_registry"
    with caplog.at_level(logging.DEBUG, logger=logger):
        registry.set("log_inject_latency_ms", "2.0")  # the value it has (2), spelt otherwise
        registry.set("log_inject_latency_ms", " 2")
        registry.set("log_inject_latency_ms", "2.50")
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == logger]
    assert logged == [
        (logging.DEBUG, "flag log_inject_latency_ms set to 2, which it already was"),
        (logging.DEBUG, "flag log_inject_latency_ms set to 2, which it already was"),
        (logging.INFO, "flag log_inject_latency_ms changed from 2 to 2.5"),
    ]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("log_inject_latency_ms", "-1",
         "flag 'log_inject_latency_ms': must be in 0..10000, got -1.0"),
        ("log_inject_latency_ms", "slow", "expected a number, got 'slow'"),
        ("log_inject_latency_jitter_ms", "nan", "expected a finite number"),
        ("lock_contention_trace_threshold_ms", "", "expected a number, got ''"),
        ("log_inject_latency", "1", "unknown flag 'log_inject_latency'; did you mean "
         "'log_inject_latency_ms'?"),
        ("no_such_flag", "1", "unknown flag 'no_such_flag'"),
        ("max_batch_rows", "5", "flag 'max_batch_rows' cannot be changed at runtime (restart "
         "the server with --max_batch_rows=...; settable at runtime: "
         "lock_contention_trace_threshold_ms, log_inject_latency_jitter_ms, "
         "log_inject_latency_ms, write_memory_limit_bytes)"),
        ("term_check_mode", "locked", "cannot be changed at runtime"),
    ],
)  # fmt: skip
def test_set_rejects_and_changes_nothing(
    registry: FlagRegistry, name: str, value: str, message: str
) -> None:
    before = registry.render()
    seen: list[object] = []
    for runtime in RUNTIME:
        registry.subscribe(runtime, seen.append)
    with pytest.raises(FlagError) as exc:
        registry.set(name, value)
    assert message in str(exc.value)
    assert registry.render() == before
    assert seen == []


def test_get_and_render_of_unknown_flags(registry: FlagRegistry) -> None:
    with pytest.raises(FlagError, match="unknown flag 'nope'"):
        registry.get("nope")
    with pytest.raises(FlagError, match="unknown flag 'nope'"):
        registry.render(["max_batch_rows", "nope"])
    with pytest.raises(FlagError, match="already defined"):
        registry.define("max_batch_rows", 1)


def test_listeners_see_each_change_and_can_unsubscribe(registry: FlagRegistry) -> None:
    a: list[float] = []
    b: list[float] = []
    unsubscribe_a = registry.subscribe("log_inject_latency_ms", a.append)
    registry.subscribe("log_inject_latency_ms", b.append)
    # A listener may read the registry: it sees the new value, and nothing deadlocks.
    reads: list[float] = []
    registry.subscribe("log_inject_latency_ms", lambda _: reads.append(registry.get(
        "log_inject_latency_ms")))  # fmt: skip
    registry.set("log_inject_latency_ms", "5")
    unsubscribe_a()
    unsubscribe_a()  # idempotent
    registry.set("log_inject_latency_ms", "7")
    assert a == [5.0]
    assert b == [5.0, 7.0]
    assert reads == [5.0, 7.0]
    # Listeners of one flag are not called for another.
    registry.set("log_inject_latency_jitter_ms", "1")
    assert b == [5.0, 7.0]


def test_a_failing_listener_does_not_stop_the_others(
    registry: FlagRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    after: list[float] = []

    def broken(value: float) -> None:
        raise RuntimeError("log is closed")

    registry.subscribe("log_inject_latency_ms", broken)
    registry.subscribe("log_inject_latency_ms", after.append)
    with pytest.raises(RuntimeError, match="log is closed"):
        registry.set("log_inject_latency_ms", "9")
    assert after == [9.0]
    assert registry.get("log_inject_latency_ms") == 9.0  # what is in force for the others
    assert "listener of flag log_inject_latency_ms failed" in caplog.text


def test_concurrent_sets_are_serialized_with_their_listeners(registry: FlagRegistry) -> None:
    seen: list[float] = []
    registry.subscribe("log_inject_latency_ms", seen.append)
    threads = [
        threading.Thread(
            target=lambda t=t: [
                registry.set("log_inject_latency_ms", str(t * 1000 + i)) for i in range(200)
            ]
        )
        for t in range(8)
    ]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert len(seen) == 8 * 200
    assert len(set(seen)) == 8 * 200
    # Listeners ran in the order the values were stored: the last one seen is in force.
    assert registry.get("log_inject_latency_ms") == seen[-1]
    for t in range(8):  # and each thread's own sets in its order
        mine = [v for v in seen if t * 1000 <= v < t * 1000 + 200]
        assert mine == sorted(mine)


def test_render_flag_value() -> None:
    assert render_flag_value(100.0) == "100"
    assert render_flag_value(0.25) == "0.25"
    assert render_flag_value(1e20) == "1e+20"
    assert render_flag_value(TermCheckMode.LOCKED) == "locked"
    assert render_flag_value(Path("/x")) == "/x"
    assert render_flag_value(None) == ""
    assert render_flag_value(7) == "7"
