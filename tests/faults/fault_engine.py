"""A stand-in for `vllm serve` that misbehaves on cue: the engine of the fault matrix.

Run as a separate process, like an engine (`engine.command: [python, tests/faults/fault_engine.py]`),
it takes vLLM's command line (MODEL, --host, --port, --served-model-name; other flags are accepted and
ignored), speaks plain HTTP/1.1 over asyncio streams (so that it can also misbehave at the socket
level) and logs the lines vLLM logs. `FAULT_MODE` in its environment picks the fault:

    ok              serve every request
    hang-startup    log a few lines, never listen
    oom-hang        on the first completion: log vLLM's CUDA OOM traceback, then never answer again
    http-500        completions answer 500 (vLLM's JSON error)
    reset           two tokens, then the connection is reset (TCP RST)
    cut             two tokens, then the connection is closed (no end of stream, no [DONE])
    stall           one token, then nothing, connection open
    malformed       a `data:` line that is not JSON
    no-choices      a chunk without `choices`
    slow-stop       serve; on SIGTERM write `$FAULT_DIR/sigterm`, then ignore it (the group SIGKILL ends us)
    port-taken-once the first launch (no `$FAULT_DIR/launched` yet) binds `$FAULT_PORT`, which is taken

`FAULT_TOKEN_S` is the time between tokens (default 0.002 s). `FAULT_AFTER=n` serves the first n
completions normally before the fault starts. `$FAULT_DIR`, when
set, receives one `request-<pid>-<n>` file per completion request (so a test can see the workload run).
Standard library only: it runs under any interpreter.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

MODE = os.environ.get("FAULT_MODE", "ok")
AFTER = int(os.environ.get("FAULT_AFTER", "0"))
TOKEN_S = float(os.environ.get("FAULT_TOKEN_S", "0.002"))
FAULT_DIR = Path(os.environ["FAULT_DIR"]) if os.environ.get("FAULT_DIR") else None
TOKENS = 16
VERSION = "0.32.0"
OOM_TRACEBACK = """\
ERROR {ts} [core.py:710] EngineCore encountered a fatal error.
ERROR {ts} [core.py:710] Traceback (most recent call last):
ERROR {ts} [core.py:710]   File "vllm/v1/engine/core.py", line 701, in run_engine_core
ERROR {ts} [core.py:710]     engine_core.run_busy_loop()
ERROR {ts} [core.py:710] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 0 has a \
total capacity of 23.69 GiB of which 1.02 GiB is free. Including non-PyTorch memory, this process has 22.66 GiB \
memory in use."""


def log(line: str) -> None:
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"(APIServer pid={os.getpid()}) INFO {stamp} [fault_engine.py] {line}", flush=True)


def mark(name: str) -> None:
    if FAULT_DIR is not None:
        FAULT_DIR.mkdir(parents=True, exist_ok=True)
        (FAULT_DIR / name).write_text(str(os.getpid()))


class Engine:
    def __init__(self, served: str) -> None:
        self.served = served
        self.requests = 0
        self.dead = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                keep = await self.route(method, path, body, writer)
                if not keep:
                    return
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            return
        finally:
            if not writer.is_closing():
                writer.close()

    async def route(self, method: str, path: str, body: bytes, writer: asyncio.StreamWriter) -> bool:
        if path == "/health":
            return await respond(writer, 200, b"")
        if path == "/v1/models":
            payload = {"object": "list", "data": [{"id": self.served, "object": "model", "max_model_len": 8192}]}
            return await respond(writer, 200, json.dumps(payload).encode(), "application/json")
        if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
            return await self.complete(json.loads(body or b"{}"), writer, chat=path.endswith("chat/completions"))
        return await respond(writer, 404, b'{"detail":"Not Found"}', "application/json")

    async def complete(self, request: dict[str, object], writer: asyncio.StreamWriter, chat: bool) -> bool:
        self.requests += 1
        mark(f"request-{os.getpid()}-{self.requests}")
        fault = MODE if self.requests > AFTER else "ok"
        if self.dead:
            await asyncio.Event().wait()  # the engine core is gone: nobody ever answers
        if fault == "oom-hang":
            self.dead = True
            ts = time.strftime("%m-%d %H:%M:%S")
            for line in OOM_TRACEBACK.format(ts=ts).splitlines():
                print(f"(EngineCore_DP0 pid={os.getpid()}) {line}", flush=True)
            await asyncio.Event().wait()
        if fault == "http-500":
            error = {"error": {"message": "Internal server error", "type": "InternalServerError", "code": 500}}
            return await respond(writer, 500, json.dumps(error).encode(), "application/json")
        max_tokens = int(request.get("max_tokens") or TOKENS)  # type: ignore[call-overload]
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
        for i in range(max_tokens):
            if fault == "reset" and i == 2:
                reset(writer)
                return False
            if fault == "cut" and i == 2:
                writer.close()
                return False
            if fault == "stall" and i == 1:
                await asyncio.Event().wait()
            if fault == "malformed" and i == 1:
                await send(writer, "data: {\"id\": \"cmpl-1\", \"choices\": [{\"text\": \n\n")
                continue
            if fault == "no-choices" and i == 1:
                await send(writer, "data: " + json.dumps({"id": "cmpl-1", "object": "text_completion"}) + "\n\n")
                continue
            text = " tok"
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = "length" if i == max_tokens - 1 else None
            await send(writer, "data: " + json.dumps({"id": "cmpl-1", "choices": [choice]}) + "\n\n")
            await asyncio.sleep(TOKEN_S)
        usage = {"prompt_tokens": 10, "completion_tokens": max_tokens, "total_tokens": 10 + max_tokens}
        await send(writer, "data: " + json.dumps({"id": "cmpl-1", "choices": [], "usage": usage}) + "\n\n")
        await send(writer, "data: [DONE]\n\n")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


async def respond(writer: asyncio.StreamWriter, status: int, body: bytes, ctype: str = "text/plain") -> bool:
    reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}[status]
    writer.write(f"HTTP/1.1 {status} {reason}\r\ncontent-type: {ctype}\r\ncontent-length: {len(body)}\r\n\r\n"
                 .encode() + body)
    await writer.drain()
    return True


async def send(writer: asyncio.StreamWriter, text: str) -> None:
    data = text.encode()
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: the peer gets a TCP RST, as when a server process dies mid-write."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def main(args: argparse.Namespace) -> int:
    log(f"vLLM API server version {VERSION}")
    log(f"non-default args: {{'model': '{args.model}', 'fault_mode': '{MODE}'}}")
    if MODE == "hang-startup":
        await asyncio.Event().wait()
    port = args.port
    if MODE == "port-taken-once" and FAULT_DIR is not None and not (FAULT_DIR / "launched").exists():
        mark("launched")
        port = int(os.environ["FAULT_PORT"])
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((args.host, port))  # taken: OSError: [Errno 98] Address already in use, as vLLM dies of it
    engine = Engine(args.served_model_name or args.model)
    server = await asyncio.start_server(engine.handle, sock=sock)
    if MODE == "slow-stop":
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, lambda: mark("sigterm"))
    log(f"Starting vLLM API server 0 on http://{args.host}:{port}")
    async with server:
        await server.serve_forever()
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name")
    args, _ = parser.parse_known_args(argv)
    return args


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(main(parse(sys.argv[1:]))))
    except KeyboardInterrupt:
        sys.exit(0)
