"""One MCP session through the proxy with a tool policy in force (mcp 1.x client).

    python policy_client.py URL {http|sse} MESSAGE DENIED_TOOL

Lists the tools, calls chat_send without a sender (the proxy stamps it) and calls DENIED_TOOL (the proxy must
answer it itself). Prints one JSON object on stdout: the tool names listed, the tools whose inputSchema still
has a `sender` property, chat_send's result text, and the denied call's error code and message.
"""

import asyncio
import json
import sys

from mcp import ClientSession
from mcp.shared.exceptions import McpError


async def session(read, write, out, message, denied):
    async with ClientSession(read, write) as s:
        await s.initialize()
        listed = await s.list_tools()
        out["tools"] = sorted(t.name for t in listed.tools)
        out["with_sender"] = sorted(t.name for t in listed.tools if "sender" in (t.inputSchema or {}).get("properties", {}))
        out["required_of_send"] = next(
            (t.inputSchema.get("required") for t in listed.tools if t.name == "chat_send"), None
        )
        sent = await s.call_tool("chat_send", {"message": message, "channel": "general"})
        out["send"] = {"is_error": sent.isError, "text": " ".join(c.text for c in sent.content if hasattr(c, "text"))}
        try:
            r = await s.call_tool(denied, {})
            out["denied"] = {"answered": True, "is_error": r.isError, "text": str(r.content)}
        except McpError as e:
            out["denied"] = {"code": e.error.code, "message": e.error.message}


async def main():
    url, transport, message, denied = sys.argv[1:5]
    out = {}
    if transport == "sse":
        from mcp.client.sse import sse_client

        async with sse_client(url) as (read, write):
            await session(read, write, out, message, denied)
    else:
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(url) as (read, write, _):
            await session(read, write, out, message, denied)
    print(json.dumps(out), flush=True)


asyncio.run(asyncio.wait_for(main(), 40))
