//! Transparent re-initialisation of a session the upstream lost (MCP
//! Session Management, items 3 and 4: a server that ended a session answers
//! its id with 404, and the client must then start a new session with a new
//! `initialize`). The proxy saw the client's `initialize`, so it does that
//! for the client, and the client keeps its session:
//!
//! 1. A POST or GET in a recorded, live session gets 404: the 404 is read
//!    whole and held (`Step::Original`); the request is parked (its body is
//!    in memory; the 404 means it was never dispatched).
//! 2. One exchange per session leads (`SessionTable::try_begin_reopen`); the
//!    others wait for it (`Step::Wait`). The leader POSTs the recorded
//!    `initialize` without session id and protocol-version field, with the
//!    identity current now (`Step::Initialize`), and requires 200, exactly
//!    one new id and the same `protocolVersion`; then sends
//!    `notifications/initialized` on the new id if the client had sent it
//!    (`Step::Initialized`).
//! 3. The session maps C (the client's id) to U' (the upstream's new one),
//!    and the parked request is sent once more on U' (`Step::Retry`; a GET
//!    without `Last-Event-ID`), with the current identity. Whatever answers
//!    it is relayed; a second 404 forgets the session.
//!
//! Any failure of the replay relays the original 404 and forgets C (the
//! client then does what the specification tells it to). A request is
//! reopened at most once, a session at most once a second. Until a session's
//! first reopen nothing is rewritten: the relay stays byte-exact.
//!
//! The same machinery replays a request the upstream answered 401 while a
//! credential source that renews is in force (`--token-command`): the 401
//! is held whole, the request waits (at most `--connect-timeout`) for the
//! source's next token (`Ctx::token_generation` moving past the one it was
//! sent under), and goes out once more under it; whatever answers that is
//! relayed. With no new token in time, the held 401 is relayed.
//!
//! The shape: `Reopen` is the decision. It takes events (a response head,
//! an answer read whole or not, a request of its own failing, a look at the
//! session table, the outcome of a table change) with the facts they need,
//! and says what to do next as an `Action`; it owns its phases and the
//! bytes it holds, and touches no socket, clock or table. `Conn` applies
//! actions in one place (`apply`, the only code here that borrows the
//! session table), and runs `Phase::Collect`, the reading of an answer
//! whole, beside it.

use crate::mcp::initialize::Format;
use crate::mcp::rpc;
use crate::mcp::session::ReopenRefused;
use crate::mcp::version_scan::{Scan, VersionScan, Why};
use std::borrow::Cow;

mod apply;
#[cfg(test)]
mod tests;

/// The `notifications/initialized` a replay sends when the client had.
const INITIALIZED: &[u8] = br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;

/// Where the re-initialisation of the current exchange's session stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The upstream's 404 is being read whole.
    Original,
    /// This exchange leads: the recorded `initialize` is being replayed.
    Initialize,
    /// Then `notifications/initialized` on the new upstream session.
    Initialized,
    /// Another exchange leads the reopen of this session: wait for it.
    Wait,
    /// The request goes out again on the new upstream id; whatever answers
    /// it is relayed.
    Retry,
    /// Nothing more to do: the answer in hand is relayed as it came.
    Done,
}

/// A response head, as a decision needs it.
#[derive(Clone, Copy, Debug)]
pub(super) struct Head<'a> {
    pub(super) status: u16,
    pub(super) session_id: Option<&'a [u8]>,
    pub(super) format: Option<Format>,
    pub(super) keep_alive: bool,
}

/// What the session table says of the exchange's session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Seen {
    /// The session is recorded (not forgotten, evicted or expired).
    pub(super) known: bool,
    /// Its upstream id is no longer the one the request went out with:
    /// another exchange re-initialised it meanwhile.
    pub(super) mapped_since_sent: bool,
    /// Another exchange's reopen of it is in flight.
    pub(super) reopening: bool,
    /// The client had sent `notifications/initialized`.
    pub(super) initialized_sent: bool,
}

/// What to do with a response head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum OnHead {
    /// Not the reopen's: relay it as usual.
    Relay,
    /// Forget the session, then relay it (a second 404 after a reopen).
    ForgetAndRelay,
    /// Read the answer whole (`Phase::Collect`).
    Collect,
}

/// What to do next, applied by `Conn::apply`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// Nothing now (an event that changes nothing).
    Stay,
    /// Try to lead the session's reopen; its outcome goes to `on_lead`.
    TryLead,
    /// Send the recorded `initialize` (with the identity current now).
    SendInitialize,
    /// Send `notifications/initialized` on the new upstream id.
    SendInitialized,
    /// Map the session to the new upstream id; the outcome goes to
    /// `on_finished`.
    Finish,
    /// Send the parked request again on the session's upstream id.
    Retry,
    /// Wait for another exchange's reopen (`Phase::AwaitReopen`).
    Wait,
    /// Wait for the credential source's next token (`Phase::AwaitReopen`,
    /// bounded by `--connect-timeout`).
    AwaitToken,
    /// Send the parked request again, as it was, under the token now.
    RetryToken,
    /// The token expired before the request was sent and no new one came
    /// in time: the outage answer, with the request's id.
    TokenExpired,
    /// Keep waiting; look again later.
    KeepWaiting,
    /// Forget the session; the head in hand is relayed as usual (a second
    /// 404 after the retry).
    Forget,
    /// The 404 could not be held whole: relay it as it comes, from its
    /// first byte.
    RelayAsItComes,
    /// Give up: relay the held 404 as it came. `release_lead`: end this
    /// exchange's lead in the table (as a failed replay); `forget`: the
    /// session; `why`: logged at warn.
    GiveUp { why: Option<Cow<'static, str>>, forget: bool, release_lead: bool },
}

impl Action {
    fn fail(why: impl Into<Cow<'static, str>>, leading: bool) -> Action {
        Action::GiveUp { why: Some(why.into()), forget: true, release_lead: leading }
    }

    /// Relay the held 404, the session left as it is in the table.
    fn relay_original() -> Action {
        Action::GiveUp { why: None, forget: false, release_lead: false }
    }
}

/// The re-initialisation state of one exchange: its step and what it holds.
pub(super) struct Reopen {
    step: Step,
    /// The upstream's 404, head and body as received.
    original: Vec<u8>,
    /// The upstream session id the request went out with.
    sent_with: Box<[u8]>,
    /// The whole replayed request of the current step.
    request: Vec<u8>,
    /// The new upstream id, from the answer to the replayed `initialize`.
    new_id: Option<Box<[u8]>>,
    /// The answer being collected: its status, and (for the replayed
    /// `initialize`) the reading of its `protocolVersion` as it streams
    /// past: the answer itself is not kept, whatever its size.
    status: u16,
    scan: Option<VersionScan>,
    /// The upstream may keep the connection after the collected answer.
    keep_alive: bool,
    /// The replayed `initialize`'s id (JSON text) and the version it must
    /// get back.
    init_id: Vec<u8>,
    version: Box<str>,
    /// A 401 replay: the token generation the request was sent under.
    token: Option<u64>,
    /// Not a 401 but a token past its expiry: the request was never sent
    /// and waits for the renewal in flight (`for_expired`).
    expired: bool,
}

impl Reopen {
    /// A 401 to a request sent under token generation `sent_under`.
    pub(super) fn for_token(sent_under: u64, keep_alive: bool) -> Reopen {
        Reopen { token: Some(sent_under), ..Reopen::new(b"", keep_alive) }
    }

    /// A request not sent because the token of generation `current` is
    /// past its expiry: it waits for the next one, as a 401's replay does,
    /// and without one gets the outage answer (there is no answer to relay).
    pub(super) fn for_expired(current: u64) -> Reopen {
        Reopen { token: Some(current), expired: true, ..Reopen::new(b"", true) }
    }

    /// A 404 to a request in a recorded session, sent with `sent_with`.
    pub(super) fn new(sent_with: &[u8], keep_alive: bool) -> Reopen {
        Reopen {
            step: Step::Original,
            original: Vec::new(),
            sent_with: sent_with.into(),
            request: Vec::new(),
            new_id: None,
            status: 0,
            scan: None,
            keep_alive,
            init_id: Vec::new(),
            version: "".into(),
            token: None,
            expired: false,
        }
    }

    /// The exchange is sending a request of the proxy's own (the replayed
    /// `initialize` or `notifications/initialized`), not the client's.
    pub(super) fn replaying(&self) -> bool {
        matches!(self.step, Step::Initialize | Step::Initialized)
    }

    /// The bytes to send instead of the client's request, while replaying.
    pub(super) fn replay_bytes(&self) -> Option<&[u8]> {
        self.replaying().then_some(self.request.as_slice())
    }

    /// Reads payload of an answer to a replayed request as it is walked
    /// (the 404 is held whole in the buffer instead).
    fn read_payload(&mut self, data: &[u8]) {
        if let Some(scan) = self.scan.as_mut() {
            scan.feed(data);
        }
    }

    /// An answer to a request of the proxy's own is walked, not held: its
    /// bytes leave the buffer as they are read.
    fn streams_answer(&self) -> bool {
        self.replaying()
    }

    /// Sockets of a reopen are fresh: after a restart the pool holds the old
    /// upstream's dead connections, and a POST is never sent twice.
    pub(super) fn avoids_pool(&self) -> bool {
        matches!(self.step, Step::Initialize | Step::Initialized | Step::Retry)
    }

    /// Whether the request went out with another upstream id than the
    /// session has now.
    pub(super) fn sent_with_other_than(&self, upstream_id: &[u8]) -> bool {
        *self.sent_with != *upstream_id
    }

    /// A final response head arrived for this exchange.
    pub(super) fn on_head(&mut self, head: &Head) -> OnHead {
        match self.step {
            Step::Initialize | Step::Initialized => {
                self.status = head.status;
                if self.step == Step::Initialize {
                    self.new_id = head.session_id.map(Into::into);
                    self.scan = head.format.and_then(|f| VersionScan::new(f, &self.init_id));
                } else {
                    self.scan = None;
                }
                self.keep_alive = head.keep_alive;
                OnHead::Collect
            }
            Step::Retry if head.status == 404 && self.token.is_none() => OnHead::ForgetAndRelay,
            _ => OnHead::Relay,
        }
    }

    /// The answer being collected is whole (`held`: the bytes of a held
    /// 404, head and body).
    pub(super) fn on_collected(&mut self, held: &[u8], seen: Seen) -> Action {
        match self.step {
            Step::Original if self.token.is_some() => {
                self.original.extend_from_slice(held);
                self.step = Step::Wait;
                Action::AwaitToken
            }
            Step::Original => {
                self.original.extend_from_slice(held);
                if !seen.known {
                    Action::relay_original()
                } else if seen.mapped_since_sent {
                    Action::Retry
                } else {
                    Action::TryLead
                }
            }
            Step::Initialize => {
                let version = match self.scan.as_mut() {
                    Some(scan) => scan.finish().clone(),
                    None => Scan::Missing(Why::Ended { events: 0, not_json: 0 }),
                };
                let why = match (&self.new_id, version) {
                    _ if self.status != 200 => Some("initialize not answered 200"),
                    (None, _) => Some("no session id in the answer to initialize"),
                    (Some(_), Scan::Version(v)) if *v == *self.version => None,
                    (Some(_), Scan::Version(_)) => Some("a different protocol version"),
                    (Some(_), _) => Some("no protocol version in the answer to initialize"),
                };
                match why {
                    Some(why) => Action::fail(why, true),
                    None if seen.initialized_sent => Action::SendInitialized,
                    None => Action::Finish,
                }
            }
            Step::Initialized if (200..300).contains(&self.status) => Action::Finish,
            Step::Initialized => Action::fail("notifications/initialized refused", true),
            Step::Wait | Step::Retry | Step::Done => Action::Stay,
        }
    }

    /// The answer being collected could not be read whole (cut, too large,
    /// bad framing, too slow).
    pub(super) fn on_collect_failed(&mut self) -> Action {
        if self.step == Step::Original {
            self.step = Step::Done;
            Action::RelayAsItComes
        } else {
            Action::fail("answer not read whole", self.replaying())
        }
    }

    /// A request of the proxy's own could not be sent or answered.
    pub(super) fn on_own_request_failed(&mut self, why: Cow<'static, str>) -> Action {
        Action::fail(why, self.replaying())
    }

    /// The outcome of trying to lead the session's reopen.
    pub(super) fn on_lead(&mut self, outcome: Result<(), ReopenRefused>) -> Action {
        match outcome {
            Ok(()) => Action::SendInitialize,
            Err(ReopenRefused::InFlight) => {
                self.step = Step::Wait;
                Action::Wait
            }
            Err(ReopenRefused::TooSoon) => Action::GiveUp {
                why: Some("session lost again within a second of its re-initialisation".into()),
                forget: true,
                release_lead: false,
            },
            Err(ReopenRefused::Unknown) => Action::relay_original(),
        }
    }

    /// A look at the table while waiting for another exchange's reopen
    /// (`deadline_passed`: waited `REOPEN_WAIT`).
    pub(super) fn on_check(&mut self, seen: Seen, deadline_passed: bool) -> Action {
        match seen {
            Seen { known: true, mapped_since_sent: true, .. } => Action::Retry,
            Seen { known: true, reopening: true, .. } if !deadline_passed => Action::KeepWaiting,
            // Forgotten (the reopen failed, or the client deleted it), or
            // waited long enough.
            _ => Action::relay_original(),
        }
    }

    /// A look at the token while waiting for the next one (`now`: the
    /// generation in force; `deadline_passed`: waited `--connect-timeout`;
    /// `renewing`: a new token may still come).
    pub(super) fn on_token_check(&mut self, now: u64, renewing: bool, deadline_passed: bool) -> Action {
        match self.token {
            Some(sent) if now != sent => Action::RetryToken,
            Some(_) if renewing && !deadline_passed => Action::KeepWaiting,
            _ if self.expired => Action::TokenExpired,
            _ => Action::relay_original(),
        }
    }

    /// The recorded `initialize` is about to be replayed: its id and the
    /// version it got; refused when either is unknown.
    pub(super) fn prepare_initialize(&mut self, body: &[u8], version: &str) -> Result<(), &'static str> {
        let init_id = rpc::parse(body).ok().and_then(|b| b.single().map(|m| m.id().json().to_vec()));
        match init_id {
            Some(id) if !version.is_empty() => {
                self.init_id = id;
                self.version = version.into();
                Ok(())
            }
            _ => Err("the recorded initialize or its protocol version is unknown"),
        }
    }

    /// The outcome of mapping the session to its new upstream id.
    pub(super) fn on_finished<E: std::fmt::Debug>(&mut self, outcome: Result<(), E>) -> Action {
        match outcome {
            Ok(()) => Action::Retry,
            Err(why) => Action::GiveUp {
                why: Some(format!("session re-initialisation refused: {why:?}").into()),
                forget: false,
                release_lead: false,
            },
        }
    }

    /// The held 404, to be relayed as it came.
    fn take_original(&mut self) -> Vec<u8> {
        self.step = Step::Done;
        std::mem::take(&mut self.original)
    }
}
