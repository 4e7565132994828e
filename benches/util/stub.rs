//! The upstream stub every relay measurement shares: one mio thread that
//! answers keep-alive requests with a fixed JSON body and holds idle SSE
//! streams, plus one blocking thread per timed SSE stream (handed off from
//! the loop so that pacing and flow control are plain blocking writes).

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Length of the fixed JSON answer to every plain request.
pub const RESPONSE_BODY_LEN: usize = 200;

/// Every timestamp in an event is nanoseconds since this instant, shared by
/// the stub threads and the clients (one process, one monotonic clock).
pub fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

pub fn now_ns() -> u64 {
    epoch().elapsed().as_nanos() as u64
}

/// `data: {"t":<20 digits>,"p":"xxx…"}\n\n`: exactly `size` bytes.
pub const EVENT_PREFIX: &[u8] = b"data: {\"t\":";
const T_DIGITS: usize = 20;
const EVENT_MID: &[u8] = b",\"p\":\"";
pub const EVENT_SUFFIX: &[u8] = b"\"}\n\n";
pub const MIN_EVENT: usize = EVENT_PREFIX.len() + T_DIGITS + EVENT_MID.len() + EVENT_SUFFIX.len();

pub fn event_template(size: usize) -> Vec<u8> {
    assert!(size >= MIN_EVENT, "event of {size} bytes is too small");
    let mut e = Vec::with_capacity(size);
    e.extend_from_slice(EVENT_PREFIX);
    e.extend_from_slice(&[b'0'; T_DIGITS]);
    e.extend_from_slice(EVENT_MID);
    e.resize(size - EVENT_SUFFIX.len(), b'x');
    e.extend_from_slice(EVENT_SUFFIX);
    e
}

fn stamp_event(e: &mut [u8], t: u64) {
    let digits = &mut e[EVENT_PREFIX.len()..EVENT_PREFIX.len() + T_DIGITS];
    let mut v = t;
    for d in digits.iter_mut().rev() {
        *d = b'0' + (v % 10) as u8;
        v /= 10;
    }
}

/// The send timestamp of an event built by `event_template`, if it is one.
pub fn event_time(e: &[u8]) -> Option<u64> {
    if !e.starts_with(EVENT_PREFIX) || !e.ends_with(EVENT_SUFFIX) {
        return None;
    }
    let digits = e.get(EVENT_PREFIX.len()..EVENT_PREFIX.len() + T_DIGITS)?;
    let mut v = 0u64;
    for d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        v = v * 10 + u64::from(d - b'0');
    }
    Some(v)
}

/// What the stub saw, for the correctness checks.
#[derive(Default)]
pub struct Seen {
    /// Head and body of the last request to `/check`.
    pub last_check: Mutex<Vec<u8>>,
    pub requests: AtomicU64,
    pub open_idle: AtomicU64,
}

pub struct Stub {
    pub addr: SocketAddr,
    pub seen: Arc<Seen>,
}

/// Start the stub on 127.0.0.1:0.
pub fn start() -> Stub {
    let listener = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("stub bind");
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    std::thread::Builder::new().name("stub".into()).spawn(move || run(listener, s)).unwrap();
    Stub { addr, seen }
}

struct Conn {
    stream: TcpStream,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_pos: usize,
    idle_stream: bool,
}

const LISTENER: Token = Token(usize::MAX);

fn run(mut listener: TcpListener, seen: Arc<Seen>) {
    let mut poll = Poll::new().unwrap();
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE).unwrap();
    let mut events = Events::with_capacity(1024);
    let mut conns: Vec<Option<Conn>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let response = fixed_response();
    loop {
        if let Err(e) = poll.poll(&mut events, None) {
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            panic!("stub poll: {e}");
        }
        for ev in events.iter() {
            if ev.token() == LISTENER {
                loop {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let _ = stream.set_nodelay(true);
                            let slot = free.pop().unwrap_or_else(|| {
                                conns.push(None);
                                conns.len() - 1
                            });
                            poll.registry()
                                .register(&mut stream, Token(slot), Interest::READABLE | Interest::WRITABLE)
                                .unwrap();
                            conns[slot] = Some(Conn {
                                stream,
                                inbuf: Vec::with_capacity(4096),
                                out: Vec::new(),
                                out_pos: 0,
                                idle_stream: false,
                            });
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            eprintln!("stub accept: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                            break;
                        }
                    }
                }
                continue;
            }
            let slot = ev.token().0;
            let Some(conn) = conns.get_mut(slot).and_then(Option::as_mut) else { continue };
            match serve(conn, &response, &seen) {
                Next::Keep => {}
                Next::Close => {
                    let mut c = conns[slot].take().unwrap();
                    let _ = poll.registry().deregister(&mut c.stream);
                    if c.idle_stream {
                        seen.open_idle.fetch_sub(1, Ordering::Relaxed);
                    }
                    free.push(slot);
                }
                Next::HandOff(params) => {
                    let mut c = conns[slot].take().unwrap();
                    let _ = poll.registry().deregister(&mut c.stream);
                    free.push(slot);
                    let std_stream = into_std(c.stream);
                    std::thread::spawn(move || {
                        let _ = stream_sse(std_stream, params);
                    });
                }
            }
        }
    }
}

fn into_std(s: TcpStream) -> std::net::TcpStream {
    use std::os::fd::{FromRawFd, IntoRawFd};
    // SAFETY: the fd comes from a TcpStream we own and give up here.
    let s = unsafe { std::net::TcpStream::from_raw_fd(s.into_raw_fd()) };
    s.set_nonblocking(false).unwrap();
    s
}

fn fixed_response() -> Vec<u8> {
    let mut body = br#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":""#.to_vec();
    let tail = br#""}],"isError":false}}"#;
    body.resize(RESPONSE_BODY_LEN - tail.len(), b'a');
    body.extend_from_slice(tail);
    assert_eq!(body.len(), RESPONSE_BODY_LEN);
    let mut r = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(&body);
    r
}

/// A timed SSE stream: `n` events of `size` bytes, each its own chunk;
/// `pace` between events (zero: as fast as the socket takes them).
#[derive(Clone, Copy, Debug)]
pub struct SseParams {
    pub n: u64,
    pub size: usize,
    pub pace: Duration,
}

enum Next {
    Keep,
    Close,
    HandOff(SseParams),
}

fn query_u64(target: &str, key: &str) -> Option<u64> {
    let q = target.split_once('?')?.1;
    q.split('&').find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn serve(c: &mut Conn, response: &[u8], seen: &Seen) -> Next {
    // Read until WouldBlock (edge-triggered).
    let mut eof = false;
    loop {
        let len = c.inbuf.len();
        if c.inbuf.capacity() - len < 2048 {
            c.inbuf.reserve(4096);
        }
        let cap = c.inbuf.capacity();
        c.inbuf.resize(cap, 0);
        match c.stream.read(&mut c.inbuf[len..]) {
            Ok(0) => {
                c.inbuf.truncate(len);
                eof = true;
                break;
            }
            Ok(n) => c.inbuf.truncate(len + n),
            Err(e) => {
                c.inbuf.truncate(len);
                match e.kind() {
                    io::ErrorKind::WouldBlock => break,
                    io::ErrorKind::Interrupted => continue,
                    _ => return Next::Close,
                }
            }
        }
    }
    // Answer every complete request.
    let mut at = 0;
    while !c.idle_stream {
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        let head_len = match req.parse(&c.inbuf[at..]) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => break,
            Err(e) => panic!("stub: bad request from the relay: {e}"),
        };
        let cl = req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("content-length"))
            .map(|h| std::str::from_utf8(h.value).unwrap().trim().parse::<usize>().unwrap())
            .unwrap_or(0);
        if c.inbuf.len() - at < head_len + cl {
            break;
        }
        let target = req.path.unwrap_or("").to_owned();
        seen.requests.fetch_add(1, Ordering::Relaxed);
        if target.starts_with("/check") {
            *seen.last_check.lock().unwrap() = c.inbuf[at..at + head_len + cl].to_vec();
        }
        at += head_len + cl;
        if target.starts_with("/sse") {
            let params = SseParams {
                n: query_u64(&target, "n").unwrap_or(100),
                size: query_u64(&target, "size").unwrap_or(200) as usize,
                pace: Duration::from_micros(query_u64(&target, "pace_us").unwrap_or(0)),
            };
            return Next::HandOff(params);
        }
        if target.starts_with("/idle") {
            c.out.extend_from_slice(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
                  transfer-encoding: chunked\r\n\r\n",
            );
            let ev = b"event: message\ndata: {\"hello\":1}\n\n";
            c.out.extend_from_slice(format!("{:x}\r\n", ev.len()).as_bytes());
            c.out.extend_from_slice(ev);
            c.out.extend_from_slice(b"\r\n");
            c.idle_stream = true;
            seen.open_idle.fetch_add(1, Ordering::Relaxed);
            break;
        }
        c.out.extend_from_slice(response);
    }
    c.inbuf.drain(..at);
    // Write until done or WouldBlock.
    while c.out_pos < c.out.len() {
        match c.stream.write(&c.out[c.out_pos..]) {
            Ok(n) => c.out_pos += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => return Next::Close,
        }
    }
    if c.out_pos == c.out.len() {
        c.out.clear();
        c.out_pos = 0;
        if c.idle_stream {
            c.out.shrink_to_fit();
            c.inbuf.shrink_to_fit();
        }
    }
    if eof {
        Next::Close
    } else {
        Next::Keep
    }
}

/// One timed SSE stream on a blocking socket, then close.
fn stream_sse(mut s: std::net::TcpStream, p: SseParams) -> io::Result<()> {
    let _ = s.set_nodelay(true);
    s.write_all(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n\
          connection: close\r\ntransfer-encoding: chunked\r\n\r\n",
    )?;
    let template = event_template(p.size);
    let chunk_head = format!("{:x}\r\n", p.size).into_bytes();
    let mut batch: Vec<u8> = Vec::with_capacity(256 * 1024);
    let flush_at = if p.pace.is_zero() { 64 * 1024 } else { 0 };
    let mut next = Instant::now();
    for _ in 0..p.n {
        if !p.pace.is_zero() {
            next += p.pace;
            let now = Instant::now();
            if next > now {
                std::thread::sleep(next - now);
            }
        }
        batch.extend_from_slice(&chunk_head);
        let at = batch.len();
        batch.extend_from_slice(&template);
        stamp_event(&mut batch[at..], now_ns());
        batch.extend_from_slice(b"\r\n");
        if batch.len() >= flush_at {
            s.write_all(&batch)?;
            batch.clear();
        }
    }
    batch.extend_from_slice(b"0\r\n\r\n");
    s.write_all(&batch)?;
    let _ = s.shutdown(std::net::Shutdown::Write);
    // Let the peer read the end before the socket goes (no reset).
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut sink = [0u8; 1024];
    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    Ok(())
}

pub fn self_check() {
    let mut e = event_template(200);
    assert_eq!(e.len(), 200);
    stamp_event(&mut e, 1234567);
    assert_eq!(event_time(&e), Some(1234567));
}
