"""Every runtime-settable flag has a documented, enforced range (issue #15, item 4).

SetFlag is reachable by any client of the admin service, so each runtime flag is checked at
its bounds and beyond, with NaN, infinities, negatives and junk: a refused value raises
FlagError (INVALID_ARGUMENT on the wire) and changes nothing, listeners included.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from raftlet.tserver.flag_registry import MAX_NAME_TEXT, MAX_VALUE_TEXT, REDACTED, FlagRegistry
from raftlet.tserver.flag_spec import FlagError
from raftlet.tserver.settings import FLAGS
from tests.unit.tserver_settings_helpers import parse, write_config

# name -> (lowest, highest) accepted, as the help text documents them.
RANGES = {
    "log_inject_latency_ms": (0.0, 10_000.0),
    "log_inject_latency_jitter_ms": (0.0, 10_000.0),
    "lock_contention_trace_threshold_ms": (0.0, 3_600_000.0),
}
# Integer flags, name -> (lowest, highest) accepted, and how the help text says them.
INT_RANGES = {"write_memory_limit_bytes": (1 << 20, 1 << 40, "1 MiB to 1 TiB")}
JUNK = [
    "", " ", "nan", "NaN", "-nan", "inf", "-inf", "+Infinity", "1e999", "-1e999", "0x10",
    "1_000", "\u0661\u0662", "\uff11\uff12", "12ms", "1,5", "--1", "1e", "e5", ".",
    "\x00", "1\x00", "ten",
    "9" * 65, "1" * 5000,
]  # fmt: skip


@pytest.fixture
def registry(tmp_path: Path) -> FlagRegistry:
    return FlagRegistry.from_settings(parse(write_config(tmp_path)))


def test_the_table_covers_every_runtime_flag() -> None:
    assert {s.name for s in FLAGS if s.runtime} == set(RANGES) | set(INT_RANGES)


@pytest.mark.parametrize("name", sorted(INT_RANGES))
def test_an_integer_runtime_flag_takes_its_bounds_and_refuses_the_rest(
    registry: FlagRegistry, name: str
) -> None:
    lo, hi, said = INT_RANGES[name]
    assert said in next(s for s in FLAGS if s.name == name).help
    for text, expected in ((str(lo), lo), (f" {hi} ", hi), (str(hi), hi)):
        registry.set(name, text)
        assert registry.get(name) == expected
    seen: list[object] = []
    registry.subscribe(name, seen.append)
    for text in [str(lo - 1), str(hi + 1), "0", "-1", "1.5", "1e6", f"{lo}.0", *JUNK]:
        with pytest.raises(FlagError):
            registry.set(name, text)
        assert registry.get(name) == hi
    assert seen == []


@pytest.mark.parametrize("name", sorted(RANGES))
def test_every_runtime_flag_is_bounded_and_says_so(name: str) -> None:
    spec = next(s for s in FLAGS if s.name == name)
    lo, hi = RANGES[name]
    spec.check(lo)
    spec.check(hi)
    for beyond in (lo - 1, hi + 1, 1e300):
        with pytest.raises(ValueError, match=f"must be in {int(lo)}..{int(hi)}"):
            spec.check(beyond)
    assert f"{int(hi)}" in spec.help


@pytest.mark.parametrize("name", sorted(RANGES))
def test_values_at_the_bounds_are_taken(registry: FlagRegistry, name: str) -> None:
    lo, hi = RANGES[name]
    for text, expected in ((repr(lo), lo), (repr(hi), hi), (f" {hi:g} ", hi), ("+0", 0.0),
                           ("1e3", 1000.0), ("0.5", 0.5)):  # fmt: skip
        registry.set(name, text)
        assert registry.get(name) == expected


def _in_range(name: str, text: str) -> bool:
    lo, hi = RANGES[name]
    try:
        value = float(text)
    except ValueError:
        return False
    return "_" not in text and lo <= value <= hi


REFUSED = [
    (name, text)
    for name in sorted(RANGES)
    for text in ["-1", "-0.001", "10000.001", "3600000.001", "1e12", "1e308", *JUNK]
    if not _in_range(name, text)
]


@pytest.mark.parametrize(("name", "text"), REFUSED)
def test_values_out_of_range_or_junk_change_nothing(
    registry: FlagRegistry, name: str, text: str
) -> None:
    before = registry.render()
    seen: list[object] = []
    registry.subscribe(name, seen.append)
    with pytest.raises(FlagError) as exc:
        registry.set(name, text)
    message = str(exc.value)
    assert message.startswith(f"flag {name!r}: ")
    assert len(message) < 200  # a megabyte of junk does not come back in the error
    assert registry.render() == before
    assert seen == []


def test_names_and_values_too_long_are_refused_cheaply(registry: FlagRegistry) -> None:
    before = registry.render()
    with pytest.raises(FlagError, match="unknown flag") as exc:
        registry.set("x" * (MAX_NAME_TEXT + 1), "1")
    assert len(str(exc.value)) < 200
    with pytest.raises(FlagError, match="value too long"):
        registry.set("log_inject_latency_ms", "1" + " " * MAX_VALUE_TEXT)
    with pytest.raises(FlagError, match="unknown flag"):
        registry.render(["y" * 10_000_000])
    with pytest.raises(FlagError, match="the value must be text"):
        registry.set("log_inject_latency_ms", 5)  # type: ignore[arg-type]
    assert registry.render() == before


def test_path_flags_are_marked_sensitive_and_can_be_redacted(registry: FlagRegistry) -> None:
    assert registry.sensitive_names() == ["config", "data_dir"]
    plain = registry.render()
    redacted = registry.render(redact_sensitive=True)
    assert plain["data_dir"] != REDACTED
    assert redacted["config"] == redacted["data_dir"] == REDACTED
    assert {k: v for k, v in redacted.items() if k not in ("config", "data_dir")} == {
        k: v for k, v in plain.items() if k not in ("config", "data_dir")
    }
    assert registry.render(["data_dir"], redact_sensitive=True) == {"data_dir": REDACTED}
