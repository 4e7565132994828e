//! Applying a reopen's actions to the connection: the one place that
//! borrows the session table, sends the replay's requests and runs
//! `Phase::Collect` (see the parent module for the decision).

use super::*;
use crate::conn::exchange::Exchange;
use crate::conn::filter::credential;
use crate::conn::{editor, Conn, Ctx, Phase};
use crate::http::body::Decoder;
use crate::http::chunked::Piece;
use crate::http::framing::Framing;
use crate::http::head::ResponseHead;
use crate::http::headers::{name, HeaderList};
use crate::limits::{MAX_REOPEN_ANSWER, REOPEN_POLL, REOPEN_WAIT};
use crate::mcp::initialize::Format;
use log::{debug, info, warn};
use std::borrow::Cow;

impl Conn {
    /// A final response head has arrived (still in `upstream_buf`): true
    /// when the reopen takes it over instead of relaying it.
    pub(in crate::conn) fn reopen_takes(&mut self, resp: &ResponseHead, ctx: &Ctx) -> bool {
        let nonce = credential::note_nonce(resp, ctx);
        let stepping_up = cfg!(feature = "tls") && resp.status == 403 && ctx.step_up.is_some();
        if self.ex.recovery.reopen.is_none() && resp.status != 404 && resp.status != 401 && !stepping_up {
            // Nearly every response: no reopen under way, no session lost.
            return false;
        }
        let head = Head {
            status: resp.status,
            session_id: resp.headers.get_name(name::MCP_SESSION_ID),
            format: resp.headers.get_name(name::CONTENT_TYPE).and_then(Format::from_content_type),
            keep_alive: resp.keep_alive,
        };
        let lost = self.ex.recovery.reopen.is_none()
            && resp.status == 404
            && self.ex.may_reopen(resp)
            && self.ex.reopen_seen(ctx).known;
        let refused = self.ex.recovery.reopen.is_none()
            && resp.status == 401
            && self.ex.may_replay(resp)
            && (ctx.renewable || self.ex.recovery.token_generation != ctx.token_generation);
        let step_up = match stepping_up && self.ex.recovery.reopen.is_none() && self.ex.may_replay(resp) {
            true => credential::insufficient_scope(resp),
            false => None,
        };
        let decision = match self.ex.recovery.reopen.as_deref_mut() {
            Some(r) => r.on_head(&head),
            None if step_up.is_some() => {
                info!(
                    "conn {}: the upstream wants more scope (403): the request waits for a token with it",
                    self.id
                );
                if let (Some(cell), Some(scope)) = (ctx.step_up, step_up) {
                    *cell.borrow_mut() = Some(scope);
                }
                let sent_under = self.ex.recovery.token_generation;
                self.ex.recovery.reopen = Some(Box::new(Reopen::for_token(sent_under, resp.keep_alive)));
                OnHead::Collect
            }
            None if refused => {
                // A DPoP server that wants its nonce (RFC 9449 §9) needs no
                // new token: the loop puts the nonce in force and the
                // request goes again with a proof that carries it.
                if nonce && credential::wants_dpop_nonce(resp) {
                    info!(
                        "conn {}: the upstream asked for its DPoP nonce (401): sent again with it",
                        self.id
                    );
                } else {
                    ctx.unauthorized.set(true);
                    info!(
                        "conn {}: the upstream refused the token (401): the request waits for a new one",
                        self.id
                    );
                }
                let sent_under = self.ex.recovery.token_generation;
                self.ex.recovery.reopen = Some(Box::new(Reopen::for_token(sent_under, resp.keep_alive)));
                OnHead::Collect
            }
            None if lost => {
                let sent_with = self.ex.req.headers.get_name(name::MCP_SESSION_ID).unwrap_or_default();
                self.ex.recovery.reopen = Some(Box::new(Reopen::new(sent_with, resp.keep_alive)));
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

    /// A request of the proxy's own failed (connect refused, timed out, a
    /// proxy-made answer instead of the upstream's): the client gets the
    /// upstream's 404 it was recovering from.
    pub(in crate::conn) fn own_request_failed(&mut self, ctx: &Ctx, why: Cow<'static, str>) {
        if let Some(a) = self.ex.recovery.reopen.as_deref_mut().map(|r| r.on_own_request_failed(why)) {
            self.apply(ctx, a);
        }
    }

    /// The token is past its expiry and a renewal is in flight: the
    /// request, not sent, waits for it as a 401's replay does (the upstream
    /// connection back in the pool meanwhile).
    pub(in crate::conn) fn await_renewal(&mut self, ctx: &Ctx) {
        info!("conn {}: the token has expired: the request waits for the renewal", self.id);
        self.upstream.hand_back(true);
        self.ex.recovery.reopen = Some(Box::new(Reopen::for_expired(ctx.token_generation)));
        self.apply(ctx, Action::AwaitToken);
    }

    /// `Phase::AwaitReopen`: look at the table again.
    pub(in crate::conn) fn await_reopen(&mut self, ctx: &Ctx) -> bool {
        let Phase::AwaitReopen { until, .. } = self.phase else {
            return false;
        };
        let seen = self.ex.reopen_seen(ctx);
        let deadline_passed = ctx.now >= until;
        let Some(action) = self.ex.recovery.reopen.as_deref_mut().map(|r| match r.token {
            Some(_) => r.on_token_check(ctx.token_generation, ctx.renewable, deadline_passed),
            None => r.on_check(seen, deadline_passed),
        }) else {
            return false;
        };
        let waiting = action == Action::KeepWaiting;
        self.apply(ctx, action);
        !waiting
    }

    // ---- Phase::Collect: an answer read whole instead of relayed ----

    pub(in crate::conn) fn start_collect(&mut self, resp: &ResponseHead) {
        let mut at = resp.len;
        if self.ex.recovery.reopen.as_deref().is_some_and(Reopen::streams_answer) {
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
    pub(in crate::conn) fn collect(&mut self, ctx: &Ctx) -> bool {
        if !self.upstream_buf.has_space() {
            self.upstream_buf.grow();
        }
        let (n, eof) = self.upstream.read(&mut self.upstream_buf, &self.out);
        if n > 0 {
            self.last_activity = ctx.now;
        }
        let Phase::Collect { input, at } = &mut self.phase else {
            return false;
        };
        let streams = self.ex.recovery.reopen.as_deref().is_some_and(Reopen::streams_answer);
        let reopen = &mut self.ex.recovery.reopen;
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
    pub(in crate::conn) fn collect_failed(&mut self, ctx: &Ctx) {
        if let Some(a) = self.ex.recovery.reopen.as_deref_mut().map(Reopen::on_collect_failed) {
            self.apply(ctx, a);
        }
    }

    fn collected(&mut self, ctx: &Ctx, at: usize) {
        // The socket goes to the pool when the upstream keeps it and
        // nothing follows the answer.
        let exact = self.upstream_buf.len() == at;
        let keep = self.ex.recovery.reopen.as_deref().is_some_and(|r| r.keep_alive) && exact;
        self.upstream.hand_back(keep);
        let seen = self.ex.reopen_seen(ctx);
        let held = self.upstream_buf.data().get(..at).unwrap_or_default();
        let action = self.ex.recovery.reopen.as_deref_mut().map(|r| r.on_collected(held, seen));
        self.upstream_buf.clear();
        if let Some(a) = action {
            self.apply(ctx, a);
        }
    }

    // ---- the one place that applies decisions and reads the table ----

    /// Applies `action`, and the actions its table changes lead to.
    fn apply(&mut self, ctx: &Ctx, action: Action) {
        let mut next = Some(action);
        while let Some(action) = next.take() {
            let id = self.ex.session.id.clone();
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
                    self.ex.recovery.reopen.as_deref_mut().map(|r| r.on_lead(outcome))
                }
                Action::SendInitialize | Action::SendInitialized => {
                    let written = if matches!(action, Action::SendInitialize) {
                        self.ex.write_initialize(ctx)
                    } else {
                        self.ex.write_initialized(ctx)
                    };
                    match written {
                        Ok(()) => {
                            self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
                            None
                        }
                        Err(failed) => Some(failed),
                    }
                }
                Action::Finish => {
                    let new_id =
                        self.ex.recovery.reopen.as_deref().and_then(|r| r.new_id.clone()).unwrap_or_default();
                    let outcome = ctx.sessions.borrow_mut().finish_reopen(&id, Ok(&new_id), ctx.now);
                    if outcome.is_ok() {
                        info!("conn {}: MCP session re-initialised on the upstream", self.id);
                        if ctx.observing() {
                            self.ex.audit_reinit(true);
                        }
                    }
                    self.ex.recovery.reopen.as_deref_mut().map(|r| r.on_finished(outcome))
                }
                Action::Retry => self.retry(ctx),
                Action::RetryToken => self.retry_token(ctx),
                Action::TokenExpired => {
                    warn!(
                        "conn {}: the token has expired and no new one came in time: the request is not sent",
                        self.id
                    );
                    self.ex.recovery.reopen = None;
                    self.answer_outage(ctx, crate::conn::answer::Answer::CredentialExpired);
                    None
                }
                Action::AwaitToken => {
                    self.set_phase(Phase::AwaitReopen {
                        until: ctx.now + ctx.config.connect_timeout,
                        next_check: ctx.now + REOPEN_POLL,
                    });
                    None
                }
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
                            self.ex.audit_reinit(false);
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

    /// Relays the held 404 as if it had just arrived.
    fn relay_original(&mut self, ctx: &Ctx) {
        let original = self.ex.recovery.reopen.as_deref_mut().map(Reopen::take_original).unwrap_or_default();
        self.upstream.spend();
        self.upstream_buf.clear();
        if !self.upstream_buf.push(&original) {
            // Cannot happen: the 404 was read into this buffer.
            self.close(crate::conn::CloseReason::UpstreamFailed);
            return;
        }
        self.set_phase(Phase::ReadResponseHead { since: ctx.now });
    }

    /// Sends the parked request again as it was, under the token in force
    /// now (a 401 replay).
    fn retry_token(&mut self, ctx: &Ctx) -> Option<Action> {
        debug!("conn {}: a new token: the request refused with 401 is sent again", self.id);
        if self.ex.plan_upstream(ctx).is_err() {
            // Cannot happen: the same body was planned before.
            return Some(Action::relay_original());
        }
        if let Some(r) = self.ex.recovery.reopen.as_deref_mut() {
            r.step = Step::Retry;
        }
        self.set_phase(Phase::Connect { attempt: 0, retry_at: None, since: ctx.now });
        None
    }

    /// Sends the parked request again, on the session's upstream id now and
    /// with the current identity (a GET stream without `Last-Event-ID`: the
    /// new session has no events to resume).
    fn retry(&mut self, ctx: &Ctx) -> Option<Action> {
        let upstream_id = ctx.sessions.borrow().get(&self.ex.session.id).map(|s| s.upstream_id().to_vec());
        let Some(upstream_id) = upstream_id else {
            return Some(Action::relay_original());
        };
        if self.ex.recovery.reopen.as_deref().is_some_and(|r| r.step == Step::Original) {
            debug!("conn {}: session already re-initialised: request sent again", self.id);
        }
        let ex = &mut self.ex;
        let _ = ex.req.headers.set_name(name::MCP_SESSION_ID, &upstream_id);
        if ex.req.method.as_slice() == b"GET" {
            ex.req.headers.remove_name(name::LAST_EVENT_ID);
        }
        if self.ex.plan_upstream(ctx).is_err() {
            // Cannot happen: the same body was planned before.
            return Some(Action::relay_original());
        }
        if let Some(r) = self.ex.recovery.reopen.as_deref_mut() {
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

impl Exchange {
    /// Writes the recorded `initialize` with the current identity (then the
    /// exchange goes to Connect to send it).
    fn write_initialize(&mut self, ctx: &Ctx) -> Result<(), Action> {
        let recorded = {
            let table = ctx.sessions.borrow();
            table.get(&self.session.id).map(|s| {
                (
                    recorded_fields(s.headers()),
                    s.initialize_body().to_vec(),
                    Box::<str>::from(s.protocol_version()),
                )
            })
        };
        let Some((mut headers, body, version)) = recorded else {
            return Err(Action::fail("session forgotten", true));
        };
        let r = self.recovery.reopen.as_deref_mut().ok_or_else(no_reopen)?;
        if let Err(why) = r.prepare_initialize(&body, &version) {
            return Err(Action::fail(why, true));
        }
        self.write_replay(ctx, &mut headers, &body, Step::Initialize)
    }

    /// Writes `notifications/initialized` on the new upstream id.
    fn write_initialized(&mut self, ctx: &Ctx) -> Result<(), Action> {
        let recorded = {
            let table = ctx.sessions.borrow();
            table
                .get(&self.session.id)
                .map(|s| (recorded_fields(s.headers()), Box::<str>::from(s.protocol_version())))
        };
        let Some((mut headers, version)) = recorded else {
            return Err(Action::fail("session forgotten", true));
        };
        let new_id = self.recovery.reopen.as_deref().and_then(|r| r.new_id.clone()).unwrap_or_default();
        if headers.set_name(name::MCP_SESSION_ID, &new_id).is_err()
            || headers.set_name(name::MCP_PROTOCOL_VERSION, version.as_bytes()).is_err()
        {
            return Err(Action::fail("new session id not usable in a header", true));
        }
        self.write_replay(ctx, &mut headers, INITIALIZED, Step::Initialized)
    }

    /// Writes a whole request of the proxy's own (with the current identity)
    /// into the reopen's request buffer.
    fn write_replay(
        &mut self,
        ctx: &Ctx,
        headers: &mut HeaderList,
        body: &[u8],
        step: Step,
    ) -> Result<(), Action> {
        let (who, route) = (ctx.credentials(), ctx.route());
        let req = editor::Outgoing { method: b"POST", target: &self.req.target, framed: true };
        let r = self.recovery.reopen.as_deref_mut().ok_or_else(no_reopen)?;
        r.request.clear();
        let mut plan = crate::mcp::stamp::Plan::default();
        if editor::plan_request(&req, headers, body, &who, &route, &mut r.request, &mut plan).is_err() {
            return Err(Action::fail("recorded request refused by the scanner", true));
        }
        plan.parts(body).for_each(|p| r.request.extend_from_slice(p));
        r.step = step;
        Ok(())
    }

    /// A 404 the proxy may recover from: a POST or GET in a session it
    /// recorded, with a body it can read whole. Not a loss: a 404 to
    /// DELETE, to `initialize` (it has no session id), or to an id never
    /// recorded or already forgotten.
    fn may_reopen(&self, resp: &ResponseHead) -> bool {
        self.session.known
            && matches!(self.req.method.as_slice(), b"POST" | b"GET")
            && matches!(resp.framing, Framing::Length(_) | Framing::Chunked)
    }

    /// A 401 the proxy may replay under a new token: a POST or GET (whose
    /// body is whole in memory) and an answer it can read whole.
    fn may_replay(&self, resp: &ResponseHead) -> bool {
        matches!(self.req.method.as_slice(), b"POST" | b"GET")
            && matches!(resp.framing, Framing::Length(_) | Framing::Chunked)
    }

    /// What the table says of this exchange's session now.
    fn reopen_seen(&self, ctx: &Ctx) -> Seen {
        let table = ctx.sessions.borrow();
        let Some(s) = table.get(&self.session.id) else { return Seen::default() };
        Seen {
            known: true,
            mapped_since_sent: self
                .recovery
                .reopen
                .as_deref()
                .is_some_and(|r| r.sent_with_other_than(s.upstream_id())),
            reopening: s.is_reopening(),
            initialized_sent: s.initialized_sent(),
        }
    }
}

/// What a request of the proxy's own gets when no re-initialisation is
/// under way (cannot happen: decisions are applied only under one).
fn no_reopen() -> Action {
    Action::fail("no re-initialisation under way", true)
}
