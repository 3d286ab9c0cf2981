"""raftlet's tests: ``unit/`` (fast, no processes), ``sim/`` (deterministic simulation),
``integration/`` (real processes). A package so that ``python -m tests.sim.run`` works."""
