#!/usr/bin/env python3
"""One real agentchattr session through the installed package: run with the Python of a venv where the
wheel (and agentchattr's requirements) are installed, from nowhere near the source tree.

Usage: agentchattr_session.py AGENTCHATTR_TREE

Starts agentchattr's run.py from AGENTCHATTR_TREE (unpacked snapshot) on free ports with fresh data and
upload dirs, waits for its `Session token:` line, registers an agent as wrapper.py does
(POST /api/register {"base": "claude", "label": null, "ready_gate": false}), starts McpIdentityProxy from the
installed mcp_identity_proxy (the binary the wheel installed beside this Python: checked), and through it with
the mcp 1.x client (streamable HTTP): initialize, list the tools, chat_send to #general claiming another
sender. GET /api/messages (X-Session-Token) must then hold the message under the registered name. stop()
must end the proxy with exit 0. Exits non-zero on the first failure.
"""

import asyncio
import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.request
import uuid

from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

import mcp_identity_proxy
from mcp_identity_proxy import McpIdentityProxy

TREE = sys.argv[1]
START_LIMIT = 60.0


def fail(msg):
    print(f"agentchattr_session: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def http(method, url, body=None, headers=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json",
                                                                          **(headers or {})})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


def wait_listening(port, deadline):
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def main():
    binary = mcp_identity_proxy.find_binary()
    scripts = sysconfig.get_path("scripts")
    if os.path.dirname(binary) != scripts:
        fail(f"find_binary() gave {binary}, not the wheel's binary in {scripts}")
    print(f"agentchattr_session: package {mcp_identity_proxy.__file__}, binary {binary}")

    web, mcp_http, mcp_sse = free_ports(3)
    scratch = tempfile.mkdtemp(prefix="agentchattr-session-")
    server = subprocess.Popen(
        [sys.executable, "run.py", "--port", str(web), "--mcp-http-port", str(mcp_http),
         "--mcp-sse-port", str(mcp_sse), "--data-dir", os.path.join(scratch, "data"),
         "--upload-dir", os.path.join(scratch, "uploads")],
        cwd=TREE, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))
    log = []
    token_box = []

    def read_output():
        for raw in server.stdout:
            line = raw.decode("utf-8", "replace").rstrip()
            log.append(line)
            if "Session token:" in line and not token_box:
                token_box.append(line.split("Session token:", 1)[1].strip())

    threading.Thread(target=read_output, daemon=True).start()
    proxy = None
    try:
        deadline = time.monotonic() + START_LIMIT
        while not token_box and time.monotonic() < deadline and server.poll() is None:
            time.sleep(0.05)
        if not token_box:
            fail("run.py printed no `Session token:` line\n" + "\n".join(log[-40:]))
        session_token = token_box[0]
        if not (wait_listening(web, deadline) and wait_listening(mcp_http, deadline)):
            fail(f"run.py is not listening on {web} and {mcp_http}\n" + "\n".join(log[-40:]))

        reg = http("POST", f"http://127.0.0.1:{web}/api/register",
                   {"base": "claude", "label": None, "ready_gate": False})
        name, token = reg["name"], reg["token"]
        print(f"agentchattr_session: registered as {name!r} (slot {reg.get('slot')})")

        proxy = McpIdentityProxy(f"http://127.0.0.1:{mcp_http}", "/mcp", name, token)
        if proxy.start() is not True:
            fail("McpIdentityProxy.start() did not return True")
        if proxy._proc.args[0] != binary:
            fail(f"the proxy ran {proxy._proc.args[0]}, not {binary}")

        text = f"dist-check {uuid.uuid4()}"

        async def session():
            async with streamable_http_client(f"{proxy.url}/mcp") as (read, write, _):
                async with ClientSession(read, write) as s:
                    init = await s.initialize()
                    tools = [t.name for t in (await s.list_tools()).tools]
                    result = await s.call_tool("chat_send", {"message": text, "channel": "general",
                                                             "sender": "mallory"})
                    return init, tools, result

        init, tools, result = asyncio.run(asyncio.wait_for(session(), 60))
        print(f"agentchattr_session: initialize -> {init.serverInfo.name} {init.protocolVersion}; "
              f"{len(tools)} tools")
        if "chat_send" not in tools:
            fail(f"no chat_send in {tools}")
        result_text = " ".join(getattr(c, "text", "") for c in result.content)
        if result.isError or "Error" in result_text:
            fail(f"chat_send answered {result_text!r}")

        messages = http("GET", f"http://127.0.0.1:{web}/api/messages?channel=general",
                        headers={"X-Session-Token": session_token})
        mine = [m for m in messages if m.get("text") == text]
        if len(mine) != 1:
            fail(f"the message is not stored once in #general: {mine} (of {len(messages)})")
        if mine[0].get("sender") != name:
            fail(f"stored under {mine[0].get('sender')!r}, not the registered {name!r}")
        print(f"agentchattr_session: chat_send stored in #general under {name!r} (claimed 'mallory')")

        proxy.stop()
        if proxy.returncode != 0:
            fail(f"the proxy exited {proxy.returncode} at stop()")
        proxy = None
        print("agentchattr_session: OK")
    finally:
        if proxy is not None:
            proxy.stop()
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
