//! The audit log's file: the I/O around `obs::Observer`'s records.
//! `AuditFile` appends the buffered records with one write per loop turn
//! (none while idle), rotates to `PATH.1` before a record would take the
//! file past `--audit-max-bytes` (a turn's records then take one write per
//! file), and reopens on SIGUSR1. A failed write is said once at warn; its
//! records are dropped and counted, relaying goes on.

use crate::config::AuditLog;
use crate::obs::metrics::Metrics;
use log::{debug, info, warn};
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::PathBuf;

/// Where the audit records go.
pub(super) struct AuditFile {
    /// `None`: stderr.
    path: Option<PathBuf>,
    file: Option<File>,
    /// Bytes in the current file (for `--audit-max-bytes`).
    size: u64,
    max_bytes: Option<u64>,
    /// A failure was said at warn; said again only after a success.
    failing: bool,
    /// A failed write ended within a record.
    torn: bool,
}

impl AuditFile {
    /// Opens the log (appending); an error here stops the start.
    pub(super) fn open(cfg: &AuditLog) -> io::Result<AuditFile> {
        let mut a = AuditFile {
            path: cfg.path.clone(),
            file: None,
            size: 0,
            max_bytes: cfg.max_bytes,
            failing: false,
            torn: false,
        };
        if a.path.is_some() {
            a.reopen()?;
        }
        Ok(a)
    }

    fn reopen(&mut self) -> io::Result<()> {
        let Some(path) = &self.path else { return Ok(()) };
        self.file = None;
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        self.size = file.metadata().map(|m| m.len()).unwrap_or(0);
        self.file = Some(file);
        Ok(())
    }

    /// SIGUSR1: the file was moved away (logrotate); start a new one.
    pub(super) fn on_reopen_signal(&mut self) {
        if self.path.is_none() {
            return;
        }
        match self.reopen() {
            Ok(()) => info!("audit log reopened"),
            Err(e) => self.fail(&e, 0, None),
        }
    }

    /// Writes `buf` (`records` records): one write, or with
    /// `--audit-max-bytes` one per file the records go to. A file is
    /// rotated before a record would take it past the bound, so a turn's
    /// records (a batch has many) may end one file and begin the next; a
    /// record is never split.
    pub(super) fn write(&mut self, buf: &[u8], records: u64, metrics: &mut Metrics) {
        if self.path.is_none() {
            let mut err = io::stderr().lock();
            if let Err(e) = err.write_all(buf) {
                self.fail(&e, records, Some(metrics));
            }
            return;
        }
        let Some(max) = self.max_bytes else {
            self.append(buf, records, metrics);
            return;
        };
        let mut rest = buf;
        while !rest.is_empty() {
            let mut fit = whole_records(rest, max.saturating_sub(self.size));
            if fit == 0 && self.size > 0 {
                if let Err(e) = self.rotate() {
                    // The bound cannot be kept: the rest goes where it can.
                    self.fail(&e, 0, None);
                    self.append(rest, record_count(rest), metrics);
                    return;
                }
                fit = whole_records(rest, max.saturating_sub(self.size));
            }
            // A record longer than the bound fills a file alone.
            if fit == 0 {
                fit = rest.iter().position(|&b| b == b'\n').map_or(rest.len(), |i| i + 1);
            }
            let (part, tail) = rest.split_at(fit);
            self.append(part, record_count(part), metrics);
            rest = tail;
        }
    }

    /// One write of whole records to the file (opened again first if a
    /// reopen failed).
    fn append(&mut self, buf: &[u8], records: u64, metrics: &mut Metrics) {
        if self.file.is_none() {
            // A reopen that failed: try again, as a write would.
            if let Err(e) = self.reopen() {
                self.fail(&e, records, Some(metrics));
                return;
            }
        }
        let Some(file) = self.file.as_mut() else { return };
        // A record cut by an earlier failed write is ended first, so that
        // what follows starts a line of its own (the cut one does not parse).
        let mut written = 0;
        let result = if std::mem::take(&mut self.torn) {
            file.write_all(&[b"\n".as_slice(), buf].concat())
        } else {
            write_counting(file, buf, &mut written)
        };
        match result {
            Ok(()) => {
                self.size += buf.len() as u64;
                if std::mem::take(&mut self.failing) {
                    info!("audit log writable again");
                }
            }
            Err(e) => {
                // Only the records not written whole are dropped.
                let kept = buf.get(..written).unwrap_or_default();
                self.size += written as u64;
                self.torn = written > 0 && !kept.ends_with(b"\n");
                self.fail(&e, records.saturating_sub(record_count(kept)), Some(metrics));
            }
        }
    }

    fn rotate(&mut self) -> io::Result<()> {
        let Some(path) = self.path.clone() else { return Ok(()) };
        let mut to = path.clone().into_os_string();
        to.push(".1");
        self.file = None;
        std::fs::rename(&path, PathBuf::from(to))?;
        self.reopen()?;
        debug!("audit log rotated");
        Ok(())
    }

    fn fail(&mut self, e: &io::Error, records: u64, metrics: Option<&mut Metrics>) {
        if let Some(m) = metrics {
            m.audit_dropped(records);
        }
        if !std::mem::replace(&mut self.failing, true) {
            warn!("audit log: {}: records are dropped (and counted) until it works again", e.kind());
        }
    }
}

/// The length of the whole records (lines) at the start of `buf` that fit
/// in `room` bytes.
fn whole_records(buf: &[u8], room: u64) -> usize {
    let within = &buf[..buf.len().min(usize::try_from(room).unwrap_or(usize::MAX))];
    within.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1)
}

/// Records in `buf`: each ends with the one line break it holds.
fn record_count(buf: &[u8]) -> u64 {
    buf.iter().filter(|&&b| b == b'\n').count() as u64
}

/// `write_all` that says how much was written before an error.
fn write_counting(file: &mut File, buf: &[u8], written: &mut usize) -> io::Result<()> {
    while let Some(rest) = buf.get(*written..).filter(|r| !r.is_empty()) {
        match file.write(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => *written += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_records_never_cut_a_record() {
        let buf = b"a\nbb\nccc\n";
        let fits: Vec<usize> = (0..=10).map(|room| whole_records(buf, room)).collect();
        assert_eq!(fits, [0, 0, 2, 2, 2, 5, 5, 5, 5, 9, 9]);
        assert_eq!(whole_records(b"", 10), 0);
        assert_eq!((record_count(buf), record_count(b"")), (3, 0));
    }
}
