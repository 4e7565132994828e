"""One MCP session of the Python SDK against agentchattr (through the proxy), driven step by step; JSON on stdout.

    python agentchattr_client.py URL --steps STEP[,STEP...] [--transport streamable-http|sse|stdio]
        [--sender mallory] [--timeout 60]

The SDK is whichever the interpreter has: 1.x (`streamable_http_client` + `ClientSession`, or with
`--transport sse` the legacy `sse_client` + `ClientSession`) or 2.x (`mcp.Client`, mode "auto": against
agentchattr's FastMCP 1.x its `server/discover` probe is refused and it falls back to the initialize
handshake, i.e. a session). With `--transport stdio`, URL is the command line of a stdio server as a JSON array
(the proxy with `--stdio`), which the SDK's `stdio_client` spawns (with `RUST_LOG` from this environment, `debug`
by default; its stderr is this script's); there is no HTTP to record and no session id. It connects (one
initialize), runs the steps, then exits (the streamable HTTP clients send the closing DELETE; the stdio client
closes the server's stdin). Steps:

- `list:LABEL`        tools/list; the tool names are recorded.
- `call:LABEL`        chat_send {sender, message: LABEL, channel: "general", choices: []}, as an agent would send
                      it; its result or error is recorded, never raised.
- `stream:LABEL:SECS` the state of the client's standalone GET streams (streamable HTTP only): every GET so far
                      with its status, when it opened (before the last pause began or not) and ended and why,
                      and the bytes it carried before and after the last pause ended; first waits up to SECS seconds for a byte to arrive on a GET stream
                      after the last pause (agentchattr's server writes a `: ping` comment on it every 15 s
                      and nothing else).
- `read:LABEL`        chat_read {sender, channel: "general"}; its result or error is recorded, never raised.
- `pause:NAME`        print `PAUSE NAME` and wait for a line on stdin (the test acts meanwhile).

Every HTTP exchange is recorded by a transport wrapper under the SDK's httpx client: method, path and query,
status, the Mcp-Session-Id sent and received, the JSON-RPC method and id sent, the JSON-RPC ids, errors and
result presence of the answer (JSON, or each SSE `data:` line), the body's size, and for a GET its chunks with
their times and how the stream ended. WARNING and INFO records of the SDK's loggers are kept too.

Prints `RESULT <json>` last; exits 0 even if something failed ("error").
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from datetime import timedelta
from importlib.metadata import version
from urllib.parse import parse_qs

import anyio

from client_common import error_of, last_sent_session_id, pause, print_result, record_call, rpc_of, run_reported

try:  # SDK 2.x
    import httpx2 as httpx
    from mcp import Client, StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client

    SDK_MAJOR = 2
except ModuleNotFoundError:  # SDK 1.x
    import httpx
    from mcp import ClientSession, StdioServerParameters, stdio_client
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    SDK_MAJOR = 1

CALL_TIMEOUT_S = 15
BODY_CAP = 256 * 1024
CHUNK_RECORDS_CAP = 200


def answers_in(content_type: str, body: bytes) -> list[dict]:
    """The JSON-RPC messages of a body (JSON, or the `data:` lines of SSE events), summarised."""
    texts: list[str] = []
    if not body.strip():
        return []
    if content_type.startswith("application/json"):
        texts.append(body.decode("utf-8", "replace"))
    elif content_type.startswith("text/event-stream"):
        data: list[str] = []
        for line in body.decode("utf-8", "replace").replace("\r\n", "\n").split("\n"):
            if line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
            elif line == "" and data:
                texts.append("\n".join(data))
                data = []
        if data:
            texts.append("\n".join(data))
    out = []
    for text in texts:
        try:
            msg = json.loads(text)
        except ValueError:
            out.append({"unparsed": text[:200]})
            continue
        for m in msg if isinstance(msg, list) else [msg]:
            if not isinstance(m, dict):
                continue
            rec = {"id": m.get("id"), "method": m.get("method"), "has_result": "result" in m,
                   "bytes": len(text)}
            if "error" in m:
                rec["error"] = m["error"]
            result = m.get("result")
            if isinstance(result, dict) and "protocolVersion" in result:
                rec["protocol_version"] = result["protocolVersion"]
            out.append(rec)
    return out


class Counted(httpx.AsyncByteStream):
    """A response body passed through unchanged, its chunks recorded in `entry`."""

    def __init__(self, inner, entry: dict) -> None:
        self.inner = inner
        self.entry = entry
        self.body = bytearray()

    async def __aiter__(self):
        e = self.entry
        try:
            async for chunk in self.inner:
                now = time.time()
                e["bytes"] += len(chunk)
                if len(e["chunks"]) < CHUNK_RECORDS_CAP:
                    e["chunks"].append({"t": now, "n": len(chunk), "head": chunk[:80].decode("utf-8", "replace")})
                if len(self.body) < BODY_CAP:
                    self.body.extend(chunk[: BODY_CAP - len(self.body)])
                yield chunk
            self.finish("eof")
        except BaseException as exc:
            self.finish(f"error: {exc!r}")
            raise

    def finish(self, how: str) -> None:
        e = self.entry
        if e["ended"] is None:
            e["ended"] = time.time()
            e["end"] = how
            if e["method"] == "POST" or (e["method"] == "GET" and e["status"] != 200):
                e["answers"] = answers_in(e["content_type"] or "", bytes(self.body))
            if e["status"] != 200 and e["method"] != "DELETE":
                e["body_text"] = bytes(self.body[:600]).decode("utf-8", "replace")

    async def aclose(self) -> None:
        self.finish("closed by the client")
        await self.inner.aclose()


class Recording(httpx.AsyncBaseTransport):
    def __init__(self, log: list) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.log = log

    async def handle_async_request(self, request):
        entry = {
            "t": time.time(),
            "method": request.method,
            "path": request.url.raw_path.decode(),
            "status": None,
            "content_type": None,
            "sent_session_id": request.headers.get("mcp-session-id"),
            "session_get": None,
            "rpc_method": None,
            "rpc_id": None,
            "bytes": 0,
            "chunks": [],
            "ended": None,
            "end": None,
        }
        method, rpc_id = rpc_of(request.content)
        if method != "batch":
            entry["rpc_method"], entry["rpc_id"] = method, rpc_id
        self.log.append(entry)
        try:
            response = await self.inner.handle_async_request(request)
        except BaseException as exc:
            entry["ended"] = time.time()
            entry["end"] = f"error: {exc!r}"
            raise
        entry["status"] = response.status_code
        entry["content_type"] = response.headers.get("content-type")
        entry["session_get"] = response.headers.get("mcp-session-id")
        response.stream = Counted(response.stream, entry)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


class SdkLog(logging.Handler):
    def __init__(self, out: list) -> None:
        super().__init__(logging.INFO)
        self.out = out

    def emit(self, record) -> None:
        if len(self.out) < 200:
            self.out.append({"t": record.created, "logger": record.name, "level": record.levelname,
                             "message": record.getMessage()[:300]})


class Run:
    def __init__(self, args, out: dict) -> None:
        self.args = args
        self.out = out
        self.http: list[dict] = out["http"]
        self.pause_t = None  # when the last pause began (PAUSE printed)
        self.mark_t = time.time()  # the last pause's end (or the start)
        self.call = None
        self.list_tools = None
        self.session_id = None

    def sse_session_id(self):
        """Legacy SSE: the session is the `session_id` query parameter of the endpoint the server announced."""
        for h in reversed(self.http):
            if h["method"] == "POST" and "?" in h["path"]:
                ids = parse_qs(h["path"].split("?", 1)[1]).get("session_id")
                if ids:
                    return ids[0]
        return None

    async def step_call(self, label: str) -> dict:
        rec = {"step": "call", "label": label, "message": label, "started": time.time()}
        t0 = time.monotonic()
        n_http = len(self.http)
        arguments = {"sender": self.args.sender, "message": label, "channel": "general", "choices": []}
        await record_call(rec, self.call, "chat_send", arguments)
        rec["elapsed_ms"] = (time.monotonic() - t0) * 1000
        rec["session_id"] = self.session_id()
        # The POSTs this call made, described at the end (see `describe_posts`).
        rec["http_range"] = [n_http, len(self.http)]
        return rec

    async def step_read(self, label: str) -> dict:
        rec = {"step": "read", "label": label}
        await record_call(rec, self.call, "chat_read", {"sender": self.args.sender, "channel": "general"})
        rec["session_id"] = self.session_id()
        return rec

    async def step_list(self, label: str) -> dict:
        rec = {"step": "list", "label": label}
        try:
            tools = await self.list_tools()
            rec["tools"] = [t.name for t in tools.tools]
        except Exception as e:  # noqa: BLE001
            rec["error"] = error_of(e)
        rec["session_id"] = self.session_id()
        return rec

    def gets(self) -> list[dict]:
        out = []
        for h in self.http:
            if h["method"] != "GET":
                continue
            after = [c for c in h["chunks"] if c["t"] > self.mark_t]
            out.append({
                "opened": h["t"],
                "status": h["status"],
                "sent_session_id": h["sent_session_id"],
                "ended": h["ended"],
                "end": h["end"],
                "opened_after_mark": h["t"] > self.mark_t,
                "opened_before_pause": self.pause_t is not None and h["t"] < self.pause_t,
                "bytes": h["bytes"],
                "bytes_after_mark": sum(c["n"] for c in after),
                "first_after_mark": after[0] if after else None,
                "body_text": h.get("body_text"),
            })
        return out

    async def step_stream(self, label: str, secs: float) -> dict:
        rec = {"step": "stream", "label": label, "pause": self.pause_t, "mark": self.mark_t}
        t0 = time.monotonic()
        with anyio.move_on_after(secs):
            while not any(g["bytes_after_mark"] for g in self.gets()):
                await anyio.sleep(0.05)
        rec["waited_ms"] = (time.monotonic() - t0) * 1000
        rec["gets"] = self.gets()
        rec["at"] = time.time()
        rec["session_id"] = self.session_id()
        return rec

    async def step_pause(self, name: str) -> dict:
        self.pause_t = time.time()
        await pause(name)
        self.mark_t = time.time()
        return {"step": "pause", "label": name, "paused": self.pause_t, "resumed": self.mark_t}

    async def steps(self) -> None:
        self.out["session_id_at_start"] = self.session_id()
        for step in self.args.steps.split(","):
            kind, _, rest = step.partition(":")
            if kind == "call":
                rec = await self.step_call(rest)
            elif kind == "list":
                rec = await self.step_list(rest)
            elif kind == "read":
                rec = await self.step_read(rest)
            elif kind == "stream":
                label, _, secs = rest.partition(":")
                rec = await self.step_stream(label, float(secs or 0))
            elif kind == "pause":
                rec = await self.step_pause(rest)
            else:
                raise ValueError(f"unknown step {step!r}")
            self.out["steps"].append(rec)
        self.out["session_id_at_end"] = self.session_id()

    def make_http_client(self, headers=None, timeout=None, auth=None):
        return httpx.AsyncClient(
            headers={"Authorization": "Bearer spoof", **(headers or {})},
            timeout=timeout or httpx.Timeout(30, read=300),
            auth=auth,
            follow_redirects=True,
            transport=Recording(self.http),
        )

    def stdio_server(self):
        argv = json.loads(self.args.url)
        env = {"RUST_LOG": os.environ.get("RUST_LOG", "debug")}
        return StdioServerParameters(command=argv[0], args=argv[1:], env=env)

    async def run(self) -> None:
        timeout = timedelta(seconds=CALL_TIMEOUT_S)
        if SDK_MAJOR == 1 and self.args.transport == "stdio":
            async with stdio_client(self.stdio_server()) as (read, write):
                async with ClientSession(read, write) as session:
                    init = await session.initialize()
                    self.out["protocol_version"] = init.protocolVersion
                    self.session_id = lambda: None
                    self.call = lambda name, a: session.call_tool(name, a, read_timeout_seconds=timeout)
                    self.list_tools = session.list_tools
                    await self.steps()
        elif self.args.transport == "stdio":
            async with Client(self.stdio_server()) as client:
                self.session_id = lambda: None
                self.call = lambda name, a: client.call_tool(name, a, read_timeout_seconds=CALL_TIMEOUT_S)
                self.list_tools = client.list_tools
                await self.steps()
        elif SDK_MAJOR == 1 and self.args.transport == "sse":
            async with sse_client(self.args.url, httpx_client_factory=self.make_http_client) as (read, write):
                async with ClientSession(read, write) as session:
                    init = await session.initialize()
                    self.out["protocol_version"] = init.protocolVersion
                    self.session_id = self.sse_session_id
                    self.call = lambda name, a: session.call_tool(name, a, read_timeout_seconds=timeout)
                    self.list_tools = session.list_tools
                    await self.steps()
        elif SDK_MAJOR == 1:
            async with self.make_http_client() as http_client:
                async with streamable_http_client(self.args.url, http_client=http_client) as (read, write, get_id):
                    async with ClientSession(read, write) as session:
                        init = await session.initialize()
                        self.out["protocol_version"] = init.protocolVersion
                        self.session_id = get_id
                        self.call = lambda name, a: session.call_tool(name, a, read_timeout_seconds=timeout)
                        self.list_tools = session.list_tools
                        await self.steps()
        else:
            if self.args.transport != "streamable-http":
                raise ValueError("the 2.x client is driven on streamable HTTP only")
            async with self.make_http_client() as http_client:
                transport = streamable_http_client(self.args.url, http_client=http_client)
                async with Client(transport) as client:
                    self.session_id = lambda: last_sent_session_id(self.http)
                    self.call = lambda name, a: client.call_tool(name, a, read_timeout_seconds=CALL_TIMEOUT_S)
                    self.list_tools = client.list_tools
                    await self.steps()
        self.out["closed"] = True


def describe_posts(out: dict) -> None:
    """Each call step's tools/call POSTs: the JSON-RPC id sent, and the messages their answers carried (the
    legacy SSE answers travel on the GET stream instead, so their POSTs carry none)."""
    for rec in out["steps"]:
        lo, hi = rec.pop("http_range", (0, 0))
        if rec["step"] == "call":
            rec["posts"] = [
                {"rpc_id": h["rpc_id"], "status": h["status"], "answers": h.get("answers"), "end": h["end"]}
                for h in out["http"][lo:hi]
                if h["method"] == "POST" and h["rpc_method"] == "tools/call"
            ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--steps", required=True)
    parser.add_argument("--transport", default="streamable-http", choices=["streamable-http", "sse", "stdio"])
    parser.add_argument("--sender", default="mallory")
    parser.add_argument("--timeout", type=float, default=60, help="bound on the whole run, pauses included")
    args = parser.parse_args()
    out: dict = {"sdk": version("mcp"), "sdk_major": SDK_MAJOR, "transport": args.transport, "http": [],
                 "steps": [], "sdk_log": [], "error": None}
    handler = SdkLog(out["sdk_log"])
    mcp_logger = logging.getLogger("mcp")
    mcp_logger.addHandler(handler)
    mcp_logger.setLevel(logging.INFO)
    out["elapsed_ms"] = run_reported(Run(args, out).run, args.timeout, out)
    describe_posts(out)
    for h in out["http"]:  # chunk lists only for GET streams: the rest is summarised
        if h["method"] != "GET":
            h.pop("chunks", None)
    print_result(out)


if __name__ == "__main__":
    main()
