"""A stand-in https:// upstream for tests/it/tls.rs (Python's ssl module; no other package).

    python3 tls_upstream.py MODE CERTDIR [CERT] [--client-ca] [--bad-flag PATH]

Prints `port N` once listening on 127.0.0.1 (port 0: the OS picks), then serves until killed. MODE:
  tls     HTTP/1.1 keep-alive over TLS with CERTDIR/CERT.pem and .key (CERT: localhost by default):
            POST /mcp: a JSON-RPC answer with the request's id; `initialize` also gets Mcp-Session-Id: s1;
              method "stream": an event stream of 5 events, one chunk and one TLS record each, 300 ms apart,
              each carrying the time it was sent;
            GET /sse: a legacy endpoint event naming https://<the Host it was sent>/messages/?session_id=x;
            GET /stats: {"connections": C, "handshakes": H, "requests": R, "agents": [the X-Agent-Token seen]}.
          --client-ca: mutual TLS, a client certificate signed by CERTDIR/root.pem required.
          --bad-flag PATH: while PATH exists new connections get CERTDIR/expired.pem, and idle connections
            are closed (a certificate gone bad, as after a reload).
          --tls1.1: TLS 1.1 at most (no version in common with the proxy's 1.2 and 1.3).
  stall   accepts, reads the ClientHello and never answers.
  plain   answers every request with plain HTTP (no TLS on the port).
  cut     answers the ClientHello with the first bytes of a TLS record, then closes.
"""

import json
import os
import socket
import ssl
import sys
import threading
import time

mode, certdir = sys.argv[1], sys.argv[2]
rest = sys.argv[3:]
cert = rest[0] if rest and not rest[0].startswith("--") else "localhost"
client_ca = "--client-ca" in rest
bad_flag = rest[rest.index("--bad-flag") + 1] if "--bad-flag" in rest else None
old_only = "--tls1.1" in rest
stats = {"connections": 0, "handshakes": 0, "requests": 0, "agents": []}
lock = threading.Lock()


def context(name):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(os.path.join(certdir, name + ".pem"), os.path.join(certdir, name + ".key"))
    ctx.set_alpn_protocols(["http/1.1"])
    if old_only:
        ctx.minimum_version = ssl.TLSVersion.TLSv1
        ctx.maximum_version = ssl.TLSVersion.TLSv1_1
        ctx.set_ciphers("DEFAULT:@SECLEVEL=0")
    if client_ca:
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(os.path.join(certdir, "root.pem"))
    return ctx


good, bad = context(cert), context("expired")


def bump(key, value=1):
    with lock:
        if isinstance(stats[key], list):
            stats[key].append(value)
        else:
            stats[key] += value


def read_request(conn, buf):
    """One request (head, Content-Length body) or None at EOF; polls bad_flag while idle."""
    while b"\r\n\r\n" not in buf:
        if bad_flag and os.path.exists(bad_flag) and not buf:
            return None, buf
        try:
            data = conn.recv(65536)
        except socket.timeout:
            continue
        if not data:
            return None, buf
        buf += data
    head, _, buf = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target = lines[0].split(" ")[:2]
    fields = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        fields[k.strip().lower()] = v.strip()
    n = int(fields.get("content-length", "0"))
    conn.settimeout(None)
    while len(buf) < n:
        data = conn.recv(65536)
        if not data:
            return None, buf
        buf += data
    body, buf = buf[:n], buf[n:]
    return (method, target, fields, body), buf


def respond(conn, status, body, fields=()):
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in fields)
    conn.sendall(head.encode() + b"\r\n" + body)


def serve_tls(raw):
    bump("connections")
    ctx = bad if bad_flag and os.path.exists(bad_flag) else good
    try:
        conn = ctx.wrap_socket(raw, server_side=True)
    except (ssl.SSLError, OSError):
        return
    bump("handshakes")
    buf = b""
    try:
        while True:
            conn.settimeout(0.1)
            req, buf = read_request(conn, buf)
            if req is None:
                return
            method, target, fields, body = req
            bump("requests")
            bump("agents", fields.get("x-agent-token", ""))
            if target == "/stats":
                with lock:
                    respond(conn, "200 OK", json.dumps(stats).encode())
            elif target.startswith("/sse"):
                event = f"event: endpoint\r\ndata: https://{fields.get('host', '')}/messages/?session_id=x\r\n\r\n"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + event.encode()
                )
                time.sleep(0.5)
                return
            else:
                rpc = json.loads(body or b"{}")
                if rpc.get("method") == "stream":
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for i in range(5):
                        if i:
                            time.sleep(0.3)
                        event = f"event: message\ndata: {i} {time.time():.6f}\n\n".encode()
                        conn.sendall(b"%x\r\n%s\r\n" % (len(event), event))
                    conn.sendall(b"0\r\n\r\n")
                    continue
                answer = {"jsonrpc": "2.0", "id": rpc.get("id"), "result": {"method": rpc.get("method")}}
                extra = [("Mcp-Session-Id", "s1")] if rpc.get("method") == "initialize" else []
                respond(conn, "200 OK", json.dumps(answer).encode(), extra)
    except (ssl.SSLError, OSError):
        return
    finally:
        try:
            conn.close()
        except OSError:
            pass


def serve_other(raw):
    bump("connections")
    if mode == "stall":
        raw.recv(65536)
        time.sleep(3600)
    elif mode == "plain":
        raw.recv(65536)
        raw.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        time.sleep(0.2)
        raw.close()
    elif mode == "cut":
        raw.recv(65536)
        # A handshake record announcing 80 bytes, 6 of them sent.
        raw.sendall(b"\x16\x03\x03\x00\x50\x02\x00\x00\x4c\x03\x03")
        time.sleep(0.1)
        raw.close()


listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(f"port {listener.getsockname()[1]}", flush=True)
while True:
    raw, _ = listener.accept()
    target = serve_tls if mode == "tls" else serve_other
    threading.Thread(target=target, args=(raw,), daemon=True).start()
