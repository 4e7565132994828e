//! Both ends of the raw HTTP/1.1 wire on std::net: `StubUpstream`, a scripted
//! upstream, and `RawClient`, a byte-level client.
//!
//! Both sides parse heads with the same small, strict parser and never merge
//! field lines: tests count lines, so duplicates must stay visible.
#![allow(dead_code)]

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Upper bound for anything a stub waits on, so no test can hang.
pub const STUB_LIMIT: Duration = Duration::from_secs(15);

/// A parsed head: start line and field lines exactly as received.
#[derive(Clone, Debug, Default)]
pub struct Head {
    pub start: String,
    pub fields: Vec<(String, String)>,
}

impl Head {
    /// Every value of `name` (case-insensitive), one per field line.
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.fields.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
    }

    /// The value of `name` when there is exactly one field line; panics otherwise.
    #[track_caller]
    pub fn one(&self, name: &str) -> &str {
        let all = self.all(name);
        assert_eq!(all.len(), 1, "expected exactly one {name:?} line in {:#?}", self.fields);
        all[0]
    }

    pub fn has(&self, name: &str) -> bool {
        !self.all(name).is_empty()
    }
}

/// Parse `bytes` (a head without the final blank line, or with it) strictly:
/// every field line must contain a colon; no obs-fold accepted.
#[track_caller]
pub fn parse_head(bytes: &[u8]) -> Head {
    let text = std::str::from_utf8(bytes).unwrap_or_else(|_| panic!("head not UTF-8: {bytes:?}"));
    let text = text.strip_suffix("\r\n\r\n").unwrap_or(text);
    let mut lines = text.split("\r\n");
    let start = lines.next().unwrap_or("").to_string();
    let mut fields = Vec::new();
    for line in lines {
        assert!(!line.starts_with(' ') && !line.starts_with('\t'), "obs-fold line {line:?} in head {text:?}");
        let (name, value) = line
            .split_once(':')
            .unwrap_or_else(|| panic!("field line without colon {line:?} in head {text:?}"));
        assert!(!name.is_empty() && !name.ends_with(' '), "bad field name {name:?} in {text:?}");
        fields.push((name.to_string(), value.trim_matches([' ', '\t']).to_string()));
    }
    Head { start, fields }
}

/// `read` that retries `Interrupted`: on Linux a socket read with a timeout
/// set fails with EINTR when the process is stopped and continued, even
/// without a signal handler (signal(7)).
fn read_retrying(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// Where `needle` first starts in `hay`.
pub fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    find(hay, needle).is_some()
}

/// One request as the upstream received it.
#[derive(Clone, Debug)]
pub struct Req {
    pub method: String,
    pub target: String,
    pub version: String,
    pub head: Head,
    /// Decoded body.
    pub body: Vec<u8>,
    /// Head and body bytes exactly as they arrived.
    pub raw: Vec<u8>,
    /// Index of the upstream connection it arrived on (0-based).
    pub conn: usize,
}

impl Req {
    pub fn raw_text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
}

/// What a handler wants after answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    KeepAlive,
    Close,
}

type Handler = dyn Fn(&Req, &mut TcpStream) -> Next + Send + Sync;

#[derive(Default)]
struct Shared {
    reqs: Mutex<Vec<Req>>,
    cv: Condvar,
    conns: AtomicUsize,
}

/// A scripted upstream: a thread per accepted connection reads requests and
/// hands each to the handler, which writes whatever raw bytes it likes.
pub struct StubUpstream {
    pub port: u16,
    shared: Arc<Shared>,
}

impl StubUpstream {
    pub fn start(handler: impl Fn(&Req, &mut TcpStream) -> Next + Send + Sync + 'static) -> StubUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stub upstream");
        StubUpstream::on(listener, handler)
    }

    /// Serve on an already bound listener.
    pub fn on(
        listener: TcpListener,
        handler: impl Fn(&Req, &mut TcpStream) -> Next + Send + Sync + 'static,
    ) -> StubUpstream {
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let handler: Arc<Handler> = Arc::new(handler);
        let sh = shared.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { continue };
                let conn = sh.conns.fetch_add(1, Ordering::SeqCst);
                let sh = sh.clone();
                let handler = handler.clone();
                std::thread::spawn(move || serve(stream, conn, &sh, &*handler));
            }
        });
        StubUpstream { port, shared }
    }

    /// Answer every request with `response`, keeping the connection open.
    pub fn fixed(response: impl Into<Vec<u8>>) -> StubUpstream {
        let response = response.into();
        StubUpstream::start(move |_, s| {
            let _ = s.write_all(&response);
            Next::KeepAlive
        })
    }

    /// Answer every request with `response`, then close the connection.
    pub fn fixed_then_close(response: impl Into<Vec<u8>>) -> StubUpstream {
        let response = response.into();
        StubUpstream::start(move |_, s| {
            let _ = s.write_all(&response);
            Next::Close
        })
    }

    /// Read requests and never answer (the connection is held for `STUB_LIMIT`).
    pub fn silent() -> StubUpstream {
        StubUpstream::start(|_, _| {
            std::thread::sleep(STUB_LIMIT);
            Next::Close
        })
    }

    /// `127.0.0.1:PORT`
    pub fn authority(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `http://127.0.0.1:PORT/mcp`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }

    pub fn requests(&self) -> Vec<Req> {
        self.shared.reqs.lock().unwrap().clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.reqs.lock().unwrap().len()
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.conns.load(Ordering::SeqCst)
    }

    /// Wait (bounded) until at least `n` requests arrived; return them all.
    #[track_caller]
    pub fn wait_requests(&self, n: usize, limit: Duration) -> Vec<Req> {
        let deadline = Instant::now() + limit;
        let mut reqs = self.shared.reqs.lock().unwrap();
        while reqs.len() < n {
            let now = Instant::now();
            if now >= deadline {
                panic!("upstream saw {} requests, wanted {n}: {:#?}", reqs.len(), *reqs);
            }
            reqs = self.shared.cv.wait_timeout(reqs, deadline - now).unwrap().0;
        }
        reqs.clone()
    }

    /// The only request the upstream saw (waits up to 5 s for it).
    #[track_caller]
    pub fn only_request(&self) -> Req {
        let reqs = self.wait_requests(1, Duration::from_secs(5));
        assert_eq!(reqs.len(), 1, "upstream saw more than one request: {reqs:#?}");
        reqs[0].clone()
    }
}

fn serve(mut stream: TcpStream, conn: usize, sh: &Shared, handler: &Handler) {
    stream.set_read_timeout(Some(STUB_LIMIT)).unwrap();
    stream.set_write_timeout(Some(STUB_LIMIT)).unwrap();
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut stream, &mut buf, conn) else {
            return;
        };
        {
            let mut reqs = sh.reqs.lock().unwrap();
            reqs.push(req.clone());
            sh.cv.notify_all();
        }
        if handler(&req, &mut stream) == Next::Close {
            let _ = stream.shutdown(Shutdown::Write);
            // Drain until the peer closes so no RST races the response.
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut sink = [0u8; 4096];
            while matches!(read_retrying(&mut stream, &mut sink), Ok(n) if n > 0) {}
            return;
        }
    }
}

/// Read more bytes into `buf`; false on EOF or error.
fn fill(stream: &mut TcpStream, buf: &mut Vec<u8>) -> bool {
    let mut chunk = [0u8; 16 * 1024];
    match read_retrying(stream, &mut chunk) {
        Ok(0) | Err(_) => false,
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            true
        }
    }
}

pub fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>, conn: usize) -> Option<Req> {
    let head_end = loop {
        if let Some(i) = find(buf, b"\r\n\r\n") {
            break i + 4;
        }
        if !fill(stream, buf) {
            return None;
        }
    };
    let head = parse_head(&buf[..head_end]);
    let mut parts = head.start.splitn(3, ' ');
    let method = parts.next().unwrap_or("").to_string();
    let target = parts.next().unwrap_or("").to_string();
    let version = parts.next().unwrap_or("").to_string();
    let te_chunked = head.all("transfer-encoding").iter().any(|v| v.to_ascii_lowercase().contains("chunked"));
    let (body, end) = if te_chunked {
        loop {
            if let Some((body, _trailers, used)) = decode_chunked(&buf[head_end..]) {
                break (body, head_end + used);
            }
            if !fill(stream, buf) {
                return None;
            }
        }
    } else {
        let len: usize = head.all("content-length").first().map(|v| v.parse().unwrap_or(0)).unwrap_or(0);
        while buf.len() < head_end + len {
            if !fill(stream, buf) {
                return None;
            }
        }
        (buf[head_end..head_end + len].to_vec(), head_end + len)
    };
    let raw: Vec<u8> = buf.drain(..end).collect();
    Some(Req { method, target, version, head, body, raw, conn })
}

/// Decode a complete chunked body at the start of `data`:
/// (body, trailer fields, bytes used), or None when incomplete.
pub fn decode_chunked(data: &[u8]) -> Option<(Vec<u8>, Vec<(String, String)>, usize)> {
    let mut pos = 0;
    let mut body = Vec::new();
    loop {
        let line_end = find(&data[pos..], b"\r\n")? + pos;
        let line = std::str::from_utf8(&data[pos..line_end]).expect("chunk size line not UTF-8");
        let hex = line.split(';').next().unwrap().trim();
        let size = usize::from_str_radix(hex, 16).unwrap_or_else(|_| panic!("bad chunk size line {line:?}"));
        pos = line_end + 2;
        if size == 0 {
            // Trailer section up to an empty line.
            let mut trailers = Vec::new();
            loop {
                let end = find(&data[pos..], b"\r\n")? + pos;
                if end == pos {
                    return Some((body, trailers, end + 2));
                }
                let t = String::from_utf8_lossy(&data[pos..end]).into_owned();
                let (n, v) = t.split_once(':').unwrap_or((&t, ""));
                trailers.push((n.to_string(), v.trim().to_string()));
                pos = end + 2;
            }
        }
        if data.len() < pos + size + 2 {
            return None;
        }
        body.extend_from_slice(&data[pos..pos + size]);
        assert_eq!(&data[pos + size..pos + size + 2], b"\r\n", "chunk data not followed by CRLF");
        pos += size + 2;
    }
}

/// A raw response as the client saw it.
#[derive(Clone, Debug, Default)]
pub struct Resp {
    pub status: u16,
    pub head: Head,
    pub body: Vec<u8>,
    pub trailers: Vec<(String, String)>,
    /// Exactly the bytes this response took on the wire (head and framed body).
    pub raw: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn raw_text(&self) -> String {
        String::from_utf8_lossy(&self.raw).into_owned()
    }
    pub fn all(&self, name: &str) -> Vec<&str> {
        self.head.all(name)
    }
    #[track_caller]
    pub fn one(&self, name: &str) -> &str {
        self.head.one(name)
    }
    pub fn has(&self, name: &str) -> bool {
        self.head.has(name)
    }
}

/// A raw HTTP/1.1 client over one connection; keeps unread bytes between
/// responses so keep-alive and pipelining can be checked.
pub struct RawClient {
    pub stream: TcpStream,
    buf: Vec<u8>,
    eof: bool,
}

impl RawClient {
    pub fn new(stream: TcpStream) -> RawClient {
        RawClient { stream, buf: Vec::new(), eof: false }
    }

    #[track_caller]
    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write request to proxy");
    }

    /// Read more; false at EOF. Panics on a timeout with what was read so far.
    #[track_caller]
    fn fill(&mut self) -> bool {
        if self.eof {
            return false;
        }
        let mut chunk = [0u8; 16 * 1024];
        match read_retrying(&mut self.stream, &mut chunk) {
            Ok(0) => {
                self.eof = true;
                false
            }
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => panic!(
                "timed out reading from proxy; unread bytes so far: {:?}",
                String::from_utf8_lossy(&self.buf)
            ),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                self.eof = true;
                false
            }
            Err(e) => {
                panic!("read from proxy: {e}; unread bytes so far: {:?}", String::from_utf8_lossy(&self.buf))
            }
        }
    }

    /// Read one response head; the body is left unread.
    #[track_caller]
    pub fn read_head(&mut self) -> Resp {
        let end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            if !self.fill() {
                panic!(
                    "connection closed before a complete response head; got {:?}",
                    String::from_utf8_lossy(&self.buf)
                );
            }
        };
        let raw: Vec<u8> = self.buf.drain(..end).collect();
        let head = parse_head(&raw);
        let mut parts = head.start.splitn(3, ' ');
        let version = parts.next().unwrap_or("");
        assert!(version == "HTTP/1.1" || version == "HTTP/1.0", "bad status line {:?}", head.start);
        let status = parts
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {:?}", head.start));
        Resp { status, head, raw, ..Resp::default() }
    }

    /// Read one complete response to a request with `method`.
    #[track_caller]
    pub fn read_response(&mut self, method: &str) -> Resp {
        let mut resp = self.read_head();
        let no_body =
            method == "HEAD" || (100..200).contains(&resp.status) || resp.status == 204 || resp.status == 304;
        if no_body {
            return resp;
        }
        let chunked =
            resp.all("transfer-encoding").iter().any(|v| v.to_ascii_lowercase().contains("chunked"));
        if chunked {
            assert!(
                !resp.has("content-length"),
                "response has both transfer-encoding and content-length: {:?}",
                resp.raw_text()
            );
            loop {
                if let Some((body, trailers, used)) = decode_chunked(&self.buf) {
                    resp.body = body;
                    resp.trailers = trailers;
                    resp.raw.extend(self.buf.drain(..used));
                    return resp;
                }
                if !self.fill() {
                    panic!(
                        "connection closed inside a chunked body; head {:?}, body so far {:?}",
                        resp.raw_text(),
                        String::from_utf8_lossy(&self.buf)
                    );
                }
            }
        }
        if let Some(len) = resp.all("content-length").first() {
            let len: usize = len.parse().unwrap_or_else(|_| panic!("bad content-length {len:?}"));
            while self.buf.len() < len {
                if !self.fill() {
                    panic!(
                        "connection closed after {} of {len} body bytes; head {:?}",
                        self.buf.len(),
                        resp.raw_text()
                    );
                }
            }
            resp.body = self.buf.drain(..len).collect();
            resp.raw.extend_from_slice(&resp.body.clone());
            return resp;
        }
        // Close-delimited.
        while self.fill() {}
        resp.body = std::mem::take(&mut self.buf);
        resp.raw.extend_from_slice(&resp.body.clone());
        resp
    }

    /// Read raw bytes (framing included) until `needle` shows up or `limit`
    /// passes; returns when it was seen, and everything read so far.
    pub fn read_until(&mut self, needle: &[u8], limit: Duration) -> (Option<Instant>, Vec<u8>) {
        let deadline = Instant::now() + limit;
        let old = self.stream.read_timeout().ok().flatten();
        loop {
            if contains(&self.buf, needle) {
                let _ = self.stream.set_read_timeout(old);
                return (Some(Instant::now()), self.buf.clone());
            }
            let now = Instant::now();
            if now >= deadline || self.eof {
                let _ = self.stream.set_read_timeout(old);
                return (None, self.buf.clone());
            }
            let _ = self.stream.set_read_timeout(Some((deadline - now).max(Duration::from_millis(1))));
            let mut chunk = [0u8; 16 * 1024];
            match read_retrying(&mut self.stream, &mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(_) => {}
            }
        }
    }

    /// Everything buffered and not consumed by a response yet.
    pub fn unread(&self) -> &[u8] {
        &self.buf
    }

    /// True when the proxy closes the connection within `limit`
    /// (any bytes that arrive meanwhile are kept in the buffer).
    pub fn closed_within(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while !self.eof {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            let _ = self.stream.set_read_timeout(Some(deadline - now));
            let mut chunk = [0u8; 4096];
            match read_retrying(&mut self.stream, &mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::ConnectionReset => self.eof = true,
                Err(_) => {}
            }
        }
        true
    }
}

/// A request with `Host` first, then `fields`, then a content-length for a
/// non-empty body (or for POST).
pub fn request(method: &str, target: &str, host: &str, fields: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nHost: {host}\r\n");
    for (n, v) in fields {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    let has_len = fields.iter().any(|(n, _)| {
        n.eq_ignore_ascii_case("content-length") || n.eq_ignore_ascii_case("transfer-encoding")
    });
    if !has_len && (!body.is_empty() || method == "POST") {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// `HTTP/1.1 <status>` with `fields`, a content-length and `body`.
pub fn response(status: &str, fields: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status}\r\n");
    for (n, v) in fields {
        out.push_str(&format!("{n}: {v}\r\n"));
    }
    out.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// The helpers themselves, against each other with no proxy in between.
#[cfg(test)]
mod selfcheck {
    use super::*;

    fn conn(up: &StubUpstream) -> RawClient {
        let s = TcpStream::connect(("127.0.0.1", up.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        RawClient::new(s)
    }

    #[test]
    fn stubs_and_raw_client_agree_without_a_proxy() {
        let up = StubUpstream::fixed(&b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Checksum: abc123\r\n\r\n"[..]);
        let mut c = conn(&up);
        let mut raw =
            b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
                .to_vec();
        raw.extend(request("GET", "/y", "h", &[("A", "1"), ("a", "2")], b""));
        c.send(&raw);
        let r = c.read_response("POST");
        assert_eq!(r.text(), "hello world");
        assert_eq!(r.trailers.len(), 1);
        let r = c.read_response("GET");
        assert_eq!(r.text(), "hello world");
        let reqs = up.wait_requests(2, Duration::from_secs(2));
        assert_eq!(reqs[0].body, b"abc");
        assert_eq!(reqs[1].head.all("a"), vec!["1", "2"]);
        assert_eq!(reqs[1].target, "/y");

        let up = StubUpstream::fixed_then_close(&b"HTTP/1.1 200 OK\r\n\r\nclose body"[..]);
        let mut c = conn(&up);
        c.send(&request("GET", "/", "h", &[], b""));
        assert_eq!(c.read_response("GET").text(), "close body");

        let up = StubUpstream::start(|_, s| {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n");
            std::thread::sleep(Duration::from_millis(500));
            let _ = s.write_all(b"6\r\nsecond\r\n0\r\n\r\n");
            Next::KeepAlive
        });
        let mut c = conn(&up);
        let t0 = Instant::now();
        c.send(&request("GET", "/", "h", &[], b""));
        let h = c.read_head();
        assert_eq!(h.status, 200);
        let (s, _) = c.read_until(b"first", Duration::from_millis(300));
        assert!(s.unwrap() - t0 < Duration::from_millis(200));
        let (s, _) = c.read_until(b"second", Duration::from_millis(300));
        assert!(s.is_none());
        let (s, _) = c.read_until(b"second", Duration::from_millis(1000));
        assert!(s.is_some());
    }
}
