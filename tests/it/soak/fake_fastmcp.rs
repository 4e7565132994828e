//! The fake FastMCP server: sessions in one generation's memory; tool calls answered as JSON or SSE.

use std::collections::HashMap;
use std::io::Write;
use std::net::TcpStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use super::state::Failures;
use super::{AGENT, PROTOCOL, STREAM_EVERY, TOKEN};
use crate::support::restarting::Generation;
use crate::support::wire::{Next, Req};

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
pub(super) struct FakeFastMcp {
    sessions: Mutex<Sessions>,
    next_session: AtomicU64,
    /// Every tools/call processed, by its `n` tag, with its generation.
    pub(super) processed: Mutex<HashMap<String, u64>>,
    /// Deliveries of a call already processed.
    pub(super) again: AtomicU64,
    pub(super) failures: Arc<Failures>,
}

pub(super) const NOT_FOUND: &str =
    r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}"#;

impl FakeFastMcp {
    pub(super) fn new(failures: Arc<Failures>) -> FakeFastMcp {
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

    pub(super) fn handle(&self, req: &Req, s: &mut TcpStream, gen: &Generation) -> Next {
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

pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
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
