//! The three identity sources: the flags (the starting `Live` identity),
//! `--identity-file` (`IdentityWatch`: change notification or polling, and
//! SIGHUP) and `--control-stdin` (`ControlStdin`: one JSON object per line,
//! EOF shuts down). Whatever the source, `Live::update` applies it to the
//! next request.

use crate::config::read_identity_file;
use crate::limits::{IDENTITY_POLL, MAX_CONTROL_LINE};
use crate::mcp::identity::{self, Identity};
use crate::mcp::tools::{Policy, ToolFlags};
use crate::sys::{self, FileStamp, StdinChannel, StdinRead};
use log::{debug, info, warn};
use mio::Poll;
use std::io;
use std::path::Path;
use std::time::Instant;

/// The identity in force: applied to each request when its head is built,
/// so a change reaches the next request and never half of one request.
pub(super) struct Live {
    pub(super) identity: Identity,
    /// `Bearer <token>`, built once per identity.
    pub(super) bearer: Vec<u8>,
    /// The tool policy of the flags with this identity's lists.
    pub(super) policy: Policy,
    /// Tokens set by `set_token` (a credential source's renewals).
    pub(super) generation: u64,
}

impl Live {
    pub(super) fn new(identity: Identity, tools: &ToolFlags) -> Live {
        let bearer = [b"Bearer ".as_slice(), identity.token.as_bytes()].concat();
        let policy = Policy::for_identity(tools, &identity);
        Live { identity, bearer, policy, generation: 0 }
    }

    /// A new token for the same agent (a credential source's renewal),
    /// sent with `scheme` (`Bearer`, or `DPoP` for a DPoP-bound one).
    pub(super) fn set_token(&mut self, token: &str, scheme: crate::credentials::Scheme) {
        self.identity.token = token.to_string();
        let prefix: &[u8] = match scheme {
            crate::credentials::Scheme::Bearer => b"Bearer ",
            crate::credentials::Scheme::DPoP => b"DPoP ",
        };
        self.bearer = [prefix, token.as_bytes()].concat();
        self.generation += 1;
    }

    /// The same token, but what goes with it changed (a new DPoP nonce): a
    /// request refused under the old one is sent again.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(super) fn bump(&mut self) {
        self.generation += 1;
    }

    /// Applies a new identity; the name it replaces when it changed.
    pub(super) fn update(&mut self, identity: Identity, source: &str, tools: &ToolFlags) -> Option<String> {
        if identity == self.identity {
            debug!("identity from {source} unchanged");
            return None;
        }
        let token_changed = identity.token != self.identity.token;
        let lists_changed = identity.allow_tools != self.identity.allow_tools
            || identity.deny_tools != self.identity.deny_tools;
        info!(
            "identity updated from {source}: agent {:?}{}{}",
            identity.agent,
            if token_changed { ", new token" } else { "" },
            if lists_changed { ", new tool lists" } else { "" }
        );
        let generation = self.generation;
        let previous = std::mem::replace(self, Live::new(identity, tools));
        self.generation = generation;
        Some(previous.identity.agent)
    }
}

/// Watches `--identity-file`: through a change notification where the OS
/// has one wired (inotify on the file's directory, Linux), so an idle proxy
/// never wakes up; else by a stat every `IDENTITY_POLL`.
pub(super) struct IdentityWatch {
    path: std::path::PathBuf,
    seen: Option<FileStamp>,
    next_check: Instant,
    notify: Option<sys::FileWatch>,
    /// The watch reported something about the file since the last check.
    notified: bool,
}

impl IdentityWatch {
    pub(super) fn stamp(&self) -> Option<FileStamp> {
        sys::file_stamp(&self.path)
    }

    /// When the loop must wake up to poll (never when notified).
    pub(super) fn wake_at(&self) -> Option<Instant> {
        match self.notify {
            Some(_) => None,
            None => Some(self.next_check),
        }
    }

    /// The watch's descriptor was readable.
    pub(super) fn on_event(&mut self, registry: &mio::Registry) {
        let Some(w) = self.notify.as_mut() else { return };
        let seen = w.drain();
        self.notified |= seen.changed;
        if seen.lost {
            // The directory itself went away: the watch is dead.
            warn!("identity file directory no longer watched; polling the file instead");
            if let Some(w) = self.notify.take() {
                w.close(registry);
            }
            self.notified = true;
        }
    }

    /// A new identity when the file changed (or `force`, on SIGHUP).
    pub(super) fn check(&mut self, now: Instant, force: bool) -> Option<Identity> {
        let due = match self.notify {
            Some(_) => self.notified,
            None => now >= self.next_check,
        };
        if !force && !due {
            return None;
        }
        self.notified = false;
        self.next_check = now + IDENTITY_POLL;
        let stamp = self.stamp();
        if !force && stamp == self.seen {
            return None;
        }
        self.seen = stamp;
        match read_identity_file(&self.path) {
            Ok(identity) => Some(identity),
            Err(e) => {
                // The message names the path and the reason, never a value.
                warn!("{e}; keeping the current identity");
                None
            }
        }
    }
}

/// `--control-stdin`: identity objects, one per line; EOF means the wrapper
/// is gone.
pub(super) struct ControlStdin {
    pub(super) channel: StdinChannel,
    pending: Vec<u8>,
    /// A line longer than `MAX_CONTROL_LINE` is being skipped.
    discarding: bool,
}

impl ControlStdin {
    pub(super) fn open(poll: &Poll, waker: &std::sync::Arc<mio::Waker>) -> io::Result<ControlStdin> {
        let channel = StdinChannel::open(poll.registry(), super::STDIN, waker)?;
        Ok(ControlStdin { channel, pending: Vec::new(), discarding: false })
    }

    /// Read what is there; returns the identities of complete lines and
    /// whether stdin reached EOF.
    pub(super) fn read(&mut self) -> (Vec<Identity>, bool) {
        let mut out = Vec::new();
        let eof = self.channel.read(&mut self.pending, usize::MAX) == StdinRead::Eof;
        while let Some(nl) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=nl).collect();
            if std::mem::take(&mut self.discarding) {
                continue;
            }
            Self::take_line(&line, &mut out);
        }
        if self.pending.len() > MAX_CONTROL_LINE {
            warn!("control stdin: line longer than {MAX_CONTROL_LINE} bytes ignored");
            self.pending.clear();
            self.discarding = true;
        }
        if eof && !self.pending.is_empty() && !self.discarding {
            let line = std::mem::take(&mut self.pending);
            Self::take_line(&line, &mut out);
        }
        (out, eof)
    }

    fn take_line(line: &[u8], out: &mut Vec<Identity>) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match identity::parse(line) {
            Ok(identity) => out.push(identity),
            Err(e) => warn!("control stdin: {e}; keeping the current identity"),
        }
    }
}

impl IdentityWatch {
    /// Watch `path` (notification where wired, else polling); the first
    /// check, at once, reads the file if it exists, so one created or
    /// changed since the arguments were parsed counts.
    pub(super) fn new(path: &Path, poll: &Poll, token: mio::Token, starting_agent: &str) -> IdentityWatch {
        let notify = match sys::FileWatch::new(path, poll.registry(), token) {
            Ok(w) => Some(w),
            Err(e) => {
                debug!("identity file: no change notification ({e}); polling every {IDENTITY_POLL:?}");
                None
            }
        };
        let w = IdentityWatch {
            path: path.to_path_buf(),
            seen: None,
            next_check: Instant::now(),
            notify,
            notified: true,
        };
        if w.stamp().is_none() {
            info!(
                "identity file {} does not exist yet: waiting for it; until then agent {starting_agent:?} from the flags",
                path.display()
            );
        }
        w
    }
}
