//! Socket reads and writes as `(bytes, SocketState)` pairs (sozu's
//! `SocketResult`): one call can both make progress and hit EOF. The only
//! module that looks at `io::ErrorKind`.

use std::io::{self, IoSlice, Read, Write};

/// What the socket said after the bytes were moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SocketState {
    /// More may follow at once.
    Open,
    /// Nothing more now; wait for the next readiness event.
    WouldBlock,
    /// The peer closed its side (read returned 0, or write hit a closed pipe).
    Closed,
    /// Any other error; the connection is unusable.
    Error(io::ErrorKind),
}

fn socket_state(e: &io::Error) -> SocketState {
    match e.kind() {
        io::ErrorKind::WouldBlock => SocketState::WouldBlock,
        io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::UnexpectedEof => SocketState::Closed,
        k => SocketState::Error(k),
    }
}

/// A blocking socket's deadline passing, as the OS reports it: a read or
/// write timeout is `WouldBlock` (EAGAIN) on Unix and `TimedOut` on
/// Windows; `TcpStream::connect_timeout` gives `TimedOut`.
pub fn timed_out(kind: io::ErrorKind) -> bool {
    matches!(kind, io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

/// One `read` into `buf`, retried on EINTR.
pub fn read_into<R: Read>(r: &mut R, buf: &mut [u8]) -> (usize, SocketState) {
    loop {
        return match r.read(buf) {
            Ok(0) if !buf.is_empty() => (0, SocketState::Closed),
            Ok(n) => (n, SocketState::Open),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => (0, socket_state(&e)),
        };
    }
}

/// One vectored `write`, retried on EINTR.
pub fn write_vectored<W: Write>(w: &mut W, bufs: &[IoSlice<'_>]) -> (usize, SocketState) {
    loop {
        return match w.write_vectored(bufs) {
            Ok(0) if bufs.iter().any(|b| !b.is_empty()) => (0, SocketState::Closed),
            Ok(n) => (n, SocketState::Open),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => (0, socket_state(&e)),
        };
    }
}

/// Slices of `parts` concatenated, skipping the first `skip` bytes.
pub fn slices_after<'a, const N: usize>(
    parts: &[&'a [u8]],
    mut skip: usize,
) -> smallvec::SmallVec<[IoSlice<'a>; N]> {
    let mut out = smallvec::SmallVec::new();
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        out.push(IoSlice::new(&p[skip..]));
        skip = 0;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_eof_and_progress() {
        let mut src: &[u8] = b"abc";
        let mut buf = [0u8; 2];
        assert_eq!(read_into(&mut src, &mut buf), (2, SocketState::Open));
        assert_eq!(read_into(&mut src, &mut buf), (1, SocketState::Open));
        assert_eq!(read_into(&mut src, &mut buf), (0, SocketState::Closed));
    }

    #[test]
    fn skipping_slices() {
        let parts: [&[u8]; 3] = [b"ab", b"", b"cde"];
        let s = slices_after::<4>(&parts, 3);
        assert_eq!(s.len(), 1);
        assert_eq!(&*s[0], b"de");
        assert_eq!(slices_after::<4>(&parts, 0).len(), 2);
        assert!(slices_after::<4>(&parts, 5).is_empty());
    }
}
