//! The clients of the relay bench: a closed-loop keep-alive load generator
//! (one mio thread, one request in flight per connection, every response's
//! status and body length checked), a timed SSE reader (chunked decoding,
//! every event's size, shape and timestamp checked), and idle SSE streams.

use crate::stub::{event_time, now_ns};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

pub struct LoadResult {
    /// Responses completed inside the measurement window.
    pub count: u64,
    /// Responses completed during the whole call (warm-up included).
    pub total: u64,
    pub secs: f64,
    /// Latencies (request written to response complete) in the window, sorted.
    pub lat_ns: Vec<u64>,
    /// The server closed a keep-alive connection after a complete response.
    pub reconnects: u64,
}

impl LoadResult {
    pub fn rps(&self) -> f64 {
        self.count as f64 / self.secs
    }
}

pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

struct LConn {
    stream: TcpStream,
    out_pos: usize,
    inbuf: Vec<u8>,
    sent_at: Instant,
    /// A request is in flight (written or being written).
    busy: bool,
}

fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_nodelay(true)?;
    s.set_nonblocking(true)?;
    Ok(TcpStream::from_std(s))
}

/// Closed-loop load: `conns` keep-alive connections, each sending `request`
/// again as soon as the previous response is complete and verified.
pub fn load(
    addr: SocketAddr,
    request: &[u8],
    expect_body: usize,
    conns: usize,
    warmup: Duration,
    measure: Duration,
) -> Result<LoadResult, String> {
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut cs: Vec<LConn> = Vec::with_capacity(conns);
    for i in 0..conns {
        let mut stream = connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        poll.registry()
            .register(&mut stream, Token(i), Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| e.to_string())?;
        cs.push(LConn {
            stream,
            out_pos: 0,
            inbuf: Vec::with_capacity(4096),
            sent_at: Instant::now(),
            busy: false,
        });
    }
    let start = Instant::now();
    let window = start + warmup;
    let end = window + measure;
    let mut lat: Vec<u64> = Vec::with_capacity(1 << 16);
    let (mut count, mut total, mut reconnects) = (0u64, 0u64, 0u64);
    let mut events = Events::with_capacity(1024);
    for c in cs.iter_mut() {
        send(c, request)?;
    }
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        poll.poll(&mut events, Some((end - now).min(Duration::from_millis(20))))
            .map_err(|e| e.to_string())?;
        for ev in events.iter() {
            let i = ev.token().0;
            let c = &mut cs[i];
            if c.busy && c.out_pos < request.len() {
                write_some(c, request)?;
            }
            let eof = read_all(c)?;
            let mut reconnect = false;
            if c.busy && c.out_pos == request.len() {
                if let Some((used, close)) = parse_response(&c.inbuf, expect_body)? {
                    let done = Instant::now();
                    if used != c.inbuf.len() {
                        return Err(format!("{} unexpected bytes after a response", c.inbuf.len() - used));
                    }
                    c.inbuf.clear();
                    c.busy = false;
                    total += 1;
                    if done >= window && done < end {
                        count += 1;
                        lat.push((done - c.sent_at).as_nanos() as u64);
                    }
                    reconnect = close;
                }
            }
            if eof {
                if c.busy {
                    return Err(format!(
                        "connection closed mid-exchange ({} bytes of response)",
                        c.inbuf.len()
                    ));
                }
                reconnect = true;
            }
            if reconnect {
                reconnects += 1;
                let _ = poll.registry().deregister(&mut c.stream);
                let mut stream = connect(addr).map_err(|e| format!("reconnect {addr}: {e}"))?;
                poll.registry()
                    .register(&mut stream, Token(i), Interest::READABLE | Interest::WRITABLE)
                    .map_err(|e| e.to_string())?;
                c.stream = stream;
                c.inbuf.clear();
            }
            if !c.busy && Instant::now() < end {
                send(c, request)?;
            }
        }
    }
    lat.sort_unstable();
    Ok(LoadResult { count, total, secs: measure.as_secs_f64(), lat_ns: lat, reconnects })
}

fn send(c: &mut LConn, request: &[u8]) -> Result<(), String> {
    c.busy = true;
    c.out_pos = 0;
    c.sent_at = Instant::now();
    write_some(c, request)
}

fn write_some(c: &mut LConn, request: &[u8]) -> Result<(), String> {
    while c.out_pos < request.len() {
        match c.stream.write(&request[c.out_pos..]) {
            Ok(n) => c.out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("write: {e}")),
        }
    }
    Ok(())
}

/// Read until WouldBlock; true on EOF.
fn read_all(c: &mut LConn) -> Result<bool, String> {
    let mut buf = [0u8; 8192];
    loop {
        match c.stream.read(&mut buf) {
            Ok(0) => return Ok(true),
            Ok(n) => c.inbuf.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionReset => return Ok(true),
            Err(e) => return Err(format!("read: {e}")),
        }
    }
}

/// Requests taking turns between relays: one blocking keep-alive
/// connection to each and one request in flight in all, the order reversed
/// every round, so each relay meets the machine's load at the same moments
/// (a neighbour's busy process, the CPU it sits on). Each relay's latencies
/// (request written to response complete) in the window, sorted; every
/// response checked as in `load`.
#[allow(dead_code)] // only the relay bench's https section takes turns
pub fn alternate(
    targets: &[(SocketAddr, &[u8])],
    expect_body: usize,
    warmup: Duration,
    measure: Duration,
) -> Result<Vec<Vec<u64>>, String> {
    let mut conns = Vec::with_capacity(targets.len());
    for (addr, _) in targets {
        conns.push(connect_blocking(*addr)?);
    }
    let mut lat: Vec<Vec<u64>> = targets.iter().map(|_| Vec::with_capacity(1 << 16)).collect();
    let mut buf = Vec::with_capacity(4096);
    let window = Instant::now() + warmup;
    let end = window + measure;
    let n = targets.len();
    for round in 0usize.. {
        let now = Instant::now();
        if now >= end {
            break;
        }
        for k in 0..n {
            let i = if round % 2 == 0 { k } else { n - 1 - k };
            let t0 = Instant::now();
            exchange(&mut conns[i], targets[i].1, expect_body, &mut buf)?;
            if now >= window {
                lat[i].push(t0.elapsed().as_nanos() as u64);
            }
        }
    }
    for l in &mut lat {
        l.sort_unstable();
    }
    Ok(lat)
}

/// One request and its verified response on a blocking connection.
fn exchange(
    s: &mut std::net::TcpStream,
    request: &[u8],
    expect_body: usize,
    buf: &mut Vec<u8>,
) -> Result<(), String> {
    s.write_all(request).map_err(|e| format!("write: {e}"))?;
    buf.clear();
    let mut chunk = [0u8; 8192];
    loop {
        let n = match s.read(&mut chunk) {
            Ok(0) => return Err("closed before a complete response".into()),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read: {e}")),
        };
        buf.extend_from_slice(&chunk[..n]);
        match parse_response(buf, expect_body)? {
            None => {}
            Some((used, _)) if used != buf.len() => return Err("bytes after the response".into()),
            Some((_, true)) => return Err("the relay closes the keep-alive connection".into()),
            Some(_) => return Ok(()),
        }
    }
}

/// A complete, verified response: (bytes used, server will close).
fn parse_response(buf: &[u8], expect_body: usize) -> Result<Option<(usize, bool)>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head: {e}: {:?}", String::from_utf8_lossy(buf))),
    };
    if resp.code != Some(200) {
        return Err(format!("status {:?}, expected 200: {:?}", resp.code, String::from_utf8_lossy(buf)));
    }
    let mut cl = None;
    let mut close = false;
    for h in resp.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            let v = std::str::from_utf8(h.value).ok().and_then(|v| v.trim().parse::<usize>().ok());
            if cl.is_some() {
                return Err("two content-length fields".into());
            }
            cl = Some(v.ok_or("bad content-length")?);
        } else if h.name.eq_ignore_ascii_case("connection") {
            close |= std::str::from_utf8(h.value).is_ok_and(|v| v.to_ascii_lowercase().contains("close"));
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("chunked response where a content-length one was expected".into());
        }
    }
    let cl = cl.ok_or("response without content-length")?;
    if cl != expect_body {
        return Err(format!("body length {cl}, expected {expect_body}"));
    }
    if buf.len() < head + cl {
        return Ok(None);
    }
    Ok(Some((head + cl, close)))
}

pub struct SseResult {
    /// Request written to terminating chunk received.
    pub elapsed: Duration,
    /// Per-event latency: stub's send stamp to the read that completed it.
    pub lat_ns: Vec<u64>,
}

enum Chunk {
    Size(Vec<u8>),
    Data(usize),
    DataEnd(u8),
    Trailer(Vec<u8>),
    Done,
}

/// Read one SSE stream of `n` events of `size` bytes from `GET path`.
pub fn sse(addr: SocketAddr, host: &str, n: u64, size: usize, pace_us: u64) -> Result<SseResult, String> {
    sse_on(connect_blocking(addr)?, host, n, size, pace_us)
}

/// A blocking connection for `sse_on` (no delay, a 60 s read timeout).
#[allow(dead_code)] // not every bench that includes this file reads over TLS
pub fn connect_blocking(addr: SocketAddr) -> Result<std::net::TcpStream, String> {
    let s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
    s.set_nodelay(true).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(60))).map_err(|e| e.to_string())?;
    Ok(s)
}

/// `sse` over a connected stream (plain, or TLS: the relay bench's https section).
#[allow(dead_code)] // not every bench that includes this file reads over TLS
pub fn sse_on(
    mut s: impl Read + Write,
    host: &str,
    n: u64,
    size: usize,
    pace_us: u64,
) -> Result<SseResult, String> {
    let req = format!(
        "GET /sse?n={n}&size={size}&pace_us={pace_us} HTTP/1.1\r\nhost: {host}\r\n\
         accept: text/event-stream\r\ncache-control: no-cache\r\n\r\n"
    );
    let t0 = Instant::now();
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = vec![0u8; 256 * 1024];
    let mut head: Vec<u8> = Vec::new();
    let mut state: Option<Chunk> = None;
    let mut event: Vec<u8> = Vec::with_capacity(size);
    let mut lat = Vec::with_capacity(n as usize);
    let (mut events, mut bytes) = (0u64, 0u64);
    loop {
        let got = match s.read(&mut buf) {
            Ok(0) => return Err(format!("EOF after {events} of {n} events")),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("read after {events} events: {e}")),
        };
        let arrived = now_ns();
        let mut data = &buf[..got];
        if state.is_none() {
            head.extend_from_slice(data);
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut resp = httparse::Response::new(&mut headers);
            let len = match resp.parse(&head) {
                Ok(httparse::Status::Complete(len)) => len,
                Ok(httparse::Status::Partial) => continue,
                Err(e) => return Err(format!("bad SSE response head: {e}")),
            };
            if resp.code != Some(200) {
                return Err(format!("SSE status {:?}", resp.code));
            }
            let has = |name: &str, val: &str| {
                resp.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case(name)
                        && std::str::from_utf8(h.value).is_ok_and(|v| v.to_ascii_lowercase().contains(val))
                })
            };
            if !has("content-type", "text/event-stream") || !has("transfer-encoding", "chunked") {
                return Err(format!(
                    "SSE head not chunked event-stream: {:?}",
                    String::from_utf8_lossy(&head[..len])
                ));
            }
            let consumed_before = head.len() - got;
            data = &buf[len - consumed_before..got];
            state = Some(Chunk::Size(Vec::new()));
        }
        let st = state.as_mut().unwrap();
        while !data.is_empty() {
            match st {
                Chunk::Size(line) => {
                    let nl = memchr::memchr(b'\n', data);
                    let take = nl.map_or(data.len(), |i| i + 1);
                    line.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if nl.is_some() {
                        let text = std::str::from_utf8(line).map_err(|_| "chunk size not UTF-8")?;
                        let hex = text.trim_end().split(';').next().unwrap_or("");
                        let len = usize::from_str_radix(hex.trim(), 16)
                            .map_err(|_| format!("bad chunk size line {text:?}"))?;
                        *st = if len == 0 { Chunk::Trailer(Vec::new()) } else { Chunk::Data(len) };
                    }
                }
                Chunk::Data(left) => {
                    let take = (*left).min(data.len());
                    let mut piece = &data[..take];
                    data = &data[take..];
                    *left -= take;
                    bytes += take as u64;
                    while !piece.is_empty() {
                        let want = (size - event.len()).min(piece.len());
                        event.extend_from_slice(&piece[..want]);
                        piece = &piece[want..];
                        if event.len() == size {
                            let t = event_time(&event).ok_or_else(|| {
                                format!(
                                    "event {events} malformed: {:?}",
                                    String::from_utf8_lossy(&event[..60])
                                )
                            })?;
                            lat.push(arrived.saturating_sub(t));
                            events += 1;
                            event.clear();
                        }
                    }
                    if *left == 0 {
                        *st = Chunk::DataEnd(0);
                    }
                }
                Chunk::DataEnd(seen) => {
                    let want = if *seen == 0 { b'\r' } else { b'\n' };
                    if data[0] != want {
                        return Err("chunk data not followed by CRLF".into());
                    }
                    data = &data[1..];
                    *seen += 1;
                    if *seen == 2 {
                        *st = Chunk::Size(Vec::new());
                    }
                }
                Chunk::Trailer(line) => {
                    let nl = memchr::memchr(b'\n', data);
                    let take = nl.map_or(data.len(), |i| i + 1);
                    line.extend_from_slice(&data[..take]);
                    data = &data[take..];
                    if nl.is_some() {
                        if line.as_slice() == b"\r\n" {
                            *st = Chunk::Done;
                        } else {
                            line.clear();
                        }
                    }
                }
                Chunk::Done => return Err(format!("{} bytes after the last chunk", data.len())),
            }
        }
        if matches!(st, Chunk::Done) {
            let elapsed = t0.elapsed();
            if events != n || !event.is_empty() || bytes != n * size as u64 {
                return Err(format!(
                    "stream ended with {events} of {n} events, {bytes} bytes, {} partial",
                    event.len()
                ));
            }
            lat.sort_unstable();
            return Ok(SseResult { elapsed, lat_ns: lat });
        }
    }
}

/// Open one idle SSE stream and wait for its first event.
pub fn open_idle(addr: SocketAddr, host: &str, timeout: Duration) -> Result<std::net::TcpStream, String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(timeout)).map_err(|e| e.to_string())?;
    let req = format!("GET /idle HTTP/1.1\r\nhost: {host}\r\naccept: text/event-stream\r\n\r\n");
    s.write_all(req.as_bytes()).map_err(|e| format!("write: {e}"))?;
    let mut got: Vec<u8> = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let want: &[u8] = b"data: {\"hello\":1}\n\n";
    while memchr::memmem::find(&got, want).is_none() {
        match s.read(&mut buf) {
            Ok(0) => return Err(format!("EOF after {} bytes", got.len())),
            Ok(k) => got.extend_from_slice(&buf[..k]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("no first event within {timeout:?} ({e})")),
        }
    }
    if !got.starts_with(b"HTTP/1.1 200") {
        return Err(format!(
            "idle stream status line: {:?}",
            String::from_utf8_lossy(&got[..got.len().min(40)])
        ));
    }
    Ok(s)
}
