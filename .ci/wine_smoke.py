#!/usr/bin/env python3
"""Smoke run of the Windows build under wine against a Linux upstream.

Usage: wine_smoke.py PATH/TO/mcp-identity-proxy.exe [WINE]

Checks what a Windows user of agentchattr would hit first: keep-alive reuse,
a 1 MiB request body and a 1 MiB response body, an SSE stream relayed as it
arrives, a stamped tools/call with the token injected, a new identity over
--control-stdin, the 403 DNS-rebinding guard, shutdown by stdin EOF and by
Ctrl-C, exit status 2 (bad arguments, --control-stdin on a file) and 3 (port
in use); an https:// upstream (tests/support/tls_upstream.py with certificates
made by tests/support/make_tls_certs.sh): answers over one TLS handshake, and
an unknown issuer answered 502; and --stdio, where stdin and stdout are the
host's pipes: initialize, tools/list and a stamped tools/call as JSON-RPC
lines, nothing else on stdout, exit 0 at stdin's end; --token-command with a
Windows program (cmd.exe) as the child. Standard library only (and the openssl
command); exits non-zero on the first failure.
"""

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

EXE = sys.argv[1]
WINE = sys.argv[2] if len(sys.argv) > 2 else "/usr/lib/wine/wine64"
TOKEN = "smoke-token-7f3a-SECRET"
BIG = 1024 * 1024
# wine's first start of a prefix can take a while; later ones are quick.
START_LIMIT = 60.0

seen = []  # (path, headers dict, body bytes) of every upstream request
seen_lock = threading.Lock()


class Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def record(self, body):
        with seen_lock:
            seen.append((self.path, {k.lower(): v for k, v in self.headers.items()}, body))

    def send(self, status, ctype, body):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.record(body)
        try:
            msg = json.loads(body)
            rid = msg.get("id") if isinstance(msg, dict) else None
            method = msg.get("method") if isinstance(msg, dict) else None
        except ValueError:
            msg, rid, method = None, None, None
        if isinstance(msg, dict) and method is not None and "id" not in msg:
            # A notification: accepted, never answered (MCP streamable HTTP).
            self.send(202, "text/plain", b"")
            return
        result = {"received": len(body)}
        if method == "tools/list":
            result = {"tools": [{"name": "chat_send", "inputSchema": {"type": "object"}}]}
        answer = {"jsonrpc": "2.0", "id": rid, "result": result}
        self.send(200, "application/json", json.dumps(answer).encode())

    def do_GET(self):
        self.record(b"")
        if self.path == "/mcp":
            # No standalone stream on the MCP endpoint (the stdio front-end asks for one).
            self.send(405, "text/plain", b"")
        elif self.path == "/big":
            self.send(200, "application/octet-stream", b"x" * BIG)
        elif self.path == "/sse":
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for i in range(3):
                self.wfile.write(f"event: message\ndata: tick {i} {time.monotonic():.3f}\n\n".encode())
                self.wfile.flush()
                time.sleep(0.5)
            self.close_connection = True
        else:
            self.send(200, "application/json", b'{"ok":true}')


def fail(msg, proc=None):
    print(f"FAIL: {msg}")
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        print("--- proxy stderr (tail)\n" + err[-3000:])
    sys.exit(1)


def env():
    e = dict(os.environ)
    e.setdefault("WINEDEBUG", "-all")
    e["MCP_PROXY_TOKEN"] = TOKEN
    e["RUST_LOG"] = "info"
    return e


def start(upstream_port, extra=(), stdin=subprocess.PIPE, url=None):
    url = url or f"http://127.0.0.1:{upstream_port}/mcp"
    args = [WINE, EXE, "--upstream", url, "--agent", "win-agent"]
    proc = subprocess.Popen(
        args + list(extra), stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env()
    )
    # A reader thread for the port line: the pipe may stay silent.
    line = []
    t = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
    t.start()
    t.join(START_LIMIT)
    if not line:
        fail(f"no port line within {START_LIMIT} s", proc)
    text = line[0].decode(errors="replace")
    if not text.startswith("  MCP proxy: port "):
        fail(f"unexpected first line {text!r}", proc)
    return proc, int(text.split()[-1])


def wait_exit(proc, limit, what):
    try:
        return proc.wait(limit)
    except subprocess.TimeoutExpired:
        fail(f"no exit {limit} s after {what}", proc)


def post_json(conn, port, payload, host=None):
    body = json.dumps(payload).encode()
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Host": host or f"127.0.0.1:{port}",
        "Authorization": "Bearer client-supplied",
    }
    conn.request("POST", "/mcp", body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read()


def check(cond, msg, proc):
    if not cond:
        fail(msg, proc)
    print(f"ok: {msg}")


def last_tools_call():
    with seen_lock:
        for path, headers, body in reversed(seen):
            if b"tools/call" in body:
                return headers, json.loads(body)
    return None, None


def main():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    up = server.server_address[1]
    t0 = time.monotonic()

    proc, port = start(up, ["--control-stdin"])
    print(f"ok: proxy.exe listening on port {port} ({time.monotonic() - t0:.1f} s to start)")

    # Keep-alive: three requests on one connection, each answered at once
    # (a read that is not drained to WouldBlock stalls the second one).
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    for i in range(3):
        t = time.monotonic()
        status, body = post_json(conn, port, {"jsonrpc": "2.0", "id": i, "method": "ping"})
        check(status == 200 and json.loads(body)["id"] == i and time.monotonic() - t < 2,
              f"keep-alive request {i + 1} on one connection answered in {time.monotonic() - t:.2f} s", proc)
    sock_before = conn.sock
    post_json(conn, port, {"jsonrpc": "2.0", "id": 9, "method": "ping"})
    check(conn.sock is sock_before and sock_before is not None, "the client connection was reused", proc)

    # A 1 MiB request body (scanned whole) and a 1 MiB response body.
    t = time.monotonic()
    status, body = post_json(conn, port, {"jsonrpc": "2.0", "id": 10, "method": "ping", "params": {"pad": "p" * BIG}})
    check(status == 200 and json.loads(body)["result"]["received"] > BIG,
          f"1 MiB request body relayed in {time.monotonic() - t:.2f} s", proc)
    t = time.monotonic()
    conn.request("GET", "/big", headers={"Host": f"127.0.0.1:{port}"})
    resp = conn.getresponse()
    data = resp.read()
    check(resp.status == 200 and len(data) == BIG, f"1 MiB response body relayed in {time.monotonic() - t:.2f} s", proc)

    # SSE: each event arrives while the upstream is still sending.
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(f"GET /sse HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: text/event-stream\r\n\r\n".encode())
    got, first_at, t = b"", None, time.monotonic()
    while got.count(b"data: tick") < 3:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
        if first_at is None and b"data: tick 0" in got:
            first_at = time.monotonic() - t
    s.close()
    check(got.count(b"data: tick") == 3 and first_at is not None and first_at < 0.9,
          f"SSE: 3 events relayed, the first after {first_at} s (the stream lasts 1.5 s)", proc)

    # A stamped tools/call: sender overwritten, the client's credential replaced.
    status, _ = post_json(conn, port, {"jsonrpc": "2.0", "id": 20, "method": "tools/call",
                                       "params": {"name": "chat_send", "arguments": {"sender": "spoof", "message": "hi"}}})
    headers, msg = last_tools_call()
    check(status == 200 and msg["params"]["arguments"]["sender"] == "win-agent",
          "tools/call stamped with the agent name", proc)
    check(headers.get("authorization") == f"Bearer {TOKEN}", "the token injected as Authorization", proc)

    # A new identity over --control-stdin applies to the next request.
    proc.stdin.write(b'{"agent": "renamed-agent", "token": "smoke-token-2"}\n')
    proc.stdin.flush()
    deadline = time.monotonic() + 5
    while True:
        post_json(conn, port, {"jsonrpc": "2.0", "id": 21, "method": "tools/call",
                               "params": {"name": "chat_send", "arguments": {"message": "again"}}})
        headers, msg = last_tools_call()
        if msg["params"]["arguments"].get("sender") == "renamed-agent" or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    check(msg["params"]["arguments"].get("sender") == "renamed-agent"
          and headers.get("authorization") == "Bearer smoke-token-2", "rename over --control-stdin applied", proc)
    conn.close()

    # DNS rebinding: a foreign Host gets 403 and nothing reaches upstream.
    before = len(seen)
    c2 = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    status, _ = post_json(c2, port, {"jsonrpc": "2.0", "id": 30, "method": "ping"}, host=f"evil.example:{port}")
    c2.close()
    check(status == 403 and len(seen) == before, "a rebinding Host gets 403 before any upstream contact", proc)

    # Stop by stdin EOF.
    proc.stdin.close()
    code = wait_exit(proc, 15, "stdin EOF")
    err = proc.stderr.read().decode(errors="replace")
    check(code == 0 and "control stdin closed" in err and "shutdown complete" in err,
          f"stdin EOF: graceful shutdown, exit status {code}", None)
    check(TOKEN not in err and "smoke-token-2" not in err, "no token in the log", None)

    # Stop by Ctrl-C: wine turns SIGINT into CTRL_C_EVENT for the console handler.
    proc, port = start(up, [])
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    code = wait_exit(proc, 15, "Ctrl-C (SIGINT to wine)")
    err = proc.stderr.read().decode(errors="replace")
    check(code == 0 and "shutting down" in err and "shutdown complete" in err,
          f"Ctrl-C: graceful shutdown through the console handler, exit status {code}", None)

    # Exit 2: bad arguments, and --control-stdin on a regular file.
    r = subprocess.run([WINE, EXE, "--agent", "a"], capture_output=True, env=env(), timeout=60)
    check(r.returncode == 2, f"missing --upstream: exit status {r.returncode}", None)
    with tempfile.TemporaryFile() as f:
        f.write(b'{"agent": "a", "token": "b"}\n')
        f.seek(0)
        r = subprocess.run([WINE, EXE, "--upstream", f"http://127.0.0.1:{up}/mcp", "--agent", "a", "--control-stdin"],
                           stdin=f, capture_output=True, env=env(), timeout=60)
    check(r.returncode == 2 and b"--control-stdin: stdin must be" in r.stderr,
          f"--control-stdin on a file: exit status {r.returncode}: {r.stderr.decode(errors='replace').strip()}", None)
    r = subprocess.run([WINE, EXE, "--upstream", f"http://127.0.0.1:{up}/mcp", "--agent", "a", "--control-stdin"],
                       stdin=subprocess.DEVNULL, capture_output=True, env=env(), timeout=60)
    check(r.returncode == 2 and b"--control-stdin: stdin must be" in r.stderr,
          f"--control-stdin on NUL: exit status {r.returncode}: {r.stderr.decode(errors='replace').strip()}", None)

    # Exit 3: a fixed port already in use.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    busy = taken.getsockname()[1]
    r = subprocess.run([WINE, EXE, "--upstream", f"http://127.0.0.1:{up}/mcp", "--agent", "a",
                        "--listen", f"127.0.0.1:{busy}"], capture_output=True, env=env(), timeout=60)
    taken.close()
    check(r.returncode == 3 and f"  MCP proxy: port {busy} in use".encode() in r.stdout,
          f"port in use: exit status {r.returncode}, stdout {r.stdout.decode(errors='replace').strip()!r}", None)

    stdio_smoke(up)
    token_command_smoke(up)
    tls_smoke()
    print(f"wine smoke run passed in {time.monotonic() - t0:.1f} s")


def token_command_smoke(up):
    """--token-command under wine: a Windows program (cmd.exe) run as a child, its stdout read through the pipe."""
    proc, port = start(up, ["--token-command", "cmd /c echo tok-wine-7f3a"])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    call = {"jsonrpc": "2.0", "id": 60, "method": "tools/call", "params": {"name": "chat_send", "arguments": {}}}
    status, body = post_json(conn, port, call)
    headers, _ = last_tools_call()
    check(status == 200 and headers.get("authorization") == "Bearer tok-wine-7f3a" and "x-agent-token" not in headers,
          "--token-command: cmd.exe's token in Authorization only", proc)
    conn.close()
    proc.send_signal(signal.SIGINT)
    code = wait_exit(proc, 15, "Ctrl-C (SIGINT to wine)")
    err = proc.stderr.read().decode(errors="replace")
    check(code == 0 and "tok-wine-7f3a" not in err, "--token-command: exit 0 at Ctrl-C, no token in the log", None)
    r = subprocess.run([WINE, EXE, "--upstream", f"http://127.0.0.1:{up}/mcp", "--agent", "win-agent",
                        "--token-command", "cmd /c exit 1"], capture_output=True, env=env(), timeout=60)
    check(r.returncode == 2 and b"--token-command gave no token at start" in r.stderr,
          f"--token-command that exits 1: exit status {r.returncode}", None)


def stdio_smoke(up):
    """--stdio under wine: the host's pipes on stdin and stdout, JSON-RPC lines both ways."""
    args = [WINE, EXE, "--upstream", f"http://127.0.0.1:{up}/mcp", "--agent", "win-agent", "--stdio"]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env())
    lines = []

    def read_lines():
        for line in proc.stdout:
            lines.append(line)

    threading.Thread(target=read_lines, daemon=True).start()

    def ask(msg, limit):
        proc.stdin.write(json.dumps(msg).encode() + b"\n")
        proc.stdin.flush()
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            for line in lines:
                answer = json.loads(line)
                if isinstance(answer, dict) and answer.get("id") == msg["id"]:
                    return answer
            time.sleep(0.05)
        fail(f"--stdio: no answer to {msg['method']} within {limit} s; stdout {lines!r}", proc)

    t = time.monotonic()
    init = ask({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                           "clientInfo": {"name": "wine-smoke", "version": "1"}}}, START_LIMIT)
    check("result" in init, f"--stdio: initialize answered on stdout in {time.monotonic() - t:.1f} s", proc)
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    listed = ask({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, 10)
    tools = [t.get("name") for t in listed.get("result", {}).get("tools", [])]
    check(tools == ["chat_send"], f"--stdio: tools/list answered: {tools}", proc)
    called = ask({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                  "params": {"name": "chat_send", "arguments": {"sender": "spoof", "message": "hi"}}}, 10)
    headers, msg = last_tools_call()
    check("result" in called and msg["params"]["arguments"]["sender"] == "win-agent"
          and headers.get("authorization") == f"Bearer {TOKEN}", "--stdio: tools/call stamped, the token injected", proc)
    proc.stdin.close()
    code = wait_exit(proc, 15, "--stdio: stdin EOF")
    time.sleep(0.2)
    every_line_jsonrpc = all(json.loads(line).get("jsonrpc") == "2.0" for line in lines)
    check(code == 0 and len(lines) == 3 and every_line_jsonrpc,
          f"--stdio: exit status {code} at stdin's end; stdout held the 3 answers and nothing else: {lines!r}", None)


def tls_smoke():
    """The .exe against an https:// upstream: rustls and ring built by mingw, run by wine."""
    here = os.path.dirname(os.path.abspath(__file__))
    support = os.path.join(here, "..", "tests", "support")
    certs = tempfile.mkdtemp(prefix="wine-tls-")
    subprocess.run(["bash", os.path.join(support, "make_tls_certs.sh"), certs], check=True, capture_output=True)
    server = subprocess.Popen([sys.executable, os.path.join(support, "tls_upstream.py"), "tls", certs],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        tls_port = int(server.stdout.readline().split()[-1])
        url = f"https://localhost:{tls_port}/mcp"
        # A Windows path to the Linux file: wine's Z: drive is the Unix root.
        ca = "Z:" + os.path.join(certs, "root.pem").replace("/", "\\")
        proc, port = start(0, ["--control-stdin", "--ca-file", ca], url=url)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        for i in range(3):
            status, body = post_json(conn, port, {"jsonrpc": "2.0", "id": 40 + i, "method": "ping"})
            check(status == 200 and json.loads(body)["id"] == 40 + i, f"https upstream: request {i + 1} answered", proc)
        conn.request("GET", "/stats", headers={"Host": f"127.0.0.1:{port}"})
        stats = json.loads(conn.getresponse().read())
        check(stats["handshakes"] == 1 and stats["agents"] == [TOKEN] * 4,
              f"https upstream: one TLS handshake for 4 requests, the token sent over TLS ({stats})", proc)
        conn.close()
        proc.stdin.close()
        wait_exit(proc, 15, "stdin EOF")
        # Without --ca-file the test CA is unknown: 502 with the id, the reason logged.
        proc, port = start(0, ["--control-stdin"], url=url)
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        status, body = post_json(conn, port, {"jsonrpc": "2.0", "id": 50, "method": "ping"})
        conn.close()
        proc.stdin.close()
        wait_exit(proc, 15, "stdin EOF")
        err = proc.stderr.read().decode(errors="replace")
        check(status == 502 and json.loads(body)["id"] == 50 and "UnknownIssuer" in err,
              "https upstream with an unknown issuer: 502 with the id, the reason logged", None)
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    try:
        main()
    except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError) as e:
        # A stalled relay shows up as a socket timeout here.
        print(f"FAIL: {type(e).__name__}: {e}")
        sys.exit(1)
