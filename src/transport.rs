//! The upstream connection's byte stream: a plain socket, or TLS over one
//! (`crate::tls`, with the `tls` feature). Reads and writes go through
//! `Read` and `Write`, so `io::read_into` and `io::write_vectored` treat
//! both alike; the event loop registers `tcp_mut`.

use mio::net::TcpStream;
use std::io::{self, IoSlice, Read, Write};

/// An upstream connection.
#[derive(Debug)]
pub enum Transport {
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
    /// Failed (`Transport::tls_failure` says why).
    Failed,
}

impl Transport {
    /// A fresh connection to `upstream`: TLS when it is `https://`.
    pub fn new(tcp: TcpStream, upstream: &crate::config::Upstream) -> Result<Transport, String> {
        #[cfg(feature = "tls")]
        if let Some(setup) = &upstream.tls {
            return crate::tls::TlsStream::new(tcp, setup)
                .map(|s| Transport::Tls(Box::new(s)))
                .map_err(|e| e.to_string());
        }
        let _ = upstream;
        Ok(Transport::Plain(tcp))
    }

    pub fn tcp(&self) -> &TcpStream {
        match self {
            Transport::Plain(s) => s,
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.tcp(),
        }
    }

    pub fn tcp_mut(&mut self) -> &mut TcpStream {
        match self {
            Transport::Plain(s) => s,
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.tcp_mut(),
        }
    }

    /// Moves the TLS handshake on (`Done` at once for a plain socket);
    /// `readable` and `writable` are cleared when used up.
    pub fn handshake(&mut self, readable: &mut bool, writable: &mut bool) -> Handshake {
        match self {
            Transport::Plain(_) => {
                let _ = (readable, writable);
                Handshake::Done
            }
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.handshake(readable, writable),
        }
    }

    /// Bytes written are still waiting to go out (TLS records the socket
    /// did not take yet): flush with an empty `write_vectored`.
    pub fn pending_output(&self) -> bool {
        match self {
            Transport::Plain(_) => false,
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.pending_output(),
        }
    }

    /// Why the TLS connection failed, if it did (for the warn line).
    pub fn tls_failure(&self) -> Option<String> {
        match self {
            Transport::Plain(_) => None,
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.failure().map(|f| f.to_string()),
        }
    }

    /// Whether an idle connection spoke (data, EOF, an error) since its
    /// last exchange; `seen`: the socket was reported readable (or hung
    /// up) since; `None`: unknown (a pooled connection), so look. TLS
    /// records without data (session tickets) do not count.
    pub fn idle_spoke(&mut self, seen: Option<bool>) -> bool {
        match self {
            Transport::Plain(s) => match seen {
                Some(seen) => seen,
                None => {
                    let mut probe = [0u8; 1];
                    !matches!(s.peek(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
                }
            },
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.idle_spoke(seen),
        }
    }
}

impl Read for Transport {
    #[inline]
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.read(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Transport {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write(buf),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.write(buf),
        }
    }

    #[inline]
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Transport::Plain(s) => s.write_vectored(bufs),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Transport::Plain(s) => s.flush(),
            #[cfg(feature = "tls")]
            Transport::Tls(t) => t.flush(),
        }
    }
}
