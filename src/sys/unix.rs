//! Unix (Linux, macOS, the BSDs): SIGINT/SIGTERM/SIGHUP through a self-pipe
//! that mio polls, stdin made non-blocking and polled directly, the
//! descriptor limit raised to the hard limit, and file stamps from `stat`.

use super::{SignalsSeen, StdinRead};
use mio::net::{TcpListener, TcpStream};
use mio::{Registry, Token, Waker};
use std::fs::File;
use std::io::{self, IsTerminal, Read};
use std::net::SocketAddr;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

/// The calling thread's `errno`: the symbol differs per libc.
#[cfg(any(target_os = "linux", target_os = "emscripten", target_os = "hurd", target_os = "dragonfly"))]
fn errno_location() -> *mut libc::c_int {
    // SAFETY: returns the address of the thread-local errno; no preconditions.
    unsafe { libc::__errno_location() }
}

#[cfg(any(target_vendor = "apple", target_os = "freebsd"))]
fn errno_location() -> *mut libc::c_int {
    // SAFETY: as above; Apple's and FreeBSD's libc name it `__error`.
    unsafe { libc::__error() }
}

#[cfg(any(target_os = "android", target_os = "netbsd", target_os = "openbsd"))]
fn errno_location() -> *mut libc::c_int {
    // SAFETY: as above; Bionic and the other BSDs name it `__errno`.
    unsafe { libc::__errno() }
}

/// Write end of the signal pipe, for the handler (-1 until installed).
static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    // Async-signal-safe: one write(2) to a non-blocking pipe, errno kept
    // for the code the signal interrupted.
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = sig as u8;
        let errno = errno_location();
        // SAFETY: errno's location is thread-local and valid; write(2) on a
        // valid fd with a 1-byte stack buffer is async-signal-safe.
        unsafe {
            let saved = *errno;
            libc::write(fd, (&byte as *const u8).cast(), 1);
            *errno = saved;
        }
    }
}

/// SIGINT, SIGTERM, SIGHUP and SIGUSR1, delivered as readiness of a pipe.
pub struct Signals {
    receiver: mio::unix::pipe::Receiver,
    _sender: mio::unix::pipe::Sender,
}

impl Signals {
    /// Install the handlers; a signal makes `token` readable (the waker is
    /// for platforms without a pollable signal channel).
    pub fn install(registry: &Registry, token: Token, _waker: &Arc<Waker>) -> io::Result<Signals> {
        let (sender, mut receiver) = mio::unix::pipe::new()?;
        SIGNAL_FD.store(sender.as_raw_fd(), Ordering::Relaxed);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1] {
            // SAFETY: a zeroed sigaction with a valid handler and an empty
            // mask is a valid argument; the handler only calls write(2).
            let rc = unsafe {
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as *const () as usize;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        registry.register(&mut receiver, token, mio::Interest::READABLE)?;
        Ok(Signals { receiver, _sender: sender })
    }

    /// Drain the pipe: which signals arrived since the last drain.
    pub fn drain(&mut self) -> SignalsSeen {
        let mut seen = SignalsSeen::default();
        let mut buf = [0u8; 64];
        loop {
            match self.receiver.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    for &s in &buf[..n] {
                        match libc::c_int::from(s) {
                            libc::SIGHUP => seen.hangup = true,
                            libc::SIGUSR1 => seen.reopen = true,
                            _ => seen.terminate = true,
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        seen
    }
}

/// Whether stdin can carry `--control-stdin`: a pipe, a socket or a
/// terminal. A regular file would be read at once to its end (an immediate
/// shutdown) and a character device that is not a terminal (`/dev/null`)
/// is empty; kqueue accepts regular files, so the check is explicit.
fn check_stdin(stdin: &File) -> io::Result<()> {
    let kind = stdin.metadata()?.file_type();
    let refused = if kind.is_file() {
        Some("stdin is a regular file")
    } else if kind.is_char_device() && !stdin.is_terminal() {
        Some("stdin is a character device that is not a terminal")
    } else if kind.is_dir() || kind.is_block_device() {
        Some("stdin is not a stream")
    } else {
        None
    };
    match refused {
        Some(what) => Err(io::Error::new(io::ErrorKind::InvalidInput, what)),
        None => Ok(()),
    }
}

/// `--control-stdin`: fd 0 made non-blocking and polled by mio.
pub struct StdinChannel {
    /// A duplicate of fd 0: same open file (and non-blocking flag), closed
    /// on drop without closing fd 0 itself.
    file: File,
}

impl StdinChannel {
    /// Check stdin's type, make it non-blocking and register it for `token`.
    pub fn open(registry: &Registry, token: Token, _waker: &Arc<Waker>) -> io::Result<StdinChannel> {
        let file = File::from(io::stdin().as_fd().try_clone_to_owned()?);
        check_stdin(&file)?;
        let fd = file.as_raw_fd();
        // SAFETY: fcntl with F_GETFL/F_SETFL on an open descriptor has no
        // memory effects.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                return Err(io::Error::last_os_error());
            }
        }
        registry.register(&mut mio::unix::SourceFd(&fd), token, mio::Interest::READABLE)?;
        Ok(StdinChannel { file })
    }

    /// Append what is available to `pending`, up to about `budget` bytes.
    pub fn read(&mut self, pending: &mut Vec<u8>, budget: usize) -> StdinRead {
        let mut buf = [0u8; 4096];
        let mut taken = 0;
        loop {
            if taken >= budget {
                return StdinRead::More;
            }
            match self.file.read(&mut buf) {
                Ok(0) => return StdinRead::Eof,
                Ok(n) => {
                    pending.extend_from_slice(buf.get(..n).unwrap_or_default());
                    taken += n;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return StdinRead::Pending,
                Err(e) => {
                    log::warn!("control stdin: {e}; treating as closed");
                    return StdinRead::Eof;
                }
            }
        }
    }

    /// Stop polling stdin (after EOF).
    pub fn close(&mut self, registry: &Registry) {
        let _ = registry.deregister(&mut mio::unix::SourceFd(&self.file.as_raw_fd()));
    }
}

/// `OPEN_MAX` from `<sys/syslimits.h>`: macOS reports an unlimited hard
/// limit but refuses a soft limit above this (see setrlimit(2) COMPATIBILITY).
#[cfg(target_vendor = "apple")]
const OPEN_MAX: libc::rlim_t = 10240;

/// Raise the soft descriptor limit to the hard one (as nginx's
/// `worker_rlimit_nofile` does) and return the soft limit now in force.
pub fn raise_descriptor_limit() -> Option<u64> {
    // SAFETY: getrlimit/setrlimit with valid pointers to local structs.
    unsafe {
        let mut lim: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            } else {
                #[cfg(target_vendor = "apple")]
                {
                    let capped =
                        libc::rlimit { rlim_cur: OPEN_MAX.min(lim.rlim_max), rlim_max: lim.rlim_max };
                    if capped.rlim_cur > lim.rlim_cur && libc::setrlimit(libc::RLIMIT_NOFILE, &capped) == 0 {
                        lim.rlim_cur = capped.rlim_cur;
                    }
                }
            }
        }
        // rlim_t is narrower than u64 on some 32-bit targets.
        #[allow(clippy::useless_conversion)]
        Some(u64::from(lim.rlim_cur))
    }
}

/// Size, mtime, inode and device of a file: a rename or an in-place write
/// changes at least one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    len: u64,
    mtime: (i64, i64),
    ino: u64,
    dev: u64,
}

/// The stamp of `path`, or `None` when it cannot be read.
pub fn file_stamp(path: &Path) -> Option<FileStamp> {
    let m = std::fs::metadata(path).ok()?;
    Some(FileStamp { len: m.len(), mtime: (m.mtime(), m.mtime_nsec()), ino: m.ino(), dev: m.dev() })
}

/// Bind the listener (mio sets SO_REUSEADDR, so a restart can reuse a port
/// in TIME_WAIT while a live listener still makes bind fail).
pub fn listen(addr: SocketAddr) -> io::Result<TcpListener> {
    TcpListener::bind(addr)
}

/// Start a non-blocking connect to an upstream: a refused loopback connect
/// fails at once on Unix, so no socket option is needed.
pub fn connect(addr: SocketAddr) -> io::Result<TcpStream> {
    TcpStream::connect(addr)
}
