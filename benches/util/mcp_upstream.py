"""The stand-in MCP upstream of benches/stdio.rs: streamable HTTP with JSON answers, Python's standard library
only, so that a call costs the server about 0.2 ms and what a bridge adds stands out.

    MCP_BENCH_TOKEN=... python3 mcp_upstream.py

Prints `PORT n` once listening on 127.0.0.1 (the OS picks the port), then serves until killed. HTTP/1.1
keep-alive, one thread per connection, each answer one write.

  POST /mcp   `Authorization: Bearer <MCP_BENCH_TOKEN>` required (401 otherwise). `initialize` opens a session
              (`Mcp-Session-Id`); every other request needs a live one (400 without, 404 for an unknown one).
              Notifications and responses: 202. `tools/list`: one tool, `chat_read`. `tools/call` `chat_read`:
              a text result `{"sender": <its sender argument>, "messages": []}`, so the caller can check the
              call arrived with the identity it expects. `ping`: `{}`. A batch gets a list of answers.
  GET /mcp    405: no server-to-client stream.
  DELETE /mcp the session ends (200).
"""

import http.server
import json
import os
import secrets
import threading

TOKEN = os.environ["MCP_BENCH_TOKEN"]
VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")
TOOL = {
    "name": "chat_read",
    "description": "Read chat messages (a stand-in: always none).",
    "inputSchema": {
        "type": "object",
        "properties": {"sender": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["sender"],
    },
}
sessions = set()
lock = threading.Lock()


def answer(message):
    """The answer to one JSON-RPC message, or None for a notification or a response."""
    if not isinstance(message, dict) or "method" not in message or "id" not in message:
        return None
    method, rid, params = message["method"], message["id"], message.get("params") or {}
    if method == "initialize":
        asked = params.get("protocolVersion")
        result = {
            "protocolVersion": asked if asked in VERSIONS else VERSIONS[0],
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "stdio-bench-upstream", "version": "1"},
        }
    elif method == "tools/list":
        result = {"tools": [TOOL]}
    elif method == "tools/call" and params.get("name") == TOOL["name"]:
        sender = (params.get("arguments") or {}).get("sender")
        text = json.dumps({"sender": sender, "messages": []})
        result = {"content": [{"type": "text", "text": text}], "isError": False}
    elif method == "ping":
        result = {}
    else:
        return {"jsonrpc": "2.0", "id": rid, "error": {"code": -32601, "message": f"no method {method}"}}
    return {"jsonrpc": "2.0", "id": rid, "result": result}


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *args):
        pass

    def handle(self):
        # mcp-remote (undici) sometimes resets its connection as it exits: not this server's error.
        try:
            super().handle()
        except ConnectionResetError:
            pass

    def reply(self, status, body=b"", fields=()):
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n"
        if body:
            head += "Content-Type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in fields)
        self.wfile.write(head.encode() + b"\r\n" + body)

    def read_body(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("Content-Length", "0")))

    def do_POST(self):
        body = self.read_body()
        if self.headers.get("Authorization", "") != f"Bearer {TOKEN}":
            return self.reply("401 Unauthorized", b'{"error": "bad or missing bearer token"}')
        try:
            message = json.loads(body)
        except ValueError:
            error = {"jsonrpc": "2.0", "id": None, "error": {"code": -32700, "message": "parse error"}}
            return self.reply("400 Bad Request", json.dumps(error).encode())
        batch = message if isinstance(message, list) else [message]
        session = self.headers.get("Mcp-Session-Id")
        fields = []
        if any(isinstance(m, dict) and m.get("method") == "initialize" for m in batch):
            session = secrets.token_hex(16)
            with lock:
                sessions.add(session)
            fields.append(("Mcp-Session-Id", session))
        elif session is None:
            return self.reply("400 Bad Request", b'{"error": "no Mcp-Session-Id"}')
        else:
            with lock:
                known = session in sessions
            if not known:
                return self.reply("404 Not Found", b'{"error": "unknown session"}')
        answers = [a for a in map(answer, batch) if a is not None]
        if not answers:
            return self.reply("202 Accepted", b"", fields)
        out = answers if isinstance(message, list) else answers[0]
        self.reply("200 OK", json.dumps(out).encode(), fields)

    def do_GET(self):
        self.reply("405 Method Not Allowed", b"", [("Allow", "POST, DELETE")])

    def do_DELETE(self):
        with lock:
            sessions.discard(self.headers.get("Mcp-Session-Id"))
        self.reply("200 OK")


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
print(f"PORT {server.server_address[1]}", flush=True)
server.serve_forever()
