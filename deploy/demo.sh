#!/usr/bin/env bash
# `make demo`: a real three-server raftlet cluster on this machine, a 10-second concurrent
# write load, its summary and the servers' contention metrics, then a clean shutdown.
#
# The cluster is stopped by an EXIT trap, so it goes down whether a step fails, the load
# is interrupted (Ctrl-C) or everything succeeds: no server is ever left running. The data
# dir is a fresh temporary directory, removed afterwards unless something failed (then its
# server logs are kept and their place is printed).
#
# Environment: RAFTLET (the command, default .venv/bin/raftlet), DEMO_DURATION (10),
# DEMO_THREADS (8), DEMO_ARGS (extra `raftlet cluster up` flags, e.g.
# "--term-check-mode locked --log-inject-latency-ms 20 --tserver-flag=--write_rounds_in_flight=0"
# for the KUDU-2727 setup).
set -euo pipefail

RAFTLET=${RAFTLET:-.venv/bin/raftlet}
DURATION=${DEMO_DURATION:-10}
THREADS=${DEMO_THREADS:-8}
DIR=$(mktemp -d "${TMPDIR:-/tmp}/raftlet-demo.XXXXXX")

step() { printf '\n== %s\n' "$*"; }

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    step "raftlet cluster down"
    if ! "$RAFTLET" cluster down --data-dir "$DIR" --timeout 20; then
        status=1
    fi
    if [ "$status" -eq 0 ]; then
        rm -rf "$DIR"
    else
        echo "demo failed (exit $status); server logs kept in $DIR" >&2
    fi
    exit "$status"
}
trap cleanup EXIT
# Ctrl-C or a TERM from a CI timeout: exit, which runs the cleanup above.
trap 'exit 130' INT TERM

step "raftlet cluster up: 3 servers, table kv in 4 tablets x 3 replicas"
# shellcheck disable=SC2086  # DEMO_ARGS is a list of flags
"$RAFTLET" cluster up --data-dir "$DIR" ${DEMO_ARGS:-}

step "raftlet write --duration $DURATION --threads $THREADS: concurrent inserts, each acknowledged by a majority"
"$RAFTLET" write --data-dir "$DIR" --duration "$DURATION" --threads "$THREADS"

step "raftlet metrics: queues, consensus lock contention and term checks on each server"
"$RAFTLET" metrics --data-dir "$DIR"

step "raftlet cluster status"
"$RAFTLET" cluster status --data-dir "$DIR"
