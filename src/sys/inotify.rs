//! Linux: change notification for one file through inotify on its
//! directory, so the idle proxy never wakes up to look. Watching the
//! directory, not the file, catches what a file watch would miss: an atomic
//! rename over the file (a new inode), and a file that does not exist yet.

use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};
use std::ffi::OsString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// What a drain of the watch found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WatchSeen {
    /// The file was written and closed, or something was renamed to its
    /// name (or events were lost: look anyway).
    pub changed: bool,
    /// The directory went away: the watch is dead, poll instead.
    pub lost: bool,
}

/// An inotify descriptor watching the directory of one file, registered
/// with the loop for readability.
pub struct FileWatch {
    fd: OwnedFd,
    name: OsString,
}

impl FileWatch {
    /// Watch `path`'s directory for writes that close and renames into it,
    /// and register the descriptor under `token`.
    pub fn new(path: &Path, registry: &Registry, token: Token) -> io::Result<FileWatch> {
        let name = path.file_name().ok_or_else(|| io::Error::other("no file name"))?.to_os_string();
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let mut dir_c = dir.as_os_str().as_bytes().to_vec();
        if dir_c.contains(&0) {
            return Err(io::Error::other("NUL in path"));
        }
        dir_c.push(0);
        // SAFETY: no pointer arguments; the result is checked.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // A write that closes (in place, or a new file written whole) and a
        // rename onto the name. Not IN_CREATE: a new file is empty when it
        // is created, and reading it then would only log a bad identity.
        let mask = libc::IN_CLOSE_WRITE | libc::IN_MOVED_TO;
        // SAFETY: `dir_c` is NUL-terminated and outlives the call.
        let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), dir_c.as_ptr().cast(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        registry.register(&mut SourceFd(&fd.as_raw_fd()), token, Interest::READABLE)?;
        Ok(FileWatch { fd, name })
    }

    /// Read every pending event (the descriptor is non-blocking) and say
    /// whether one concerned the file.
    pub fn drain(&mut self) -> WatchSeen {
        let mut seen = WatchSeen::default();
        // Room for many events at once (each is 16 bytes plus its name).
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                // WouldBlock: drained. An error other than that cannot be
                // read past: look at the file once and keep going.
                if n < 0 && io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock {
                    seen.changed = true;
                }
                return seen;
            }
            self.parse(&buf[..n as usize], &mut seen);
        }
    }

    fn parse(&self, mut events: &[u8], seen: &mut WatchSeen) {
        // struct inotify_event { int wd; u32 mask; u32 cookie; u32 len; char name[len]; }
        const HEADER: usize = 16;
        while events.len() >= HEADER {
            let mask = u32::from_ne_bytes([events[4], events[5], events[6], events[7]]);
            let len = u32::from_ne_bytes([events[12], events[13], events[14], events[15]]) as usize;
            let end = HEADER.saturating_add(len).min(events.len());
            let name = &events[HEADER..end];
            let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
            if mask & libc::IN_Q_OVERFLOW != 0 {
                seen.changed = true;
            }
            if mask & (libc::IN_IGNORED | libc::IN_DELETE_SELF | libc::IN_MOVE_SELF) != 0 {
                seen.lost = true;
            }
            if name == self.name.as_bytes() {
                seen.changed = true;
            }
            events = &events[end..];
        }
    }

    /// Stop watching (the descriptor closes on drop).
    pub fn close(self, registry: &Registry) {
        let _ = registry.deregister(&mut SourceFd(&self.fd.as_raw_fd()));
    }
}
