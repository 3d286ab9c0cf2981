"""One PySyncObj node for ``bench/peers.py`` (run by the bench's own virtualenv, which has
``pysyncobj``; the project never depends on it).

    python bench/_peers_syncobj.py --self 127.0.0.1:P1 --partners 127.0.0.1:P2,127.0.0.1:P3 \
        --control 127.0.0.1:C1

The node replicates a dict (``set(key, value)``) over PySyncObj's own TCP transport with
its default configuration: no journal file, so the log lives in memory only and nothing is
fsynced.  PySyncObj has no separate client protocol, so the load runs *inside* the leader
process ("writer in the leader"): a control socket takes one JSON line per request and
answers one JSON line:

    {"cmd": "state"}  ->  {"leader": "127.0.0.1:P1" or null, "is_leader": bool, "ready": bool}
    {"cmd": "load", "inflight": N, "seconds": S, "value_bytes": B, "key_base": K}
                      ->  {"elapsed": s, "latencies_ms": [...], "errors": {reason: n}}

A load keeps N replicated ``set`` calls outstanding for S seconds: each call's callback
(run on the node's tick thread) records its latency and issues the next one, closed loop.
"""

from __future__ import annotations

import argparse
import json
import socket
import socketserver
import threading
import time
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, replicated


class KV(SyncObj):
    def __init__(self, self_addr: str, partners: list[str], batch: bool) -> None:
        # No journal file (the default): the log is in memory only.  appendEntriesUseBatch
        # (the default, True) sends new entries on the next tick, up to 100 ms later; False
        # wakes the sender for every command.
        super().__init__(self_addr, partners, SyncObjConf(appendEntriesUseBatch=batch))
        self._data: dict[int, bytes] = {}

    @replicated
    def set(self, key: int, value: bytes) -> None:
        self._data[key] = value


def run_load(node: KV, inflight: int, seconds: float, value_bytes: int, key_base: int) -> dict:
    value = b"v" * value_bytes
    latencies: list[float] = []
    errors: dict[str, int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    done = threading.Event()
    state = {"key": key_base, "outstanding": 0}

    def issue() -> None:
        with lock:
            state["key"] += 1
            key = state["key"]
            state["outstanding"] += 1
        t0 = time.perf_counter()

        def callback(_result: Any, error: int) -> None:
            ms = (time.perf_counter() - t0) * 1000
            with lock:
                state["outstanding"] -= 1
                if error == FAIL_REASON.SUCCESS:
                    latencies.append(ms)
                else:
                    errors[str(error)] = errors.get(str(error), 0) + 1
                last = stop.is_set() and state["outstanding"] == 0
            if last:
                done.set()
            elif not stop.is_set():
                issue()

        node.set(key, value, callback=callback)

    start = time.perf_counter()
    for _ in range(inflight):
        issue()
    stop.wait(seconds)
    stop.set()
    with lock:
        if state["outstanding"] == 0:
            done.set()
    done.wait(30)
    # The calls still outstanding at the stop are waited for and counted, and so is the
    # time they take: the same rule as the other systems' closed loops (bench/_drivers.py).
    elapsed = time.perf_counter() - start
    return {"elapsed": elapsed, "latencies_ms": latencies, "errors": errors}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--self", dest="self_addr", required=True)
    parser.add_argument("--partners", required=True)
    parser.add_argument("--control", required=True)
    parser.add_argument("--batch", action="store_true", help="appendEntriesUseBatch=True")
    args = parser.parse_args()
    node = KV(args.self_addr, args.partners.split(","), args.batch)

    class Handler(socketserver.StreamRequestHandler):
        def handle(self) -> None:
            for line in self.rfile:
                req = json.loads(line)
                if req["cmd"] == "state":
                    leader = node._getLeader()
                    resp: dict = {
                        "leader": None if leader is None else str(leader),
                        "is_leader": bool(node._isLeader()),
                        "ready": bool(node.isReady()),
                    }
                elif req["cmd"] == "load":
                    resp = run_load(
                        node,
                        int(req["inflight"]),
                        float(req["seconds"]),
                        int(req["value_bytes"]),
                        int(req["key_base"]),
                    )
                else:
                    resp = {"error": f"unknown cmd {req['cmd']!r}"}
                self.wfile.write(json.dumps(resp).encode() + b"\n")
                self.wfile.flush()

    host, port = args.control.rsplit(":", 1)
    socketserver.TCPServer.allow_reuse_address = True
    with socketserver.TCPServer((host, int(port)), Handler) as server:
        server.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        print(f"pysyncobj node {args.self_addr} control {args.control} ready", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
