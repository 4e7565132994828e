//! The upstream connection's byte stream: a plain socket, or TLS over one
//! (`crate::tls`, with the `tls` feature), either of them maybe inside a
//! forward proxy's `CONNECT` tunnel (`route::connect`), opened first as
//! part of the handshake. Reads and writes go through `Read` and `Write`,
//! so `io::read_into` and `io::write_vectored` treat all alike; the event
//! loop registers `tcp_mut`.

use crate::io::{read_into, write_vectored, SocketState};
use crate::route::connect::{read_reply, ConnectSetup, Invalid, Reply};
use mio::net::TcpStream;
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::sync::Arc;

/// An upstream connection.
#[derive(Debug)]
pub struct Transport {
    stream: Stream,
    /// The `CONNECT` through a forward proxy, until its 2xx: nothing else
    /// is written or read before (`None`: direct, or the tunnel is open).
    tunnel: Option<Box<Tunnel>>,
}

#[derive(Debug)]
enum Stream {
    Plain(TcpStream),
    #[cfg(feature = "tls")]
    Tls(Box<crate::tls::TlsStream>),
}

/// Where the handshake stands (plain sockets have none).
#[derive(Debug, PartialEq, Eq)]
pub enum Handshake {
    /// Done: requests may be written.
    Done,
    /// Waiting for the socket (its readiness was used up).
    Wait,
    /// Failed (`Transport::proxy_failure` or `Transport::tls_failure`
    /// says why).
    Failed,
}

/// A `CONNECT` under way.
#[derive(Debug)]
struct Tunnel {
    setup: Arc<ConnectSetup>,
    /// Bytes of the request written.
    written: usize,
    /// The proxy's answer so far (at most `MAX_PROXY_ANSWER_HEAD`).
    answer: Vec<u8>,
    failure: Option<ProxyFailure>,
}

/// Why a tunnel through the forward proxy failed (for its warn line; no
/// credential is in it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyFailure {
    /// A final status other than 2xx (407, 403, 502, ...).
    Refused(u16),
    /// Not an answer to go on with.
    Invalid(Invalid),
    /// The proxy closed the connection before its answer.
    Closed,
    /// The socket failed.
    Io(io::ErrorKind),
    /// No answer within `--connect-timeout`.
    Stalled,
}

impl ProxyFailure {
    /// The proxy could not reach the upstream (502, 503, 504): worth
    /// retrying as a refused connect is (a restart behind the proxy).
    pub fn upstream_unreachable(self) -> bool {
        matches!(self, ProxyFailure::Refused(502..=504))
    }
}

impl fmt::Display for ProxyFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProxyFailure::Refused(status) => {
                let reason = String::from_utf8_lossy(crate::http::write::reason_phrase(*status));
                write!(f, "answered {status} {reason} to CONNECT")
            }
            ProxyFailure::Invalid(why) => write!(f, "sent {why}"),
            ProxyFailure::Closed => f.write_str("closed the connection before answering CONNECT"),
            ProxyFailure::Io(kind) => write!(f, "socket error during CONNECT: {kind}"),
            ProxyFailure::Stalled => f.write_str("did not answer CONNECT within --connect-timeout"),
        }
    }
}

impl Stream {
    fn tcp_mut(&mut self) -> &mut TcpStream {
        match self {
            Stream::Plain(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.tcp_mut(),
        }
    }
}

impl Tunnel {
    /// Writes the request and reads the answer as far as the socket
    /// allows; `Done` once the tunnel is open.
    fn step(&mut self, tcp: &mut TcpStream, readable: &mut bool, writable: &mut bool) -> Handshake {
        let request = self.setup.request();
        while *writable && self.written < request.len() {
            let rest = request.get(self.written..).unwrap_or_default();
            match write_vectored(tcp, &[IoSlice::new(rest)]) {
                (n, SocketState::Open) => self.written += n,
                (_, SocketState::WouldBlock) => *writable = false,
                (_, SocketState::Closed) => return self.fail(ProxyFailure::Closed),
                (_, SocketState::Error(kind)) => return self.fail(ProxyFailure::Io(kind)),
            }
        }
        if self.written < request.len() {
            return Handshake::Wait;
        }
        let mut chunk = [0u8; 1024];
        while *readable {
            let room =
                crate::limits::MAX_PROXY_ANSWER_HEAD.saturating_sub(self.answer.len()).min(chunk.len());
            let (n, state) = read_into(tcp, chunk.get_mut(..room.max(1)).unwrap_or_default());
            self.answer.extend_from_slice(chunk.get(..n).unwrap_or_default());
            match read_reply(&self.answer) {
                Reply::Open => return Handshake::Done,
                Reply::Refused(status) => return self.fail(ProxyFailure::Refused(status)),
                Reply::Invalid(why) => return self.fail(ProxyFailure::Invalid(why)),
                Reply::Partial => {}
            }
            match state {
                SocketState::Open => {}
                SocketState::WouldBlock => *readable = false,
                SocketState::Closed => return self.fail(ProxyFailure::Closed),
                SocketState::Error(kind) => return self.fail(ProxyFailure::Io(kind)),
            }
        }
        Handshake::Wait
    }

    fn fail(&mut self, why: ProxyFailure) -> Handshake {
        self.failure.get_or_insert(why);
        Handshake::Failed
    }
}

impl Transport {
    /// A fresh connection to `upstream`: TLS when it is `https://`, in a
    /// tunnel through its forward proxy when it has one.
    pub fn new(tcp: TcpStream, upstream: &crate::config::Upstream) -> Result<Transport, String> {
        let tunnel = upstream.tunnel.as_ref().map(|setup| {
            Box::new(Tunnel { setup: setup.clone(), written: 0, answer: Vec::new(), failure: None })
        });
        #[cfg(feature = "tls")]
        if let Some(setup) = &upstream.tls {
            // rustls writes nothing before the handshake is pumped, so the
            // tunnel can open first on the same socket.
            return crate::tls::TlsStream::new(tcp, setup)
                .map(|s| Transport { stream: Stream::Tls(Box::new(s)), tunnel })
                .map_err(|e| e.to_string());
        }
        Ok(Transport { stream: Stream::Plain(tcp), tunnel })
    }

    pub fn tcp(&self) -> &TcpStream {
        match &self.stream {
            Stream::Plain(s) => s,
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.tcp(),
        }
    }

    pub fn tcp_mut(&mut self) -> &mut TcpStream {
        self.stream.tcp_mut()
    }

    /// Moves the handshake on: the proxy's `CONNECT` first, when there is
    /// one, then TLS (`Done` at once for a plain socket); `readable` and
    /// `writable` are cleared when used up.
    pub fn handshake(&mut self, readable: &mut bool, writable: &mut bool) -> Handshake {
        if let Some(tunnel) = self.tunnel.as_mut() {
            match tunnel.step(self.stream.tcp_mut(), readable, writable) {
                Handshake::Done => self.tunnel = None,
                other => return other,
            }
        }
        match &mut self.stream {
            Stream::Plain(_) => Handshake::Done,
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.handshake(readable, writable),
        }
    }

    /// The proxy's `CONNECT` is still unanswered.
    pub fn in_tunnel_setup(&self) -> bool {
        self.tunnel.is_some()
    }

    /// Why the tunnel through the forward proxy failed, if it did, and
    /// the proxy's `host:port` (for the warn line).
    pub fn proxy_failure(&self) -> Option<(ProxyFailure, &str)> {
        let t = self.tunnel.as_deref()?;
        Some((t.failure?, t.setup.proxy.as_str()))
    }

    /// The proxy's `host:port`, while the tunnel is being opened.
    pub fn proxy_name(&self) -> Option<&str> {
        self.tunnel.as_deref().map(|t| t.setup.proxy.as_str())
    }

    /// Bytes written are still waiting to go out (TLS records the socket
    /// did not take yet): flush with an empty `write_vectored`.
    pub fn pending_output(&self) -> bool {
        match &self.stream {
            Stream::Plain(_) => false,
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.pending_output(),
        }
    }

    /// Why the TLS connection failed, if it did (for the warn line).
    pub fn tls_failure(&self) -> Option<String> {
        match &self.stream {
            Stream::Plain(_) => None,
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.failure().map(|f| f.to_string()),
        }
    }

    /// Whether an idle connection spoke (data, EOF, an error) since its
    /// last exchange; `seen`: the socket was reported readable (or hung
    /// up) since; `None`: unknown (a pooled connection), so look. TLS
    /// records without data (session tickets) do not count.
    pub fn idle_spoke(&mut self, seen: Option<bool>) -> bool {
        match &mut self.stream {
            Stream::Plain(s) => match seen {
                Some(seen) => seen,
                None => {
                    let mut probe = [0u8; 1];
                    !matches!(s.peek(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
                }
            },
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.idle_spoke(seen),
        }
    }
}

impl Read for Transport {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match &mut self.stream {
            Stream::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Transport {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match &mut self.stream {
            Stream::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.write(buf),
        }
    }

    #[inline]
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match &mut self.stream {
            Stream::Plain(s) => s.write_vectored(bufs),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match &mut self.stream {
            Stream::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Stream::Tls(t) => t.flush(),
        }
    }
}
