"""`raftlet completion`: the generated script completes commands, subcommands and options
in a real bash."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from raftlet.cli.completion_cmd import command_tree, render
from raftlet.cli.main import build_parser, main


def test_the_tree_follows_the_parser() -> None:
    tree = command_tree(build_parser())
    assert {"cluster", "write", "scan", "completion"} <= set(tree[""])
    assert tree["cluster"][:6] == [
        "balance-leaders",
        "down",
        "ksck",
        "replace-server",
        "status",
        "up",
    ]
    assert tree["tablet"][:4] == ["add-replica", "export", "move-replica", "remove-replica"]
    assert "--wait" in tree["tablet move-replica"]
    assert "--in-flight" in tree["write"]
    assert "--data-dir" in tree["cluster up"]


def complete(script: str, line: str) -> list[str]:
    """What bash offers for ``line`` (the word being completed is its last, maybe empty)."""
    words = line.split(" ")
    program = (
        f"{script}\nCOMP_WORDS=({' '.join(repr(w) for w in words)})\n"
        f"COMP_CWORD={len(words) - 1}\n_raftlet\nprintf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    )
    out = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [w for w in out.splitlines() if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completes_commands_subcommands_and_options() -> None:
    script = render(command_tree(build_parser()), "bash")
    assert complete(script, "raftlet clu") == ["cluster"]
    assert complete(script, "raftlet cluster ") == [
        "balance-leaders",
        "down",
        "ksck",
        "replace-server",
        "status",
        "up",
        "--help",
    ]
    assert complete(script, "raftlet tablet m") == ["move-replica"]
    assert complete(script, "raftlet cluster up --tab") == ["--tablets"]
    assert complete(script, "raftlet write --data-dir ./c1 --in") == ["--in-flight"]
    assert complete(script, "raftlet nope --") == ["--help", "--version"]  # unknown: top level


def test_the_command_prints_the_script(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("autoload -U +X bashcompinit")
    assert "complete -o default -F _raftlet raftlet" in out
