"""Contention-free statistics and the profiled lock.

Striped counters, gauges and concurrent log-linear histograms (per-thread cells merged only
when read), the profiled lock that times and reports contended acquires, and the registry
that exports everything as Prometheus text and Kudu-like JSON. Imports nothing else of the
project, so every other package may use it.
"""
