//! `--probe URL`: one `GET` to a health endpoint, then an exit status, for
//! a container HEALTHCHECK in an image without curl. Blocking `std::net`
//! under one deadline for the whole probe; nothing of the proxy starts.
//! The URL parser, the request writer and the status-line reader are pure
//! (tested at every split offset); `run` alone touches a socket.

use crate::io::{read_into, timed_out, SocketState};
use crate::limits;
use std::fmt;
use std::io::{self, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

pub use crate::url::{Host, Url};

/// Parses a health URL: `http://HOST[:PORT][/PATH]` (`url::parse`); the
/// probe speaks plain HTTP only. The error says what is wrong in words
/// (the caller names the flag).
pub fn parse_url(url: &str) -> Result<Url, &'static str> {
    let u = crate::url::parse(url)?;
    if u.https {
        return Err("https is not supported (no TLS in this binary); use http://");
    }
    Ok(u)
}

/// The probe's request: `Connection: close`, so the answer ends with the
/// connection and nothing is kept (RFC 9112 §9.6).
pub fn request(url: &Url) -> Vec<u8> {
    format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUser-Agent: mcp-identity-proxy/{} (probe)\r\nConnection: close\r\n\r\n",
        url.target,
        url.authority(),
        env!("CARGO_PKG_VERSION"),
    )
    .into_bytes()
}

/// What the bytes received so far say about the response's status line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusLine {
    /// No whole line yet, and what came may still begin one.
    Partial,
    /// A whole `HTTP/1.x NNN ...` line: its code.
    Complete(u16),
    Invalid(Invalid),
}

/// Why the first line is not an HTTP/1.x status line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// httparse refused it (a wrong version, a bad code, a stray byte).
    Http(httparse::Error),
    /// An empty line where the status line belongs.
    EmptyLine,
    /// No line end within `limits::PROBE_MAX_STATUS_LINE` bytes.
    TooLong,
}

impl fmt::Display for Invalid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Invalid::Http(e) => write!(f, "{e}"),
            Invalid::EmptyLine => f.write_str("an empty line"),
            Invalid::TooLong => {
                write!(f, "no line end in the first {} bytes", limits::PROBE_MAX_STATUS_LINE)
            }
        }
    }
}

/// Reads the status line (RFC 9112 §4) from the start of `received`, whole
/// or a prefix of it; bytes after the line are not looked at (the probe
/// wants the code, not the fields or the body).
pub fn status_line(received: &[u8]) -> StatusLine {
    let mut no_fields: [httparse::Header<'_>; 0] = [];
    let Some(end) = memchr::memchr(b'\n', received) else {
        // A prefix that cannot begin a status line is refused now, not at
        // the deadline. Without a line end httparse cannot complete.
        return match httparse::Response::new(&mut no_fields).parse(received) {
            Err(e) => StatusLine::Invalid(Invalid::Http(e)),
            Ok(_) if received.len() >= limits::PROBE_MAX_STATUS_LINE => StatusLine::Invalid(Invalid::TooLong),
            Ok(_) => StatusLine::Partial,
        };
    };
    let line = received.get(..=end).unwrap_or(received);
    if line.len() > limits::PROBE_MAX_STATUS_LINE {
        return StatusLine::Invalid(Invalid::TooLong);
    }
    if line == b"\n" || line == b"\r\n" {
        // httparse would skip it, but a response starts with its status
        // line (the empty-line allowance of RFC 9112 §2.2 is for requests).
        return StatusLine::Invalid(Invalid::EmptyLine);
    }
    // httparse completes a whole head: the line, then the empty line that
    // ends a head without fields.
    let mut head = Vec::with_capacity(line.len() + 2);
    head.extend_from_slice(line);
    head.extend_from_slice(b"\r\n");
    let mut response = httparse::Response::new(&mut no_fields);
    match response.parse(&head) {
        Ok(httparse::Status::Complete(_)) => match response.code {
            Some(code) => StatusLine::Complete(code),
            None => StatusLine::Invalid(Invalid::Http(httparse::Error::Status)),
        },
        // Not reached: a whole line and an empty one complete a head.
        Ok(httparse::Status::Partial) => StatusLine::Invalid(Invalid::Http(httparse::Error::NewLine)),
        Err(e) => StatusLine::Invalid(Invalid::Http(e)),
    }
}

/// The bytes of the answer read so far, at most
/// `limits::PROBE_MAX_STATUS_LINE`: reads go into `space`, `fill` counts
/// them, `status` reads the line.
pub struct StatusReader {
    buf: Vec<u8>,
    len: usize,
}

impl Default for StatusReader {
    fn default() -> StatusReader {
        StatusReader { buf: vec![0; limits::PROBE_MAX_STATUS_LINE], len: 0 }
    }
}

impl StatusReader {
    /// Where the next read goes; empty once the limit is reached.
    pub fn space(&mut self) -> &mut [u8] {
        self.buf.get_mut(self.len..).unwrap_or_default()
    }

    pub fn fill(&mut self, n: usize) {
        self.len = self.len.saturating_add(n).min(self.buf.len());
    }

    pub fn received(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or_default()
    }

    pub fn status(&self) -> StatusLine {
        status_line(self.received())
    }
}

/// What the probe was doing when its deadline passed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Connecting,
    Sending,
    Waiting,
}

/// Why a probe failed (exit status 1). `Display` is one line and shows at
/// most `limits::PROBE_EXCERPT` received bytes, escaped.
#[derive(Debug, PartialEq, Eq)]
pub enum Failure {
    Resolve(String),
    Connect(SocketAddr, io::ErrorKind),
    Timeout(Phase, Duration),
    Send(io::ErrorKind),
    Read(io::ErrorKind),
    /// Closed before a whole status line; what came before it.
    Closed(Vec<u8>),
    Invalid(Invalid, Vec<u8>),
    /// A status line with a code other than 200.
    Status(u16),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Resolve(host) => write!(f, "cannot resolve host '{host}'"),
            Failure::Connect(addr, kind) => write!(f, "cannot connect to {addr}: {kind}"),
            Failure::Timeout(phase, after) => {
                let doing = match phase {
                    Phase::Connecting => "connecting",
                    Phase::Sending => "sending the request",
                    Phase::Waiting => "waiting for the status line",
                };
                write!(f, "no answer within {after:?} ({doing})")
            }
            Failure::Send(kind) => write!(f, "cannot send the request: {kind}"),
            Failure::Read(kind) => write!(f, "{kind} while waiting for the status line"),
            Failure::Closed(got) if got.is_empty() => f.write_str("the connection closed without an answer"),
            Failure::Closed(got) => {
                write!(f, "the connection closed before a whole status line: \"{}\"", excerpt(got))
            }
            Failure::Invalid(why, got) => {
                write!(f, "not an HTTP/1.x status line ({why}): \"{}\"", excerpt(got))
            }
            Failure::Status(code) => write!(f, "answered {code}, not 200"),
        }
    }
}

/// The first received bytes, escaped (no control byte reaches a terminal).
fn excerpt(got: &[u8]) -> String {
    let cut = got.get(..limits::PROBE_EXCERPT).unwrap_or(got);
    let more = if cut.len() < got.len() { "..." } else { "" };
    format!("{}{more}", cut.escape_ascii())
}

/// Runs the probe: resolve, connect, send, read the status line, all
/// within `limits::PROBE_TIMEOUT` (a name's resolution excepted: the
/// system resolver takes no deadline). `Ok` means a 200.
pub fn run(url: &Url) -> Result<(), Failure> {
    probe(url, limits::PROBE_TIMEOUT)
}

fn probe(url: &Url, timeout: Duration) -> Result<(), Failure> {
    let deadline = Instant::now() + timeout;
    let left = |phase| {
        let left = deadline.saturating_duration_since(Instant::now());
        // A zero timeout means "none" to set_read_timeout and is an error
        // to connect_timeout: the deadline has passed.
        if left.is_zero() {
            Err(Failure::Timeout(phase, timeout))
        } else {
            Ok(left)
        }
    };
    let mut stream = connect(url, &left, timeout)?;
    stream.set_write_timeout(Some(left(Phase::Sending)?)).map_err(|e| Failure::Send(e.kind()))?;
    stream.write_all(&request(url)).map_err(|e| {
        if timed_out(e.kind()) {
            Failure::Timeout(Phase::Sending, timeout)
        } else {
            Failure::Send(e.kind())
        }
    })?;
    let mut reader = StatusReader::default();
    loop {
        match reader.status() {
            StatusLine::Complete(200) => return Ok(()),
            StatusLine::Complete(code) => return Err(Failure::Status(code)),
            StatusLine::Invalid(why) => return Err(Failure::Invalid(why, reader.received().to_vec())),
            StatusLine::Partial => {}
        }
        // Each read waits only for what is left, so a trickle of bytes
        // cannot stretch the probe past its deadline.
        stream.set_read_timeout(Some(left(Phase::Waiting)?)).map_err(|e| Failure::Read(e.kind()))?;
        match read_into(&mut stream, reader.space()) {
            (n, SocketState::Open) => reader.fill(n),
            (_, SocketState::Closed) => return Err(Failure::Closed(reader.received().to_vec())),
            (_, SocketState::WouldBlock) => return Err(Failure::Timeout(Phase::Waiting, timeout)),
            (_, SocketState::Error(kind)) if timed_out(kind) => {
                return Err(Failure::Timeout(Phase::Waiting, timeout))
            }
            (_, SocketState::Error(kind)) => return Err(Failure::Read(kind)),
        }
    }
}

/// Connects to the first address that accepts (`localhost`: IPv4, then
/// IPv6); the error is the last address's.
fn connect(
    url: &Url,
    left: &dyn Fn(Phase) -> Result<Duration, Failure>,
    timeout: Duration,
) -> Result<TcpStream, Failure> {
    let mut last = None;
    for addr in addrs(url)? {
        match TcpStream::connect_timeout(&addr, left(Phase::Connecting)?) {
            Ok(stream) => return Ok(stream),
            Err(e) if timed_out(e.kind()) => last = Some(Failure::Timeout(Phase::Connecting, timeout)),
            Err(e) => last = Some(Failure::Connect(addr, e.kind())),
        }
    }
    // `addrs` is never empty, so `last` is set.
    Err(last.unwrap_or_else(|| Failure::Resolve(url.authority())))
}

fn addrs(url: &Url) -> Result<Vec<SocketAddr>, Failure> {
    if let Some(fixed) = url.fixed_addrs() {
        return Ok(fixed);
    }
    let name = url.host_text();
    let addrs: Vec<SocketAddr> = match (name.as_str(), url.port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(_) => Vec::new(),
    };
    if addrs.is_empty() {
        return Err(Failure::Resolve(name));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_refuses_https() {
        for url in ["https://127.0.0.1/healthz", "HTTPS://h/"] {
            assert_eq!(parse_url(url).map_err(|e| e.contains("https is not supported")), Err(true), "{url}");
        }
        assert!(parse_url("http://h/x").is_ok());
    }

    #[test]
    fn the_request_is_a_get_with_host_and_connection_close() {
        let text = String::from_utf8(request(&parse_url("http://[::1]:9/healthz?x").unwrap())).unwrap();
        assert!(text.starts_with("GET /healthz?x HTTP/1.1\r\nHost: [::1]:9\r\n"), "{text}");
        assert!(text.ends_with("\r\nConnection: close\r\n\r\n"), "{text}");
        let mut fields = [httparse::EMPTY_HEADER; 8];
        let mut req = httparse::Request::new(&mut fields);
        assert_eq!(req.parse(text.as_bytes()), Ok(httparse::Status::Complete(text.len())));
    }

    /// Whole answers and what their status line reads as.
    fn answers() -> Vec<(Vec<u8>, StatusLine)> {
        let invalid = |e| StatusLine::Invalid(Invalid::Http(e));
        let mut long = b"HTTP/1.1 200 ".to_vec();
        long.resize(limits::PROBE_MAX_STATUS_LINE + 10, b'x');
        long.extend_from_slice(b"\r\n");
        vec![
            (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(), StatusLine::Complete(200)),
            (b"HTTP/1.0 200 OK\r\n".to_vec(), StatusLine::Complete(200)),
            (b"HTTP/1.1 200 OK\n\nok".to_vec(), StatusLine::Complete(200)),
            (b"HTTP/1.1 200\r\n\r\n".to_vec(), StatusLine::Complete(200)),
            (b"HTTP/1.1 503 Service Unavailable\r\n\r\n".to_vec(), StatusLine::Complete(503)),
            (b"HTTP/1.1 204 No Content\r\n\r\n".to_vec(), StatusLine::Complete(204)),
            // The fields are not read: a bad one after a 200 still is a 200.
            (b"HTTP/1.1 200 OK\r\nbad field\r\n\r\n".to_vec(), StatusLine::Complete(200)),
            (b"HTTP/2 200\r\n\r\n".to_vec(), invalid(httparse::Error::Version)),
            (b"SSH-2.0-OpenSSH_9.6\r\n".to_vec(), invalid(httparse::Error::Version)),
            (b"HTTP/1.1 2000 OK\r\n".to_vec(), invalid(httparse::Error::Status)),
            (b"HTTP/1.1 20 OK\r\n".to_vec(), invalid(httparse::Error::Status)),
            (b"HTTP/1.1 200 OK\rX\r\n".to_vec(), invalid(httparse::Error::Status)),
            (b"\r\nHTTP/1.1 200 OK\r\n\r\n".to_vec(), StatusLine::Invalid(Invalid::EmptyLine)),
            (b"\nHTTP/1.1 200 OK\r\n\r\n".to_vec(), StatusLine::Invalid(Invalid::EmptyLine)),
            (long, StatusLine::Invalid(Invalid::TooLong)),
            (vec![b'x'; 3 * limits::PROBE_MAX_STATUS_LINE], invalid(httparse::Error::Version)),
            (vec![b'H'; 3 * limits::PROBE_MAX_STATUS_LINE], invalid(httparse::Error::Version)),
        ]
    }

    #[test]
    fn probe_status_line_whole_and_every_prefix() {
        for (answer, want) in answers() {
            assert_eq!(status_line(&answer), want, "{:?}", answer.escape_ascii().to_string());
            // Every prefix reads as "more to come" or already as the
            // final answer, never as something else.
            for i in 0..answer.len() {
                let got = status_line(&answer[..i]);
                assert!(
                    got == StatusLine::Partial || got == want,
                    "{:?} cut at {i}: {got:?}, whole {want:?}",
                    answer.escape_ascii().to_string()
                );
            }
        }
        assert_eq!(status_line(b""), StatusLine::Partial);
        assert_eq!(status_line(b"HTTP/1.1 200 OK"), StatusLine::Partial);
        assert_eq!(status_line(b"HTTP/1.1 200 OK\r"), StatusLine::Partial);
        assert_eq!(status_line(b"HTTP/1.1 20"), StatusLine::Partial);
        assert_eq!(status_line(b"X"), StatusLine::Invalid(Invalid::Http(httparse::Error::Version)));
    }

    /// What a `StatusReader` fed `pieces` in turn reads, stopping where the
    /// probe stops (a final status, or a full reader).
    fn read_in_pieces(pieces: &[&[u8]]) -> StatusLine {
        let mut r = StatusReader::default();
        for piece in pieces {
            if r.status() != StatusLine::Partial {
                break;
            }
            let space = r.space();
            let n = piece.len().min(space.len());
            space[..n].copy_from_slice(&piece[..n]);
            r.fill(n);
        }
        r.status()
    }

    #[test]
    fn probe_status_reader_at_every_split() {
        for (answer, want) in answers() {
            let name = answer.escape_ascii().to_string();
            assert_eq!(read_in_pieces(&[&answer]), want, "{name} whole");
            for i in 0..=answer.len() {
                let (a, b) = answer.split_at(i);
                assert_eq!(read_in_pieces(&[a, b]), want, "{name} split at {i}");
            }
            let bytes: Vec<&[u8]> = answer.chunks(1).collect();
            assert_eq!(read_in_pieces(&bytes), want, "{name} byte by byte");
            // Three pieces, over a short status line and a little past it
            // (the long ones: two pieces and byte by byte above).
            let line = memchr::memchr(b'\n', &answer).map_or(answer.len(), |e| e + 3).min(answer.len());
            if line > 64 {
                continue;
            }
            for i in 0..=line {
                for j in i..=line {
                    let got = read_in_pieces(&[&answer[..i], &answer[i..j], &answer[j..]]);
                    assert_eq!(got, want, "{name} split at {i} and {j}");
                }
            }
        }
    }

    #[test]
    fn probe_reader_is_bounded() {
        let mut r = StatusReader::default();
        let n = r.space().len();
        assert_eq!(n, limits::PROBE_MAX_STATUS_LINE);
        r.space().fill(b'H');
        r.fill(n + 100);
        assert!(r.space().is_empty());
        assert_eq!(r.received().len(), limits::PROBE_MAX_STATUS_LINE);
    }

    #[test]
    fn probe_failures_are_one_short_line() {
        let flood = vec![0x1bu8; 100_000];
        for f in [
            Failure::Resolve("no.such.host".into()),
            Failure::Connect("127.0.0.1:9".parse().unwrap(), io::ErrorKind::ConnectionRefused),
            Failure::Timeout(Phase::Waiting, Duration::from_secs(3)),
            Failure::Send(io::ErrorKind::BrokenPipe),
            Failure::Read(io::ErrorKind::ConnectionReset),
            Failure::Closed(Vec::new()),
            Failure::Closed(b"HTTP/1.1 2".to_vec()),
            Failure::Invalid(Invalid::TooLong, flood.clone()),
            Failure::Invalid(Invalid::Http(httparse::Error::Version), b"\x1b[2J\r\n\xff".to_vec()),
            Failure::Status(503),
        ] {
            let line = f.to_string();
            assert!(!line.is_empty() && line.len() < 256, "{line}");
            assert!(line.bytes().all(|b| b.is_ascii_graphic() || b == b' '), "{line:?}");
        }
        assert_eq!(Failure::Status(503).to_string(), "answered 503, not 200");
        assert_eq!(
            Failure::Invalid(Invalid::Http(httparse::Error::Version), b"\x1b[2J\r\n".to_vec()).to_string(),
            "not an HTTP/1.x status line (invalid HTTP version): \"\\x1b[2J\\r\\n\""
        );
        assert_eq!(
            Failure::Timeout(Phase::Connecting, Duration::from_secs(3)).to_string(),
            "no answer within 3s (connecting)"
        );
    }
}
