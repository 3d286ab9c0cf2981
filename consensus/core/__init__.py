"""consensus.core — a deterministic, sans-I/O Raft state machine.

Nothing here reads a clock, starts a thread, or touches a file or socket, and
nothing here imports the rest of raftlet.  The driver (consensus/raft_consensus.py)
and the simulator (tests/sim) feed it ticks and messages and carry out the
``Ready`` it returns.  See docs/ARCHITECTURE.md for the rules a driver must keep.
"""

from raftlet.consensus.core.config import Config
from raftlet.consensus.core.errors import (
    ConfigChangeDeferred,
    ConfigChangeRefused,
    NotLeaderError,
    ProposalDropped,
    RaftConfigError,
    TermMismatch,
)
from raftlet.consensus.core.membership import (
    ConfigChange,
    ConfigChangeType,
    ConfState,
    Membership,
)
from raftlet.consensus.core.progress import Progress, ProgressState
from raftlet.consensus.core.raft import Raft
from raftlet.consensus.core.raft_log import RaftLog
from raftlet.consensus.core.rawnode import RawNode, Status
from raftlet.consensus.core.storage import EntriesUnreadable, MemoryStorage, Storage
from raftlet.consensus.core.types import (
    NO_NODE,
    Entry,
    EntryType,
    HardState,
    Message,
    MessageType,
    ReadState,
    Ready,
    Role,
    SoftState,
)

__all__ = [
    "NO_NODE",
    "ConfState",
    "Config",
    "ConfigChange",
    "ConfigChangeDeferred",
    "ConfigChangeRefused",
    "ConfigChangeType",
    "EntriesUnreadable",
    "Entry",
    "EntryType",
    "HardState",
    "Membership",
    "MemoryStorage",
    "Message",
    "MessageType",
    "NotLeaderError",
    "Progress",
    "ProgressState",
    "ProposalDropped",
    "Raft",
    "RaftConfigError",
    "RaftLog",
    "RawNode",
    "ReadState",
    "Ready",
    "Role",
    "SoftState",
    "Status",
    "Storage",
    "TermMismatch",
]
