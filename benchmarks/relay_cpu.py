"""The Suite relay's CPU per request, alone: no engine, no database, no auth.

A paced fake replica (plain asyncio, on a Unix socket) answers every request with an
event stream of `--chunks` chunks `--interval-ms` apart, as `amity serve` streams a
completion. One proxy per tree in `--trees` (a checkout's root, put first on its
PYTHONPATH) relays to it: `proxy.forward` of that tree's `amity/suite/replicas/proxy.py`
behind FastAPI on uvicorn with httptools and uvloop, as the Suite runs it. A load
generator in this process (raw sockets: its own CPU is not measured) keeps
`--concurrency` streams going through each proxy in turn, in interleaved rounds (tree
order reversed every other round: a drift of the machine's load hits all alike), and
reports each proxy's CPU time (user + system, from /proc) per request: the medians over
rounds, and every round's figure.

    /work/main/.venv/bin/python benchmarks/relay_cpu.py --trees /tmp/before,. --rounds 5

`--py-spy PATH` records each proxy with py-spy (`--rate 200`) over one more round, to
`relay-<tree index>.txt` (py-spy's raw, collapsed stacks).
"""

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from served import cpu_seconds, free_port  # this folder's helpers

# One chunk as `amity serve` streams a completion token (about the same size).
CHUNK = (b'data: {"id":"cmpl-0123456789abcdef","object":"text_completion","created":1764700000,'
         b'"model":"bench","choices":[{"index":0,"text":" word","token":1234,"logprobs":null,'
         b'"finish_reason":null}]}\n\n')
REQUEST_BODY = json.dumps({"model": "bench", "prompt": "Once upon a time", "max_tokens": 64,
                           "stream": True}).encode()


# --- the fake replica ------------------------------------------------------------------

async def replica_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                             chunks: int, interval_s: float) -> None:
    """Answers requests on one kept-alive connection until the proxy closes it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), 0)
            await reader.readexactly(length)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            framed = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
            for _ in range(chunks):
                await asyncio.sleep(interval_s)
                writer.write(framed)
            writer.write(b"0\r\n\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def run_replica(path: str, chunks: int, interval_s: float) -> None:
    server = await asyncio.start_unix_server(
        lambda r, w: replica_connection(r, w, chunks, interval_s), path)
    async with server:
        await server.serve_forever()


# --- the proxy ---------------------------------------------------------------------------

def run_proxy(port: int, replica_path: str) -> None:
    import uvicorn
    from fastapi import FastAPI, Request

    from amity.suite.replicas.proxy import forward, new_client, request_headers

    app = FastAPI()
    client = new_client(replica_path)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.body()
        return await forward(client, "http://replica/v1/completions", request, body,
                             lambda: None, request_headers(request, drop=("authorization",)))

    uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", loop="uvloop",
                log_level="warning")


# --- the load ----------------------------------------------------------------------------

async def stream_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1:%d\r\n"
                 b"content-type: application/json\r\naccept: text/event-stream\r\n"
                 b"authorization: Bearer x\r\ncontent-length: %d\r\n\r\n%s"
                 % (port, len(REQUEST_BODY), REQUEST_BODY))
    tail = await reader.read(65536)
    if not tail.startswith(b"HTTP/1.1 200"):
        raise ConnectionError(f"the proxy answered {tail[:300]!r}")
    while not tail.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("the proxy closed the stream")
        tail = tail[-8:] + data


async def load(port: int, concurrency: int, requests: int) -> None:
    remaining = [requests]

    async def worker() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while remaining[0] > 0:
            remaining[0] -= 1
            await stream_once(reader, writer, port)
        writer.close()

    await asyncio.gather(*(worker() for _ in range(concurrency)))




def wait_for_port(port: int) -> None:
    import socket
    for _ in range(600):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"no proxy on port {port}")




def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trees", default=".", help="comma-separated checkout roots, one proxy each")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--requests", type=int, default=384, help="requests per proxy per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--interval-ms", type=float, default=10.0)
    parser.add_argument("--py-spy", default=None, help="py-spy's path: profile one more round")
    parser.add_argument("--role", choices=["replica", "proxy"], help=argparse.SUPPRESS)
    parser.add_argument("--socket", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "replica":
        asyncio.run(run_replica(args.socket, args.chunks, args.interval_ms / 1000))
        return
    if args.role == "proxy":
        run_proxy(args.port, args.socket)
        return

    trees = [str(Path(t).resolve()) for t in args.trees.split(",")]
    work = Path(tempfile.mkdtemp(prefix="amity-relay-cpu-"))
    socket_path = str(work / "replica.sock")
    me = [sys.executable, str(Path(__file__).resolve())]
    sizing = ["--chunks", str(args.chunks), "--interval-ms", str(args.interval_ms)]
    children = [subprocess.Popen(me + ["--role", "replica", "--socket", socket_path] + sizing)]
    proxies = []  # (port, process)
    try:
        for tree in trees:
            port = free_port()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")])}
            children.append(subprocess.Popen(
                me + ["--role", "proxy", "--socket", socket_path, "--port", str(port)], env=env, cwd=work))
            proxies.append((port, children[-1]))
        for port, _ in proxies:
            wait_for_port(port)
            asyncio.run(load(port, 4, 8))  # warm-up
        per_round: list[list[float]] = [[] for _ in trees]
        load_before = os.getloadavg()[0]
        for round_index in range(args.rounds + (1 if args.py_spy else 0)):
            profiling = args.py_spy and round_index == args.rounds
            order = list(range(len(trees)))
            for i in order[::-1] if round_index % 2 else order:
                port, proc = proxies[i]
                spy = subprocess.Popen(
                    [args.py_spy, "record", "--rate", "200", "--pid", str(proc.pid), "--format", "raw",
                     "-o", f"relay-{i}.txt"], stdout=subprocess.DEVNULL) if profiling else None
                before = cpu_seconds(proc.pid)
                asyncio.run(load(port, args.concurrency, args.requests))
                ms = 1000 * (cpu_seconds(proc.pid) - before) / args.requests
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait()
                else:
                    per_round[i].append(ms)
        print(json.dumps({
            "concurrency": args.concurrency, "requests": args.requests, "chunks": args.chunks,
            "load_average_1min": [load_before, os.getloadavg()[0]],
            "proxy_cpu_ms_per_request": {tree: {"median": statistics.median(r), "rounds": r}
                                         for tree, r in zip(trees, per_round)}}, indent=1))
    finally:
        for child in children:
            child.terminate()
            child.wait(timeout=30)


if __name__ == "__main__":
    main()
