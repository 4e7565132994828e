//! The client's wire: responses read strictly (framed complete, or cut), and the checks of their outcome.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Instant;

use serde_json::Value;

use super::fake_fastmcp::NOT_FOUND;
use super::DEADLINE;
use crate::support::wire::{decode_chunked, find, parse_head, Head};

/// A response read strictly: framed complete, or cut.
pub(super) enum Got {
    Complete(Response),
    /// The connection closed before the response was complete (`head` when
    /// the head itself had arrived).
    Cut {
        head: Option<Head>,
    },
}

pub(super) struct Response {
    pub(super) status: u16,
    pub(super) head: Head,
    body: Vec<u8>,
}

impl Response {
    pub(super) fn text(&self) -> String {
        format!("{} {:?} {:?}", self.status, self.head.fields, String::from_utf8_lossy(&self.body))
    }
}

pub(super) enum Chunk {
    Data(Vec<u8>),
    Last,
    Cut,
}

/// One client connection to the proxy, kept alive between requests. Every
/// read is bounded by the request's deadline; framing is parsed here, so a
/// body shorter than its Content-Length, or a chunked body without its last
/// chunk, is a cut and never an answer.
pub(super) struct Wire {
    port: u16,
    stream: Option<TcpStream>,
    buf: Vec<u8>,
}

impl Wire {
    pub(super) fn new(port: u16) -> Wire {
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
    pub(super) fn send(&mut self, bytes: &[u8]) -> Result<bool, String> {
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
    pub(super) fn read_head(&mut self, deadline: Instant) -> Result<Option<(u16, Head)>, String> {
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
    pub(super) fn read_response(&mut self, deadline: Instant) -> Result<Got, String> {
        match self.read_head(deadline)? {
            Some((status, head)) => self.read_body(status, head, deadline),
            None => Ok(Got::Cut { head: None }),
        }
    }

    /// The body after `head`, by its framing.
    pub(super) fn read_body(&mut self, status: u16, head: Head, deadline: Instant) -> Result<Got, String> {
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
    pub(super) fn read_chunk(&mut self, deadline: Instant) -> Result<Chunk, String> {
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
pub(super) fn take_events(buf: &mut Vec<u8>) -> Result<Vec<Value>, String> {
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
pub(super) fn messages(r: &Response) -> Result<Vec<Value>, String> {
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
pub(super) fn proxy_error(r: &Response, id: &Value) -> Option<String> {
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
pub(super) fn answer_to(r: &Response, id: u64, tag: &str) -> Result<String, String> {
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
pub(super) fn is_server_404(r: &Response) -> bool {
    r.status == 404 && r.body == NOT_FOUND.as_bytes()
}

/// The outcome of a request with no result to check (a notification, a
/// DELETE, a GET that got no stream): the server's `ok` status with an empty
/// body, the server's 404 or a clean proxy error; None when it is none of them.
pub(super) fn plain_outcome(r: &Response, ok: u16) -> Option<String> {
    if r.status == ok && r.body.is_empty() {
        Some("answered".into())
    } else if is_server_404(r) {
        Some("404".into())
    } else {
        proxy_error(r, &Value::Null)
    }
}
