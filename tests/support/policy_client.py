"""One MCP session through the proxy with a tool policy in force (Python SDK 1.x or 2.x).

    python policy_client.py URL {http|sse} MESSAGE DENIED_TOOL

The SDK is whichever the interpreter has: 1.x (`ClientSession` over the transport's streams, `McpError`,
camelCase fields) or 2.x (`mcp.Client` over the transport, mode "auto", `MCPError`, snake_case fields). The
transport is `streamable_http_client` (http) or the legacy `sse_client` (sse).

Lists the tools, calls chat_send without a sender (the proxy stamps it) and calls DENIED_TOOL (the proxy must
answer it itself). Each call is bounded by CALL_TIMEOUT_S: a call that gets no answer (a legacy POST the
proxy refused with an HTTP status ends the 1.x SSE client's writer) is recorded as the SDK's timeout error,
not left to hang. Prints one JSON object on stdout: the SDK version, the tool names listed, the tools whose
inputSchema still has a `sender` property, chat_send's `required`, chat_send's result text, and the denied
call's outcome (its error code and message, or the result it was answered with).
"""

import asyncio
import json
import sys
from contextlib import asynccontextmanager
from datetime import timedelta
from importlib.metadata import version

try:  # SDK 2.x
    from mcp import Client, MCPError

    SDK_MAJOR = 2
except ImportError:  # SDK 1.x
    from mcp import ClientSession
    from mcp import McpError as MCPError

    SDK_MAJOR = 1
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

CALL_TIMEOUT_S = 10


def input_schema(tool) -> dict:
    return (tool.input_schema if SDK_MAJOR == 2 else tool.inputSchema) or {}


def is_error(result) -> bool:
    return bool(result.is_error if SDK_MAJOR == 2 else result.isError)


@asynccontextmanager
async def connect(url, transport):
    """A connected session: `list_tools()` and `call(name, arguments)`."""
    opened = sse_client(url) if transport == "sse" else streamable_http_client(url)
    if SDK_MAJOR == 2:
        async with Client(opened) as client:
            yield client.list_tools, lambda name, a: client.call_tool(name, a, read_timeout_seconds=CALL_TIMEOUT_S)
    else:
        timeout = timedelta(seconds=CALL_TIMEOUT_S)
        async with opened as streams:
            # sse_client yields (read, write), streamable_http_client (read, write, get_session_id).
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                yield s.list_tools, lambda name, a: s.call_tool(name, a, read_timeout_seconds=timeout)


async def session(url, transport, out, message, denied):
    async with connect(url, transport) as (list_tools, call):
        listed = await list_tools()
        out["tools"] = sorted(t.name for t in listed.tools)
        out["with_sender"] = sorted(t.name for t in listed.tools if "sender" in input_schema(t).get("properties", {}))
        out["required_of_send"] = next(
            (input_schema(t).get("required") for t in listed.tools if t.name == "chat_send"), None
        )
        sent = await call("chat_send", {"message": message, "channel": "general"})
        out["send"] = {"is_error": is_error(sent), "text": " ".join(c.text for c in sent.content if hasattr(c, "text"))}
        try:
            r = await call(denied, {})
            out["denied"] = {"answered": True, "is_error": is_error(r), "text": str(r.content)}
        except MCPError as e:
            out["denied"] = {"code": e.error.code, "message": e.error.message}


async def main():
    url, transport, message, denied = sys.argv[1:5]
    out = {"sdk": version("mcp"), "transport": transport}
    await session(url, transport, out, message, denied)
    print(json.dumps(out), flush=True)


asyncio.run(asyncio.wait_for(main(), 40))
