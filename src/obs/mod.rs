//! What an operator sees of the proxy besides its log: the audit log's
//! records (`audit`), the counters and gauges behind `/metrics`
//! (`metrics`), the upstream's health behind `/healthz` (`health`), the
//! RFC 3339 time stamps they carry (`clock`), and the metrics listener's
//! requests and answers (`serve`). Pure: fed values and the time, gives
//! bytes; the event loop owns the sockets and the file.

pub mod audit;
pub mod clock;
pub mod health;
pub mod metrics;
pub mod serve;

use audit::Record;
use health::Health;
use metrics::Metrics;
use std::time::Duration;

/// What the loop observes: the counters, the upstream's health, and the
/// audit records not yet written (one buffer, written when the loop is
/// about to wait).
#[derive(Debug, Default)]
pub struct Observer {
    pub metrics: Metrics,
    pub health: Health,
    /// The audit log is on: records are written into `pending`.
    audit: bool,
    pending: Vec<u8>,
    /// Writes the records into `pending`.
    writer: audit::Writer,
    /// Records in `pending`.
    records: u64,
}

impl Observer {
    pub fn new(audit: bool) -> Observer {
        Observer { audit, ..Observer::default() }
    }

    /// One record, at `ts` (since the epoch), with the agent name in force.
    pub fn record(&mut self, ts: Duration, agent: &str, record: &Record) {
        self.metrics.count(record);
        if self.audit {
            self.writer.write(ts, agent, record, &mut self.pending);
            self.records += 1;
        }
    }

    /// The records to write, and how many they are; `None` when there are none.
    pub fn take_pending(&mut self) -> Option<(Vec<u8>, u64)> {
        if self.pending.is_empty() {
            return None;
        }
        Some((std::mem::take(&mut self.pending), std::mem::take(&mut self.records)))
    }

    /// The buffer back after the write (its allocation is reused).
    pub fn give_back(&mut self, mut buf: Vec<u8>) {
        if self.pending.is_empty() {
            buf.clear();
            self.pending = buf;
        }
    }
}
