//! A soak under faults: 16 clients calling a tool and 4 holding GET streams
//! through the proxy for a minute, while the upstream (a fake FastMCP server
//! whose sessions live in the memory of one process) is killed and restarted
//! on the same port every 2 to 5 s, sometimes staying down for 2 s first.
//!
//! Every request gets exactly one of these outcomes, each checked strictly:
//!
//! - answered: framed complete, for its id, with the result for its call;
//! - the server's 404: the restarted server lost the session, and the client
//!   initialises a new one (what the MCP specification asks of a client);
//! - a clean proxy error: 200 with a JSON-RPC error carrying the request's id
//!   (a request in a recorded session), 202 for a notification, or 502/504
//!   with a JSON-RPC error body;
//! - a visible cut: the connection closed before the response was complete,
//!   while the upstream was dying or down.
//!
//! Anything else fails the test: a wait past 10 s, an answer to another id or
//! with another result, a cut response framed as complete, a session id that
//! is not the client's own, a tools/call the upstream processed reaching it
//! again, an answer for a call the upstream never processed. Afterwards the
//! proxy's descriptors and RSS are back to their level before the soak.
//!
//! The fault schedule (intervals, and which restarts wait 2 s) is
//! pseudo-random from a seed printed at the start; `MCP_SOAK_SEED=0x...
//! cargo test --test it soak::` repeats it. The timing of the requests around
//! it varies from run to run, and so may whether a last restart fits in the
//! minute.

use std::collections::{BTreeMap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

#[cfg(target_os = "linux")]
use crate::support::procfs::{fd_count, proc_stat, rss_kib};
use crate::support::proxy_process::{scratch_dir, token_file, ProxyProcess};
use crate::support::restarting::{Generation, RestartingUpstream};
use crate::support::wire::{decode_chunked, find, parse_head, request, Head, Next, Req};

const CALLERS: usize = 16;
const STREAMERS: usize = 4;
/// The same load without faults before the soak, so that the "before"
/// figures include the proxy's working set at this concurrency (its slab,
/// buffer free list, session table) and the comparison measures only what
/// the faults leave behind.
const WARM_UP: Duration = Duration::from_secs(2);
const SOAK: Duration = Duration::from_secs(60);
const MIN_RESTARTS: u32 = 10;
/// The longest a request may wait for its outcome: clients give up after
/// 10 s, which is why `--restart-grace` defaults to 5.
const DEADLINE: Duration = Duration::from_secs(10);
/// Time for the proxy's idle timers to run down after the clients close:
/// above its 2 s upstream pool expiry.
const RUNDOWN: Duration = Duration::from_secs(3);
/// How long after an outage ended it still explains a request's cut or
/// proxy error: slack for the proxy learning a little late, on a loaded
/// machine, that a connection to the dead generation is closed.
const OUTAGE_MARGIN: Duration = Duration::from_millis(250);
/// Between two notifications on a GET stream.
const STREAM_EVERY: Duration = Duration::from_millis(400);
const DEFAULT_SEED: u64 = 0x5eed_50ac;

const AGENT: &str = "soak-agent";
const TOKEN: &str = "tok-SOAK-3c1d-SECRET";
const PROTOCOL: &str = "2025-06-18";

// ---------------------------------------------------------------- shared state

/// xorshift64*: the fault schedule and each client's pauses, from the seed.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.below(hi - lo + 1))
    }
}

/// Every failure, from a client thread, the fake server or the driver; the
/// first one stops the soak.
#[derive(Default)]
struct Failures(Mutex<Vec<String>>);

impl Failures {
    fn add(&self, who: &str, what: String) {
        self.0.lock().unwrap().push(format!("{who}: {what}"));
    }

    fn any(&self) -> bool {
        !self.0.lock().unwrap().is_empty()
    }

    fn list(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Records a panic of the thread it lives in as a failure.
struct PanicGuard<'a>(&'a Failures, String);

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.add(&self.1, "panicked (message above)".into());
        }
    }
}

/// When the upstream was dying or down: from just before its kill to the
/// moment it listens again.
#[derive(Default)]
struct Outages(Mutex<Vec<(Instant, Option<Instant>)>>);

impl Outages {
    fn begin(&self) {
        self.0.lock().unwrap().push((Instant::now(), None));
    }

    fn end(&self) {
        if let Some(last) = self.0.lock().unwrap().last_mut() {
            last.1 = Some(Instant::now());
        }
    }

    /// Whether an outage overlaps [since - OUTAGE_MARGIN, now].
    fn since(&self, since: Instant) -> bool {
        let from = since.checked_sub(OUTAGE_MARGIN).unwrap_or(since);
        // Every outage began in the past: it overlaps unless it ended before `from`.
        self.0.lock().unwrap().iter().any(|(_, up)| up.map_or(true, |up| up >= from))
    }
}

// ---------------------------------------------------------------- the fake FastMCP server

/// What one generation of the server remembers: its sessions, by id.
#[derive(Default)]
struct Sessions {
    generation: u64,
    table: HashMap<String, Session>,
}

struct Session {
    /// The clientInfo name of the initialize that created it.
    owner: String,
    streaming: bool,
}

/// A fake FastMCP server (Python SDK 1.x streamable HTTP): sessions live in
/// the memory of one generation, so a restarted server answers 404 to every
/// session it did not create. It answers a tools/call sometimes as JSON,
/// sometimes as an SSE stream of progress notifications then the result,
/// with small delays so that some restarts land halfway through.
struct FakeFastMcp {
    sessions: Mutex<Sessions>,
    next_session: AtomicU64,
    /// Every tools/call processed, by its `n` tag, with its generation.
    processed: Mutex<HashMap<String, u64>>,
    /// Deliveries of a call already processed.
    again: AtomicU64,
    failures: Arc<Failures>,
}

const NOT_FOUND: &str =
    r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}"#;

impl FakeFastMcp {
    fn new(failures: Arc<Failures>) -> FakeFastMcp {
        FakeFastMcp {
            sessions: Mutex::default(),
            next_session: AtomicU64::new(1),
            processed: Mutex::default(),
            again: AtomicU64::new(0),
            failures,
        }
    }

    fn violation(&self, what: String) {
        self.failures.add("upstream", what);
    }

    /// This generation's sessions; a new generation starts with none.
    fn sessions(&self, gen: &Generation) -> std::sync::MutexGuard<'_, Sessions> {
        let mut s = self.sessions.lock().unwrap();
        if s.generation < gen.number {
            s.generation = gen.number;
            s.table.clear();
        }
        s
    }

    fn owner_of(&self, gen: &Generation, sid: &str) -> Option<String> {
        let s = self.sessions(gen);
        if s.generation != gen.number {
            return None;
        }
        s.table.get(sid).map(|sess| sess.owner.clone())
    }

    fn handle(&self, req: &Req, s: &mut TcpStream, gen: &Generation) -> Next {
        if req.head.all("authorization") != [format!("Bearer {TOKEN}")] {
            self.violation(format!("a request without the proxy's credentials: {}", req.raw_text()));
        }
        let sids = req.head.all("mcp-session-id");
        if sids.len() > 1 {
            self.violation(format!("a request with {} session ids: {}", sids.len(), req.raw_text()));
        }
        let sid = sids.first().map(|v| v.to_string());
        match (req.method.as_str(), sid) {
            ("POST", sid) => self.post(req, sid, s, gen),
            ("GET", Some(sid)) => self.stream(&sid, s, gen),
            ("DELETE", Some(sid)) => {
                let mut sessions = self.sessions(gen);
                if sessions.generation == gen.number && sessions.table.remove(&sid).is_some() {
                    drop(sessions);
                    write_json(s, "200 OK", None, "", None)
                } else {
                    drop(sessions);
                    write_json(s, "404 Not Found", None, NOT_FOUND, None)
                }
            }
            _ => {
                self.violation(format!("an unexpected request: {}", req.raw_text()));
                write_json(s, "400 Bad Request", None, "", None)
            }
        }
    }

    fn post(&self, req: &Req, sid: Option<String>, s: &mut TcpStream, gen: &Generation) -> Next {
        let Ok(v) = serde_json::from_slice::<Value>(&req.body) else {
            self.violation(format!("a POST body that is not JSON: {}", req.raw_text()));
            return write_json(s, "400 Bad Request", None, "", None);
        };
        let method = v["method"].as_str().unwrap_or("");
        let Some(sid) = sid else {
            if method != "initialize" {
                self.violation(format!("{method} without a session id: {}", req.raw_text()));
                return write_json(s, "400 Bad Request", None, "", None);
            }
            let n = self.next_session.fetch_add(1, Ordering::SeqCst);
            let sid = format!("g{}-s{n}", gen.number);
            let owner = v["params"]["clientInfo"]["name"].as_str().unwrap_or("").to_string();
            self.sessions(gen).table.insert(sid.clone(), Session { owner, streaming: false });
            let result = json!({"jsonrpc":"2.0","id":v["id"],"result":{"protocolVersion":PROTOCOL,"capabilities":{"tools":{}},"serverInfo":{"name":"fake-fastmcp","version":"1"}}});
            // FastMCP answers every POST as SSE unless json_response is set: both.
            return if n % 3 == 0 {
                write_sse(s, &sid, &[result], Duration::ZERO)
            } else {
                write_json(s, "200 OK", Some(&sid), &result.to_string(), None)
            };
        };
        let tag = (method == "tools/call").then(|| v["params"]["arguments"]["n"].as_str().unwrap_or(""));
        let owner = self.owner_of(gen, &sid);
        if let Some(tag) = tag {
            // Check and record under one lock: two deliveries of one call
            // race each other on two connections.
            let mut processed = self.processed.lock().unwrap();
            if let Some(first) = processed.get(tag) {
                self.again.fetch_add(1, Ordering::SeqCst);
                self.violation(format!(
                    "tools/call {tag} reached the upstream again (processed in generation {first}; \
                     now in generation {}, session {sid})",
                    gen.number
                ));
            } else if owner.is_some() {
                processed.insert(tag.to_string(), gen.number);
            }
        }
        let Some(owner) = owner else {
            return write_json(s, "404 Not Found", None, NOT_FOUND, None);
        };
        match tag {
            Some(tag) => self.call_tool(&v, tag, &sid, &owner, s),
            None if v.get("id").is_none() => write_json(s, "202 Accepted", Some(&sid), "", None),
            None => {
                let body = json!({"jsonrpc":"2.0","id":v["id"],"result":{}}).to_string();
                write_json(s, "200 OK", Some(&sid), &body, None)
            }
        }
    }

    fn call_tool(&self, v: &Value, tag: &str, sid: &str, owner: &str, s: &mut TcpStream) -> Next {
        let args = &v["params"]["arguments"];
        if args["sender"] != AGENT {
            self.violation(format!(
                "tools/call {tag} arrived with sender {}, not stamped {AGENT:?}",
                args["sender"]
            ));
        }
        if tag.split('-').next() != Some(owner) {
            self.violation(format!("session {sid} of {owner} carried {tag}, another client's call"));
        }
        let h = fnv1a(tag.as_bytes());
        // The tool's work: a restart now leaves the call processed and
        // unanswered, the case the proxy must never resend.
        std::thread::sleep(Duration::from_millis(5 + h % 15));
        let result = json!({"jsonrpc":"2.0","id":v["id"],"result":{"content":[{"type":"text","text":format!("ok {tag}")}],"isError":false}});
        let pause = Duration::from_millis(10 + (h >> 8) % 30);
        match (h >> 16) % 4 {
            0 => write_json(s, "200 OK", Some(sid), &result.to_string(), None),
            1 => write_json(s, "200 OK", Some(sid), &result.to_string(), Some(pause)),
            _ => {
                let progress = |i: u32| json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":tag,"progress":i}});
                write_sse(s, sid, &[progress(1), progress(2), result], pause)
            }
        }
    }

    /// GET: a standalone SSE stream, a notification every `STREAM_EVERY`
    /// until the generation dies or the reader goes; one per session, as in
    /// the Python SDK (a second one is 409).
    fn stream(&self, sid: &str, s: &mut TcpStream, gen: &Generation) -> Next {
        let owner = {
            let mut sessions = self.sessions(gen);
            let current = sessions.generation == gen.number;
            match sessions.table.get_mut(sid) {
                Some(_) if !current => None,
                Some(sess) if sess.streaming => {
                    drop(sessions);
                    self.violation(format!("a second GET stream for session {sid}"));
                    return write_json(s, "409 Conflict", None, "", None);
                }
                Some(sess) => {
                    sess.streaming = true;
                    Some(sess.owner.clone())
                }
                None => None,
            }
        };
        let Some(owner) = owner else {
            return write_json(s, "404 Not Found", None, NOT_FOUND, None);
        };
        let head = format!(
            "HTTP/1.1 200 OK\r\ncache-control: no-cache, no-transform\r\ncontent-type: text/event-stream\r\n\
             mcp-session-id: {sid}\r\ntransfer-encoding: chunked\r\n\r\n"
        );
        let mut ok = s.write_all(head.as_bytes()).is_ok();
        let mut seq = 0;
        while ok && gen.is_alive() {
            std::thread::sleep(STREAM_EVERY);
            seq += 1;
            let note = json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":{"owner":owner,"seq":seq}}});
            ok = s.write_all(&sse_chunk(&note)).is_ok();
        }
        let mut sessions = self.sessions(gen);
        if sessions.generation == gen.number {
            if let Some(sess) = sessions.table.get_mut(sid) {
                sess.streaming = false;
            }
        }
        Next::Close
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// A JSON (or empty) response with a Content-Length; with `split`, the head
/// and half the body, then the rest after that pause.
fn write_json(
    s: &mut TcpStream,
    status: &str,
    sid: Option<&str>,
    body: &str,
    split: Option<Duration>,
) -> Next {
    let sid_line = sid.map(|sid| format!("mcp-session-id: {sid}\r\n")).unwrap_or_default();
    let ct_line = if body.is_empty() { "" } else { "content-type: application/json\r\n" };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nserver: uvicorn\r\n{ct_line}{sid_line}content-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    let at = if split.is_some() { body.len() / 2 } else { body.len() };
    out.extend_from_slice(&body.as_bytes()[..at]);
    if s.write_all(&out).is_err() {
        return Next::Close;
    }
    if let Some(pause) = split {
        std::thread::sleep(pause);
        if s.write_all(&body.as_bytes()[at..]).is_err() {
            return Next::Close;
        }
    }
    Next::KeepAlive
}

/// An SSE response, one event per chunk, `pause` between events.
fn write_sse(s: &mut TcpStream, sid: &str, events: &[Value], pause: Duration) -> Next {
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncache-control: no-cache, no-transform\r\nconnection: keep-alive\r\n\
         content-type: text/event-stream\r\nmcp-session-id: {sid}\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    .into_bytes();
    for (i, event) in events.iter().enumerate() {
        if i > 0 {
            std::thread::sleep(pause);
        }
        out.extend(sse_chunk(event));
        if s.write_all(&out).is_err() {
            return Next::Close;
        }
        out.clear();
    }
    if s.write_all(b"0\r\n\r\n").is_err() {
        return Next::Close;
    }
    Next::KeepAlive
}

fn sse_chunk(message: &Value) -> Vec<u8> {
    let event = format!("event: message\r\ndata: {message}\r\n\r\n");
    let mut out = format!("{:x}\r\n", event.len()).into_bytes();
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\r\n");
    out
}

// ---------------------------------------------------------------- the client's wire

/// A response read strictly: framed complete, or cut.
enum Got {
    Complete(Response),
    /// The connection closed before the response was complete (`head` when
    /// the head itself had arrived).
    Cut {
        head: Option<Head>,
    },
}

struct Response {
    status: u16,
    head: Head,
    body: Vec<u8>,
}

impl Response {
    fn text(&self) -> String {
        format!("{} {:?} {:?}", self.status, self.head.fields, String::from_utf8_lossy(&self.body))
    }
}

enum Chunk {
    Data(Vec<u8>),
    Last,
    Cut,
}

/// One client connection to the proxy, kept alive between requests. Every
/// read is bounded by the request's deadline; framing is parsed here, so a
/// body shorter than its Content-Length, or a chunked body without its last
/// chunk, is a cut and never an answer.
struct Wire {
    port: u16,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Wire {
    fn new(port: u16) -> Wire {
        Wire { port, stream: None, buf: Vec::new() }
    }

    fn close(&mut self) {
        if let Some(s) = self.stream.take() {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.buf.clear();
    }

    /// Send a request, connecting first when needed; false when the
    /// connection failed under it.
    fn send(&mut self, bytes: &[u8]) -> Result<bool, String> {
        if self.stream.is_none() {
            let s = TcpStream::connect(("127.0.0.1", self.port))
                .map_err(|e| format!("cannot connect to the proxy: {e}"))?;
            let _ = s.set_nodelay(true);
            let _ = s.set_write_timeout(Some(DEADLINE));
            self.stream = Some(s);
        }
        if !self.buf.is_empty() {
            return Err(format!("stray bytes from the proxy between two responses: {:?}", lossy(&self.buf)));
        }
        let sent = self.stream.as_mut().is_some_and(|s| s.write_all(bytes).is_ok());
        if !sent {
            self.close();
        }
        Ok(sent)
    }

    /// Read more; false at EOF or reset; an error when `deadline` passes.
    fn fill(&mut self, deadline: Instant) -> Result<bool, String> {
        let Some(s) = self.stream.as_mut() else {
            return Ok(false);
        };
        let mut chunk = [0u8; 16 * 1024];
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(format!(
                    "no complete answer within {DEADLINE:?}; read so far {:?}",
                    lossy(&self.buf)
                ));
            }
            let _ = s.set_read_timeout(Some(left));
            match s.read(&mut chunk) {
                Ok(0) => return Ok(false),
                Ok(n) => {
                    self.buf.extend_from_slice(&chunk[..n]);
                    return Ok(true);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::WouldBlock | ErrorKind::TimedOut
                    ) => {}
                Err(_) => return Ok(false),
            }
        }
    }

    /// The head of the next response, None when the connection closed first.
    fn read_head(&mut self, deadline: Instant) -> Result<Option<(u16, Head)>, String> {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill(deadline)? {
                self.close();
                return Ok(None);
            }
        };
        let raw: Vec<u8> = self.buf.drain(..end).collect();
        let head = parse_head(&raw);
        let status = head
            .start
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse::<u16>().ok())
            .ok_or_else(|| format!("bad status line {:?}", head.start))?;
        Ok(Some((status, head)))
    }

    /// One complete response, or the cut that ended it.
    fn read_response(&mut self, deadline: Instant) -> Result<Got, String> {
        match self.read_head(deadline)? {
            Some((status, head)) => self.read_body(status, head, deadline),
            None => Ok(Got::Cut { head: None }),
        }
    }

    /// The body after `head`, by its framing.
    fn read_body(&mut self, status: u16, head: Head, deadline: Instant) -> Result<Got, String> {
        let te = head.all("transfer-encoding");
        let cl = head.all("content-length");
        let body = if !te.is_empty() {
            if te != ["chunked"] || !cl.is_empty() {
                return Err(format!("bad framing: transfer-encoding {te:?}, content-length {cl:?}"));
            }
            loop {
                if let Some((body, _trailers, used)) = decode_chunked(&self.buf) {
                    self.buf.drain(..used);
                    break body;
                }
                if !self.fill(deadline)? {
                    self.close();
                    return Ok(Got::Cut { head: Some(head) });
                }
            }
        } else if let [len] = cl[..] {
            let len: usize = (!len.is_empty() && len.bytes().all(|b| b.is_ascii_digit()))
                .then(|| len.parse().ok())
                .flatten()
                .ok_or_else(|| format!("bad content-length {len:?}"))?;
            while self.buf.len() < len {
                if !self.fill(deadline)? {
                    self.close();
                    return Ok(Got::Cut { head: Some(head) });
                }
            }
            self.buf.drain(..len).collect()
        } else {
            // Close-delimited (or several lengths): the end could not be
            // told from a cut.
            return Err(format!(
                "a response without one Content-Length or chunked framing: {:?}",
                head.fields
            ));
        };
        let close = head.all("connection").iter().any(|v| v.to_ascii_lowercase().contains("close"));
        if close {
            self.close();
        }
        Ok(Got::Complete(Response { status, head, body }))
    }

    /// The next chunk of a chunked stream.
    fn read_chunk(&mut self, deadline: Instant) -> Result<Chunk, String> {
        loop {
            if let Some(i) = find(&self.buf, b"\r\n") {
                let line = std::str::from_utf8(&self.buf[..i]).unwrap_or("?");
                let hex = line.split(';').next().unwrap_or("").trim();
                let size =
                    usize::from_str_radix(hex, 16).map_err(|_| format!("bad chunk size line {line:?}"))?;
                if size == 0 {
                    return Ok(Chunk::Last);
                }
                if self.buf.len() >= i + 2 + size + 2 {
                    if &self.buf[i + 2 + size..i + 4 + size] != b"\r\n" {
                        return Err(format!("chunk data not followed by CRLF: {:?}", lossy(&self.buf)));
                    }
                    let data = self.buf[i + 2..i + 2 + size].to_vec();
                    self.buf.drain(..i + 4 + size);
                    return Ok(Chunk::Data(data));
                }
            }
            if !self.fill(deadline)? {
                self.close();
                return Ok(Chunk::Cut);
            }
        }
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(600)]).into_owned()
}

/// The JSON-RPC messages of the complete SSE events at the start of `buf`
/// (taken out of it); events without data (comments) are skipped.
fn take_events(buf: &mut Vec<u8>) -> Result<Vec<Value>, String> {
    let mut out = Vec::new();
    while let Some(i) = find(buf, b"\r\n\r\n") {
        let event: Vec<u8> = buf.drain(..i + 4).collect();
        let text =
            std::str::from_utf8(&event[..i]).map_err(|_| format!("event not UTF-8: {:?}", lossy(&event)))?;
        let data: Vec<&str> = text
            .split("\r\n")
            .filter_map(|l| l.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        out.push(
            serde_json::from_str(&data.join("\n"))
                .map_err(|e| format!("event data is not JSON ({e}): {text:?}"))?,
        );
    }
    Ok(out)
}

/// The JSON-RPC messages of a complete response: its body for JSON, the
/// data of each event for SSE (which must end on an event boundary).
fn messages(r: &Response) -> Result<Vec<Value>, String> {
    let ct = r.head.all("content-type");
    match ct.first() {
        Some(ct) if ct.starts_with("text/event-stream") => {
            let mut body = r.body.clone();
            let events = take_events(&mut body)?;
            if !body.is_empty() {
                return Err(format!("an SSE body framed complete ends inside an event: {}", r.text()));
            }
            Ok(events)
        }
        Some(ct) if ct.starts_with("application/json") => Ok(vec![serde_json::from_slice(&r.body)
            .map_err(|e| format!("a JSON body framed complete is not JSON ({e}): {}", r.text()))?]),
        _ => Err(format!("unexpected content-type: {}", r.text())),
    }
}

/// A clean proxy-made error for the request with `id`: 200, 502 or 504 with
/// a JSON-RPC error carrying that id and no result (the fake server never
/// answers with an error). Its label in the summary names the status and
/// message.
fn proxy_error(r: &Response, id: &Value) -> Option<String> {
    let json = r.head.all("content-type").first().is_some_and(|ct| ct.starts_with("application/json"));
    let v = serde_json::from_slice::<Value>(&r.body).ok()?;
    let clean = matches!(r.status, 200 | 502 | 504)
        && json
        && v["jsonrpc"] == "2.0"
        && v["id"] == *id
        && v["error"]["code"].is_i64()
        && v.get("result").is_none();
    clean.then(|| format!("proxy error {} {}", r.status, v["error"]["message"].as_str().unwrap_or("")))
}

/// The outcome label of a complete response that must be the answer to
/// tools/call `id` with tag `tag`: the result last, progress notifications
/// for the same call before it.
fn answer_to(r: &Response, id: u64, tag: &str) -> Result<String, String> {
    let msgs = messages(r)?;
    let Some((last, progress)) = msgs.split_last() else {
        return Err(format!("a body framed complete without a message: {}", r.text()));
    };
    let answered = r.status == 200
        && last["id"] == id
        && last["result"]["content"][0]["text"] == format!("ok {tag}")
        && progress
            .iter()
            .all(|m| m["method"] == "notifications/progress" && m["params"]["progressToken"] == tag);
    if !answered {
        return Err(format!("not its answer (a cut framed complete?): {}", r.text()));
    }
    let sse = r.head.all("content-type").first().is_some_and(|ct| ct.starts_with("text/event-stream"));
    Ok(if sse { "answered sse" } else { "answered json" }.to_string())
}

/// The server's own 404 for a session it does not know.
fn is_server_404(r: &Response) -> bool {
    r.status == 404 && r.body == NOT_FOUND.as_bytes()
}

/// The outcome of a request with no result to check (a notification, a
/// DELETE, a GET that got no stream): the server's `ok` status with an empty
/// body, the server's 404 or a clean proxy error; None when it is none of them.
fn plain_outcome(r: &Response, ok: u16) -> Option<String> {
    if r.status == ok && r.body.is_empty() {
        Some("answered".into())
    } else if is_server_404(r) {
        Some("404".into())
    } else {
        proxy_error(r, &Value::Null)
    }
}

// ---------------------------------------------------------------- clients

/// One phase of client threads (the warm-up, then the soak).
struct Run {
    port: u16,
    stop: AtomicBool,
    failures: Arc<Failures>,
    outages: Arc<Outages>,
    /// Every session id a client got from an initialize answer, and which.
    issued: Arc<Mutex<HashMap<String, String>>>,
    /// (request kind, outcome label) -> how many.
    counts: Mutex<BTreeMap<(&'static str, String), u64>>,
    longest_wait: Mutex<Duration>,
    /// The outcome of every tools/call, by tag.
    calls: Mutex<HashMap<String, String>>,
}

impl Run {
    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst) || self.failures.any()
    }

    fn count(&self, kind: &'static str, outcome: impl Into<String>) {
        *self.counts.lock().unwrap().entry((kind, outcome.into())).or_default() += 1;
    }

    /// How many `kind` requests had an outcome whose label starts with `outcome`.
    fn get(&self, kind: &'static str, outcome: &str) -> u64 {
        let counts = self.counts.lock().unwrap();
        counts.iter().filter(|((k, o), _)| *k == kind && o.starts_with(outcome)).map(|(_, n)| n).sum()
    }

    fn summary(&self) -> String {
        let counts = self.counts.lock().unwrap();
        let mut out = String::new();
        let mut last = "";
        for ((kind, outcome), n) in counts.iter() {
            if *kind != last {
                out.push_str(if last.is_empty() { "" } else { "; " });
                out.push_str(kind);
                out.push(':');
                last = kind;
            } else {
                out.push(',');
            }
            out.push_str(&format!(" {n} {outcome}"));
        }
        out
    }
}

struct Client<'r> {
    run: &'r Run,
    name: String,
    wire: Wire,
    session: Option<String>,
    next_id: u64,
    rng: Rng,
}

impl<'r> Client<'r> {
    fn new(run: &'r Run, name: String, seed: u64) -> Client<'r> {
        let rng = Rng::new(seed ^ fnv1a(name.as_bytes()));
        Client { run, wire: Wire::new(run.port), name, session: None, next_id: 1, rng }
    }

    fn pause(&mut self, lo: u64, hi: u64) {
        std::thread::sleep(self.rng.millis(lo, hi));
    }

    fn request(&self, method: &str, body: &[u8], accept: &str) -> Vec<u8> {
        let host = format!("127.0.0.1:{}", self.run.port);
        let mut fields = vec![("Accept", accept)];
        if !body.is_empty() {
            fields.push(("Content-Type", "application/json"));
        }
        if let Some(sid) = &self.session {
            fields.push(("Mcp-Session-Id", sid));
            fields.push(("MCP-Protocol-Version", PROTOCOL));
        }
        request(method, "/mcp", &host, &fields, body)
    }

    /// Send on the keep-alive connection and read the response; checks the
    /// wait and every session id in the head.
    fn exchange(&mut self, method: &str, body: &[u8], what: &str) -> Result<(Got, Instant), String> {
        let bytes = self.request(method, body, "application/json, text/event-stream");
        let t0 = Instant::now();
        let got = if self.wire.send(&bytes)? {
            self.wire.read_response(t0 + DEADLINE).map_err(|e| format!("{what}: {e}"))?
        } else {
            Got::Cut { head: None }
        };
        self.waited(t0, what)?;
        match &got {
            Got::Complete(r) => self.check_session_ids(&r.head, what)?,
            Got::Cut { head: Some(head) } => self.check_session_ids(head, what)?,
            Got::Cut { head: None } => {}
        }
        Ok((got, t0))
    }

    fn waited(&self, t0: Instant, what: &str) -> Result<(), String> {
        let waited = t0.elapsed();
        if waited > DEADLINE {
            return Err(format!("{what} waited {waited:?} for its outcome"));
        }
        let mut longest = self.run.longest_wait.lock().unwrap();
        *longest = (*longest).max(waited);
        Ok(())
    }

    /// Every session id in a head must be the client's own (in an initialize
    /// answer: one never handed to another client).
    fn check_session_ids(&self, head: &Head, what: &str) -> Result<(), String> {
        for sid in head.all("mcp-session-id") {
            if self.session.as_deref() == Some(sid) {
                continue;
            }
            let issued = self.run.issued.lock().unwrap();
            match issued.get(sid) {
                Some(other) if *other != self.name => {
                    return Err(format!(
                        "{what}: got session id {sid:?}, which was handed to {other}; its own is {:?}",
                        self.session
                    ))
                }
                _ if self.session.is_some() => {
                    return Err(format!("{what}: got session id {sid:?}; its own is {:?}", self.session))
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// A cut or a proxy error must meet a dying or down upstream: one that
    /// overlaps the time since `since` (when the request began, or when its
    /// stream last spoke).
    fn explained(&self, since: Instant, what: &str, outcome: &str) -> Result<(), String> {
        if !self.run.outages.since(since) {
            return Err(format!(
                "{what}: {outcome} {:?} after it began, with the upstream up all along",
                since.elapsed()
            ));
        }
        Ok(())
    }

    /// Count a plain outcome (see `plain_outcome`) and act on it: a 404 ends
    /// the session, a proxy error must be explained.
    fn plain(
        &mut self,
        kind: &'static str,
        got: Got,
        ok: u16,
        t0: Instant,
        what: &str,
    ) -> Result<(), String> {
        let outcome = match got {
            Got::Cut { .. } => "cut".to_string(),
            Got::Complete(r) => {
                plain_outcome(&r, ok).ok_or_else(|| format!("{what}: not an outcome: {}", r.text()))?
            }
        };
        if outcome == "404" {
            self.session = None;
        } else if outcome != "answered" {
            self.explained(t0, what, &outcome)?;
        }
        self.run.count(kind, outcome);
        Ok(())
    }

    /// initialize, then notifications/initialized; whether a session opened.
    fn open_session(&mut self) -> Result<bool, String> {
        let id = self.next_id;
        self.next_id += 1;
        let what = format!("initialize #{id}");
        let body = json!({"jsonrpc":"2.0","id":id,"method":"initialize","params":{"protocolVersion":PROTOCOL,"capabilities":{},"clientInfo":{"name":self.name,"version":"1"}}});
        let (got, t0) = self.exchange("POST", body.to_string().as_bytes(), &what)?;
        let r = match got {
            Got::Cut { .. } => {
                self.run.count("initialize", "cut");
                self.explained(t0, &what, "cut")?;
                return Ok(false);
            }
            Got::Complete(r) => r,
        };
        if let Some(label) = proxy_error(&r, &json!(id)) {
            self.explained(t0, &what, &label)?;
            self.run.count("initialize", label);
            return Ok(false);
        }
        let msgs = messages(&r).map_err(|e| format!("{what}: {e}"))?;
        let sids = r.head.all("mcp-session-id");
        let ok = r.status == 200
            && sids.len() == 1
            && msgs.len() == 1
            && msgs[0]["id"] == id
            && msgs[0]["result"]["protocolVersion"] == PROTOCOL;
        if !ok {
            return Err(format!("{what}: not the answer: {}", r.text()));
        }
        let sid = sids[0].to_string();
        if let Some(other) = self.run.issued.lock().unwrap().insert(sid.clone(), self.name.clone()) {
            return Err(format!("{what}: got session id {sid:?}, which was handed to {other} before"));
        }
        self.run.count("initialize", "answered");
        self.session = Some(sid);

        let what = format!("notifications/initialized in {:?}", self.session);
        let body = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
        let (got, t0) = self.exchange("POST", body, &what)?;
        self.plain("initialized", got, 202, t0, &what)?;
        Ok(true)
    }

    fn call_tool(&mut self) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let tag = format!("{}-{id}", self.name);
        let what = format!("tools/call {tag} in {:?}", self.session);
        let body = json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":"chat_send","arguments":{"n":tag,"message":"soak","sender":"someone-else"}}});
        let (got, t0) = self.exchange("POST", body.to_string().as_bytes(), &what)?;
        let outcome = match got {
            Got::Cut { .. } => {
                self.explained(t0, &what, "cut")?;
                "cut".to_string()
            }
            Got::Complete(r) if is_server_404(&r) => {
                self.session = None;
                "404".to_string()
            }
            Got::Complete(r) => match proxy_error(&r, &json!(id)) {
                Some(label) => {
                    self.explained(t0, &what, &label)?;
                    label
                }
                None => answer_to(&r, id, &tag).map_err(|e| format!("{what}: {e}"))?,
            },
        };
        self.run.count("call", outcome.clone());
        if let Some(first) = self.run.calls.lock().unwrap().insert(tag, outcome) {
            return Err(format!("{what}: a second outcome (the first was {first})"));
        }
        Ok(())
    }

    fn delete(&mut self) -> Result<(), String> {
        let what = format!("DELETE {:?}", self.session);
        let (got, t0) = self.exchange("DELETE", b"", &what)?;
        self.plain("delete", got, 200, t0, &what)?;
        // Ended from the client's side whatever the answer.
        self.session = None;
        Ok(())
    }

    /// Hold a GET stream on the session until it ends or the run stops.
    fn hold_stream(&mut self) -> Result<(), String> {
        let what = format!("GET stream of {:?}", self.session);
        let mut wire = Wire::new(self.run.port);
        let t0 = Instant::now();
        let head = if wire.send(&self.request("GET", b"", "text/event-stream"))? {
            wire.read_head(t0 + DEADLINE).map_err(|e| format!("{what}: {e}"))?
        } else {
            None
        };
        self.waited(t0, &what)?;
        let Some((status, head)) = head else {
            self.run.count("stream", "cut before head");
            self.explained(t0, &what, "cut")?;
            return Ok(());
        };
        self.check_session_ids(&head, &what)?;
        if status != 200 {
            // A complete answer instead of a stream.
            let got = wire.read_body(status, head, t0 + DEADLINE).map_err(|e| format!("{what}: {e}"))?;
            self.plain("stream", got, 200, t0, &what)?;
            if self.session.is_some() {
                self.pause(150, 250);
            }
            return Ok(());
        }
        let sse = head.all("content-type").first().is_some_and(|ct| ct.starts_with("text/event-stream"));
        if !sse || head.all("transfer-encoding") != ["chunked"] {
            return Err(format!("{what}: a 200 that is not a chunked SSE stream: {:?}", head.fields));
        }
        self.run.count("stream", "opened");
        let mut events = Vec::new();
        let mut spoke = Instant::now();
        while !self.run.stopping() {
            match wire.read_chunk(Instant::now() + DEADLINE).map_err(|e| format!("{what}: {e}"))? {
                Chunk::Data(data) => {
                    spoke = Instant::now();
                    events.extend_from_slice(&data);
                    for m in take_events(&mut events).map_err(|e| format!("{what}: {e}"))? {
                        let owner = &m["params"]["data"]["owner"];
                        if m["method"] != "notifications/message" || *owner != self.name.as_str() {
                            return Err(format!("{what}: an event that is not for {}: {m}", self.name));
                        }
                        self.run.count("stream", "events");
                    }
                }
                Chunk::Last => {
                    return Err(format!(
                        "{what}: ended with the last chunk: the upstream never ends a stream, so a cut was framed complete"
                    ))
                }
                Chunk::Cut => {
                    self.run.count("stream", "cut");
                    self.explained(spoke, &what, "cut")?;
                    return Ok(());
                }
            }
        }
        Ok(())
    }
}

/// A client's life until the soak ends: a session (tried again after a
/// pause when refused), then `act` on it; its session deleted at the end.
fn live<'r>(
    run: &'r Run,
    name: String,
    seed: u64,
    mut act: impl FnMut(&mut Client<'r>) -> Result<(), String>,
) -> Result<(), String> {
    let mut c = Client::new(run, name, seed);
    while !run.stopping() {
        if c.session.is_none() {
            if !c.open_session()? {
                c.pause(100, 200);
            }
            continue;
        }
        act(&mut c)?;
    }
    if c.session.is_some() {
        c.delete()?;
    }
    Ok(())
}

/// A caller: tool calls 20 to 50 ms apart; a new session after a 404 (and
/// now and then on its own, after a DELETE).
fn caller(run: &Run, name: String, seed: u64) -> Result<(), String> {
    live(run, name, seed, |c| {
        c.call_tool()?;
        if c.session.is_some() && c.rng.below(40) == 0 {
            c.delete()?;
        }
        c.pause(20, 50);
        Ok(())
    })
}

/// A streamer: a GET stream on its session, opened again when cut.
fn streamer(run: &Run, name: String, seed: u64) -> Result<(), String> {
    live(run, name, seed, Client::hold_stream)
}

/// The clients of one phase, named `{phase}.c{k}` (callers) and
/// `{phase}.g{k}` (GET streams): names and call tags are unique in the test.
fn spawn_clients(run: &Arc<Run>, phase: &str, seed: u64) -> Vec<JoinHandle<()>> {
    let callers = (0..CALLERS).map(|k| (format!("{phase}.c{k}"), true));
    let roles = callers.chain((0..STREAMERS).map(|k| (format!("{phase}.g{k}"), false)));
    roles
        .map(|(name, calls)| {
            let run = run.clone();
            std::thread::spawn(move || {
                let _guard = PanicGuard(&run.failures, name.clone());
                let result =
                    if calls { caller(&run, name.clone(), seed) } else { streamer(&run, name.clone(), seed) };
                if let Err(e) = result {
                    run.failures.add(&name, e);
                }
            })
        })
        .collect()
}

fn stop_clients(run: &Run, clients: Vec<JoinHandle<()>>) {
    run.stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.join();
    }
}

/// Sleep `d`, or less once a failure is recorded.
fn sleep_unless_failed(failures: &Failures, d: Duration) {
    let end = Instant::now() + d;
    while !failures.any() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(Duration::from_millis(100)));
    }
}

/// The fault driver: kill the upstream every 2 to 5 s (one time in three it
/// stays down 2 s before it binds again) until `SOAK` has passed, with at
/// least `MIN_RESTARTS`; returns (restarts, restarts after 2 s down).
fn restart_now_and_then(
    up: &mut RestartingUpstream,
    outages: &Outages,
    failures: &Failures,
    seed: u64,
) -> (u32, u32) {
    let mut rng = Rng::new(seed);
    let start = Instant::now();
    let (mut restarts, mut long_stops) = (0, 0);
    while !failures.any() {
        let wait = rng.millis(2000, 5000);
        let down_for = if rng.below(3) == 0 { Duration::from_secs(2) } else { Duration::ZERO };
        if start.elapsed() + wait + down_for > SOAK && restarts >= MIN_RESTARTS {
            sleep_unless_failed(failures, SOAK.saturating_sub(start.elapsed()));
            break;
        }
        sleep_unless_failed(failures, wait);
        if failures.any() {
            break;
        }
        outages.begin();
        up.stop();
        std::thread::sleep(down_for);
        up.restart();
        outages.end();
        restarts += 1;
        long_stops += u32::from(!down_for.is_zero());
        eprintln!(
            "soak: restart {restarts} at {:.1} s (down {down_for:?}), generation {}",
            start.elapsed().as_secs_f64(),
            up.generations()
        );
    }
    (restarts, long_stops)
}

/// The proxy's open descriptors, VmRSS (KiB) and CPU time (s).
#[cfg(target_os = "linux")]
fn usage(p: &ProxyProcess) -> (usize, u64, f64) {
    (fd_count(p.pid()), rss_kib(p.pid()), proc_stat(p.pid()).1)
}

/// Fail with the failures, the summary and where the proxy's log went.
#[track_caller]
fn fail_with(p: &ProxyProcess, failures: &[String], summary: &str) -> ! {
    let log = scratch_dir("soak").join("proxy-stderr.log");
    let stderr = p.stderr_text();
    let _ = std::fs::write(&log, &stderr);
    let tail: Vec<&str> = stderr.lines().rev().take(40).collect();
    panic!(
        "{} failure(s), the first ones:\n  {}\n{summary}\nproxy log (RUST_LOG=debug) in {}; its last lines:\n{}",
        failures.len(),
        failures.iter().take(10).cloned().collect::<Vec<_>>().join("\n  "),
        log.display(),
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn every_request_gets_one_clean_outcome_through_a_minute_of_upstream_restarts() {
    let seed = std::env::var("MCP_SOAK_SEED")
        .ok()
        .and_then(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("soak: seed {seed:#x} (MCP_SOAK_SEED={seed:#x} repeats the fault schedule)");
    let started = Instant::now();
    let failures = Arc::new(Failures::default());
    let server = Arc::new(FakeFastMcp::new(failures.clone()));
    let mut up = RestartingUpstream::start({
        let server = server.clone();
        move |req, s, gen| {
            let _guard = PanicGuard(&server.failures, "upstream".into());
            server.handle(req, s, gen)
        }
    });
    let tf = token_file(TOKEN);
    let url = up.url();
    let args =
        ["--upstream", &url, "--agent", AGENT, "--token-file", tf.to_str().unwrap(), "--restart-grace", "5"];
    let mut p = ProxyProcess::start(&args, &[]);
    let outages = Arc::new(Outages::default());
    let issued = Arc::new(Mutex::default());
    let new_run = || {
        Arc::new(Run {
            port: p.port,
            stop: AtomicBool::new(false),
            failures: failures.clone(),
            outages: outages.clone(),
            issued: issued.clone(),
            counts: Mutex::default(),
            longest_wait: Mutex::default(),
            calls: Mutex::default(),
        })
    };

    let warm = new_run();
    let clients = spawn_clients(&warm, "warm", seed);
    sleep_unless_failed(&failures, WARM_UP);
    stop_clients(&warm, clients);
    if failures.any() {
        fail_with(&p, &failures.list(), &format!("warm-up: {}", warm.summary()));
    }
    std::thread::sleep(RUNDOWN);
    #[cfg(target_os = "linux")]
    let before = usage(&p);

    let soak = new_run();
    let clients = spawn_clients(&soak, "soak", seed);
    let soak_start = Instant::now();
    let (restarts, long_stops) = restart_now_and_then(&mut up, &outages, &failures, seed);
    // A last quiet second: the clients end in a healthy upstream.
    sleep_unless_failed(&failures, Duration::from_secs(1));
    stop_clients(&soak, clients);
    let soak_time = soak_start.elapsed();

    let processed = server.processed.lock().unwrap().clone();
    let longest = *soak.longest_wait.lock().unwrap();
    // Calls of the soak the upstream processed whose answer never came back
    // whole: each must have been cut or answered by the proxy, never resent.
    let unanswered = soak
        .calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(tag, outcome)| processed.contains_key(*tag) && !outcome.starts_with("answered"))
        .count();
    let summary = format!(
        "soak summary: seed {seed:#x}, {:.1} s, {restarts} restarts ({long_stops} after 2 s down); {}; \
         longest wait {:.2} s; the upstream processed {} calls ({unanswered} of the soak's without an \
         answer back), {} delivered again",
        soak_time.as_secs_f64(),
        soak.summary(),
        longest.as_secs_f64(),
        processed.len(),
        server.again.load(Ordering::SeqCst)
    );
    eprintln!("{summary}");
    if failures.any() {
        fail_with(&p, &failures.list(), &summary);
    }
    // The calls seen from both ends: an answer is the upstream's, never
    // invented; a 404 means it was not processed; a call processed and not
    // answered was cut or answered by the proxy's outage error.
    for run in [&warm, &soak] {
        for (tag, outcome) in run.calls.lock().unwrap().iter() {
            let was_processed = processed.contains_key(tag);
            let consistent = match outcome.as_str() {
                "404" => !was_processed,
                o if o.starts_with("answered") => was_processed,
                _ => true,
            };
            assert!(consistent, "{tag}: {outcome}, processed upstream: {was_processed}\n{summary}");
        }
    }
    for tag in processed.keys() {
        let known =
            warm.calls.lock().unwrap().contains_key(tag) || soak.calls.lock().unwrap().contains_key(tag);
        assert!(known, "{tag} was processed upstream, but its client saw no outcome\n{summary}");
    }
    assert!(p.is_running(), "the proxy died; stderr:\n{}", p.stderr_text());

    // Not vacuous: the faults happened, bit, and the load went on through them.
    // No 404 is required: once the proxy reopens sessions itself they become rare.
    assert!(restarts >= MIN_RESTARTS && long_stops >= 1, "{summary}");
    assert!(soak.get("call", "answered json") > 0 && soak.get("call", "answered sse") > 0, "{summary}");
    let bitten = ["cut", "proxy error", "404"].iter().map(|o| soak.get("call", o)).sum::<u64>();
    assert!(bitten > 0, "no call met a restart: {summary}");
    assert!(soak.get("stream", "cut") > 0 && soak.get("stream", "events") > 0, "{summary}");
    assert!(soak.get("stream", "opened") > STREAMERS as u64, "no GET stream was opened again: {summary}");

    std::thread::sleep(RUNDOWN);
    // Descriptors and memory from /proc: Linux only (the suite also runs
    // under wine, where the proxy is a Windows process).
    #[cfg(target_os = "linux")]
    {
        let after = usage(&p);
        eprintln!(
            "soak: proxy descriptors {} before, {} after; VmRSS {} KiB before, {} KiB after; \
             CPU {:.1} s during the soak",
            before.0,
            after.0,
            before.1,
            after.1,
            after.2 - before.2
        );
        // Slack of 2: an upstream connection pooled by a request that ended
        // just before the clients closed lives until the pool's 2 s expiry,
        // which RUNDOWN outlasts; the slack covers a late expiry on a loaded
        // machine, and is far below one leaked descriptor per restart (>= 10)
        // or per failed request (hundreds).
        assert!(
            after.0 <= before.0 + 2,
            "descriptors {} before the soak, {} after\n{summary}",
            before.0,
            after.0
        );
        // 2 MiB: the warm-up already took the working set to this load's
        // size, so what remains is allocator slack (a relay buffer grows to
        // 256 KiB while busy and a freed one may stay mapped), while a leak
        // of even 200 bytes per request over the ~12,000 requests of the
        // soak would pass it.
        assert!(
            after.1 <= before.1 + 2048,
            "VmRSS {} KiB before the soak, {} KiB after\n{summary}",
            before.1,
            after.1
        );
    }
    p.stop();
    eprintln!("soak: whole test {:.1} s", started.elapsed().as_secs_f64());
}
