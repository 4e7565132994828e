"""A FastMCP upstream shaped like agentchattr's MCP server, for the real-client tests.

Runs with the Python MCP SDK 1.x (`mcp.server.fastmcp.FastMCP`, what agentchattr runs) or 2.x
(`mcp.server.mcpserver.MCPServer`, which also speaks the stateless 2026-07-28 protocol), whichever the
interpreter has.

    FASTMCP_TEST_TOKEN=<token>[,<token>...] python fastmcp_server.py [--port N]
        [--transport streamable-http|sse] [--absolute-endpoint] [--record FILE] [--bind-on-stdin]

- Binds 127.0.0.1 (port 0 = OS-assigned), prints `PORT <n>` on stdout once listening, then serves until killed.
- `--bind-on-stdin` (a restart on the same port, prepared in advance): load everything, print `LOADED`, wait for
  a line on stdin, then bind (retrying for up to 5 s while the port is still taken) and print `PORT <n>`. The
  port is then closed only between the old process's death and this bind, not for a whole interpreter start.
- `--record FILE`: append one JSON line per HTTP request when its response starts (see `Recorder`), so a test
  can count what this process and its successors on the same port were sent. `FASTMCP_TEST_GENERATION`
  (default 1) tags the lines of this process.
- DNS-rebinding protection is the SDK default for host 127.0.0.1 (Host must be `127.0.0.1:<port>` etc.).
- Every HTTP request must carry exactly one `Authorization: Bearer <token>` with one of the tokens in
  FASTMCP_TEST_TOKEN (comma-separated); otherwise 401. Tokens come from the environment, never from argv.
- `--absolute-endpoint` (SSE only): the `endpoint` event names `http://127.0.0.1:<port>/messages/?...` instead
  of FastMCP's relative path, like other servers do; SDK clients reject an endpoint on another origin, so
  through a proxy this works only if the proxy rewrites it to its own origin.
- Every tool answers one text content: a JSON object with what the server saw (identity argument,
  every Authorization / X-Agent-Token / Host / Mcp-Session-Id value), so tests can assert stamping and
  credential replacement.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time

from server_common import serve

try:  # SDK 1.x
    from mcp.server.fastmcp import Context, FastMCP

    SDK_MAJOR = 1
except ModuleNotFoundError:  # SDK 2.x renamed FastMCP to MCPServer
    from mcp.server.mcpserver import Context, MCPServer

    SDK_MAJOR = 2

from importlib.metadata import version as _dist_version

SDK_VERSION = _dist_version("mcp")

TOKENS = [t for t in os.environ.get("FASTMCP_TEST_TOKEN", "").split(",") if t]
if not TOKENS:
    sys.exit("fastmcp_server.py: FASTMCP_TEST_TOKEN must be set (the expected bearer token)")

# Background tasks (notify_standalone) are kept referenced until they finish.
_background: set[asyncio.Task] = set()


def _request(ctx: Context):
    try:
        return ctx.request_context.request
    except (ValueError, AttributeError):
        return None


def _seen(ctx: Context, tool: str, **args) -> str:
    """The JSON text every tool answers: its arguments plus the credentials the server saw."""
    req = _request(ctx)
    headers = req.headers if req is not None else None

    def all_values(name: str) -> list[str]:
        return list(headers.getlist(name)) if headers is not None else []

    out = {
        "tool": tool,
        **args,
        "authorization": all_values("authorization"),
        "x_agent_token": all_values("x-agent-token"),
        "host": all_values("host"),
        "mcp_session_id": all_values("mcp-session-id"),
        "mcp_protocol_version": all_values("mcp-protocol-version"),
        "sdk": SDK_VERSION,
    }
    return json.dumps(out, sort_keys=True)


def build_server():
    kwargs = dict(name="agentchattr-test", instructions="test upstream for mcp-identity-proxy", log_level="ERROR")
    if SDK_MAJOR == 1:
        return FastMCP(host="127.0.0.1", **kwargs)
    return MCPServer(**kwargs)


mcp = build_server()


@mcp.tool()
async def chat_send(sender: str, message: str, ctx: Context, channel: str = "general") -> str:
    """Send a message to a channel (agentchattr shape)."""
    return _seen(ctx, "chat_send", sender=sender, message=message, channel=channel)


@mcp.tool()
async def chat_read(ctx: Context, sender: str = "") -> str:
    """Read messages (agentchattr shape)."""
    return _seen(ctx, "chat_read", sender=sender, messages=[])


@mcp.tool()
async def chat_join(name: str, ctx: Context, channel: str = "general") -> str:
    """Join a channel; the identity parameter is `name`."""
    return _seen(ctx, "chat_join", name=name, channel=channel)


@mcp.tool()
async def chat_who(ctx: Context) -> str:
    """List agents; carries no identity parameter."""
    return _seen(ctx, "chat_who", online=["claude-prime"])


@mcp.tool()
async def slow_progress(sender: str, ctx: Context, count: int = 3, interval_ms: int = 600) -> str:
    """Send `count` progress notifications and as many log notifications, `interval_ms` apart, then answer.

    Each notification carries its send time (`time.time()`, seconds) so a client can measure its arrival
    latency: progress in `message` as JSON `{"i": i, "sent": t}`, log `data` as `{"i": i, "sent": t}`.

    The answer comes `interval_ms` after the last notification: the TypeScript SDK (1.32) runs notification
    handlers in a microtask but response handlers at once, and drops the progress handler with the response,
    so a progress notification read in the same chunk as the response is lost (seen on legacy SSE directly)."""
    for i in range(count):
        if i:
            await asyncio.sleep(interval_ms / 1000)
        t = time.time()
        await ctx.report_progress(i + 1, count, json.dumps({"i": i, "sent": t}))
        await ctx.log("info", json.dumps({"i": i, "sent": time.time()}))
    await asyncio.sleep(interval_ms / 1000)
    return _seen(ctx, "slow_progress", sender=sender, count=count)


@mcp.tool()
async def notify_standalone(sender: str, ctx: Context, delay_ms: int = 100) -> str:
    """Answer at once; `delay_ms` later, outside any request, send `notifications/tools/list_changed` and a
    log message `{"standalone": true, "sent": t}`. With no related request these go on the session's
    standalone GET stream (streamable HTTP) or the SSE stream (legacy transport)."""
    session = ctx.request_context.session

    async def later() -> None:
        await asyncio.sleep(delay_ms / 1000)
        try:
            await session.send_tool_list_changed()
            await session.send_log_message(level="info", data=json.dumps({"standalone": True, "sent": time.time()}))
        except Exception as e:  # the session may be gone; tests see the absence
            print(f"notify_standalone: {e!r}", file=sys.stderr, flush=True)

    task = asyncio.get_running_loop().create_task(later())
    _background.add(task)
    task.add_done_callback(_background.discard)
    return _seen(ctx, "notify_standalone", sender=sender, delay_ms=delay_ms)


class RequireBearer:
    """ASGI middleware: exactly one `Authorization: Bearer <one of TOKENS>` on every HTTP request, else 401."""

    def __init__(self, app) -> None:
        self.app = app
        self.accepted = [[f"Bearer {t}".encode()] for t in TOKENS]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            values = [v for k, v in scope["headers"] if k.lower() == b"authorization"]
            if values not in self.accepted:
                body = json.dumps(
                    {"jsonrpc": "2.0", "id": None, "error": {"code": -32001, "message": "unauthorized (test upstream)"}}
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 401,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"www-authenticate", b'Bearer realm="test"'),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class Recorder:
    """ASGI middleware (outermost): when a response starts, append one JSON line to the record file:

        {"generation": G, "t": unix time, "method": "POST", "path": "/mcp", "status": 200,
         "session_sent": [request Mcp-Session-Id values], "session_returned": [response Mcp-Session-Id values],
         "authorization": [...], "x_agent_token": [...], "rpc": the JSON-RPC body (parsed) or null}

    Written before the first response byte, so every response a client has seen is on record. A request that
    never gets a response head (the process killed first) has no line."""

    def __init__(self, app, path: str) -> None:
        self.app = app
        self.path = path
        self.generation = int(os.environ.get("FASTMCP_TEST_GENERATION", "1"))

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        body = bytearray()
        written = False

        async def recording_receive():
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def recording_send(message) -> None:
            nonlocal written
            if message["type"] == "http.response.start" and not written:
                written = True
                self.write(scope, bytes(body), message)
            await send(message)

        await self.app(scope, recording_receive, recording_send)

    def write(self, scope, body: bytes, start) -> None:
        def values(headers, name: bytes) -> list[str]:
            return [v.decode("latin-1") for k, v in headers if k.lower() == name]

        try:
            rpc = json.loads(body) if body else None
        except ValueError:
            rpc = {"unparsed": body.decode("utf-8", "replace")}
        record = {
            "generation": self.generation,
            "t": time.time(),
            "method": scope["method"],
            "path": scope["path"],
            "status": start["status"],
            "session_sent": values(scope["headers"], b"mcp-session-id"),
            "session_returned": values(start.get("headers", []), b"mcp-session-id"),
            "authorization": values(scope["headers"], b"authorization"),
            "x_agent_token": values(scope["headers"], b"x-agent-token"),
            "rpc": rpc,
        }
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record, sort_keys=True) + "\n")


class AbsoluteEndpoint:
    """ASGI middleware for `GET /sse`: rewrite the relative `data: /messages/...` of the first (endpoint) event
    into an absolute URL on this server's own authority."""

    def __init__(self, app, port: int) -> None:
        self.app = app
        self.prefix = f"data: http://127.0.0.1:{port}/messages/".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or not scope["path"].endswith("/sse"):
            return await self.app(scope, receive, send)
        done = False

        async def rewriting_send(message) -> None:
            nonlocal done
            if not done and message["type"] == "http.response.body" and b"data: /messages/" in message["body"]:
                message = {**message, "body": message["body"].replace(b"data: /messages/", self.prefix, 1)}
                done = True
            await send(message)

        await self.app(scope, receive, rewriting_send)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--transport", choices=["streamable-http", "sse"], default="streamable-http")
    parser.add_argument("--absolute-endpoint", action="store_true")
    parser.add_argument("--record", metavar="FILE")
    parser.add_argument("--bind-on-stdin", action="store_true")
    args = parser.parse_args()

    if args.transport == "sse":
        app = mcp.sse_app() if SDK_MAJOR == 1 else mcp.sse_app(host="127.0.0.1")
    else:
        app = mcp.streamable_http_app() if SDK_MAJOR == 1 else mcp.streamable_http_app(host="127.0.0.1")

    if args.bind_on_stdin:
        print("LOADED", flush=True)
        if not sys.stdin.readline():
            sys.exit("fastmcp_server.py: stdin closed before the bind line")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    deadline = time.monotonic() + (5 if args.bind_on_stdin else 0)
    while True:
        try:
            sock.bind(("127.0.0.1", args.port))
            break
        except OSError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.01)
    sock.listen(128)
    sock.set_inheritable(True)
    port = sock.getsockname()[1]

    if args.absolute_endpoint:
        app = AbsoluteEndpoint(app, port)
    app = RequireBearer(app)
    if args.record:
        app = Recorder(app, args.record)
    serve(app, sock)


if __name__ == "__main__":
    main()
