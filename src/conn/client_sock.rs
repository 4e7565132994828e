//! The client side of a connection: a TCP socket from the listener, or a
//! `Pipe` held in memory, through which the `--stdio` front-end
//! (`crate::stdio`) speaks HTTP/1.1 to the same exchange as a TCP client
//! does. A pipe has no descriptor and no port, so no other process can
//! reach it; its readiness is set by the front-end, not by the poll.

use mio::net::TcpStream;
use std::io::{self, IoSlice, Read, Write};
use std::net::SocketAddr;

/// Bytes a connection may have written to a pipe that the front-end has not
/// taken yet: past it, writes would block, the connection stops reading its
/// upstream, and the stream waits for the host (the stdio back-pressure).
pub const PIPE_CAP: usize = 64 * 1024;

pub enum ClientSock {
    Tcp(TcpStream),
    Pipe(Pipe),
}

impl ClientSock {
    /// A connection whose client is the `--stdio` front-end, through an
    /// in-memory pipe: no socket, no peer address (it is `0.0.0.0:0`).
    pub fn pipe() -> (ClientSock, SocketAddr) {
        (ClientSock::Pipe(Pipe::default()), SocketAddr::from(([0, 0, 0, 0], 0)))
    }

    /// The client's TCP socket (none for a pipe).
    pub fn tcp(&mut self) -> Option<&mut TcpStream> {
        match self {
            ClientSock::Tcp(s) => Some(s),
            ClientSock::Pipe(_) => None,
        }
    }

    /// The client's pipe (the `--stdio` front-end's connections).
    pub fn pipe_mut(&mut self) -> Option<&mut Pipe> {
        match self {
            ClientSock::Pipe(p) => Some(p),
            ClientSock::Tcp(_) => None,
        }
    }

    pub(super) fn shutdown_write(&mut self) {
        match self {
            ClientSock::Tcp(s) => {
                let _ = s.shutdown(std::net::Shutdown::Write);
            }
            ClientSock::Pipe(p) => p.conn_done = true,
        }
    }
}

impl Read for ClientSock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            ClientSock::Tcp(s) => s.read(buf),
            ClientSock::Pipe(p) => p.read(buf),
        }
    }
}

impl Write for ClientSock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            ClientSock::Tcp(s) => s.write_vectored(bufs),
            ClientSock::Pipe(p) => p.write_vectored(bufs),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Both directions of an in-memory client connection. The front-end
/// `send`s requests and takes what the connection wrote (`received`,
/// `consume`); the connection reads and writes it as a socket.
#[derive(Debug, Default)]
pub struct Pipe {
    /// Request bytes not yet read by the connection, from `read_at`.
    to_conn: Vec<u8>,
    read_at: usize,
    /// Response bytes not yet taken by the front-end (at most `PIPE_CAP`).
    from_conn: Vec<u8>,
    /// The front-end sends nothing more: the connection reads EOF once
    /// `to_conn` is drained.
    closed: bool,
    /// The connection shut its sending side; it writes nothing more.
    conn_done: bool,
}

impl Pipe {
    /// Queue request bytes for the connection.
    pub fn send(&mut self, bytes: &[u8]) {
        if self.read_at == self.to_conn.len() {
            self.to_conn.clear();
            self.read_at = 0;
        }
        self.to_conn.extend_from_slice(bytes);
    }

    /// What the connection wrote and the front-end has not consumed.
    pub fn received(&self) -> &[u8] {
        &self.from_conn
    }

    pub fn consume(&mut self, n: usize) {
        self.from_conn.drain(..n.min(self.from_conn.len()));
    }

    /// The connection's next read after what was sent is EOF.
    pub fn close(&mut self) {
        self.closed = true;
    }

    /// The connection will write nothing more (it shut its side or closed).
    pub fn conn_done(&self) -> bool {
        self.conn_done
    }

    pub fn mark_conn_done(&mut self) {
        self.conn_done = true;
    }

    /// The connection has written all the front-end may hold: nothing more
    /// until it consumes.
    pub fn is_full(&self) -> bool {
        self.from_conn.len() >= PIPE_CAP
    }

    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let pending = self.to_conn.get(self.read_at..).unwrap_or_default();
        if pending.is_empty() {
            return match self.closed {
                true => Ok(0),
                false => Err(io::ErrorKind::WouldBlock.into()),
            };
        }
        let n = pending.len().min(buf.len());
        buf[..n].copy_from_slice(&pending[..n]);
        self.read_at += n;
        Ok(n)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        if self.conn_done {
            return Err(io::ErrorKind::BrokenPipe.into());
        }
        let mut room = PIPE_CAP.saturating_sub(self.from_conn.len());
        if room == 0 && bufs.iter().any(|b| !b.is_empty()) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let mut n = 0;
        for b in bufs {
            let take = b.len().min(room);
            self.from_conn.extend_from_slice(&b[..take]);
            n += take;
            room -= take;
            if room == 0 {
                break;
            }
        }
        Ok(n)
    }
}

impl super::Conn {
    /// The client's socket or pipe.
    pub fn client(&mut self) -> &mut ClientSock {
        &mut self.client
    }

    /// The client of a closed connection; a pipe's front-end learns that
    /// the connection is done.
    pub fn into_client(self) -> ClientSock {
        let mut client = self.client;
        if let ClientSock::Pipe(p) = &mut client {
            p.mark_conn_done();
        }
        client
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipe_blocks_when_empty_ends_when_closed_and_holds_at_most_its_cap() {
        let mut p = Pipe::default();
        let mut buf = [0u8; 8];
        assert_eq!(p.read(&mut buf).map_err(|e| e.kind()), Err(io::ErrorKind::WouldBlock));
        p.send(b"0123456789");
        assert_eq!(p.read(&mut buf).ok(), Some(8));
        assert_eq!(&buf, b"01234567");
        assert_eq!(p.read(&mut buf).ok(), Some(2));
        p.close();
        assert_eq!(p.read(&mut buf).ok(), Some(0));
        let big = vec![b'x'; PIPE_CAP - 3];
        let n = p.write_vectored(&[IoSlice::new(&big), IoSlice::new(b"abcdef")]).ok();
        assert_eq!(n, Some(PIPE_CAP));
        assert!(p.is_full());
        let e = p.write_vectored(&[IoSlice::new(b"z")]).map_err(|e| e.kind());
        assert_eq!(e, Err(io::ErrorKind::WouldBlock));
        assert_eq!(p.received().len(), PIPE_CAP);
        assert_eq!(p.received().get(PIPE_CAP - 3..), Some(&b"abc"[..]));
        p.consume(PIPE_CAP - 1);
        assert_eq!(p.received(), b"c");
        p.mark_conn_done();
        let e = p.write_vectored(&[IoSlice::new(b"z")]).map_err(|e| e.kind());
        assert_eq!(e, Err(io::ErrorKind::BrokenPipe));
    }
}
