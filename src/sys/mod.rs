//! The operating system: termination signals (console events on Windows),
//! the `--control-stdin` byte channel, the descriptor limit, identity-file
//! stamps and socket options. The only module that names libc or the Windows
//! API, and the only one allowed `unsafe`; each OS family gets one file with
//! the same small safe surface.

#[cfg(unix)]
mod unix;
#[cfg(unix)]
pub use unix::*;

#[cfg(target_os = "linux")]
mod inotify;
#[cfg(target_os = "linux")]
pub use inotify::FileWatch;

#[cfg(not(target_os = "linux"))]
mod poll_only {
    //! No change notification here (macOS kqueue's vnode events and Windows'
    //! directory notifications are not wired yet): the loop polls the file.
    use mio::{Registry, Token};
    use std::io;
    use std::path::Path;

    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct WatchSeen {
        pub changed: bool,
        pub lost: bool,
    }

    pub struct FileWatch;

    impl FileWatch {
        pub fn new(_path: &Path, _registry: &Registry, _token: Token) -> io::Result<FileWatch> {
            Err(io::Error::new(io::ErrorKind::Unsupported, "no file change notification on this OS"))
        }

        pub fn drain(&mut self) -> WatchSeen {
            WatchSeen::default()
        }

        pub fn close(self, _registry: &Registry) {}
    }
}
#[cfg(not(target_os = "linux"))]
pub use poll_only::FileWatch;

#[cfg(windows)]
mod windows;
#[cfg(windows)]
pub use windows::*;

/// What a drain of the signal channel found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignalsSeen {
    /// SIGINT/SIGTERM, or Ctrl-C / Ctrl-Break / console close on Windows.
    pub terminate: bool,
    /// SIGHUP: re-read the identity file now (Unix only).
    pub hangup: bool,
    /// SIGUSR1: reopen the audit log (Unix only).
    pub reopen: bool,
}

/// What one read of the control channel gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdinRead {
    /// Everything available was appended; more may come later.
    Pending,
    /// The budget was read; more may be available now.
    More,
    /// The writer closed its end (or reading failed for good).
    Eof,
}
