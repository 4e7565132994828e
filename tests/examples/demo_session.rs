//! The demo's moving parts, shared by `cargo run --example demo` and
//! `tests/it/demo.rs`: a small MCP chat server (std::net, one thread per
//! connection), the proxy in front of it through the library API, and a
//! scripted client that talks raw HTTP/1.1 to the proxy and records what it
//! saw on the wire. Nothing here unwraps network data: every failure is an
//! `io::Error` with a message.
#![allow(dead_code)] // the example and the test each use a different subset

use mcp_identity_proxy::config;
use mcp_identity_proxy::event_loop::Proxy;
use serde_json::{json, Value};
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The name the proxy stamps into every `tools/call`.
pub const AGENT: &str = "demo-agent";
/// Who the scripted client pretends to be.
pub const IMPOSTOR: &str = "mallory";
/// The credential the scripted client forges; the proxy must replace it.
pub const FORGED_TOKEN: &str = "mallory-guess";
/// The MCP endpoint, upstream and through the proxy (path-transparent).
pub const MCP_PATH: &str = "/mcp";
/// The protocol version the scripted client asks for.
pub const PROTOCOL_VERSION: &str = "2025-06-18";
const SUPPORTED_VERSIONS: [&str; 3] = ["2025-06-18", "2025-03-26", "2024-11-05"];

/// Bounds for the demo's own HTTP reader (the proxy has its own).
const MAX_HEAD: u64 = 64 * 1024;
const MAX_BODY: usize = 1024 * 1024;
const MAX_CHUNK_LINE: u64 = 4096;
/// Server-side keep-alive idle limit and client-side read/write limit.
const SERVER_IDLE: Duration = Duration::from_secs(120);
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// `n` groups of 16 hex digits from std's randomly keyed SipHash: unique
/// per run, good enough for a loopback demo (not a CSPRNG).
fn random_hex(groups: usize) -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    (0..groups)
        .map(|i| {
            let mut h = RandomState::new().build_hasher();
            h.write_usize(i);
            h.write_u128(nanos);
            h.write_u32(std::process::id());
            format!("{:016x}", h.finish())
        })
        .collect()
}

// ---------------------------------------------------------------------------
// A minimal HTTP/1.1 message reader, for both sides of the demo.

/// One request or response as read off the wire. Header lines are kept
/// verbatim and in order, so repeated lines stay visible.
#[derive(Debug, Clone)]
pub struct Message {
    pub start_line: String,
    /// `(name, value)` exactly as sent, including repeats.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Message {
    /// The first value of a field (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Every line of a field, rendered `name: value` as on the wire.
    pub fn header_lines(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(n, v)| format!("{n}: {v}"))
            .collect()
    }

    /// Status code and reason of a response.
    pub fn status(&self) -> io::Result<(u16, String)> {
        let mut parts = self.start_line.splitn(3, ' ');
        let _version = parts.next();
        let code = parts
            .next()
            .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| invalid(format!("bad status line {:?}", self.start_line)))?;
        Ok((code, parts.next().unwrap_or("").to_string()))
    }

    /// The JSON-RPC message in the body: plain JSON or the `data:` of the
    /// first SSE event.
    pub fn json(&self) -> io::Result<Value> {
        let is_sse = self.header("content-type").is_some_and(|t| t.starts_with("text/event-stream"));
        let bytes = if is_sse {
            let text = String::from_utf8_lossy(&self.body);
            let data: Vec<&str> = text
                .split("\n\n")
                .next()
                .unwrap_or("")
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            data.join("\n").into_bytes()
        } else {
            self.body.clone()
        };
        serde_json::from_slice(&bytes).map_err(|e| invalid(format!("body is not JSON: {e}")))
    }
}

/// Read one line (with its `\n`) of at most `limit` bytes.
fn read_line<R: BufRead>(r: &mut R, limit: u64) -> io::Result<String> {
    let mut line = Vec::new();
    r.take(limit).read_until(b'\n', &mut line)?;
    if line.last() != Some(&b'\n') {
        return Err(if line.is_empty() {
            io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed")
        } else {
            invalid("line too long or truncated")
        });
    }
    String::from_utf8(line).map_err(|_| invalid("header line is not UTF-8"))
}

/// Read one message. `Ok(None)` on a clean close before its first byte.
/// (The demo never sends HEAD, so a response body follows its framing.)
fn read_message<R: BufRead>(r: &mut R, is_response: bool) -> io::Result<Option<Message>> {
    if r.fill_buf()?.is_empty() {
        return Ok(None);
    }
    let mut budget = MAX_HEAD;
    let mut next_line = |r: &mut R| -> io::Result<String> {
        let line = read_line(r, budget)?;
        budget = budget.saturating_sub(line.len() as u64);
        Ok(line.trim_end_matches(['\r', '\n']).to_string())
    };
    let start_line = next_line(r)?;
    let mut headers = Vec::new();
    loop {
        let line = next_line(r)?;
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').ok_or_else(|| invalid(format!("bad header {line:?}")))?;
        headers.push((name.to_string(), value.trim().to_string()));
    }
    let mut msg = Message { start_line, headers, body: Vec::new() };
    let chunked =
        msg.header("transfer-encoding").is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
    let bodyless_status = is_response && msg.status().is_ok_and(|(c, _)| c < 200 || c == 204 || c == 304);
    if bodyless_status {
        return Ok(Some(msg));
    }
    if chunked {
        msg.body = read_chunked(r)?;
    } else if let Some(len) = msg.header("content-length") {
        let len: usize = len
            .parse()
            .ok()
            .filter(|n| *n <= MAX_BODY)
            .ok_or_else(|| invalid(format!("bad or too large content-length {len:?}")))?;
        msg.body = vec![0; len];
        r.read_exact(&mut msg.body)?;
    } else if is_response {
        r.take(MAX_BODY as u64).read_to_end(&mut msg.body)?;
    }
    Ok(Some(msg))
}

fn read_chunked<R: BufRead>(r: &mut R) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let line = read_line(r, MAX_CHUNK_LINE)?;
        let size = line.trim_end().split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16).map_err(|_| invalid("bad chunk size"))?;
        if size == 0 {
            // Trailer section, then the empty line.
            while !read_line(r, MAX_CHUNK_LINE)?.trim_end().is_empty() {}
            return Ok(body);
        }
        if body.len() + size > MAX_BODY {
            return Err(invalid("chunked body too large"));
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        read_line(r, 2)?;
    }
}

// ---------------------------------------------------------------------------
// The built-in MCP server.

/// What the server saw on one `tools/call`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub tool: String,
    pub sender: Option<String>,
    pub authorization: Option<String>,
    pub x_agent_token: Option<String>,
}

#[derive(Default)]
struct State {
    /// Session id -> client name from `initialize`.
    sessions: HashMap<String, String>,
    /// (sender, message), oldest first.
    messages: Vec<(String, String)>,
    calls: Vec<Seen>,
}

/// A streamable-HTTP MCP server at `/mcp` with three chat tools, which
/// requires `Authorization: Bearer <token>` on every `/mcp` request.
#[derive(Clone)]
pub struct DemoServer {
    pub addr: SocketAddr,
    pub token: String,
    state: Arc<Mutex<State>>,
}

impl DemoServer {
    /// Bind a loopback port and serve on background threads.
    pub fn start(token: String) -> io::Result<DemoServer> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let server = DemoServer { addr: listener.local_addr()?, token, state: Arc::default() };
        let accept = server.clone();
        thread::Builder::new().name("demo-server".into()).spawn(move || {
            for stream in listener.incoming().flatten() {
                let conn = accept.clone();
                let _ = thread::Builder::new()
                    .name("demo-server-conn".into())
                    .spawn(move || conn.serve_connection(stream));
            }
        })?;
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("http://{}{MCP_PATH}", self.addr)
    }

    /// Every `tools/call` seen so far.
    pub fn calls(&self) -> Vec<Seen> {
        self.lock().calls.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panicking connection thread cannot leave State half-updated in a
        // way that matters for a demo; keep serving.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn serve_connection(&self, stream: TcpStream) {
        let _ = stream.set_read_timeout(Some(SERVER_IDLE));
        let _ = stream.set_write_timeout(Some(SERVER_IDLE));
        let Ok(read_half) = stream.try_clone() else { return };
        let mut reader = BufReader::new(read_half);
        let mut writer = stream;
        // Keep-alive: the proxy pools upstream connections.
        while let Ok(Some(request)) = read_message(&mut reader, false) {
            let response = self.handle(&request);
            if writer.write_all(&response.to_bytes()).is_err() {
                return;
            }
            if request.header("connection").is_some_and(|c| c.eq_ignore_ascii_case("close")) {
                return;
            }
        }
    }

    fn handle(&self, req: &Message) -> Reply {
        let mut parts = req.start_line.split(' ');
        let method = parts.next().unwrap_or("");
        let target = parts.next().unwrap_or("");
        let path = target.split('?').next().unwrap_or("");
        if path != MCP_PATH {
            // OAuth discovery probes (/.well-known/...) and anything else.
            return Reply::json(404, "Not Found", json!({"error": "not found"}));
        }
        let expected = format!("Bearer {}", self.token);
        if req.header("authorization") != Some(expected.as_str()) {
            return Reply::rpc_error(401, "Unauthorized", -32001, "missing or wrong bearer token")
                .with("www-authenticate", "Bearer realm=\"demo\"");
        }
        let session = req.header("mcp-session-id").map(str::to_string);
        match method {
            "POST" => self.post(req, session),
            "DELETE" => match session {
                Some(id) if self.lock().sessions.remove(&id).is_some() => {
                    Reply::empty(200, "OK").with("mcp-session-id", &id)
                }
                Some(_) => Reply::rpc_error(404, "Not Found", -32001, "Session not found"),
                None => Reply::rpc_error(400, "Bad Request", -32000, "missing Mcp-Session-Id"),
            },
            // No server-initiated stream: the spec lets a server answer 405.
            "GET" => Reply::empty(405, "Method Not Allowed").with("allow", "POST, DELETE"),
            _ => Reply::empty(405, "Method Not Allowed").with("allow", "POST, DELETE"),
        }
    }

    fn post(&self, req: &Message, session: Option<String>) -> Reply {
        let msg: Value = match serde_json::from_slice(&req.body) {
            Ok(v) => v,
            Err(_) => return Reply::rpc_error(400, "Bad Request", -32700, "parse error"),
        };
        if !msg.is_object() {
            return Reply::rpc_error(400, "Bad Request", -32600, "one JSON-RPC object per POST");
        }
        let method = msg.get("method").and_then(Value::as_str).unwrap_or("");
        let id = msg.get("id").cloned();
        let sse = wants_sse(req.header("accept"));
        if method == "initialize" {
            let asked = msg.pointer("/params/protocolVersion").and_then(Value::as_str).unwrap_or("");
            let version = SUPPORTED_VERSIONS.iter().find(|v| **v == asked).unwrap_or(&SUPPORTED_VERSIONS[0]);
            let client = msg.pointer("/params/clientInfo/name").and_then(Value::as_str).unwrap_or("?");
            let session_id = random_hex(2);
            self.lock().sessions.insert(session_id.clone(), client.to_string());
            let result = json!({
                "protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": "demo-chat", "version": env!("CARGO_PKG_VERSION")},
                "instructions": "A demo chat room. chat_send posts, chat_read reads, chat_who lists senders.",
            });
            return Reply::result(id, result, sse).with("mcp-session-id", &session_id);
        }
        let Some(session) = session else {
            return Reply::rpc_error(400, "Bad Request", -32000, "missing Mcp-Session-Id");
        };
        if !self.lock().sessions.contains_key(&session) {
            return Reply::rpc_error(404, "Not Found", -32001, "Session not found");
        }
        let Some(id) = id.filter(|_| !method.is_empty()) else {
            // A notification or a response to us: accepted, no body.
            return Reply::empty(202, "Accepted").with("mcp-session-id", &session);
        };
        let reply = match method {
            "ping" => Reply::result(Some(id), json!({}), sse),
            "tools/list" => Reply::result(Some(id), json!({"tools": tool_list()}), sse),
            "tools/call" => match self.call_tool(req, &msg) {
                Ok(result) => Reply::result(Some(id), result, sse),
                Err(why) => Reply::rpc(
                    200,
                    "OK",
                    json!({"jsonrpc": "2.0", "id": id,
                    "error": {"code": -32602, "message": why}}),
                    sse,
                ),
            },
            _ => Reply::rpc(
                200,
                "OK",
                json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "method not found"}}),
                sse,
            ),
        };
        reply.with("mcp-session-id", &session)
    }

    fn call_tool(&self, req: &Message, msg: &Value) -> Result<Value, String> {
        let tool = msg.pointer("/params/name").and_then(Value::as_str).ok_or("params.name missing")?;
        let args = msg.pointer("/params/arguments").cloned().unwrap_or_else(|| json!({}));
        let arg = |k: &str| args.get(k).and_then(Value::as_str).map(str::to_string);
        let sender = arg("sender");
        let authorization = req.header("authorization").map(str::to_string);
        let x_agent_token = req.header("x-agent-token").map(str::to_string);
        let token =
            authorization.as_deref().and_then(|a| a.strip_prefix("Bearer ")).unwrap_or("").to_string();
        let mut state = self.lock();
        state.calls.push(Seen {
            tool: tool.to_string(),
            sender: sender.clone(),
            authorization: authorization.clone(),
            x_agent_token: x_agent_token.clone(),
        });
        let who = sender.clone().unwrap_or_default();
        let text = match tool {
            "chat_send" => {
                let Some(message) = arg("message") else {
                    return Ok(tool_error("chat_send needs 'message'"));
                };
                if who.is_empty() {
                    return Ok(tool_error("chat_send needs 'sender'"));
                }
                state.messages.push((who.clone(), message.clone()));
                format!("{who} said: {message}")
            }
            "chat_read" => {
                let lines: Vec<String> = state.messages.iter().map(|(s, m)| format!("{s}: {m}")).collect();
                if lines.is_empty() {
                    "(no messages yet)".to_string()
                } else {
                    lines.join("\n")
                }
            }
            "chat_who" => {
                let mut senders: Vec<&str> = state.messages.iter().map(|(s, _)| s.as_str()).collect();
                senders.sort_unstable();
                senders.dedup();
                format!(
                    "senders so far: {}",
                    if senders.is_empty() { "none".into() } else { senders.join(", ") }
                )
            }
            other => return Err(format!("unknown tool {other:?}")),
        };
        let seen = format!(
            "[server saw sender={} token={}]",
            sender.as_deref().unwrap_or("(none)"),
            if token.is_empty() { "(none)" } else { &token }
        );
        Ok(json!({
            "content": [{"type": "text", "text": format!("{text}\n{seen}")}],
            "structuredContent": {
                "sender": sender,
                "token": token,
                "x_agent_token": x_agent_token,
            },
            "isError": false,
        }))
    }
}

fn tool_error(text: &str) -> Value {
    json!({"content": [{"type": "text", "text": text}], "isError": true})
}

fn tool_list() -> Value {
    let sender = json!({"type": "string", "description": "your name (the proxy sets it)"});
    json!([
        {
            "name": "chat_send",
            "description": "Post a message to the demo chat room.",
            "inputSchema": {"type": "object", "properties": {"sender": sender,
                "message": {"type": "string"}}, "required": ["sender", "message"]},
        },
        {
            "name": "chat_read",
            "description": "Read every message in the demo chat room.",
            "inputSchema": {"type": "object", "properties": {"sender": sender}, "required": ["sender"]},
        },
        {
            "name": "chat_who",
            "description": "List who has posted so far.",
            "inputSchema": {"type": "object", "properties": {}},
        },
    ])
}

/// JSON unless the client accepts only an event stream.
fn wants_sse(accept: Option<&str>) -> bool {
    let accept = accept.unwrap_or("").to_ascii_lowercase();
    accept.contains("text/event-stream") && !accept.contains("application/json")
}

/// A response the server writes (always with Content-Length).
struct Reply {
    status: u16,
    reason: &'static str,
    headers: Vec<(&'static str, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn empty(status: u16, reason: &'static str) -> Reply {
        Reply { status, reason, headers: Vec::new(), body: Vec::new() }
    }

    fn json(status: u16, reason: &'static str, v: Value) -> Reply {
        Reply::rpc(status, reason, v, false)
    }

    fn rpc(status: u16, reason: &'static str, v: Value, sse: bool) -> Reply {
        let text = v.to_string();
        if sse {
            Reply {
                status,
                reason,
                headers: vec![
                    ("content-type", "text/event-stream".into()),
                    ("cache-control", "no-cache".into()),
                ],
                body: format!("event: message\ndata: {text}\n\n").into_bytes(),
            }
        } else {
            Reply {
                status,
                reason,
                headers: vec![("content-type", "application/json".into())],
                body: text.into(),
            }
        }
    }

    fn result(id: Option<Value>, result: Value, sse: bool) -> Reply {
        Reply::rpc(200, "OK", json!({"jsonrpc": "2.0", "id": id, "result": result}), sse)
    }

    /// A JSON-RPC error without `id`, as MCP servers send for HTTP-level errors.
    fn rpc_error(status: u16, reason: &'static str, code: i32, message: &str) -> Reply {
        Reply::json(status, reason, json!({"jsonrpc": "2.0", "error": {"code": code, "message": message}}))
    }

    fn with(mut self, name: &'static str, value: &str) -> Reply {
        self.headers.push((name, value.to_string()));
        self
    }

    fn to_bytes(&self) -> Vec<u8> {
        let mut out = format!("HTTP/1.1 {} {}\r\n", self.status, self.reason);
        // The server's own casing: the proxy must still send exactly one line.
        for (name, value) in &self.headers {
            let name = if *name == "mcp-session-id" { "Mcp-Session-Id" } else { name };
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        out.push_str(&format!("content-length: {}\r\n\r\n", self.body.len()));
        let mut bytes = out.into_bytes();
        bytes.extend_from_slice(&self.body);
        bytes
    }
}

// ---------------------------------------------------------------------------
// The proxy, through the library.

/// The demo server and the proxy in front of it, both running.
pub struct Demo {
    pub server: DemoServer,
    pub proxy_addr: SocketAddr,
    /// `Proxy::run` on its own thread; it returns after SIGINT/SIGTERM or
    /// `stop.shutdown()`.
    pub proxy_thread: JoinHandle<io::Result<()>>,
    pub stop: mcp_identity_proxy::event_loop::ShutdownHandle,
}

impl Demo {
    /// Start the server with a fresh token and the proxy for `AGENT`.
    pub fn start() -> io::Result<Demo> {
        let server = DemoServer::start(format!("demo-{}", random_hex(2)))?;
        let args = ["--upstream".to_string(), server.url(), "--agent".to_string(), AGENT.to_string()];
        // The token goes in as the environment value would (never argv).
        let config = config::parse(args, Some(server.token.clone()))
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let proxy = Proxy::bind(config)?;
        let proxy_addr = proxy.local_addr();
        let stop = proxy.shutdown_handle();
        let proxy_thread = thread::Builder::new().name("proxy".into()).spawn(move || proxy.run())?;
        Ok(Demo { server, proxy_addr, proxy_thread, stop })
    }

    pub fn proxy_url(&self) -> String {
        format!("http://{}{MCP_PATH}", self.proxy_addr)
    }
}

// ---------------------------------------------------------------------------
// The scripted client.

/// One request/response of the scripted session.
#[derive(Debug, Clone)]
pub struct Step {
    pub label: String,
    pub status: u16,
    pub reason: String,
    /// Every `Mcp-Session-Id` line of the response, verbatim.
    pub session_lines: Vec<String>,
    pub response: Message,
}

/// A raw HTTP/1.1 client on one keep-alive connection.
pub struct Client {
    addr: SocketAddr,
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> io::Result<Client> {
        let stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
        stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
        Ok(Client { addr, reader: BufReader::new(stream.try_clone()?), writer: stream })
    }

    /// Send one request and read its response.
    pub fn request(
        &mut self,
        method: &str,
        session: Option<&str>,
        extra_headers: &[(&str, &str)],
        body: Option<&Value>,
    ) -> io::Result<Message> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut head = format!(
            "{method} {MCP_PATH} HTTP/1.1\r\nHost: {}\r\nAccept: application/json, text/event-stream\r\n",
            self.addr
        );
        if !body.is_empty() {
            head.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
        }
        if let Some(id) = session {
            head.push_str(&format!("Mcp-Session-Id: {id}\r\nMCP-Protocol-Version: {PROTOCOL_VERSION}\r\n"));
        }
        for (name, value) in extra_headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
        self.writer.write_all(head.as_bytes())?;
        self.writer.write_all(body.as_bytes())?;
        read_message(&mut self.reader, true)?
            .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "proxy closed the connection"))
    }
}

/// The scripted session: what each step answered and what the server saw.
#[derive(Debug)]
pub struct Transcript {
    pub steps: Vec<Step>,
    pub session_id: String,
    pub tools: Vec<String>,
    /// The `tools/call` as the server recorded it.
    pub seen: Option<Seen>,
    /// `structuredContent` of the `tools/call` result.
    pub call_result: Value,
}

/// initialize, notifications/initialized, tools/list, a `chat_send` that
/// claims to be `IMPOSTOR` with a forged token, DELETE.
pub fn run_script(demo: &Demo) -> io::Result<Transcript> {
    let mut client = Client::connect(demo.proxy_addr)?;
    let mut steps = Vec::new();
    let mut record = |label: &str, response: Message| -> io::Result<Message> {
        let (status, reason) = response.status()?;
        let session_lines = response.header_lines("mcp-session-id");
        steps.push(Step {
            label: label.to_string(),
            status,
            reason,
            session_lines,
            response: response.clone(),
        });
        Ok(response)
    };

    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
        "clientInfo": {"name": "demo-script", "version": "1"}}});
    let response = record("POST initialize", client.request("POST", None, &[], Some(&init))?)?;
    let session_id = response
        .header("mcp-session-id")
        .map(str::to_string)
        .ok_or_else(|| invalid("initialize answered without Mcp-Session-Id"))?;
    let sid = Some(session_id.as_str());

    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    record("POST notifications/initialized", client.request("POST", sid, &[], Some(&initialized))?)?;

    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    let response = record("POST tools/list", client.request("POST", sid, &[], Some(&list))?)?;
    let tools = response.json()?;
    let tools: Vec<String> = tools
        .pointer("/result/tools")
        .and_then(Value::as_array)
        .map(|ts| ts.iter().filter_map(|t| t.get("name")?.as_str().map(str::to_string)).collect())
        .unwrap_or_default();

    let before = demo.server.calls().len();
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
        "name": "chat_send", "arguments": {"sender": IMPOSTOR, "message": "hello from the demo"}}});
    let forged_bearer = format!("Bearer {FORGED_TOKEN}");
    let forged = [("Authorization", forged_bearer.as_str()), ("X-Agent-Token", FORGED_TOKEN)];
    let response = record("POST tools/call chat_send", client.request("POST", sid, &forged, Some(&call))?)?;
    let call_result = response.json()?.pointer("/result/structuredContent").cloned().unwrap_or(Value::Null);
    let seen = demo.server.calls().get(before).cloned();

    record("DELETE /mcp", client.request("DELETE", sid, &[], None)?)?;
    Ok(Transcript { steps, session_id, tools, seen, call_result })
}

/// What must hold for the demo to count as working; empty when it does.
pub fn problems(t: &Transcript, token: &str) -> Vec<String> {
    let mut out = Vec::new();
    let want_status = [200, 202, 200, 200, 200];
    for (step, want) in t.steps.iter().zip(want_status) {
        if step.status != want {
            out.push(format!("{}: status {} (expected {want})", step.label, step.status));
        }
        if step.session_lines.len() != 1 {
            out.push(format!(
                "{}: {} Mcp-Session-Id lines (expected 1)",
                step.label,
                step.session_lines.len()
            ));
        }
    }
    if t.steps.len() != want_status.len() {
        out.push(format!("{} steps ran (expected {})", t.steps.len(), want_status.len()));
    }
    let bearer = format!("Bearer {token}");
    match &t.seen {
        None => out.push("the server recorded no tools/call".into()),
        Some(seen) => {
            if seen.sender.as_deref() != Some(AGENT) {
                out.push(format!("server saw sender {:?} (expected {AGENT:?})", seen.sender));
            }
            if seen.authorization.as_deref() != Some(bearer.as_str()) {
                out.push("server did not see the agent's token in Authorization".into());
            }
            if seen.x_agent_token.as_deref() != Some(token) {
                out.push("server did not see the agent's token in X-Agent-Token".into());
            }
        }
    }
    out
}

/// The transcript as the demo prints it.
pub fn render(t: &Transcript, token: &str) -> String {
    let mut out = String::new();
    for (i, step) in t.steps.iter().enumerate() {
        let session = match step.session_lines.as_slice() {
            [] => "no Mcp-Session-Id line".to_string(),
            [one] => format!("1 session line  {one}"),
            many => format!("{} session lines (!)  {}", many.len(), many.join(" | ")),
        };
        out.push_str(&format!(
            "  {}. {:<32} -> {} {:<9} {session}\n",
            i + 1,
            step.label,
            step.status,
            step.reason
        ));
        if step.label.starts_with("POST tools/list") {
            out.push_str(&format!("       tools: {}\n", t.tools.join(", ")));
        }
        if step.label.starts_with("POST tools/call") {
            out.push_str(&format!(
                "       client sent: sender \"{IMPOSTOR}\", Authorization: Bearer {FORGED_TOKEN}, X-Agent-Token: {FORGED_TOKEN}\n"
            ));
            if let Some(seen) = &t.seen {
                let auth = seen.authorization.as_deref().unwrap_or("(none)");
                let xat = seen.x_agent_token.as_deref().unwrap_or("(none)");
                out.push_str(&format!(
                    "       server saw:  sender \"{}\", Authorization: {auth}, X-Agent-Token: {xat}{}\n",
                    seen.sender.as_deref().unwrap_or("(none)"),
                    if xat == token { "  (the agent's token)" } else { "" }
                ));
            }
        }
    }
    out
}
