# raftlet developer entry points. Every target that runs Python first makes sure the venv in
# $(VENV) exists and holds the project (editable) with its test and dev extras.

VENV ?= .venv
PYTHON := $(VENV)/bin/python
STAMP := $(VENV)/.installed
SEEDS ?= 2000
# `make chaos`: seconds of faults, the schedule's seed; more flags through CHAOS_ARGS.
DURATION ?= 120
SEED ?= 1
# The benchmarks' own virtualenv, for packages the project does not depend on (pysyncobj).
BENCH_VENV ?= .bench-venv

.PHONY: install test proto lint sim bench bench-peers demo sim-demo chaos clean distclean

install: $(STAMP)

# Re-run when pyproject.toml changes; a deleted venv takes the stamp with it.
$(STAMP): pyproject.toml
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --disable-pip-version-check -e '.[cli,test,dev]'
	touch $@

# The test files in jobs run two or more at a time, then the tests marked alone
# (tools/run_tests.py says why).
test: $(STAMP)
	$(PYTHON) tools/run_tests.py

# Regenerates proto/*_pb2*.py(i) in place; commit the result.
proto: $(STAMP)
	$(PYTHON) tools/gen_proto.py --out .

lint: $(STAMP)
	$(PYTHON) -m ruff check .
	$(PYTHON) -m mypy -p raftlet

sim: $(STAMP)
	$(PYTHON) -m tests.sim.run --seeds $(SEEDS)

bench: $(STAMP)
	@found=0; for f in bench/*.py; do \
		[ -e "$$f" ] || continue; case "$${f##*/}" in _*|ab_writes.py|peers.py|wal_bytes.py) continue;; esac; found=1; \
		echo "== $$f"; $(PYTHON) "$$f" || exit 1; \
	done; [ $$found = 1 ] || echo "no benchmarks in bench/ yet"

# raftlet next to etcd and PySyncObj (bench/peers.py; not in `make bench`: it runs for minutes
# and installs etcd-server with apt-get when root and missing). The script runs in the
# project's venv; the PySyncObj nodes run in $(BENCH_VENV), which gets pysyncobj.
# Flags through ARGS, e.g. make bench-peers ARGS="--duration 3 --repeat 3 --mode all".
bench-peers: $(STAMP)
	test -x $(BENCH_VENV)/bin/python || python3 -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -c 'import pysyncobj' 2>/dev/null || \
		$(BENCH_VENV)/bin/python -m pip install --disable-pip-version-check -q pysyncobj
	$(PYTHON) bench/peers.py --bench-venv $(BENCH_VENV) $(ARGS)

# A real 3-server cluster in a temp dir, a 10 s write load, the metrics, a clean shutdown
# (deploy/demo.sh stops the cluster in a trap, whatever fails).
demo: $(STAMP)
	RAFTLET=$(VENV)/bin/raftlet bash deploy/demo.sh

# Faults (kill, pause, partitions, slow disk, restart-all) under load against a throw-away
# cluster, then a linearizability check (`raftlet chaos --help`). Exit 1 on a violation.
chaos: $(STAMP)
	$(VENV)/bin/raftlet chaos --duration $(DURATION) --seed $(SEED) $(CHAOS_ARGS)

# The deterministic simulation, narrated: elections, partitions, invariants.
sim-demo: $(STAMP)
	$(PYTHON) -m tests.sim.demo

clean:
	rm -rf build dist out *.egg-info .pytest_cache .hypothesis .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV)
