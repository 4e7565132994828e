"""One MCP session of the Python SDK 1.x against agentchattr (through the proxy), driven step by step, for the
audit log's tests; JSON on stdout.

    python audit_client.py URL --steps STEP[,STEP...] [--timeout 60]

`streamable_http_client` + `ClientSession`: one initialize (and its notifications/initialized), the steps, then
the closing DELETE when the session ends. Steps:

- `list`                 tools/list; the tool names are recorded.
- `send:LABEL[:SENDER]`  chat_send {message: LABEL, channel: "general", choices: []}, with `sender: SENDER`
                         when given (an impersonation attempt when it is not the agent's name); none otherwise.
- `read`                 chat_read {channel: "general"}, no sender (the proxy stamps the agent's).
- `pause:NAME`           print `PAUSE NAME` and wait for a line on stdin (the test acts meanwhile).

Each step's result or error is recorded, never raised. Every HTTP exchange is recorded when its response head
arrives: method, status, the Mcp-Session-Id sent and received, and the JSON-RPC method and id sent (a request,
a notification, or none for a GET or DELETE).

Prints `RESULT <json>` last; exits 0 even if something failed ("error").
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from importlib.metadata import version

import httpx
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from client_common import error_of, pause, print_result, record_call, rpc_of, run_reported

CALL_TIMEOUT_S = 15


class Run:
    def __init__(self, args, out: dict) -> None:
        self.args = args
        self.out = out
        self.http: list[dict] = out["http"]
        self.session = None

    async def on_response(self, response) -> None:
        req = response.request
        entry = {
            "t": time.time(),
            "method": req.method,
            "status": response.status_code,
            "sent_session_id": req.headers.get("mcp-session-id"),
            "session_get": response.headers.get("mcp-session-id"),
            "rpc_method": None,
            "rpc_id": None,
        }
        entry["rpc_method"], entry["rpc_id"] = rpc_of(req.content)
        self.http.append(entry)

    def call_tool(self, name: str, arguments: dict):
        return self.session.call_tool(name, arguments, read_timeout_seconds=timedelta(seconds=CALL_TIMEOUT_S))

    async def tool(self, rec: dict, name: str, arguments: dict) -> dict:
        await record_call(rec, self.call_tool, name, arguments)
        return rec

    async def step(self, step: str) -> dict:
        kind, _, rest = step.partition(":")
        if kind == "list":
            rec = {"step": "list"}
            try:
                rec["tools"] = [t.name for t in (await self.session.list_tools()).tools]
            except Exception as e:  # noqa: BLE001
                rec["error"] = error_of(e)
            return rec
        if kind == "send":
            label, _, sender = rest.partition(":")
            arguments = {"message": label, "channel": "general", "choices": []}
            if sender:
                arguments["sender"] = sender
            return await self.tool({"step": "send", "label": label, "sender": sender or None}, "chat_send", arguments)
        if kind == "read":
            return await self.tool({"step": "read"}, "chat_read", {"channel": "general"})
        if kind == "pause":
            await pause(rest)
            return {"step": "pause", "label": rest, "resumed": time.time()}
        raise ValueError(f"unknown step {step!r}")

    async def run(self) -> None:
        client = httpx.AsyncClient(timeout=httpx.Timeout(30, read=300), event_hooks={"response": [self.on_response]})
        async with client as http_client:
            async with streamable_http_client(self.args.url, http_client=http_client) as (read, write, get_id):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    self.session = session
                    self.out["session_id"] = get_id()
                    for step in self.args.steps.split(","):
                        self.out["steps"].append(await self.step(step))
                    self.out["session_id_at_end"] = get_id()
        self.out["closed"] = True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--steps", required=True)
    parser.add_argument("--timeout", type=float, default=60, help="bound on the whole run, pauses included")
    args = parser.parse_args()
    out: dict = {"sdk": version("mcp"), "http": [], "steps": [], "error": None}
    run_reported(Run(args, out).run, args.timeout, out)
    print_result(out)


if __name__ == "__main__":
    main()
