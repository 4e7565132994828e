#!/usr/bin/env python3
"""A scripted MCP session through one proxy binary, run as `RUNNER... BINARY` (e.g. under qemu user
emulation, for a binary of another CPU).

Usage: proxy_smoke.py BINARY [RUNNER ...]

A stdlib http.server stub upstream answers initialize (with an Mcp-Session-Id), notifications/initialized
(202) and tools/call; the proxy runs with --control-stdin in front of it. Checks: `--version`; the port
line; initialize answered 200 with one session header; the follow-up carries the session id upstream; the
tools/call reaches the upstream with the agent's name stamped over a forged sender and the agent's token in
place of the client's; a new identity over stdin applies to the next call; stdin EOF stops the proxy with
exit 0. Standard library only; exits non-zero on the first failure.
"""

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BINARY = sys.argv[1]
RUNNER = sys.argv[2:]
TOKEN = "smoke-token-SECRET-1"
# Emulation is slow to start; a native run takes milliseconds.
LIMIT = 30.0

seen = []
seen_lock = threading.Lock()


def fail(msg):
    print(f"proxy_smoke: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        msg = json.loads(body)
        with seen_lock:
            seen.append(({k.lower(): v for k, v in self.headers.items()}, msg))
        method = msg.get("method")
        if method == "notifications/initialized":
            self.send_response(202)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "smoke-upstream", "version": "1"}}
        else:
            result = {"content": [{"type": "text", "text": "stored"}], "isError": False}
        answer = json.dumps({"jsonrpc": "2.0", "id": msg.get("id"), "result": result}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Mcp-Session-Id", "smoke-session-1")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def post(port, body, session=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=LIMIT)
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "Authorization": "Bearer client-forged-token", "X-Agent-Token": "client-forged-token"}
    if session:
        headers["Mcp-Session-Id"] = session
    conn.request("POST", "/mcp", body=json.dumps(body).encode(), headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheaders(), data


def main():
    version = subprocess.run([*RUNNER, BINARY, "--version"], capture_output=True, text=True, timeout=LIMIT)
    if version.returncode != 0 or not version.stdout.startswith("mcp-identity-proxy "):
        fail(f"--version: exit {version.returncode}, {version.stdout!r} {version.stderr!r}")
    print(f"proxy_smoke: {version.stdout.strip()}")

    upstream = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    env = dict(os.environ, MCP_PROXY_TOKEN=TOKEN)
    proc = subprocess.Popen(
        [*RUNNER, BINARY, "--upstream", f"http://127.0.0.1:{upstream.server_address[1]}/mcp",
         "--agent", "smoke-agent", "--control-stdin"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
        got = []
        reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
        reader.start()
        reader.join(LIMIT)
        line = got[0].decode().rstrip("\n") if got else ""
        if not line.startswith("  MCP proxy: port "):
            fail(f"no port line, got {line!r}")
        port = int(line.rsplit(" ", 1)[1])

        started = time.monotonic()
        status, headers, data = post(port, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "smoke", "version": "1"}}})
        sessions = [v for k, v in headers if k.lower() == "mcp-session-id"]
        if status != 200 or sessions != ["smoke-session-1"]:
            fail(f"initialize: {status}, session headers {sessions}, {data[:200]!r}")
        if json.loads(data)["result"]["serverInfo"]["name"] != "smoke-upstream":
            fail(f"initialize answer: {data[:200]!r}")
        status, _, _ = post(port, {"jsonrpc": "2.0", "method": "notifications/initialized"}, "smoke-session-1")
        if status != 202:
            fail(f"notifications/initialized: {status}")

        def call(expect_sender, expect_token):
            """None if the upstream saw the call as expected, else what went wrong."""
            status, _, data = post(port, {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "chat_send", "arguments": {"sender": "mallory", "message": "hi"}}}, "smoke-session-1")
            if status != 200 or json.loads(data)["result"]["isError"] is not False:
                return f"tools/call: {status} {data[:200]!r}"
            with seen_lock:
                headers, msg = seen[-1]
            sender = msg["params"]["arguments"].get("sender")
            if sender != expect_sender:
                return f"upstream saw sender {sender!r}, expected {expect_sender!r}"
            if headers.get("authorization") != f"Bearer {expect_token}" or headers.get("x-agent-token") != expect_token:
                return f"upstream saw credentials {headers.get('authorization')!r} / {headers.get('x-agent-token')!r}"
            if headers.get("mcp-session-id") != "smoke-session-1":
                return f"upstream saw session {headers.get('mcp-session-id')!r}"
            return None

        wrong = call("smoke-agent", TOKEN)
        if wrong:
            fail(wrong)
        proc.stdin.write(json.dumps({"agent": "smoke-agent-2", "token": "smoke-token-2"}).encode() + b"\n")
        proc.stdin.flush()
        # The new identity applies to the next request once the proxy has read the line: a call racing the
        # read may still carry the old one, so retry for a while.
        deadline = time.monotonic() + LIMIT
        while (wrong := call("smoke-agent-2", "smoke-token-2")) and time.monotonic() < deadline:
            time.sleep(0.1)
        if wrong:
            fail(f"after the new identity: {wrong}")
        exchange_ms = (time.monotonic() - started) * 1000
        proc.stdin.close()
        rc = proc.wait(timeout=LIMIT)
        if rc != 0:
            fail(f"exit status {rc} after stdin EOF")
        print(f"proxy_smoke: OK: initialize, notifications/initialized, tools/call stamped and re-keyed, "
              f"identity over stdin, exit 0 at stdin EOF ({exchange_ms:.0f} ms of exchanges)")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        upstream.shutdown()


if __name__ == "__main__":
    main()
