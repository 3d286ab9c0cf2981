"""The committed generated protocol modules match their .proto sources, and they work.

Regenerates proto/*_pb2*.py(i) into a temporary directory with the pinned grpcio-tools and
fails with a diff when a committed file differs or is missing. Fix with `make proto`.
"""

from __future__ import annotations

import difflib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
PROTO_DIR = REPO_ROOT / "proto"
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")
MAX_DIFF_LINES = 60


def _generated_files(directory: Path) -> dict[str, str]:
    return {
        path.name: path.read_text(encoding="utf-8")
        for suffix in GENERATED_SUFFIXES
        for path in directory.glob(f"*{suffix}")
    }


@pytest.mark.skipif(
    importlib.util.find_spec("grpc_tools") is None,
    reason="grpcio-tools is not installed (install the 'dev' extra); cannot check for drift",
)
def test_generated_files_match_sources(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(REPO_ROOT / "tools" / "gen_proto.py"), "--out", str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        pytest.fail(f"tools/gen_proto.py failed:\n{result.stderr}", pytrace=False)
    expected = _generated_files(tmp_path / "raftlet" / "proto")
    committed = _generated_files(PROTO_DIR)
    assert expected, "the generator produced no files"

    problems = []
    for name in sorted(expected.keys() - committed.keys()):
        problems.append(f"missing: proto/{name}")
    for name in sorted(committed.keys() - expected.keys()):
        problems.append(f"stale (no .proto generates it): proto/{name}")
    for name in sorted(expected.keys() & committed.keys()):
        if committed[name] != expected[name]:
            diff = list(
                difflib.unified_diff(
                    committed[name].splitlines(keepends=True),
                    expected[name].splitlines(keepends=True),
                    fromfile=f"proto/{name} (committed)",
                    tofile=f"proto/{name} (regenerated)",
                )
            )
            shown = "".join(diff[:MAX_DIFF_LINES])
            if len(diff) > MAX_DIFF_LINES:
                shown += f"... ({len(diff) - MAX_DIFF_LINES} more diff lines)\n"
            problems.append(f"differs: proto/{name}\n{shown}")
    if problems:
        pytest.fail(
            "generated protocol files are out of date; run `make proto` and commit the result:"
            "\n\n" + "\n".join(problems),
            pytrace=False,
        )


def test_messages_round_trip() -> None:
    from raftlet.proto import common_pb2, consensus_pb2, tablet_pb2

    op = tablet_pb2.WriteOperationPB(
        request_id=common_pb2.RequestIdPB(
            client_id="c1", seq_no=7, first_incomplete_seq_no=5, attempt_no=2
        ),
        ops=[
            tablet_pb2.RowOperationPB(
                type=tablet_pb2.RowOperationPB.INSERT,
                cells=[
                    tablet_pb2.CellPB(column="k", value=tablet_pb2.ValuePB(int_value=-3)),
                    tablet_pb2.CellPB(column="v", value=tablet_pb2.ValuePB(null_value=True)),
                ],
            )
        ],
    )
    entry = consensus_pb2.EntryPB(
        term=2, index=10, type=consensus_pb2.NORMAL, payload=op.SerializeToString()
    )
    batch = consensus_pb2.EntryBatchPB(entries=[entry])

    decoded = consensus_pb2.EntryBatchPB.FromString(batch.SerializeToString())
    assert decoded == batch
    decoded_op = tablet_pb2.WriteOperationPB.FromString(decoded.entries[0].payload)
    assert decoded_op == op
    assert decoded_op.ops[0].cells[1].value.WhichOneof("value") == "null_value"
    assert decoded_op.ops[0].cells[0].value.int_value == -3


def test_oneof_predicates_and_enums() -> None:
    from raftlet.proto import consensus_pb2, tablet_pb2

    pred = tablet_pb2.PredicatePB(
        column="ts",
        range=tablet_pb2.PredicatePB.RangePB(
            lower=tablet_pb2.ValuePB(int_value=1), lower_inclusive=True
        ),
    )
    decoded = tablet_pb2.PredicatePB.FromString(pred.SerializeToString())
    assert decoded.WhichOneof("kind") == "range"
    assert decoded.range.HasField("lower")
    assert not decoded.range.HasField("upper")  # unset bound = unbounded

    assert consensus_pb2.RaftRole.Name(consensus_pb2.LEADER) == "LEADER"
    assert tablet_pb2.ScanRequest().read_mode == tablet_pb2.READ_LEADER_LATEST


def test_server_error_travels_as_binary_metadata() -> None:
    from raftlet.proto import ERROR_METADATA_KEY, common_pb2

    err = common_pb2.ServerErrorPB(
        code=common_pb2.ServerErrorPB.NOT_LEADER, leader_uuid="ts-2", leader_addr="127.0.0.1:7051"
    )
    # gRPC accepts bytes values only under keys ending in "-bin".
    assert ERROR_METADATA_KEY.endswith("-bin")
    decoded = common_pb2.ServerErrorPB.FromString(err.SerializeToString())
    assert decoded.code == common_pb2.ServerErrorPB.NOT_LEADER
    assert decoded.leader_addr == "127.0.0.1:7051"


def test_services_are_generated() -> None:
    from raftlet.proto import admin_pb2_grpc, consensus_pb2_grpc, tablet_pb2_grpc

    # Servicer base classes exist with one method per rpc.
    for cls, methods in [
        (consensus_pb2_grpc.ConsensusServiceServicer, ["UpdateConsensus", "RequestVote"]),
        (tablet_pb2_grpc.TabletServiceServicer, ["Write", "Scan", "GetClusterConfig"]),
        (admin_pb2_grpc.AdminServiceServicer, ["LeaderStepDown", "GetConsensusStatus"]),
    ]:
        for method in methods:
            assert callable(getattr(cls, method))
