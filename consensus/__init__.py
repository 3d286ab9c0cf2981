"""Raft consensus for one tablet replica group.

Holds the pure state machine (``consensus.core``: no threads, clock or I/O), the durable Raft
log and consensus metadata (``consensus.log``), the threaded driver that owns the consensus
lock and publishes the lock-free (term, role) snapshot (``raft_consensus``), and the small
``Transport`` protocol through which it reaches peers (``transport``), which ``rpc``
implements over gRPC (on channels the caller hands it) and tests replace with an in-memory
one. It knows nothing of tablets or rows, and serves no RPCs: the tablet server does. It may
import ``metrics`` and ``proto``; ``consensus.core`` imports nothing of the project.
"""

# Last, so the re-exports above stay at the top; see raftlet/__init__.py.
from raftlet import require_namespaced

require_namespaced(__name__)
