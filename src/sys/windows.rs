//! Windows: console control events (Ctrl-C, Ctrl-Break, console close) and
//! `--control-stdin` both reach the loop through its `mio::Waker` (mio can
//! poll neither a console nor a pipe there, and allows one Waker per Poll);
//! no SIGHUP and no descriptor limit; file stamps from length, modification
//! and creation time; two socket options the defaults get wrong for us.

use super::{SignalsSeen, StdinRead};
use mio::net::{TcpListener, TcpStream};
use mio::{Registry, Token, Waker};
use std::io::{self, IsTerminal, Read};
use std::net::SocketAddr;
use std::os::windows::io::{AsRawHandle, AsRawSocket, FromRawSocket, OwnedSocket, RawSocket};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, SystemTime};
use windows_sys::Win32::Foundation::{FALSE, INVALID_HANDLE_VALUE, TRUE};
use windows_sys::Win32::Networking::WinSock as ws;
use windows_sys::Win32::Storage::FileSystem::{GetFileType, FILE_TYPE_CHAR, FILE_TYPE_DISK, FILE_TYPE_PIPE};
use windows_sys::Win32::System::Console::{
    SetConsoleCtrlHandler, CTRL_BREAK_EVENT, CTRL_CLOSE_EVENT, CTRL_C_EVENT, CTRL_LOGOFF_EVENT,
    CTRL_SHUTDOWN_EVENT,
};

/// Set by the console handler, taken by `Signals::drain`.
static TERMINATE: AtomicBool = AtomicBool::new(false);
/// The waker of the loop that installed the handler last.
static WAKER: Mutex<Option<Arc<Waker>>> = Mutex::new(None);

/// How long the handler holds a console close open: Windows ends the
/// process when the handler returns (and after 5 s at most), so this
/// lets the graceful shutdown run; the process exits when `run` returns.
const CLOSE_HOLD: Duration = Duration::from_millis(4500);

/// Runs on a thread the system creates for each console event.
unsafe extern "system" fn on_console_event(kind: u32) -> windows_sys::core::BOOL {
    match kind {
        CTRL_C_EVENT | CTRL_BREAK_EVENT | CTRL_CLOSE_EVENT | CTRL_LOGOFF_EVENT | CTRL_SHUTDOWN_EVENT => {
            TERMINATE.store(true, Ordering::SeqCst);
            if let Ok(waker) = WAKER.lock() {
                if let Some(w) = waker.as_ref() {
                    let _ = w.wake();
                }
            }
            if kind != CTRL_C_EVENT && kind != CTRL_BREAK_EVENT {
                std::thread::sleep(CLOSE_HOLD);
            }
            TRUE
        }
        _ => FALSE,
    }
}

/// Console control events, delivered through the loop's waker.
pub struct Signals;

impl Signals {
    /// Install the console handler; an event sets a flag and wakes the
    /// loop (`token` is for platforms with a pollable signal channel).
    pub fn install(_registry: &Registry, _token: Token, waker: &Arc<Waker>) -> io::Result<Signals> {
        if let Ok(mut slot) = WAKER.lock() {
            *slot = Some(waker.clone());
        }
        static INSTALL: Once = Once::new();
        let mut result = Ok(());
        INSTALL.call_once(|| {
            // SAFETY: plain calls with a handler of the required signature
            // that stays valid for the life of the process. The first call
            // turns Ctrl-C back on for a process started in a new process
            // group (where it is off by default); its failure is harmless.
            unsafe {
                SetConsoleCtrlHandler(None, FALSE);
                if SetConsoleCtrlHandler(Some(on_console_event), TRUE) == 0 {
                    result = Err(io::Error::last_os_error());
                }
            }
        });
        result.map(|()| Signals)
    }

    /// Which events arrived since the last drain (never a hangup: Windows
    /// has no SIGHUP).
    pub fn drain(&mut self) -> SignalsSeen {
        SignalsSeen { terminate: TERMINATE.swap(false, Ordering::SeqCst), hangup: false, reopen: false }
    }
}

/// Whether stdin can carry `--control-stdin`: a pipe or a console. A disk
/// file would be read at once to its end, and NUL (a character device that
/// is not a console) is always empty.
fn check_stdin() -> io::Result<()> {
    let stdin = io::stdin();
    let handle = stdin.as_raw_handle();
    if handle.is_null() || handle == INVALID_HANDLE_VALUE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "there is no stdin"));
    }
    // SAFETY: GetFileType only reads the handle's type; the handle is
    // stdin's and stays open for the life of the process.
    let refused = match unsafe { GetFileType(handle) } {
        FILE_TYPE_PIPE => None,
        FILE_TYPE_CHAR if stdin.is_terminal() => None,
        FILE_TYPE_CHAR => Some("stdin is a character device that is not a console"),
        FILE_TYPE_DISK => Some("stdin is a regular file"),
        _ => Some("stdin is of an unknown type"),
    };
    match refused {
        Some(what) => Err(io::Error::new(io::ErrorKind::InvalidInput, what)),
        None => Ok(()),
    }
}

/// `--control-stdin`: a thread does the blocking reads and hands the bytes
/// over a bounded channel, waking the loop after each.
pub struct StdinChannel {
    chunks: Receiver<Vec<u8>>,
}

impl StdinChannel {
    /// Check stdin's type and start the reader thread.
    pub fn open(_registry: &Registry, _token: Token, waker: &Arc<Waker>) -> io::Result<StdinChannel> {
        check_stdin()?;
        // Bounded: a flood of input blocks the reader, not memory.
        let (tx, chunks) = mpsc::sync_channel::<Vec<u8>>(8);
        let waker = waker.clone();
        std::thread::Builder::new().name("control-stdin".into()).spawn(move || {
            let mut stdin = io::stdin();
            let mut buf = vec![0u8; 4096];
            loop {
                match stdin.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        if tx.send(buf[..n].to_vec()).is_err() {
                            return;
                        }
                        let _ = waker.wake();
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        log::warn!("control stdin: {e}; treating as closed");
                        break;
                    }
                }
            }
            // The loop sees the channel disconnected: EOF.
            drop(tx);
            let _ = waker.wake();
        })?;
        Ok(StdinChannel { chunks })
    }

    /// Append what the reader thread has handed over to `pending`, up to
    /// about `budget` bytes.
    pub fn read(&mut self, pending: &mut Vec<u8>, budget: usize) -> StdinRead {
        let mut taken = 0;
        loop {
            if taken >= budget {
                return StdinRead::More;
            }
            match self.chunks.try_recv() {
                Ok(chunk) => {
                    pending.extend_from_slice(&chunk);
                    taken += chunk.len();
                }
                Err(TryRecvError::Empty) => return StdinRead::Pending,
                Err(TryRecvError::Disconnected) => return StdinRead::Eof,
            }
        }
    }

    /// Nothing to deregister: the reader thread has ended at EOF.
    pub fn close(&mut self, _registry: &Registry) {}
}

/// Windows has no descriptor limit to raise: the cap is the constant.
pub fn raise_descriptor_limit() -> Option<u64> {
    None
}

/// Length, modification and creation time of a file: an in-place write
/// changes the first two, a rename over it the creation time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    modified: Option<SystemTime>,
    created: Option<SystemTime>,
}

/// The stamp of `path`, or `None` when it cannot be read.
pub fn file_stamp(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp { len: m.len(), modified: m.modified().ok(), created: m.created().ok() })
}

fn last_socket_error() -> io::Error {
    // SAFETY: reads the calling thread's last Winsock error; no arguments.
    io::Error::from_raw_os_error(unsafe { ws::WSAGetLastError() })
}

/// A new overlapped (as mio's IOCP backend needs), non-inheritable,
/// non-blocking TCP socket for `addr`'s family.
fn tcp_socket(addr: &SocketAddr) -> io::Result<OwnedSocket> {
    // Winsock must be started before WSASocketW; std starts it on its
    // first use of std::net, so one throwaway socket does it.
    static WINSOCK: Once = Once::new();
    WINSOCK.call_once(|| drop(std::net::UdpSocket::bind("127.0.0.1:0")));
    let family = if addr.is_ipv4() { ws::AF_INET } else { ws::AF_INET6 };
    let flags = ws::WSA_FLAG_OVERLAPPED | ws::WSA_FLAG_NO_HANDLE_INHERIT;
    // SAFETY: plain socket creation with no pointers passed.
    let raw = unsafe {
        ws::WSASocketW(i32::from(family), ws::SOCK_STREAM, ws::IPPROTO_TCP, std::ptr::null(), 0, flags)
    };
    if raw == ws::INVALID_SOCKET {
        return Err(last_socket_error());
    }
    // SAFETY: `raw` is a socket we just created and own alone.
    let socket = unsafe { OwnedSocket::from_raw_socket(raw as RawSocket) };
    let mut nonblocking: u32 = 1;
    // SAFETY: FIONBIO reads one u32 from a valid pointer.
    if unsafe { ws::ioctlsocket(raw, ws::FIONBIO, &mut nonblocking) } != 0 {
        return Err(last_socket_error());
    }
    Ok(socket)
}

/// `addr` as the sockaddr bytes Winsock takes, with their length.
enum SockAddr {
    V4(ws::SOCKADDR_IN),
    V6(ws::SOCKADDR_IN6),
}

impl SockAddr {
    fn new(addr: &SocketAddr) -> SockAddr {
        match addr {
            SocketAddr::V4(a) => SockAddr::V4(ws::SOCKADDR_IN {
                sin_family: ws::AF_INET,
                sin_port: a.port().to_be(),
                // The octets are already in network order.
                sin_addr: ws::IN_ADDR { S_un: ws::IN_ADDR_0 { S_addr: u32::from_ne_bytes(a.ip().octets()) } },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => SockAddr::V6(ws::SOCKADDR_IN6 {
                sin6_family: ws::AF_INET6,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: ws::IN6_ADDR { u: ws::IN6_ADDR_0 { Byte: a.ip().octets() } },
                Anonymous: ws::SOCKADDR_IN6_0 { sin6_scope_id: a.scope_id() },
            }),
        }
    }

    fn as_ptr(&self) -> (*const ws::SOCKADDR, i32) {
        match self {
            SockAddr::V4(a) => {
                ((a as *const ws::SOCKADDR_IN).cast(), std::mem::size_of::<ws::SOCKADDR_IN>() as i32)
            }
            SockAddr::V6(a) => {
                ((a as *const ws::SOCKADDR_IN6).cast(), std::mem::size_of::<ws::SOCKADDR_IN6>() as i32)
            }
        }
    }
}

/// Bind the listener with SO_EXCLUSIVEADDRUSE: without it another socket
/// with SO_REUSEADDR may share a fixed port, so "port in use" (exit 3) would
/// not be reported as on Unix.
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = tcp_socket(&addr)?;
    let raw = socket.as_raw_socket() as ws::SOCKET;
    let on: i32 = 1;
    let sockaddr = SockAddr::new(&addr);
    let (ptr, len) = sockaddr.as_ptr();
    // SAFETY: setsockopt reads an i32 from a valid pointer of the given
    // length; bind reads `len` bytes of a sockaddr that outlives the call.
    unsafe {
        if ws::setsockopt(raw, ws::SOL_SOCKET, ws::SO_EXCLUSIVEADDRUSE, (&on as *const i32).cast(), 4) != 0 {
            return Err(last_socket_error());
        }
        if ws::bind(raw, ptr, len) != 0 {
            return Err(last_socket_error());
        }
        if ws::listen(raw, 1024) != 0 {
            return Err(last_socket_error());
        }
    }
    Ok(TcpListener::from_std(std::net::TcpListener::from(socket)))
}

/// Start a non-blocking connect to an upstream. On loopback, Windows
/// answers a refused SYN by retransmitting it for about 2 s; with no SYN
/// retransmissions (SIO_TCP_INITIAL_RTO, as libuv and curl set) a stopped
/// local upstream gets its quick 502 as on Unix.
pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    if !addr.ip().is_loopback() {
        return TcpStream::connect(addr);
    }
    let socket = tcp_socket(&addr)?;
    let raw = socket.as_raw_socket() as ws::SOCKET;
    let rto = ws::TCP_INITIAL_RTO_PARAMETERS {
        Rtt: ws::TCP_INITIAL_RTO_DEFAULT_RTT as u16,
        // mstcpip.h defines it as (UCHAR)-2: the low byte of the u16 here.
        MaxSynRetransmissions: ws::TCP_INITIAL_RTO_NO_SYN_RETRANSMISSIONS as u8,
    };
    let mut returned: u32 = 0;
    let sockaddr = SockAddr::new(&addr);
    let (ptr, len) = sockaddr.as_ptr();
    // SAFETY: WSAIoctl reads `size_of(rto)` bytes from a live local and
    // writes one u32; no overlapped I/O. connect reads `len` bytes of a
    // sockaddr that outlives the call.
    unsafe {
        let size = std::mem::size_of::<ws::TCP_INITIAL_RTO_PARAMETERS>() as u32;
        let rc = ws::WSAIoctl(
            raw,
            ws::SIO_TCP_INITIAL_RTO,
            (&rto as *const ws::TCP_INITIAL_RTO_PARAMETERS).cast(),
            size,
            std::ptr::null_mut(),
            0,
            &mut returned,
            std::ptr::null_mut(),
            None,
        );
        if rc != 0 {
            // Older Windows and wine lack it: a slower 502, nothing worse.
            log::debug!("SIO_TCP_INITIAL_RTO not applied: {}", last_socket_error());
        }
        if ws::connect(raw, ptr, len) != 0 {
            let err = last_socket_error();
            if err.raw_os_error() != Some(ws::WSAEWOULDBLOCK) {
                return Err(err);
            }
        }
    }
    Ok(TcpStream::from_std(std::net::TcpStream::from(socket)))
}
