"""Fast unit tests: no processes."""
