"""What one message costs: a ping-pong of small messages on a grpc.aio bidirectional stream
next to the same on a plain TCP socket, client and server in separate processes.

Why the tcp transports exist (docs/ARCHITECTURE.md, "consensus.rpc" and "Client writes over
tcp"): every message on a grpc.aio stream crosses gRPC's own threads and the event loop on
each side. Prints round trips per second, microseconds per round trip, and the CPU both
processes spent per round trip.

    python bench/pingpong.py [--messages 5000] [--bytes 150] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# --- servers (run as subprocesses of this script) ------------------------------------------


def _serve_socket(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while data := conn.recv(65536):
        conn.sendall(data)


async def _serve_grpc() -> None:
    import grpc

    async def echo(_requests: object, context: grpc.aio.ServicerContext) -> None:
        while True:
            message = await context.read()
            if message is grpc.aio.EOF:
                return
            await context.write(message)

    handler = grpc.stream_stream_rpc_method_handler(
        echo, request_deserializer=bytes, response_serializer=bytes
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("bench.Echo", {"P": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(port, flush=True)  # the parent waits for this line
    await server.wait_for_termination()


# --- clients -------------------------------------------------------------------------------


def _ping_socket(port: int, messages: int, size: int) -> float:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    payload = b"x" * size
    start = time.perf_counter()
    for _ in range(messages):
        sock.sendall(payload)
        got = 0
        while got < size:
            got += len(sock.recv(65536))
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed


async def _ping_grpc(port: int, messages: int, size: int) -> float:
    import grpc

    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(
            "/bench.Echo/P", request_serializer=bytes, response_deserializer=bytes
        )()
        payload = b"x" * size
        for _ in range(100):  # warm up the stream
            await call.write(payload)
            await call.read()
        start = time.perf_counter()
        for _ in range(messages):
            await call.write(payload)
            await call.read()
        elapsed = time.perf_counter() - start
        await call.done_writing()
        return elapsed


def _measure(kind: str, messages: int, size: int) -> tuple[float, float]:
    """(µs per round trip, CPU µs per round trip of both processes)."""
    if kind == "socket":
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        pid = os.fork()
        if pid == 0:  # the server: echo until the client hangs up
            _serve_socket(listener)
            os._exit(0)
        listener.close()
        cpu0 = _own_cpu_s() + _cpu_s(pid)
        elapsed = _ping_socket(port, messages, size)
        cpu1 = _own_cpu_s() + _cpu_s(pid)
        os.waitpid(pid, 0)
    else:
        server = subprocess.Popen(
            [sys.executable, str(_HERE), "--serve-grpc"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())
            cpu0 = _own_cpu_s() + _cpu_s(server.pid)
            elapsed = asyncio.run(_ping_grpc(port, messages, size))
            cpu1 = _own_cpu_s() + _cpu_s(server.pid)
        finally:
            server.terminate()
            server.wait(10)
    return elapsed / messages * 1e6, (cpu1 - cpu0) / messages * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--bytes", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--serve-grpc", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_grpc:
        asyncio.run(_serve_grpc())
        return
    print(
        f"# bench/pingpong.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
        f"python {sys.version.split()[0]}  {os.cpu_count()} cpus  {args.messages} round "
        f"trips of {args.bytes} bytes  median of {args.repeat}"
    )
    print()
    print("| path | round trips/s | µs per round trip | CPU µs per round trip (both ends) |")
    print("|---|---|---|---|")
    rows = {}
    for _ in range(args.repeat):  # interleaved, so both see the same machine
        for kind in ("grpc.aio stream", "socket"):
            key = "socket" if kind == "socket" else "grpc"
            rows.setdefault(kind, []).append(_measure(key, args.messages, args.bytes))
    for kind, samples in rows.items():
        latency = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        print(f"| {kind} | {1e6 / latency:,.0f} | {latency:.1f} | {cpu:.1f} |")


if __name__ == "__main__":
    main()
