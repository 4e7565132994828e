//! TLS to an `https://` upstream: rustls's sans-IO client connection driven
//! by the event loop's nonblocking socket. `TlsStream` reads and writes
//! plaintext through rustls's buffers (`read_tls`, `process_new_packets`,
//! `reader`, `writer`, `write_tls`); the handshake is pumped by
//! `Conn::connect_progress` under `--connect-timeout`. Nothing here blocks,
//! and nothing here logs key material: a failure keeps only rustls's error,
//! whose text names the reason (an unknown issuer, a name mismatch, an
//! alert), never a key or a certificate's bytes.
//!
//! The trust: the Mozilla root set compiled in (`webpki-roots`, so a
//! `FROM scratch` image needs no CA bundle), plus `--ca-file` and
//! `SSL_CERT_FILE` (PEM). The name checked is the `--upstream` host (a DNS
//! name or an IP address, against the certificate's SANs), also sent as SNI
//! when it is a DNS name; ALPN `http/1.1`; TLS 1.2 and 1.3.

use crate::config::TlsFlags;
pub use crate::transport::Handshake;
use mio::net::TcpStream;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::path::Path;
use std::sync::Arc;

/// What every TLS connection to the upstream is made with.
#[derive(Clone)]
pub struct TlsSetup {
    /// The upstream host as given (for the log lines).
    pub host: String,
    name: ServerName<'static>,
    config: Arc<ClientConfig>,
}

impl fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSetup").field("host", &self.host).finish_non_exhaustive()
    }
}

/// Reads a PEM file's certificates; an error names the file and what is
/// wrong, never the file's bytes.
fn certificates(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let shown = path.display();
    let iter =
        CertificateDer::pem_file_iter(path).map_err(|e| format!("{what} {shown}: {}", pem_error(&e)))?;
    let mut out = Vec::new();
    for cert in iter {
        out.push(cert.map_err(|e| format!("{what} {shown}: {}", pem_error(&e)))?);
    }
    if out.is_empty() {
        return Err(format!("{what} {shown}: no PEM certificate in it"));
    }
    Ok(out)
}

/// A PEM error without the file's bytes (some variants carry a line of it).
fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        Error::Io(io) => io.kind().to_string(),
        Error::NoItemsFound => "nothing of the expected kind in it".into(),
        _ => "not valid PEM".into(),
    }
}

/// The client configuration every TLS connection of this proxy is made
/// with (the upstream's, and the OAuth client's to an authorization
/// server): the roots, the client certificate, ALPN `http/1.1`. The error
/// says which file is wrong.
pub fn client_config(flags: &TlsFlags) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    for path in &flags.ca_files {
        for cert in certificates(path, "--ca-file")? {
            roots.add(cert).map_err(|e| format!("--ca-file {}: {e}", path.display()))?;
        }
    }
    if let Some(path) = &flags.env_ca_file {
        let (added, _skipped) = roots.add_parsable_certificates(certificates(path, "SSL_CERT_FILE")?);
        if added == 0 {
            return Err(format!("SSL_CERT_FILE {}: no usable CA certificate in it", path.display()));
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_root_certificates(roots);
    let mut config = match (&flags.client_cert, &flags.client_key) {
        (Some(cert), Some(key)) => {
            let chain = certificates(cert, "--tls-client-cert")?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("--tls-client-key {}: {}", key.display(), pem_error(&e)))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("--tls-client-cert/--tls-client-key: {e}"))?
        }
        _ => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// `host` (a DNS name or an IP address, brackets of an IPv6 address
/// removed) as the name a certificate is checked against.
pub fn server_name(host: &str) -> Result<ServerName<'static>, String> {
    ServerName::try_from(host.to_string())
        .map_err(|_| format!("'{host}' is neither a DNS name nor an IP address"))
}

impl TlsSetup {
    /// The client configuration for `host` (as in `--upstream`, brackets
    /// of an IPv6 address removed); the error says which file is wrong.
    pub fn new(host: &str, flags: &TlsFlags) -> Result<TlsSetup, String> {
        let name = server_name(host)?;
        Ok(TlsSetup { host: host.to_string(), name, config: client_config(flags)? })
    }
}

/// A TLS connection over a nonblocking socket.
pub struct TlsStream {
    tcp: TcpStream,
    conn: ClientConnection,
    /// Why the connection failed, once it has (for the one warn line).
    failure: Option<Failure>,
}

/// Why a TLS connection failed.
#[derive(Debug)]
pub enum Failure {
    /// rustls refused what the peer sent, or the peer sent an alert.
    Tls(rustls::Error),
    /// The peer closed the connection during the handshake.
    ClosedInHandshake,
    /// The socket failed during the handshake.
    Io(io::ErrorKind),
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Tls(e) => write!(f, "{e}"),
            Failure::ClosedInHandshake => {
                f.write_str("the server closed the connection during the handshake")
            }
            Failure::Io(kind) => write!(f, "socket error during the handshake: {kind}"),
        }
    }
}

impl fmt::Debug for TlsStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream").field("tcp", &self.tcp).field("failure", &self.failure).finish()
    }
}

fn tls_error() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "TLS failure")
}

impl TlsStream {
    pub fn new(tcp: TcpStream, setup: &TlsSetup) -> Result<TlsStream, rustls::Error> {
        let conn = ClientConnection::new(setup.config.clone(), setup.name.clone())?;
        Ok(TlsStream { tcp, conn, failure: None })
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    pub fn tcp_mut(&mut self) -> &mut TcpStream {
        &mut self.tcp
    }

    pub fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    pub fn is_handshaking(&self) -> bool {
        self.conn.is_handshaking()
    }

    /// TLS bytes are waiting to be written to the socket.
    pub fn pending_output(&self) -> bool {
        self.conn.wants_write()
    }

    /// Writes what rustls has for the socket, until it has nothing more or
    /// the socket would block (`WouldBlock`).
    fn flush_tls(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            match self.conn.write_tls(&mut self.tcp) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads TLS records from the socket once and processes them; `Ok(0)`
    /// at EOF. A record rustls refuses (or an alert) is kept as the
    /// failure, its alert sent if the socket takes it.
    /// The second value: the socket's read came back short (less than
    /// rustls asked for), so the socket is drained, as `fill_from` takes a
    /// short read.
    fn read_records(&mut self) -> io::Result<(usize, bool)> {
        let mut sock = Measured { tcp: &mut self.tcp, short: false };
        let n = loop {
            match self.conn.read_tls(&mut sock) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        let short = sock.short;
        if let Err(e) = self.conn.process_new_packets() {
            self.failure = Some(Failure::Tls(e));
            let _ = self.flush_tls();
            return Err(tls_error());
        }
        Ok((n, short))
    }

    /// Moves the handshake on as far as the socket allows. `readable` and
    /// `writable` are the socket's readiness, cleared when used up.
    pub fn handshake(&mut self, readable: &mut bool, writable: &mut bool) -> Handshake {
        loop {
            if *writable {
                match self.flush_tls() {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => *writable = false,
                    Err(e) => {
                        self.failure = Some(Failure::Io(e.kind()));
                        return Handshake::Failed;
                    }
                }
            }
            if !self.conn.is_handshaking() {
                // Its last flight may still wait for the socket: the next
                // write sends it first.
                return Handshake::Done;
            }
            if !*readable {
                return Handshake::Wait;
            }
            match self.read_records() {
                Ok((0, _)) => {
                    if self.failure.is_none() {
                        self.failure = Some(Failure::ClosedInHandshake);
                    }
                    return Handshake::Failed;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => *readable = false,
                Err(e) => {
                    if self.failure.is_none() {
                        self.failure = Some(Failure::Io(e.kind()));
                    }
                    return Handshake::Failed;
                }
            }
        }
    }

    /// Whether an idle connection spoke since its last exchange: data, EOF
    /// or an error make it unusable; records that carry no data (TLS 1.3
    /// session tickets, key updates) do not. `seen` is the socket's
    /// readiness (only then is it read; `None`: unknown, read anyway).
    pub fn idle_spoke(&mut self, seen: Option<bool>) -> bool {
        if seen == Some(false) {
            return false;
        }
        loop {
            match self.read_records() {
                Ok((0, _)) => return true,
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => return true,
            }
        }
        let mut probe = [0u8; 1];
        !matches!(self.conn.reader().read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

/// The socket as rustls reads it, noting a short read.
struct Measured<'a> {
    tcp: &'a mut TcpStream,
    short: bool,
}

impl Read for Measured<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.tcp.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

impl Read for TlsStream {
    /// Fills `buf` with plaintext until it is full or the socket is
    /// drained (a short socket read, or `WouldBlock`), so a short read here
    /// means drained, as the relay's edge-triggered reads expect (on
    /// Windows only `WouldBlock` counts, as in `fill_from`); `WouldBlock`
    /// when no plaintext came.
    /// `Ok(0)` after the peer's close_notify, `UnexpectedEof` at a bare EOF,
    /// `InvalidData` for a TLS failure (`failure` says which).
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failure.is_some() {
            return Err(tls_error());
        }
        let mut filled = 0;
        let mut drained = false;
        loop {
            while filled < buf.len() {
                match self.conn.reader().read(&mut buf[filled..]) {
                    Ok(0) => return Ok(filled),
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // What came first is given; the EOF is seen next read.
                    Err(_) if filled > 0 => return Ok(filled),
                    Err(e) => return Err(e),
                }
            }
            if filled == buf.len() {
                return Ok(filled);
            }
            // Drained with plaintext to give: done. (With none, read on: a
            // FIN that came with the last bytes must still be seen.)
            if drained && filled > 0 {
                return Ok(filled);
            }
            // A handshake message rustls owes (a key update's answer).
            let _ = self.flush_tls();
            match self.read_records() {
                // No read after a short one: it would only say WouldBlock.
                Ok((n, short)) => drained = n > 0 && short && cfg!(not(windows)),
                // What came first is given; a failure is kept for the next read.
                Err(_) if filled > 0 => return Ok(filled),
                Err(e) => return Err(e),
            }
        }
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    /// Encrypts what rustls takes and writes it out. Bytes rustls took are
    /// written as far as the socket allows; the rest waits in rustls
    /// (`pending_output`) and goes first on the next call, which gives
    /// `WouldBlock` while any of it is left. Empty `bufs`: only that flush.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        self.flush_tls()?;
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        let n = self.conn.writer().write_vectored(bufs)?;
        if n == 0 {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // Taken: the socket's verdict shows on the next call.
        let _ = self.flush_tls();
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.flush_tls()
    }
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use rustls::pki_types::PrivateKeyDer;
    use std::net::TcpListener;
    use std::sync::OnceLock;
    use std::time::{Duration, Instant};

    /// The test certificates (tests/support/make_tls_certs.sh: the openssl command).
    fn certs() -> &'static std::path::Path {
        static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
        DIR.get_or_init(|| {
            let dir = std::env::temp_dir().join(format!("tls-unit-{}", std::process::id()));
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/make_tls_certs.sh");
            let out = std::process::Command::new("bash").arg(script).arg(&dir).output().unwrap();
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            dir
        })
    }

    /// A blocking rustls server on a thread: `serve` gets the connection after the handshake.
    fn server(
        serve: impl FnOnce(&mut rustls::StreamOwned<rustls::ServerConnection, std::net::TcpStream>)
            + Send
            + 'static,
    ) -> std::net::SocketAddr {
        let dir = certs();
        let chain: Vec<_> =
            CertificateDer::pem_file_iter(dir.join("localhost.pem")).unwrap().map(|c| c.unwrap()).collect();
        let key = PrivateKeyDer::from_pem_file(dir.join("localhost.key")).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .unwrap();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let (sock, _) = listener.accept().unwrap();
            let conn = rustls::ServerConnection::new(Arc::new(config)).unwrap();
            let mut s = rustls::StreamOwned::new(conn, sock);
            while s.conn.is_handshaking() {
                s.conn.complete_io(&mut s.sock).unwrap();
            }
            serve(&mut s);
        });
        addr
    }

    /// A client connected and through the handshake (polling: readiness taken as always there).
    fn client(addr: std::net::SocketAddr) -> TlsStream {
        let flags = TlsFlags { ca_files: vec![certs().join("root.pem")], ..TlsFlags::default() };
        let setup = TlsSetup::new("localhost", &flags).unwrap();
        let tcp = TcpStream::connect(addr).unwrap();
        let mut t = TlsStream::new(tcp, &setup).unwrap();
        let t0 = Instant::now();
        loop {
            let (mut r, mut w) = (true, true);
            match t.handshake(&mut r, &mut w) {
                Handshake::Done => return t,
                Handshake::Wait => std::thread::sleep(Duration::from_millis(1)),
                Handshake::Failed => panic!("handshake failed: {:?}", t.failure()),
            }
            assert!(t0.elapsed() < Duration::from_secs(5), "handshake not done");
        }
    }

    #[test]
    fn reads_fill_the_buffer_or_stop_drained_and_idle_tickets_are_not_speech() {
        const N: usize = 300_000;
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let addr = server(move |s| {
            // Wait for the client's go (its idle check comes first).
            rx.recv().unwrap();
            let body: Vec<u8> = (0..N).map(|i| (i % 251) as u8).collect();
            for piece in body.chunks(7_000) {
                s.write_all(piece).unwrap();
            }
            s.flush().unwrap();
            let _ = rx.recv(); // then hold the connection until the client is done
        });
        let mut t = client(addr);
        // TLS 1.3 session tickets arrive after the handshake: records without data.
        std::thread::sleep(Duration::from_millis(100));
        assert!(!t.idle_spoke(None), "session tickets counted as the server speaking");
        tx.send(()).unwrap();
        let mut got = Vec::new();
        let mut buf = vec![0u8; 16 * 1024];
        let t0 = Instant::now();
        while got.len() < N {
            match t.read(&mut buf) {
                Ok(0) => panic!("EOF after {}", got.len()),
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                Err(e) => panic!("{e}: {:?}", t.failure()),
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "{} of {N}", got.len());
        }
        assert_eq!(got.len(), N);
        assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "plaintext corrupted");
        // Drained: nothing more now.
        assert!(matches!(t.read(&mut buf), Err(e) if e.kind() == io::ErrorKind::WouldBlock));
        drop(tx);
    }

    #[test]
    fn a_large_write_is_sent_whole_through_pending_output() {
        const N: usize = 32 * 1024 * 1024;
        let (tx, rx) = std::sync::mpsc::channel::<usize>();
        let addr = server(move |s| {
            // Read nothing for a while: the client's socket buffer fills.
            std::thread::sleep(Duration::from_millis(200));
            let mut seen = 0usize;
            let mut buf = vec![0u8; 64 * 1024];
            while seen < N {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "EOF after {seen}");
                assert!(buf[..n].iter().enumerate().all(|(i, &b)| b == ((seen + i) % 253) as u8));
                seen += n;
            }
            tx.send(seen).unwrap();
        });
        let mut t = client(addr);
        let body: Vec<u8> = (0..N).map(|i| (i % 253) as u8).collect();
        let (mut written, mut blocked) = (0, 0);
        let t0 = Instant::now();
        while written < N || t.pending_output() {
            let slices = [IoSlice::new(&body[written..])];
            let empty: [IoSlice<'_>; 0] = [];
            let bufs: &[IoSlice<'_>] = if written < N { &slices } else { &empty };
            match t.write_vectored(bufs) {
                Ok(n) => written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    blocked += 1;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => panic!("{e}"),
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "{written} of {N}");
        }
        assert!(blocked > 0, "the socket never pushed back: the pending path was not taken");
        assert_eq!(rx.recv_timeout(Duration::from_secs(20)).unwrap(), N);
    }
}
