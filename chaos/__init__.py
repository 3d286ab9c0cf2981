"""Fault injection and correctness checking for raftlet clusters (``raftlet chaos``).

A nemesis that kills, pauses, partitions and slows the servers of a real cluster on a seeded
schedule; a register and unique-insert workload that records every call and return; and a
linearizability checker for the recorded history. The integration tests use the same modules
as the command.
"""

from raftlet import require_namespaced

require_namespaced(__name__)
