"""One MCP session of the Python SDK living through an upstream restart, driven step by step; JSON on stdout.

    python restart_client.py URL --steps STEP[,STEP...] [--sender mallory] [--timeout 40]

Runs with the Python MCP SDK 1.x (`streamable_http_client` + `ClientSession`) or 2.x (`mcp.Client`, mode
"auto": against FastMCP 1.x its `server/discover` probe is refused and it falls back to the initialize
handshake, i.e. a session), whichever the interpreter has. It connects (one initialize), runs the steps, then
exits, which sends the closing DELETE. Steps:

- `call:LABEL`     chat_send {sender, message: LABEL}; its result or error is recorded, never raised.
- `calls:LABEL:N`  N chat_send at once (messages LABEL-0 .. LABEL-<N-1>).
- `notify:LABEL`   call notify_standalone until its log message arrives (3 tries, 2 s each; after a miss, wait
                   up to 8 s for a GET stream opened (200)); `get_open` says whether a GET was answered 200 since
                   the last pause (or the start). The message travels only on the standalone GET stream.
- `pause:NAME`     print `PAUSE NAME` and wait for a line on stdin (the test restarts the upstream meanwhile).

Prints `RESULT <json>` last: each step's outcome with the client's view of its session id (1.x: the
transport's `get_session_id()`; 2.x: the Mcp-Session-Id of its latest request, else the one its initialize
was answered with), and every HTTP exchange (method, status, the Mcp-Session-Id sent and every one received,
the JSON-RPC method and id sent, the parsed body of a JSON answer to a POST). Exits 0 even if something
failed ("error").
"""

from __future__ import annotations

import argparse
import json
import time
from datetime import timedelta
from importlib.metadata import version

import anyio

from client_common import error_of, last_sent_session_id, pause, print_result, record_call, rpc_of, run_reported

try:  # SDK 2.x
    import httpx2 as httpx
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    SDK_MAJOR = 2
except ModuleNotFoundError:  # SDK 1.x
    import httpx
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    SDK_MAJOR = 1

CALL_TIMEOUT_S = 10


class Run:
    def __init__(self, args, out: dict) -> None:
        self.args = args
        self.out = out
        self.http: list[dict] = out["http"]
        self.standalone: list[float] = []
        self.mark = 0  # index into self.http at the last pause
        self.call = None
        self.session_id = None

    async def on_response(self, response) -> None:
        req = response.request
        entry = {
            "t": time.time(),
            "method": req.method,
            "status": response.status_code,
            "content_type": response.headers.get("content-type"),
            "sent_session_id": req.headers.get("mcp-session-id"),
            "session_ids": response.headers.get_list("mcp-session-id"),
            "session_get": response.headers.get("mcp-session-id"),
            "rpc_method": None,
            "rpc_id": None,
        }
        method, rpc_id = rpc_of(req.content)
        if method != "batch":
            entry["rpc_method"], entry["rpc_id"] = method, rpc_id
        if req.method == "POST" and (entry["content_type"] or "").startswith("application/json"):
            try:
                raw = await response.aread()
                if raw:
                    entry["body"] = json.loads(raw)
            except Exception as e:  # noqa: BLE001
                entry["body_error"] = repr(e)
        self.http.append(entry)

    async def on_log(self, params) -> None:
        try:
            data = json.loads(params.data)
        except (TypeError, ValueError):
            return
        if isinstance(data, dict) and data.get("standalone"):
            self.standalone.append(time.time())

    async def chat_send(self, label: str, message: str) -> dict:
        rec = {"label": label, "message": message, "started": time.time()}
        t0 = time.monotonic()
        await record_call(rec, self.call, "chat_send", {"sender": self.args.sender, "message": message})
        rec["elapsed_ms"] = (time.monotonic() - t0) * 1000
        rec["session_id"] = self.session_id()
        return rec

    async def step_calls(self, label: str, n: int) -> dict:
        results: list = [None] * n

        async def one(i: int) -> None:
            results[i] = await self.chat_send(label, f"{label}-{i}")

        async with anyio.create_task_group() as tg:
            for i in range(n):
                tg.start_soon(one, i)
        return {"step": "calls", "label": label, "calls": results, "session_id": self.session_id()}

    async def step_notify(self, label: str) -> dict:
        rec = {"step": "notify", "label": label}
        t0 = time.monotonic()

        def get_open() -> bool:
            return any(h["method"] == "GET" and h["status"] == 200 for h in self.http[self.mark :])

        rec["arrived"] = False
        rec["tries"] = []
        for _ in range(3):
            before = len(self.standalone)
            try:
                await self.call("notify_standalone", {"sender": self.args.sender, "delay_ms": 100})
                rec["tries"].append("called")
            except Exception as e:  # noqa: BLE001
                rec["tries"].append(error_of(e))
                break
            with anyio.move_on_after(2):
                while len(self.standalone) == before:
                    await anyio.sleep(0.02)
            if len(self.standalone) > before:
                rec["arrived"] = True
                break
            # Not there: the stream may be (re)opening; wait for a GET answered 200.
            with anyio.move_on_after(8):
                while not get_open():
                    await anyio.sleep(0.02)
        rec["get_open"] = get_open()
        rec["get_wait_ms"] = (time.monotonic() - t0) * 1000
        rec["session_id"] = self.session_id()
        return rec

    async def step_pause(self, name: str) -> dict:
        await pause(name)
        self.mark = len(self.http)
        return {"step": "pause", "label": name, "resumed": time.time()}

    async def steps(self) -> None:
        self.out["session_id_at_start"] = self.session_id()
        for step in self.args.steps.split(","):
            kind, _, rest = step.partition(":")
            if kind == "call":
                rec = {"step": "call", **await self.chat_send(rest, rest)}
            elif kind == "calls":
                label, _, n = rest.partition(":")
                rec = await self.step_calls(label, int(n))
            elif kind == "notify":
                rec = await self.step_notify(rest)
            elif kind == "pause":
                rec = await self.step_pause(rest)
            else:
                raise ValueError(f"unknown step {step!r}")
            self.out["steps"].append(rec)
        self.out["session_id_at_end"] = self.session_id()

    def make_http_client(self):
        headers = {}
        if self.args.authorization is not None:
            headers["Authorization"] = self.args.authorization
        return httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(30, read=300),
            event_hooks={"response": [self.on_response]},
        )

    async def run(self) -> None:
        async with self.make_http_client() as http_client:
            if SDK_MAJOR == 1:
                async with streamable_http_client(self.args.url, http_client=http_client) as (read, write, get_id):
                    async with ClientSession(read, write, logging_callback=self.on_log) as session:
                        await session.initialize()
                        self.session_id = get_id
                        timeout = timedelta(seconds=CALL_TIMEOUT_S)
                        self.call = lambda name, a: session.call_tool(name, a, read_timeout_seconds=timeout)
                        await self.steps()
            else:
                transport = streamable_http_client(self.args.url, http_client=http_client)
                async with Client(transport, logging_callback=self.on_log) as client:
                    self.session_id = lambda: last_sent_session_id(self.http)
                    self.call = lambda name, a: client.call_tool(name, a, read_timeout_seconds=CALL_TIMEOUT_S)
                    await self.steps()
        self.out["closed"] = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--steps", required=True)
    parser.add_argument("--authorization")
    parser.add_argument("--sender", default="mallory")
    parser.add_argument("--timeout", type=float, default=40, help="bound on the whole run, pauses included")
    args = parser.parse_args()
    out: dict = {"sdk": version("mcp"), "sdk_major": SDK_MAJOR, "http": [], "steps": [], "error": None}
    out["elapsed_ms"] = run_reported(Run(args, out).run, args.timeout, out)
    print_result(out)


if __name__ == "__main__":
    main()
