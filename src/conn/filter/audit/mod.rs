//! The audit records of one exchange: each JSON-RPC request of its body
//! (what it is, read once when the body is whole), its answer's outcome
//! (read as the answer streams past, by the same reader as an
//! `initialize`'s version), and the session events it caused. Records are
//! queued on the connection; the loop hands them to the `Observer` (which
//! stamps the time and the agent) after each drive. Nothing is built when
//! neither the audit log nor the metrics listener is on.

use crate::conn::exchange::Exchange;
use crate::mcp::rpc;
use crate::obs::audit::Record;
use log::warn;
use std::time::Instant;

mod exchange;

pub(in crate::conn) use exchange::ExchangeAudit;

/// How an exchange ended, for its records.
#[derive(Clone, Copy, Debug)]
pub(in crate::conn) enum End {
    /// The upstream's answer was relayed whole.
    Relayed,
    /// The answer was cut short (the upstream or the client went away).
    Cut,
    /// The proxy answered.
    Proxy(crate::conn::answer::Answer),
}

/// The audit at the exchange's fixed points: the request (its body whole),
/// the response head (session events), a reopen's end, the exchange's end.
/// The audit's part: the body's requests, for the audit log and the
/// metrics (none when neither is on), and the records made.
#[derive(Default)]
pub(in crate::conn) struct AuditState {
    pub(in crate::conn) current: Option<Box<ExchangeAudit>>,
    /// The last exchange's, emptied, for the next one (its allocation and
    /// its buffers are reused).
    pub(in crate::conn) spare: Option<Box<ExchangeAudit>>,
    /// The connection's records waiting for the loop (kept across
    /// exchanges until the loop reads them).
    pub(in crate::conn) queue: Vec<crate::obs::audit::Record>,
}

impl AuditState {
    /// A new exchange: the last one's audit, emptied, is kept for reuse.
    pub(in crate::conn) fn begin(&mut self) {
        if let Some(a) = self.current.take() {
            self.spare = Some(a);
        }
    }
}

impl Exchange {
    /// The body is whole (`conn`: the connection's id, for the log): note
    /// its requests when someone observes.
    pub(in crate::conn) fn audit_request(
        &mut self,
        conn: u64,
        agent: &str,
        policy: &crate::mcp::tools::Policy,
    ) {
        let bytes_in = (self.req.len + self.body.len()) as u64;
        let mut a = self.audit.spare.take().unwrap_or_default();
        a.read_into(&self.body, &self.plan, agent, policy, bytes_in);
        for r in a.requests.iter().filter(|r| r.claimed.is_some()) {
            warn!(
                "conn {}: tools/call of {:?} claims to be {:?}, not {agent:?}: stamped as {agent:?}",
                conn,
                r.tool.as_deref().unwrap_or(""),
                r.claimed.as_deref().unwrap_or("")
            );
        }
        if a.requests.is_empty() {
            self.audit.spare = Some(a);
        } else {
            self.audit.current = Some(a);
        }
    }

    /// The exchange is over: its requests' records.
    pub(in crate::conn) fn audit_end(&mut self, now: Instant, end: End) {
        let Some(mut a) = self.audit.current.take() else { return };
        let ms = self.meter.start.map_or(0, |s| now.saturating_duration_since(s).as_millis() as u64);
        a.records(&self.session.id, self.meter.status, ms, self.meter.bytes_out, end, &mut self.audit.queue);
        self.audit.spare = Some(a);
    }

    /// The session events a response head tells of: an `initialize`
    /// answered with a session id, a DELETE of the session that passed.
    pub(in crate::conn) fn audit_session(&mut self, resp: &crate::http::head::ResponseHead) {
        let method = self.req.method.as_slice();
        let ok = (200..300).contains(&resp.status);
        if method == b"DELETE" && ok && !self.session.id.is_empty() {
            self.audit.queue.push(Record::SessionDeleted { session: self.session.id.as_slice().into() });
        } else if method == b"POST" && ok && self.session.id.is_empty() {
            let init = self
                .audit
                .current
                .as_ref()
                .is_some_and(|a| a.requests.iter().any(|r| &*r.method == rpc::INITIALIZE));
            if let Some(id) =
                resp.headers.get_name(crate::http::headers::name::MCP_SESSION_ID).filter(|_| init)
            {
                self.audit.queue.push(Record::SessionCreated { session: id.into() });
            }
        }
    }

    /// A recorded session's re-initialisation ended (`ok`: it succeeded).
    pub(in crate::conn) fn audit_reinit(&mut self, ok: bool) {
        self.audit
            .queue
            .push(Record::SessionReinitialised { session: self.session.id.as_slice().into(), ok });
    }
}
