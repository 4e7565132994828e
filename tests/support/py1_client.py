"""Python MCP SDK 1.x client: the lifecycle agentchattr's agents run, as JSON on stdout.

    python py1_client.py URL [--authorization "Bearer spoof"] [--x-agent-token spoof] [--sender mallory]
                             [--transport streamable-http|sse] [--switch-identity FILE JSON]

With `--transport sse` the legacy HTTP+SSE client (`sse_client`, URL = the `/sse` endpoint) runs the same
calls; it has no Mcp-Session-Id and no closing DELETE ("endpoint" holds the session id from the endpoint event).

With `--switch-identity FILE JSON`, after the first chat_send the script replaces FILE (the proxy's
`--identity-file`) with JSON by an atomic rename, as a wrapper would, waits `--switch-wait` seconds, and calls
chat_send again in the same session ("chat_send_after_switch").

streamable_http_client + ClientSession: initialize, tools/list, tools/call (chat_send, chat_join, chat_read,
chat_who as `--sender`), slow_progress (arrival latency of each progress/log notification), then exit, which
sends the closing DELETE. Every HTTP response is recorded by an httpx event hook (method, status, every
Mcp-Session-Id value and what `headers.get` reads). Prints one JSON object; exits 0 even if a step failed
(the error is in "error"), so the Rust test can show everything it got.
"""

from __future__ import annotations

import json
import os
import sys
from importlib.metadata import version

import anyio
import httpx
from mcp import ClientSession
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from client_common import latency_recorders, lifecycle_parser, run_reported, spoofed_headers, text_json


async def run(args, out: dict) -> None:
    http: list[dict] = out["http"]

    async def on_response(response: httpx.Response) -> None:
        http.append(
            {
                "method": response.request.method,
                "path": response.request.url.raw_path.decode(),
                "status": response.status_code,
                "content_type": response.headers.get("content-type"),
                "session_ids": response.headers.get_list("mcp-session-id"),
                "session_get": response.headers.get("mcp-session-id"),
            }
        )

    spoof_headers = spoofed_headers(args)

    on_progress, on_log = latency_recorders(out)

    def make_client(headers=None, timeout=None, auth=None) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            headers={**(headers or {}), **spoof_headers},
            timeout=timeout or httpx.Timeout(30, read=300),
            auth=auth,
            event_hooks={"response": [on_response]},
        )

    if args.transport == "sse":
        transport = sse_client(
            args.url, httpx_client_factory=make_client, on_session_created=lambda sid: out.update(endpoint=sid)
        )
        async with transport as (read, write):
            await session_calls(args, out, read, write, None, on_log, on_progress)
    else:
        async with make_client() as client:
            async with streamable_http_client(args.url, http_client=client) as (read, write, get_session_id):
                await session_calls(args, out, read, write, get_session_id, on_log, on_progress)
    out["closed"] = True


async def session_calls(args, out: dict, read, write, get_session_id, on_log, on_progress) -> None:
    logs: list[dict] = out["logs"]
    async with ClientSession(read, write, logging_callback=on_log) as session:
        init = await session.initialize()
        out["protocol_version"] = init.protocolVersion
        out["server"] = init.serverInfo.name
        out["session_id"] = get_session_id() if get_session_id else None
        tools = await session.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        calls = out["calls"]
        calls["chat_send"] = text_json(
            await session.call_tool("chat_send", {"sender": args.sender, "message": "hello from py1"})
        )
        if args.switch_identity:
            path, content = args.switch_identity
            tmp = f"{path}.tmp"
            with open(tmp, "w") as f:
                f.write(content)
            os.replace(tmp, path)
            await anyio.sleep(args.switch_wait)
            calls["chat_send_after_switch"] = text_json(
                await session.call_tool("chat_send", {"sender": args.sender, "message": "after the switch"})
            )
        calls["chat_join"] = text_json(await session.call_tool("chat_join", {"name": args.sender}))
        calls["chat_read"] = text_json(await session.call_tool("chat_read", {"sender": args.sender}))
        calls["chat_who"] = text_json(await session.call_tool("chat_who", {}))
        # Warm-up (as in py2_client.py / ts_client.cjs): measure the second notification-carrying call.
        await session.call_tool("slow_progress", {"sender": args.sender, "count": 1})
        logs.clear()
        calls["slow_progress"] = text_json(
            await session.call_tool(
                "slow_progress", {"sender": args.sender, "count": args.count}, progress_callback=on_progress
            )
        )


def main() -> None:
    parser = lifecycle_parser()
    parser.add_argument("--transport", choices=["streamable-http", "sse"], default="streamable-http")
    parser.add_argument("--switch-identity", nargs=2, metavar=("FILE", "JSON"))
    parser.add_argument("--switch-wait", type=float, default=1.0)
    args = parser.parse_args()
    out: dict = {"sdk": version("mcp"), "httpx": version("httpx"), "http": [], "progress": [], "logs": [],
                 "calls": {}, "error": None}
    out["elapsed_ms"] = run_reported(lambda: run(args, out), args.timeout, out)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
