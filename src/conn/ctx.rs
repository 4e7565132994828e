//! `Ctx`: what the event loop hands a connection on every drive.

use super::editor;
use crate::config::Config;
use crate::mcp::session::SessionTable;
use std::time::Instant;

/// What the event loop hands a connection on every drive: configuration,
/// the current identity and the time.
pub struct Ctx<'a> {
    pub config: &'a Config,
    /// `Bearer <token>`, the value set as `authorization` upstream.
    pub bearer: &'a [u8],
    /// The token alone, set as `x-agent-token`.
    pub token: &'a [u8],
    /// A DPoP-bound token's proofs (`--dpop`).
    pub dpop: Option<&'a dyn editor::Proof>,
    /// A `DPoP-Nonce` the upstream sent (RFC 9449 §9), for the loop to put
    /// in the next proofs.
    pub dpop_nonce: &'a std::cell::RefCell<Option<Vec<u8>>>,
    /// An OAuth source that can ask for more scope: where a 403
    /// `insufficient_scope`'s scope goes for the loop (the request waits
    /// for the token with the union, then goes again once).
    pub step_up: Option<&'a std::cell::RefCell<Option<String>>>,
    /// The agent name stamped into tools/call arguments.
    pub agent: &'a str,
    pub now: Instant,
    /// The port the proxy listens on (the DNS-rebinding guard's Host check).
    pub listen_port: u16,
    /// SIGINT/SIGTERM received: finish the current exchange, then close.
    pub shutting_down: bool,
    /// The MCP sessions seen created through this proxy (one thread: the
    /// cell is never borrowed across a call that could borrow it again).
    pub sessions: &'a std::cell::RefCell<SessionTable>,
    /// Where a response head is parsed in place: one for every connection,
    /// since a head is done with (relayed, or taken over by a reopen)
    /// within the call that parsed it; a waiting connection holds none.
    /// Borrowed only by `read_response_head`.
    pub response_head: &'a std::cell::RefCell<crate::http::head::ResponseHead>,
    /// The tool policy in force (the flags with the identity's lists).
    pub policy: &'a crate::mcp::tools::Policy,
    /// The stamp map in force, learned entries included.
    pub stamps: &'a crate::mcp::stamp::StampMap,
    /// Stamps a `tools/list` answer taught, for the loop to add after the
    /// round (one thread: never borrowed across a call that borrows it).
    pub learned: &'a std::cell::RefCell<Vec<crate::mcp::tools::Learned>>,
    /// The audit log and the metrics are on: exchanges keep records.
    pub observing: bool,
    /// The counters and the upstream's health (one thread: never borrowed
    /// across a call that borrows it).
    pub obs: &'a std::cell::RefCell<crate::obs::Observer>,
    /// The legacy SSE streams relayed, by session: what POSTs on other
    /// connections owe them (one thread: never borrowed across a call that
    /// borrows it).
    pub legacy: &'a std::cell::RefCell<crate::mcp::legacy::Routes>,
    /// Set when a connect to the upstream fails: the loop looks its host
    /// up again (a remote host, off the loop).
    pub connect_failed: &'a std::cell::Cell<bool>,
    /// Set when the upstream answers 401: a credential source that can
    /// renew (`--token-command`) runs again.
    pub unauthorized: &'a std::cell::Cell<bool>,
    /// A credential source that renews is in force and would renew on a
    /// 401 now (a run under way, or one it may start): a request answered
    /// 401 waits for the new token and is sent again once.
    pub renewable: bool,
    /// Counts the tokens the credential source gave: a request sent under
    /// an older one is sent again under the new one.
    pub token_generation: u64,
    /// The credential source's token is past its expiry: nothing is sent.
    pub token_expired: bool,
    /// The wall-clock time (since the epoch) of this round's audit records:
    /// read once a round, when its first record is handed over.
    pub record_time: std::cell::Cell<Option<std::time::Duration>>,
}

impl Ctx<'_> {
    /// Exchanges keep audit records (the audit log or the metrics are on).
    pub fn observing(&self) -> bool {
        self.observing
    }

    /// The identity in force now (a live identity change applies to the
    /// next request planned, a replay included).
    pub(super) fn credentials(&self) -> editor::Credentials<'_> {
        editor::Credentials { agent: self.agent, bearer: self.bearer, token: self.token, dpop: self.dpop }
    }

    pub(super) fn route(&self) -> editor::Route<'_> {
        editor::Route { authority: self.config.upstream.authority.as_bytes(), stamps: self.stamps }
    }
}
