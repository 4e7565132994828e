"""Python MCP SDK 2.x default client (`mcp.Client`, mode "auto"), as JSON on stdout.

    python py2_client.py URL [--authorization "Bearer spoof"] [--x-agent-token spoof] [--sender mallory]

`Client` probes `server/discover` at protocol 2026-07-28 and adopts it when the server is modern (stateless:
no initialize, no Mcp-Session-Id, no GET stream), else falls back to the initialize handshake. Same calls as
py1_client.py: tools/list, chat_send/chat_join/chat_read/chat_who as `--sender`, slow_progress with progress
and log latency. Every HTTP exchange is recorded by an httpx2 event hook (method, status, MCP headers sent,
every Mcp-Session-Id value received). Prints one JSON object; exits 0 even if a step failed ("error").
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from client_common import latency_recorders, lifecycle_parser, run_reported, spoofed_headers, text_json


async def _ignore(*_args) -> None:
    pass


async def run(args, out: dict) -> None:
    http: list[dict] = out["http"]

    async def on_response(response: httpx2.Response) -> None:
        req = response.request
        http.append(
            {
                "method": req.method,
                "path": req.url.raw_path.decode(),
                "status": response.status_code,
                "content_type": response.headers.get("content-type"),
                "sent_mcp_method": req.headers.get("mcp-method"),
                "sent_mcp_name": req.headers.get("mcp-name"),
                "sent_protocol_version": req.headers.get("mcp-protocol-version"),
                "sent_session_id": req.headers.get("mcp-session-id"),
                "session_ids": response.headers.get_list("mcp-session-id"),
                "session_get": response.headers.get("mcp-session-id"),
            }
        )

    logs: list[dict] = out["logs"]
    on_progress, on_log = latency_recorders(out)

    http_client = httpx2.AsyncClient(
        headers=spoofed_headers(args),
        timeout=httpx2.Timeout(30, read=300),
        event_hooks={"response": [on_response]},
    )
    async with http_client:
        transport = streamable_http_client(args.url, http_client=http_client)
        async with Client(transport, logging_callback=on_log, log_level="info") as client:
            out["protocol_version"] = client.protocol_version
            info = client.server_info
            out["server"] = info.name if info is not None else None
            tools = await client.list_tools()
            out["tools"] = sorted(t.name for t in tools.tools)
            calls = out["calls"]
            calls["chat_send"] = text_json(
                await client.call_tool("chat_send", {"sender": args.sender, "message": "hello from py2"})
            )
            calls["chat_join"] = text_json(await client.call_tool("chat_join", {"name": args.sender}))
            calls["chat_read"] = text_json(await client.call_tool("chat_read", {"sender": args.sender}))
            calls["chat_who"] = text_json(await client.call_tool("chat_who", {}))
            # Warm-up: the first notification of a process pays ~45 ms of one-time client-side work (measured
            # against the server directly: the server writes it at once). Measure the second call.
            await client.call_tool("slow_progress", {"sender": args.sender, "count": 1}, progress_callback=_ignore)
            logs.clear()
            calls["slow_progress"] = text_json(
                await client.call_tool(
                    "slow_progress", {"sender": args.sender, "count": args.count}, progress_callback=on_progress
                )
            )
        out["closed"] = True


def main() -> None:
    args = lifecycle_parser().parse_args()
    out: dict = {"sdk": version("mcp"), "httpx2": version("httpx2"), "http": [], "progress": [], "logs": [],
                 "calls": {}, "error": None}
    out["elapsed_ms"] = run_reported(lambda: run(args, out), args.timeout, out)
    json.dump(out, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
