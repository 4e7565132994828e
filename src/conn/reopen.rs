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
//! The shape: `Reopen` is the decision. It takes events (a response head,
//! an answer read whole or not, a request of its own failing, a look at the
//! session table, the outcome of a table change) with the facts they need,
//! and says what to do next as an `Action`; it owns its phases and the
//! bytes it holds, and touches no socket, clock or table. `Conn` applies
//! actions in one place (`apply`, the only code here that borrows the
//! session table), and runs `Phase::Collect`, the reading of an answer
//! whole, beside it.

use super::{editor, Conn, Ctx, Phase};
use crate::http::body::Decoder;
use crate::http::chunked::Piece;
use crate::http::framing::Framing;
use crate::http::head::ResponseHead;
use crate::http::headers::{name, HeaderList};
use crate::limits::{MAX_REOPEN_ANSWER, REOPEN_POLL, REOPEN_WAIT};
use crate::mcp::initialize::Format;
use crate::mcp::rpc;
use crate::mcp::session::ReopenRefused;
use crate::mcp::version_scan::{Scan, VersionScan, Why};
use log::{debug, info, warn};
use std::borrow::Cow;

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
}

impl Reopen {
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
            Step::Retry if head.status == 404 => OnHead::ForgetAndRelay,
            _ => OnHead::Relay,
        }
    }

    /// The answer being collected is whole (`held`: the bytes of a held
    /// 404, head and body).
    pub(super) fn on_collected(&mut self, held: &[u8], seen: Seen) -> Action {
        match self.step {
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

impl Conn {
    /// A final response head has arrived (still in `upstream_buf`): true
    /// when the reopen takes it over instead of relaying it.
    pub(super) fn reopen_takes(&mut self, resp: &ResponseHead, ctx: &Ctx) -> bool {
        if self.ex.reopen.is_none() && resp.status != 404 {
            // Nearly every response: no reopen under way, no session lost.
            return false;
        }
        let head = Head {
            status: resp.status,
            session_id: resp.headers.get_name(name::MCP_SESSION_ID),
            format: resp.headers.get_name(name::CONTENT_TYPE).and_then(Format::from_content_type),
            keep_alive: resp.keep_alive,
        };
        let lost =
            self.ex.reopen.is_none() && resp.status == 404 && self.may_reopen(resp) && self.seen(ctx).known;
        let decision = match self.ex.reopen.as_deref_mut() {
            Some(r) => r.on_head(&head),
            None if lost => {
                let sent_with = self.ex.req.headers.get_name(name::MCP_SESSION_ID).unwrap_or_default();
                self.ex.reopen = Some(Box::new(Reopen::new(sent_with, resp.keep_alive)));
                OnHead::Collect
            }
            None => OnHead::Relay,
        };
        match decision {
            OnHead::Relay => false,
            OnHead::ForgetAndRelay => {
                info!("conn {}: the re-initialised session got 404 again: forgotten", self.id);
                self.apply(ctx, Action::Forget);
                false
            }
            OnHead::Collect => {
                self.start_collect(resp);
                true
            }
        }
    }

    /// A 404 the proxy may recover from: a POST or GET in a session it
    /// recorded, with a body it can read whole. Not a loss: a 404 to
    /// DELETE, to `initialize` (it has no session id), or to an id never
    /// recorded or already forgotten.
    fn may_reopen(&self, resp: &ResponseHead) -> bool {
        self.ex.in_session
            && matches!(self.ex.req.method.as_slice(), b"POST" | b"GET")
            && matches!(resp.framing, Framing::Length(_) | Framing::Chunked)
    }

    /// A request of the proxy's own failed (connect refused, timed out, a
    /// proxy-made answer instead of the upstream's): the client gets the
    /// upstream's 404 it was recovering from.
    pub(super) fn own_request_failed(&mut self, ctx: &Ctx, why: Cow<'static, str>) {
        if let Some(a) = self.ex.reopen.as_deref_mut().map(|r| r.on_own_request_failed(why)) {
            self.apply(ctx, a);
        }
    }

    /// `Phase::AwaitReopen`: look at the table again.
    pub(super) fn await_reopen(&mut self, ctx: &Ctx) -> bool {
        let Phase::AwaitReopen { until, .. } = self.phase else {
            return false;
        };
        let seen = self.seen(ctx);
        let Some(action) = self.ex.reopen.as_deref_mut().map(|r| r.on_check(seen, ctx.now >= until)) else {
            return false;
        };
        let waiting = action == Action::KeepWaiting;
        self.apply(ctx, action);
        !waiting
    }

    // ---- Phase::Collect: an answer read whole instead of relayed ----

    pub(super) fn start_collect(&mut self, resp: &ResponseHead) {
        let mut at = resp.len;
        if self.ex.reopen.as_deref().is_some_and(Reopen::streams_answer) {
            // Only the head was needed (`on_head` read it); the body is
            // walked and let go, so an answer of any size is read in the
            // buffer's room.
            self.upstream_buf.consume(at);
            at = 0;
        }
        self.set_phase(Phase::Collect { input: Decoder::new(resp.framing), at });
    }

    /// `Phase::Collect`: read the upstream's answer whole, without relaying
    /// it (a held 404 stays at the front of `upstream_buf`, head first).
    pub(super) fn collect(&mut self, ctx: &Ctx) -> bool {
        if !self.upstream_buf.has_space() {
            self.upstream_buf.grow();
        }
        let (n, eof) = self.read_upstream();
        if n > 0 {
            self.last_activity = ctx.now;
        }
        let Phase::Collect { input, at } = &mut self.phase else {
            return false;
        };
        let streams = self.ex.reopen.as_deref().is_some_and(Reopen::streams_answer);
        let reopen = &mut self.ex.reopen;
        let unread = self.upstream_buf.data().get(*at..).unwrap_or_default();
        let (walked, error) = input.walk(unread, |run, piece, _| {
            if let (Some(r), Piece::Data) = (reopen.as_deref_mut(), piece) {
                r.read_payload(run);
            }
            true
        });
        if streams {
            self.upstream_buf.consume(walked);
        } else {
            *at += walked;
        }
        // A close-delimited answer ends with the connection.
        let (done, at) = (input.is_done() || (eof && error.is_none() && input.until_close()), *at);
        if done {
            self.collected(ctx, at);
            return true;
        }
        let full = self.upstream_buf.len() > MAX_REOPEN_ANSWER
            || (!self.upstream_buf.has_space() && !self.upstream_buf.grow());
        if error.is_some() || eof || full {
            debug!("conn {}: upstream answer not read whole during a reopen", self.id);
            self.collect_failed(ctx);
            return true;
        }
        n > 0
    }

    /// The answer could not be read whole (also: not in time).
    pub(super) fn collect_failed(&mut self, ctx: &Ctx) {
        if let Some(a) = self.ex.reopen.as_deref_mut().map(Reopen::on_collect_failed) {
            self.apply(ctx, a);
        }
    }

    fn collected(&mut self, ctx: &Ctx, at: usize) {
        // The socket goes to the pool when the upstream keeps it and
        // nothing follows the answer.
        let exact = self.upstream_buf.len() == at;
        let keep = self.ex.reopen.as_deref().is_some_and(|r| r.keep_alive) && exact;
        self.hand_back_upstream(keep);
        let seen = self.seen(ctx);
        let held = self.upstream_buf.data().get(..at).unwrap_or_default();
        let action = self.ex.reopen.as_deref_mut().map(|r| r.on_collected(held, seen));
        self.upstream_buf.clear();
        if let Some(a) = action {
            self.apply(ctx, a);
        }
    }

    // ---- the one place that applies decisions and reads the table ----

    /// What the table says of this exchange's session now.
    fn seen(&self, ctx: &Ctx) -> Seen {
        let table = ctx.sessions.borrow();
        let Some(s) = table.get(&self.ex.session_id) else { return Seen::default() };
        Seen {
            known: true,
            mapped_since_sent: self
                .ex
                .reopen
                .as_deref()
                .is_some_and(|r| r.sent_with_other_than(s.upstream_id())),
            reopening: s.is_reopening(),
            initialized_sent: s.initialized_sent(),
        }
    }

    /// Applies `action`, and the actions its table changes lead to.
    fn apply(&mut self, ctx: &Ctx, action: Action) {
        let mut next = Some(action);
        while let Some(action) = next.take() {
            let id = self.ex.session_id.clone();
            next = match action {
                Action::Stay | Action::KeepWaiting => {
                    if let Phase::AwaitReopen { next_check, .. } = &mut self.phase {
                        *next_check = ctx.now + REOPEN_POLL;
                    }
                    None
                }
                Action::TryLead => {
                    let outcome = ctx.sessions.borrow_mut().try_begin_reopen(&id, ctx.now);
                    if outcome.is_ok() {
                        info!("conn {}: upstream lost the MCP session (404): re-initialising it", self.id);
                    }
                    self.ex.reopen.as_deref_mut().map(|r| r.on_lead(outcome))
                }
                Action::SendInitialize => self.send_initialize(ctx),
                Action::SendInitialized => self.send_initialized(ctx),
                Action::Finish => {
                    let new_id = self.ex.reopen.as_deref().and_then(|r| r.new_id.clone()).unwrap_or_default();
                    let outcome = ctx.sessions.borrow_mut().finish_reopen(&id, Ok(&new_id), ctx.now);
                    if outcome.is_ok() {
                        info!("conn {}: MCP session re-initialised on the upstream", self.id);
                        if ctx.observing() {
                            self.audit_reinit(true);
                        }
                    }
                    self.ex.reopen.as_deref_mut().map(|r| r.on_finished(outcome))
                }
                Action::Retry => self.retry(ctx),
                Action::Wait => {
                    self.set_phase(Phase::AwaitReopen {
                        until: ctx.now + REOPEN_WAIT,
                        next_check: ctx.now + REOPEN_POLL,
                    });
                    None
                }
                Action::Forget => {
                    ctx.sessions.borrow_mut().forget(&id);
                    None
                }
                Action::RelayAsItComes => {
                    // From its first byte (the upstream socket is kept, so a
                    // cut is seen again and relayed as a cut).
                    self.set_phase(Phase::ReadResponseHead { since: ctx.now });
                    None
                }
                Action::GiveUp { why, forget, release_lead } => {
                    if let Some(why) = &why {
                        warn!("conn {}: session re-initialisation failed ({why}): 404 relayed", self.id);
                    }
                    {
                        let mut table = ctx.sessions.borrow_mut();
                        if release_lead {
                            let _ = table.finish_reopen(&id, Err(crate::mcp::session::ReplayFailed), ctx.now);
                        }
                        if release_lead && why.is_some() && ctx.observing() {
                            drop(table);
                            self.audit_reinit(false);
                            table = ctx.sessions.borrow_mut();
                        }
                        if forget {
                            table.forget(&id);
                        }
                    }
                    self.relay_original(ctx);
                    None
                }
            };
        }
    }

    /// Builds and sends the recorded `initialize` with the current identity.
    fn send_initialize(&mut self, ctx: &Ctx) -> Option<Action> {
        let recorded = {
            let table = ctx.sessions.borrow();
            table.get(&self.ex.session_id).map(|s| {
                (
                    recorded_fields(s.headers()),
                    s.initialize_body().to_vec(),
                    Box::<str>::from(s.protocol_version()),
                )
            })
        };
        let Some((mut headers, body, version)) = recorded else {
            return Some(Action::fail("session forgotten", true));
        };
        let r = self.ex.reopen.as_deref_mut()?;
        if let Err(why) = r.prepare_initialize(&body, &version) {
            return Some(Action::fail(why, true));
        }
        self.send_replay(ctx, &mut headers, &body, Step::Initialize)
    }

    /// Builds and sends `notifications/initialized` on the new upstream id.
    fn send_initialized(&mut self, ctx: &Ctx) -> Option<Action> {
        let recorded = {
            let table = ctx.sessions.borrow();
            table
                .get(&self.ex.session_id)
                .map(|s| (recorded_fields(s.headers()), Box::<str>::from(s.protocol_version())))
        };
        let Some((mut headers, version)) = recorded else {
            return Some(Action::fail("session forgotten", true));
        };
        let new_id = self.ex.reopen.as_deref().and_then(|r| r.new_id.clone()).unwrap_or_default();
        if headers.set_name(name::MCP_SESSION_ID, &new_id).is_err()
            || headers.set_name(name::MCP_PROTOCOL_VERSION, version.as_bytes()).is_err()
        {
            return Some(Action::fail("new session id not usable in a header", true));
        }
        self.send_replay(ctx, &mut headers, INITIALIZED, Step::Initialized)
    }

    /// Writes a whole request of the proxy's own (with the current identity)
    /// into the reopen's request buffer and goes to Connect.
    fn send_replay(
        &mut self,
        ctx: &Ctx,
        headers: &mut HeaderList,
        body: &[u8],
        step: Step,
    ) -> Option<Action> {
        let (who, route) = (ctx.credentials(), ctx.route());
        let req = editor::Outgoing { method: b"POST", target: &self.ex.req.target, framed: true };
        let r = self.ex.reopen.as_deref_mut()?;
        r.request.clear();
        let Ok(plan) = editor::plan_request(&req, headers, body, &who, &route, &mut r.request) else {
            return Some(Action::fail("recorded request refused by the scanner", true));
        };
        plan.parts(body).for_each(|p| r.request.extend_from_slice(p));
        r.step = step;
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
        None
    }

    /// Relays the held 404 as if it had just arrived.
    fn relay_original(&mut self, ctx: &Ctx) {
        let original = self.ex.reopen.as_deref_mut().map(Reopen::take_original).unwrap_or_default();
        self.drop_upstream();
        self.upstream_buf.clear();
        if !self.upstream_buf.push(&original) {
            // Cannot happen: the 404 was read into this buffer.
            self.close(super::CloseReason::UpstreamFailed);
            return;
        }
        self.set_phase(Phase::ReadResponseHead { since: ctx.now });
    }

    /// Sends the parked request again, on the session's upstream id now and
    /// with the current identity (a GET stream without `Last-Event-ID`: the
    /// new session has no events to resume).
    fn retry(&mut self, ctx: &Ctx) -> Option<Action> {
        let upstream_id = ctx.sessions.borrow().get(&self.ex.session_id).map(|s| s.upstream_id().to_vec());
        let Some(upstream_id) = upstream_id else {
            return Some(Action::relay_original());
        };
        if self.ex.reopen.as_deref().is_some_and(|r| r.step == Step::Original) {
            debug!("conn {}: session already re-initialised: request sent again", self.id);
        }
        let ex = &mut self.ex;
        let _ = ex.req.headers.set_name(name::MCP_SESSION_ID, &upstream_id);
        if ex.req.method.as_slice() == b"GET" {
            ex.req.headers.remove_name(name::LAST_EVENT_ID);
        }
        if self.plan_upstream_request(ctx).is_err() {
            // Cannot happen: the same body was planned before.
            return Some(Action::relay_original());
        }
        if let Some(r) = self.ex.reopen.as_deref_mut() {
            r.step = Step::Retry;
        }
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
        None
    }
}

/// The recorded end-to-end fields of a session's `initialize`, without
/// those that name a session or a version.
fn recorded_fields<'a>(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> HeaderList {
    let mut headers = HeaderList::new();
    for (name, value) in fields {
        if !matches!(name, b"mcp-session-id" | b"mcp-protocol-version" | b"last-event-id") {
            let _ = headers.set(name, value);
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORIGINAL: &[u8] = b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nlost!";

    fn seen(known: bool, mapped: bool, reopening: bool, initialized: bool) -> Seen {
        Seen { known, mapped_since_sent: mapped, reopening, initialized_sent: initialized }
    }

    /// A reopen that holds the 404 and leads: at `Step::Initialize`, its
    /// replayed `initialize` answered with (status, new id, body).
    fn leading(status: u16, new_id: Option<&[u8]>, format: Format, body: &[u8]) -> Reopen {
        let mut r = Reopen::new(b"u1", true);
        assert_eq!(r.on_collected(ORIGINAL, seen(true, false, false, true)), Action::TryLead);
        assert_eq!(r.on_lead(Ok(())), Action::SendInitialize);
        r.prepare_initialize(br#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}"#, "2025-06-18")
            .unwrap();
        r.step = Step::Initialize;
        let head = Head { status, session_id: new_id, format: Some(format), keep_alive: true };
        assert_eq!(r.on_head(&head), OnHead::Collect);
        r.read_payload(body);
        r
    }

    fn answer(version: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"protocolVersion":"{version}"}}}}"#).into_bytes()
    }

    #[test]
    fn the_replayed_initialize_decides_the_next_step() {
        use Format::{EventStream, Json};
        let sse = |v: &str| {
            let mut b = b"event: message\r\ndata: ".to_vec();
            b.extend(answer(v));
            b.extend(b"\r\n\r\n");
            b
        };
        // (status, new id, format, body, client sent initialized) -> action.
        let cases: Vec<(u16, Option<&[u8]>, Format, Vec<u8>, bool, Action)> = vec![
            (200, Some(b"u2"), Json, answer("2025-06-18"), true, Action::SendInitialized),
            (200, Some(b"u2"), Json, answer("2025-06-18"), false, Action::Finish),
            (200, Some(b"u2"), EventStream, sse("2025-06-18"), true, Action::SendInitialized),
            (
                200,
                Some(b"u2"),
                Json,
                answer("2025-03-26"),
                true,
                Action::fail("a different protocol version", true),
            ),
            (
                200,
                None,
                Json,
                answer("2025-06-18"),
                true,
                Action::fail("no session id in the answer to initialize", true),
            ),
            (
                500,
                Some(b"u2"),
                Json,
                answer("2025-06-18"),
                true,
                Action::fail("initialize not answered 200", true),
            ),
            (
                200,
                Some(b"u2"),
                Json,
                br#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"m"}}"#.to_vec(),
                true,
                Action::fail("no protocol version in the answer to initialize", true),
            ),
            (
                200,
                Some(b"u2"),
                Json,
                br#"{"jsonrpc":"2.0","id":8,"result":{}}"#.to_vec(),
                true,
                Action::fail("no protocol version in the answer to initialize", true),
            ),
            (
                200,
                Some(b"u2"),
                Json,
                b"{\"id\":7,".to_vec(),
                true,
                Action::fail("no protocol version in the answer to initialize", true),
            ),
        ];
        for (status, id, format, body, initialized, want) in cases {
            let mut r = leading(status, id, format, &body);
            let got = r.on_collected(b"", seen(true, false, true, initialized));
            assert_eq!(got, want, "{status} {id:?} {format:?} {}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn the_held_404_leads_waits_retries_or_is_relayed() {
        // (seen when the 404 is whole) -> action.
        for (s, want) in [
            (seen(true, false, false, true), Action::TryLead),
            (seen(true, true, false, true), Action::Retry),
            (seen(false, false, false, false), Action::relay_original()),
        ] {
            let mut r = Reopen::new(b"u1", false);
            assert_eq!(r.on_collected(ORIGINAL, s), want, "{s:?}");
        }
        // The outcome of trying to lead.
        for (outcome, want, step) in [
            (Ok(()), Action::SendInitialize, Step::Original),
            (Err(ReopenRefused::InFlight), Action::Wait, Step::Wait),
            (Err(ReopenRefused::Unknown), Action::relay_original(), Step::Original),
        ] {
            let mut r = Reopen::new(b"u1", false);
            assert_eq!(r.on_lead(outcome), want);
            assert_eq!(r.step, step);
        }
        let mut r = Reopen::new(b"u1", false);
        assert!(matches!(
            r.on_lead(Err(ReopenRefused::TooSoon)),
            Action::GiveUp { forget: true, release_lead: false, .. }
        ));
        // Waiting: (seen, waited long enough) -> action.
        for (s, late, want) in [
            (seen(true, true, false, true), false, Action::Retry),
            (seen(true, false, true, true), false, Action::KeepWaiting),
            (seen(true, false, true, true), true, Action::relay_original()),
            (seen(true, false, false, true), false, Action::relay_original()),
            (seen(false, false, false, false), false, Action::relay_original()),
        ] {
            let mut r = Reopen::new(b"u1", false);
            r.step = Step::Wait;
            assert_eq!(r.on_check(s, late), want, "{s:?} late {late}");
        }
    }

    #[test]
    fn heads_are_collected_only_while_replaying_and_a_second_404_forgets() {
        let head =
            |status| Head { status, session_id: Some(b"u9"), format: Some(Format::Json), keep_alive: false };
        for (step, status, want) in [
            (Step::Initialize, 200, OnHead::Collect),
            (Step::Initialize, 404, OnHead::Collect),
            (Step::Initialized, 202, OnHead::Collect),
            (Step::Retry, 404, OnHead::ForgetAndRelay),
            (Step::Retry, 200, OnHead::Relay),
            (Step::Done, 404, OnHead::Relay),
            (Step::Wait, 404, OnHead::Relay),
        ] {
            let mut r = Reopen::new(b"u1", true);
            r.step = step;
            assert_eq!(r.on_head(&head(status)), want, "{step:?} {status}");
        }
        let mut r = Reopen::new(b"u1", true);
        r.step = Step::Initialized;
        r.on_head(&head(202));
        assert_eq!(r.on_collected(b"", seen(true, false, true, true)), Action::Finish);
        r.on_head(&head(400));
        assert_eq!(
            r.on_collected(b"", seen(true, false, true, true)),
            Action::fail("notifications/initialized refused", true)
        );
    }

    #[test]
    fn every_failure_relays_the_original_404_byte_for_byte() {
        type Event = fn(&mut Reopen) -> Action;
        let own_request: Event = |r| r.on_own_request_failed("connect refused".into());
        let not_whole: Event = |r| r.on_collect_failed();
        let too_soon: Event = |r| r.on_lead(Err(ReopenRefused::TooSoon));
        let unknown: Event = |r| r.on_lead(Err(ReopenRefused::Unknown));
        let gone_while_waiting: Event = |r| r.on_check(Seen::default(), false);
        let waited_too_long: Event = |r| r.on_check(seen(true, false, true, true), true);
        let not_mapped: Event = |r| r.on_finished(Err("IdInUse"));
        let refused: Event = |r| {
            r.status = 400;
            r.on_collected(b"", seen(true, false, true, true))
        };
        // (step, event, whether it must give the lead back).
        let failures: Vec<(Step, Event, bool)> = vec![
            (Step::Initialize, own_request, true),
            (Step::Initialized, own_request, true),
            (Step::Initialize, not_whole, true),
            (Step::Initialized, not_whole, true),
            (Step::Initialize, refused, true),
            (Step::Initialized, refused, true),
            (Step::Original, too_soon, false),
            (Step::Original, unknown, false),
            (Step::Wait, gone_while_waiting, false),
            (Step::Wait, waited_too_long, false),
            (Step::Initialized, not_mapped, false),
        ];
        for (i, (step, event, lead)) in failures.into_iter().enumerate() {
            let mut r = Reopen::new(b"u1", true);
            r.on_collected(ORIGINAL, seen(true, false, false, true));
            r.step = step;
            match event(&mut r) {
                Action::GiveUp { release_lead, .. } => {
                    assert_eq!(release_lead, lead, "failure {i} at {step:?}");
                    assert_eq!(r.take_original(), ORIGINAL, "failure {i} at {step:?}");
                    assert_eq!(r.step, Step::Done);
                }
                other => panic!("failure {i} at {step:?} did not give up: {other:?}"),
            }
        }
        // A 404 that cannot be held whole is relayed as it comes instead.
        let mut r = Reopen::new(b"u1", true);
        assert_eq!(r.on_collect_failed(), Action::RelayAsItComes);
        assert_eq!(r.step, Step::Done);
    }
}
