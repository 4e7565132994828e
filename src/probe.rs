//! `--probe URL`: one `GET` to a health endpoint, then an exit status, for
//! a container HEALTHCHECK in an image without curl. Blocking `std::net`
//! under one deadline for the whole probe; nothing of the proxy starts.
//! The URL parser, the request writer and the status-line reader are pure
//! (tested at every split offset); `run` alone touches a socket.

use crate::io::{read_into, timed_out, SocketState};
use crate::limits;
use std::fmt;
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// A health URL, `http://HOST[:PORT][/PATH]`, checked but not resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Url {
    pub host: Host,
    pub port: u16,
    /// The request target: path and query as written, `/` when there is
    /// no path.
    pub target: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    Ip(IpAddr),
    /// A DNS name, resolved when the probe runs (`localhost` without a
    /// resolver: a `FROM scratch` image has no `/etc/hosts`).
    Name(String),
}

impl Url {
    /// `host:port` as the `Host` field wants it (RFC 9110 §7.2), an IPv6
    /// address in brackets.
    pub fn authority(&self) -> String {
        match &self.host {
            Host::Ip(IpAddr::V6(ip)) => format!("[{ip}]:{}", self.port),
            Host::Ip(IpAddr::V4(ip)) => format!("{ip}:{}", self.port),
            Host::Name(name) => format!("{name}:{}", self.port),
        }
    }
}

impl fmt::Display for Url {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "http://{}{}", self.authority(), self.target)
    }
}

const EXPECTED: &str = "expected http://HOST[:PORT][/PATH]";
const BAD_PORT: &str = "the port must be a number from 1 to 65535";

/// Parses `http://HOST[:PORT][/PATH]` (RFC 3986 §3, the `http` scheme of
/// RFC 9110 §4.2.1): HOST an IPv4 address, an IPv6 address in brackets or
/// a DNS name; PORT 1-65535, 80 when absent. The error says what is wrong
/// in words (the caller names the flag).
pub fn parse_url(url: &str) -> Result<Url, &'static str> {
    let scheme = |s: &str| url.get(..s.len()).is_some_and(|p| p.eq_ignore_ascii_case(s));
    if scheme("https://") {
        return Err("https is not supported (no TLS in this binary); use http://");
    }
    let rest = match url.get(7..) {
        Some(rest) if scheme("http://") => rest,
        _ => return Err(EXPECTED),
    };
    // The authority ends at the first '/', '?' or '#' (RFC 3986 §3.2).
    let (authority, target) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if authority.contains('@') {
        return Err("user info (USER@) is not supported");
    }
    let (host, port) = split_authority(authority)?;
    Ok(Url { host, port, target: request_target(target)? })
}

fn split_authority(authority: &str) -> Result<(Host, u16), &'static str> {
    let (host, port) = match authority.strip_prefix('[') {
        Some(v6) => {
            let (inside, after) = v6.split_once(']').ok_or("an IPv6 address needs its closing ]")?;
            let ip: Ipv6Addr = inside.parse().map_err(|_| "expected an IPv6 address inside [ ]")?;
            let port = match after {
                "" => None,
                after => Some(after.strip_prefix(':').ok_or("expected :PORT after ]")?),
            };
            (Host::Ip(IpAddr::V6(ip)), port)
        }
        None if authority.matches(':').count() > 1 => {
            return Err("an IPv6 address goes in brackets: http://[::1]:PORT/");
        }
        None => {
            let (name, port) = match authority.split_once(':') {
                Some((name, port)) => (name, Some(port)),
                None => (authority, None),
            };
            (host_name(name)?, port)
        }
    };
    let port = match port {
        None => 80,
        Some(digits) => parse_port(digits).ok_or(BAD_PORT)?,
    };
    Ok((host, port))
}

fn host_name(name: &str) -> Result<Host, &'static str> {
    if name.is_empty() {
        return Err("missing host");
    }
    if let Ok(ip) = name.parse::<Ipv4Addr>() {
        return Ok(Host::Ip(IpAddr::V4(ip)));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_') {
        return Err("the host must be an IP address or a DNS name (letters, digits, '-', '.')");
    }
    Ok(Host::Name(name.to_string()))
}

/// 1-65535 from decimal digits only (no sign, no spaces), at most five.
fn parse_port(digits: &str) -> Option<u16> {
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n = digits.bytes().fold(0u32, |n, b| n * 10 + u32::from(b - b'0'));
    u16::try_from(n).ok().filter(|&p| p != 0)
}

/// The path and query as the request target (RFC 9112 §3.2.1: origin-form,
/// `/` for an empty path). Only visible ASCII goes into the request line;
/// a fragment is never sent, so one in the URL is refused rather than
/// silently dropped.
fn request_target(target: &str) -> Result<String, &'static str> {
    if target.contains('#') {
        return Err("a fragment (#...) is never sent; remove it");
    }
    if !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("the path must be visible ASCII without spaces (percent-encode the rest)");
    }
    Ok(match target.strip_prefix('?') {
        _ if target.is_empty() => "/".to_string(),
        Some(_) => format!("/{target}"),
        None => target.to_string(),
    })
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
    let name = match &url.host {
        Host::Ip(ip) => return Ok(vec![SocketAddr::new(*ip, url.port)]),
        Host::Name(name) if name.eq_ignore_ascii_case("localhost") => {
            return Ok(vec![
                SocketAddr::from((Ipv4Addr::LOCALHOST, url.port)),
                SocketAddr::from((Ipv6Addr::LOCALHOST, url.port)),
            ])
        }
        Host::Name(name) => name,
    };
    let addrs: Vec<SocketAddr> = match (name.as_str(), url.port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(_) => Vec::new(),
    };
    if addrs.is_empty() {
        return Err(Failure::Resolve(name.clone()));
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> Host {
        Host::Ip(s.parse().unwrap())
    }

    #[test]
    fn url_forms_that_parse() {
        let name = |s: &str| Host::Name(s.to_string());
        let cases = [
            ("http://127.0.0.1:9100/healthz", ip("127.0.0.1"), 9100, "/healthz"),
            ("HTTP://127.0.0.1/healthz", ip("127.0.0.1"), 80, "/healthz"),
            ("http://127.0.0.1:9100", ip("127.0.0.1"), 9100, "/"),
            ("http://127.0.0.1", ip("127.0.0.1"), 80, "/"),
            ("http://[::1]:9100/healthz", ip("::1"), 9100, "/healthz"),
            ("http://[::1]/", ip("::1"), 80, "/"),
            ("http://[fe80::1:2]:1", ip("fe80::1:2"), 1, "/"),
            ("http://localhost:65535/h?x=1&y", name("localhost"), 65535, "/h?x=1&y"),
            ("http://metrics_1.local:00080/a/b", name("metrics_1.local"), 80, "/a/b"),
            ("http://h:1?ready", name("h"), 1, "/?ready"),
            ("http://h:1/a@b", name("h"), 1, "/a@b"),
        ];
        for (url, host, port, target) in cases {
            let want = Url { host, port, target: target.to_string() };
            assert_eq!(parse_url(url), Ok(want), "{url}");
        }
        let u = parse_url("http://[::1]:7/healthz").unwrap();
        assert_eq!((u.authority().as_str(), u.to_string().as_str()), ("[::1]:7", "http://[::1]:7/healthz"));
        assert_eq!(parse_url("http://h/x").unwrap().authority(), "h:80");
    }

    #[test]
    fn url_forms_that_are_refused_say_why() {
        let cases = [
            ("127.0.0.1:9100/healthz", "expected http://"),
            ("", "expected http://"),
            ("http:/127.0.0.1/", "expected http://"),
            ("ftp://127.0.0.1/", "expected http://"),
            ("https://127.0.0.1/healthz", "https is not supported"),
            ("HTTPS://h/", "https is not supported"),
            ("http://", "missing host"),
            ("http:///healthz", "missing host"),
            ("http://:9100/healthz", "missing host"),
            ("http://h:/", "port"),
            ("http://h:0/", "port"),
            ("http://h:65536/", "port"),
            ("http://h:123456/", "port"),
            ("http://h:+80/", "port"),
            ("http://h:8 0/", "port"),
            ("http://h:x/", "port"),
            ("http://::1/", "brackets"),
            ("http://[::1/", "closing ]"),
            ("http://[::1]x/", ":PORT after ]"),
            ("http://[127.0.0.1]/", "IPv6 address inside"),
            ("http://[]:1/", "IPv6 address inside"),
            ("http://[::1]:0/", "port"),
            ("http://user@h/", "user info"),
            ("http://user:pw@h:1/", "user info"),
            ("http://h%41/", "DNS name"),
            ("http://h/a b", "visible ASCII"),
            ("http://h/a\r\nX: y", "visible ASCII"),
            ("http://h/é", "visible ASCII"),
            ("http://h/healthz#top", "fragment"),
        ];
        for (url, why) in cases {
            match parse_url(url) {
                Err(e) => assert!(e.contains(why), "{url:?}: {e:?} does not say {why:?}"),
                Ok(u) => panic!("{url:?} parsed: {u:?}"),
            }
        }
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
