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

use super::{editor, Conn, Ctx, Phase};
use crate::http::framing::Framing;
use crate::http::head::ResponseHead;
use crate::http::headers::{name, HeaderList};
use crate::limits::{REOPEN_POLL, REOPEN_WAIT};
use crate::mcp::initialize::Format;
use crate::mcp::rpc;
use crate::mcp::session::{ReopenRefused, ReplayFailed};
use crate::mcp::version_scan::{Scan, VersionScan, Why};
use log::{debug, info, warn};

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

/// The re-initialisation state of one exchange.
pub(super) struct Reopen {
    pub(super) step: Step,
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
    fn new(sent_with: &[u8]) -> Reopen {
        Reopen {
            step: Step::Original,
            original: Vec::new(),
            sent_with: sent_with.into(),
            request: Vec::new(),
            new_id: None,
            status: 0,
            scan: None,
            keep_alive: false,
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
    pub(super) fn read_payload(&mut self, data: &[u8]) {
        if let Some(scan) = self.scan.as_mut() {
            scan.feed(data);
        }
    }

    /// An answer to a request of the proxy's own is walked, not held: its
    /// bytes leave the buffer as they are read.
    pub(super) fn streams_answer(&self) -> bool {
        self.replaying()
    }

    /// The upstream keeps the connection after the collected answer.
    pub(super) fn keeps_connection(&self) -> bool {
        self.keep_alive
    }

    /// Sockets of a reopen are fresh: after a restart the pool holds the old
    /// upstream's dead connections, and a POST is never sent twice.
    pub(super) fn avoids_pool(&self) -> bool {
        matches!(self.step, Step::Initialize | Step::Initialized | Step::Retry)
    }
}

impl Conn {
    /// A final response head has arrived (still in `upstream_buf`): true
    /// when the reopen takes it over instead of relaying it.
    pub(super) fn reopen_takes(&mut self, resp: &ResponseHead, ctx: &Ctx) -> bool {
        match self.ex.reopen.as_deref_mut().map(|r| r.step) {
            Some(Step::Initialize | Step::Initialized) => {
                if let Some(r) = self.ex.reopen.as_deref_mut() {
                    r.status = resp.status;
                    if r.step == Step::Initialize {
                        r.new_id = resp.headers.get_name(name::MCP_SESSION_ID).map(Into::into);
                    }
                    let format =
                        resp.headers.get_name(name::CONTENT_TYPE).and_then(Format::from_content_type);
                    r.scan = match (r.step, format) {
                        (Step::Initialize, Some(f)) => VersionScan::new(f, &r.init_id),
                        _ => None,
                    };
                    r.keep_alive = resp.keep_alive;
                }
                self.start_collect(resp);
                true
            }
            Some(Step::Retry) if resp.status == 404 => {
                info!("conn {}: the re-initialised session got 404 again: forgotten", self.id);
                ctx.sessions.borrow_mut().forget(&self.ex.session_id);
                false
            }
            Some(_) => false,
            None if resp.status == 404 && self.may_reopen(resp, ctx) => {
                let sent_with = self.ex.req.headers.get_name(name::MCP_SESSION_ID).unwrap_or_default();
                let mut r = Reopen::new(sent_with);
                r.keep_alive = resp.keep_alive;
                self.ex.reopen = Some(Box::new(r));
                self.start_collect(resp);
                true
            }
            None => false,
        }
    }

    /// The session's upstream id is no longer the one the request went out
    /// with: another exchange re-initialised it meanwhile.
    fn mapped_since_sent(&self, upstream_id: &[u8]) -> bool {
        self.ex.reopen.as_deref().is_some_and(|r| *r.sent_with != *upstream_id)
    }

    /// A 404 the proxy may recover from: a POST or GET in a session it
    /// recorded and still holds, with a body it can read whole. Not a loss:
    /// a 404 to DELETE, to `initialize` (it has no session id), or to an id
    /// never recorded or already forgotten.
    fn may_reopen(&self, resp: &ResponseHead, ctx: &Ctx) -> bool {
        self.ex.in_session
            && matches!(self.ex.req.method.as_slice(), b"POST" | b"GET")
            && matches!(resp.framing, Framing::Length(_) | Framing::Chunked)
            && ctx.sessions.borrow().get(&self.ex.session_id).is_some()
    }

    /// The answer being collected could not be read whole (cut, too large,
    /// bad framing, too slow).
    pub(super) fn collect_failed(&mut self, ctx: &Ctx) {
        let Some(r) = self.ex.reopen.as_deref_mut() else { return };
        if r.step == Step::Original {
            // The 404 itself: relay it as it comes, from its first byte (the
            // upstream socket is kept, so a cut is seen again and relayed as
            // a cut).
            r.step = Step::Done;
            self.set_phase(Phase::ReadResponseHead { since: ctx.now });
        } else {
            self.fail_reopen(ctx, "answer not read whole");
        }
    }

    pub(super) fn collected(&mut self, ctx: &Ctx, at: usize) {
        let step = self.ex.reopen.as_deref().map_or(Step::Done, |r| r.step);
        if let (Step::Original, Some(r)) = (step, self.ex.reopen.as_deref_mut()) {
            // Held to be relayed as it came if the recovery fails; the
            // answers to replayed requests are read from their payload.
            r.original.extend_from_slice(self.upstream_buf.data().get(..at).unwrap_or_default());
        }
        self.release_collected(at);
        self.upstream_buf.clear();
        match step {
            Step::Original => self.after_404(ctx),
            Step::Initialize => self.initialize_answered(ctx),
            Step::Initialized => {
                let status = self.ex.reopen.as_deref().map_or(0, |r| r.status);
                if (200..300).contains(&status) {
                    self.finish_reopen(ctx);
                } else {
                    self.fail_reopen(ctx, "notifications/initialized refused");
                }
            }
            Step::Wait | Step::Retry | Step::Done => {}
        }
    }

    /// The 404 is in hand: lead the reopen, wait for the one under way, go
    /// straight to the retry when another exchange already reopened the
    /// session, or give up.
    fn after_404(&mut self, ctx: &Ctx) {
        let begun = {
            let mut table = ctx.sessions.borrow_mut();
            match table.get(&self.ex.session_id).map(|s| self.mapped_since_sent(s.upstream_id())) {
                None => Err(ReopenRefused::Unknown),
                Some(true) => {
                    drop(table);
                    debug!("conn {}: session already re-initialised: request sent again", self.id);
                    self.retry(ctx);
                    return;
                }
                Some(false) => table.try_begin_reopen(&self.ex.session_id, ctx.now),
            }
        };
        match begun {
            Ok(()) => {
                info!("conn {}: upstream lost the MCP session (404): re-initialising it", self.id);
                self.replay_initialize(ctx);
            }
            Err(ReopenRefused::InFlight) => {
                if let Some(r) = self.ex.reopen.as_deref_mut() {
                    r.step = Step::Wait;
                }
                self.set_phase(Phase::AwaitReopen {
                    until: ctx.now + REOPEN_WAIT,
                    next_check: ctx.now + REOPEN_POLL,
                });
            }
            Err(ReopenRefused::TooSoon) => {
                warn!(
                    "conn {}: session lost again within a second of its re-initialisation: 404 relayed",
                    self.id
                );
                ctx.sessions.borrow_mut().forget(&self.ex.session_id);
                self.relay_original(ctx);
            }
            Err(ReopenRefused::Unknown) => self.relay_original(ctx),
        }
    }

    /// `Phase::AwaitReopen`: look at the table again.
    pub(super) fn await_reopen(&mut self, ctx: &Ctx) -> bool {
        let Phase::AwaitReopen { until, next_check } = &mut self.phase else {
            return false;
        };
        let until = *until;
        *next_check = ctx.now + REOPEN_POLL;
        let state = ctx
            .sessions
            .borrow()
            .get(&self.ex.session_id)
            .map(|s| (s.is_reopening(), self.mapped_since_sent(s.upstream_id())));
        match state {
            Some((_, true)) => self.retry(ctx),
            Some((true, false)) if ctx.now < until => return false,
            // Forgotten (the reopen failed, or the client deleted it), or
            // waited long enough.
            _ => self.relay_original(ctx),
        }
        true
    }

    fn initialize_answered(&mut self, ctx: &Ctx) {
        let Some(r) = self.ex.reopen.as_deref_mut() else { return };
        let version = match r.scan.as_mut() {
            Some(scan) => scan.finish().clone(),
            None => Scan::Missing(Why::Ended { events: 0, not_json: 0 }),
        };
        let why = match (&r.new_id, version) {
            _ if r.status != 200 => Some("initialize not answered 200"),
            (None, _) => Some("no session id in the answer to initialize"),
            (Some(_), Scan::Version(v)) if *v == *r.version => None,
            (Some(_), Scan::Version(_)) => Some("a different protocol version"),
            (Some(_), _) => Some("no protocol version in the answer to initialize"),
        };
        if let Some(why) = why {
            self.fail_reopen(ctx, why);
            return;
        }
        let initialized =
            ctx.sessions.borrow().get(&self.ex.session_id).is_some_and(|s| s.initialized_sent());
        if initialized {
            self.replay_initialized(ctx);
        } else {
            self.finish_reopen(ctx);
        }
    }

    /// The recorded end-to-end fields of the session's `initialize`, without
    /// those that name a session or a version.
    fn recorded_fields(&self, ctx: &Ctx) -> Option<(HeaderList, Vec<u8>, Box<str>)> {
        let table = ctx.sessions.borrow();
        let s = table.get(&self.ex.session_id)?;
        let mut headers = HeaderList::new();
        for (name, value) in s.headers() {
            if !matches!(name, b"mcp-session-id" | b"mcp-protocol-version" | b"last-event-id") {
                let _ = headers.set(name, value);
            }
        }
        Some((headers, s.initialize_body().to_vec(), s.protocol_version().into()))
    }

    /// Writes a whole request of the proxy's own (with the current identity)
    /// into the reopen's request buffer and goes to Connect.
    fn send_replay(&mut self, ctx: &Ctx, headers: &mut HeaderList, body: &[u8], step: Step) {
        let (who, route) = (ctx.credentials(), ctx.route());
        let req = editor::Outgoing { method: b"POST", target: &self.ex.req.target, framed: true };
        let Some(r) = self.ex.reopen.as_deref_mut() else { return };
        let planned = editor::plan_request(&req, headers, body, &who, &route, &mut r.request);
        let Ok(plan) = planned else {
            self.fail_reopen(ctx, "recorded request refused by the scanner");
            return;
        };
        plan.parts(body).for_each(|p| r.request.extend_from_slice(p));
        r.step = step;
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
    }

    fn replay_initialize(&mut self, ctx: &Ctx) {
        let Some((mut headers, body, version)) = self.recorded_fields(ctx) else {
            self.fail_reopen(ctx, "session forgotten");
            return;
        };
        let init_id = rpc::parse(&body).ok().and_then(|b| b.single().map(|m| m.id().json().to_vec()));
        match (init_id, self.ex.reopen.as_deref_mut()) {
            (Some(id), Some(r)) if !version.is_empty() => {
                r.init_id = id;
                r.version = version;
            }
            _ => {
                self.fail_reopen(ctx, "the recorded initialize or its protocol version is unknown");
                return;
            }
        }
        self.send_replay(ctx, &mut headers, &body, Step::Initialize);
    }

    fn replay_initialized(&mut self, ctx: &Ctx) {
        let Some((mut headers, _, version)) = self.recorded_fields(ctx) else {
            self.fail_reopen(ctx, "session forgotten");
            return;
        };
        let new_id = self.ex.reopen.as_deref().and_then(|r| r.new_id.clone()).unwrap_or_default();
        if headers.set_name(name::MCP_SESSION_ID, &new_id).is_err()
            || headers.set_name(name::MCP_PROTOCOL_VERSION, version.as_bytes()).is_err()
        {
            self.fail_reopen(ctx, "new session id not usable in a header");
            return;
        }
        self.send_replay(ctx, &mut headers, INITIALIZED, Step::Initialized);
    }

    /// The replay succeeded: map the session to its new upstream id and
    /// send the parked request again.
    fn finish_reopen(&mut self, ctx: &Ctx) {
        let new_id = self.ex.reopen.as_deref().and_then(|r| r.new_id.clone()).unwrap_or_default();
        let done = ctx.sessions.borrow_mut().finish_reopen(&self.ex.session_id, Ok(&new_id), ctx.now);
        match done {
            Ok(()) => {
                info!("conn {}: MCP session re-initialised on the upstream", self.id);
                self.retry(ctx);
            }
            Err(why) => {
                warn!("conn {}: session re-initialisation refused: {why:?}: 404 relayed", self.id);
                self.relay_original(ctx);
            }
        }
    }

    /// Any failure of the replay: the session is forgotten and the client
    /// gets the upstream's 404, as if the proxy had not tried.
    pub(super) fn fail_reopen(&mut self, ctx: &Ctx, why: &str) {
        warn!("conn {}: session re-initialisation failed ({why}): 404 relayed", self.id);
        let leading = self.ex.reopen.as_deref().is_some_and(Reopen::replaying);
        let mut table = ctx.sessions.borrow_mut();
        if leading {
            let _ = table.finish_reopen(&self.ex.session_id, Err(ReplayFailed), ctx.now);
        }
        table.forget(&self.ex.session_id);
        drop(table);
        self.relay_original(ctx);
    }

    /// Relays the held 404 as if it had just arrived.
    fn relay_original(&mut self, ctx: &Ctx) {
        let original = match self.ex.reopen.as_deref_mut() {
            Some(r) => {
                r.step = Step::Done;
                std::mem::take(&mut r.original)
            }
            None => Vec::new(),
        };
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
    fn retry(&mut self, ctx: &Ctx) {
        let upstream_id = ctx.sessions.borrow().get(&self.ex.session_id).map(|s| s.upstream_id().to_vec());
        let Some(upstream_id) = upstream_id else {
            self.relay_original(ctx);
            return;
        };
        let ex = &mut self.ex;
        let _ = ex.req.headers.set_name(name::MCP_SESSION_ID, &upstream_id);
        if ex.req.method.as_slice() == b"GET" {
            ex.req.headers.remove_name(name::LAST_EVENT_ID);
        }
        if self.plan_upstream_request(ctx).is_err() {
            // Cannot happen: the same body was planned before.
            self.relay_original(ctx);
            return;
        }
        if let Some(r) = self.ex.reopen.as_deref_mut() {
            r.step = Step::Retry;
        }
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
    }
}
