"""Deterministic simulation of the Raft core: network.py (simulated network and
faults), cluster.py (N RawNodes with simulated drivers on a simulated clock),
invariants.py (safety checks after every event), scenarios.py (random schedules
and lab-style scenarios), run.py (the `make sim` CLI), demo.py (`make demo`)."""
