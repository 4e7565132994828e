//! The MCP sessions the proxy saw created, kept so that a session the
//! upstream lost (a restart: 404 on its id) can be re-initialised on the
//! client's behalf, and the mapping between the id the client holds and the
//! upstream's new id after that. Pure data: no I/O, never reads the clock
//! (callers pass `now`), never sends or decides what to send. It stores what
//! the caller gives it: the caller filters credentials and hop-by-hop fields
//! out of the headers before recording them.
//!
//! MCP streamable HTTP, Session Management: a server that ended a session
//! answers its id with 404, and the client must then start a new session
//! with a new `initialize`. The proxy does that for the client and keeps the
//! client's id: after a reopen, requests carry the new upstream id and
//! responses the client's. Until a session's first reopen nothing maps.

use std::time::Instant;

use crate::limits::{
    MAX_RECORDED_INITIALIZE, MAX_SESSIONS, MAX_SESSION_ID_LEN, REOPEN_INTERVAL, REOPEN_WAIT,
    SESSION_IDLE_TIMEOUT,
};

/// One recorded session, keyed by the id the client holds.
#[derive(Clone, Debug)]
pub struct Session {
    client_id: Box<[u8]>,
    /// The upstream's id after a reopen; `None` while it is the client's.
    upstream_id: Option<Box<[u8]>>,
    initialize: Box<[u8]>,
    headers: Box<[(Box<[u8]>, Box<[u8]>)]>,
    protocol_version: Box<str>,
    initialized_sent: bool,
    last_used: Instant,
    reopening: bool,
    last_reopen: Option<Instant>,
}

impl Session {
    /// The id the client holds (and always sees).
    pub fn client_id(&self) -> &[u8] {
        &self.client_id
    }

    /// The id the upstream knows the session by now: the client's until a
    /// first reopen.
    pub fn upstream_id(&self) -> &[u8] {
        self.upstream_id.as_deref().unwrap_or(&self.client_id)
    }

    /// The client's `initialize` body as it was forwarded.
    pub fn initialize_body(&self) -> &[u8] {
        &self.initialize
    }

    /// The recorded end-to-end request header fields (name, value) of the
    /// `initialize`, in the order given.
    pub fn headers(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.headers.iter().map(|(n, v)| (&**n, &**v))
    }

    /// The protocol version the server chose in its `initialize` answer; a
    /// replay must get the same one.
    pub fn protocol_version(&self) -> &str {
        &self.protocol_version
    }

    /// Whether the client sent `notifications/initialized` on this session,
    /// so that a replay sends it too.
    pub fn initialized_sent(&self) -> bool {
        self.initialized_sent
    }

    pub fn last_used(&self) -> Instant {
        self.last_used
    }

    /// Whether a reopen is in flight.
    pub fn is_reopening(&self) -> bool {
        self.reopening
    }
}

/// Why a session is not recorded (it is relayed as usual, only not
/// re-initialised after an upstream restart).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotTracked {
    /// An empty id (MCP: a session id holds at least one visible ASCII
    /// character).
    EmptyId,
    /// An id longer than `MAX_SESSION_ID_LEN`.
    IdTooLong,
    /// An `initialize` body larger than `MAX_RECORDED_INITIALIZE`.
    InitializeTooLarge,
}

/// Why a reopen may not start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReopenRefused {
    /// The id is not recorded (never, forgotten, evicted or expired).
    Unknown,
    /// Another request's reopen of this session is in flight: wait for it.
    InFlight,
    /// The last reopen of this session started less than
    /// `REOPEN_INTERVAL` ago.
    TooSoon,
}

/// The replay of `initialize` (and `notifications/initialized`) failed: no
/// 200, not exactly one new id, another protocol version, a second 404.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayFailed;

/// Why a finished reopen did not map the session (it is then forgotten,
/// unless `Unknown` or `NotInFlight`, which change nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReopenFailed {
    /// The id is not recorded (forgotten or evicted while the reopen ran).
    Unknown,
    /// No reopen of this session was in flight.
    NotInFlight,
    /// The caller's replay failed.
    Replay,
    /// The new upstream id is already a client or upstream id in the table:
    /// mapping it would show one client another's session.
    IdInUse,
    /// The new upstream id is empty or longer than `MAX_SESSION_ID_LEN`.
    BadId,
}

/// At most `MAX_SESSIONS` sessions; a linear scan over so few beats a map.
/// An empty table (stateless traffic, or a server that gives no session id)
/// costs nothing per request.
#[derive(Debug, Default)]
pub struct SessionTable {
    sessions: Vec<Session>,
    /// Sessions with a mapped upstream id: while 0, no id is rewritten and
    /// [`SessionTable::client_id_for`] needs no scan.
    reopened: usize,
}

impl SessionTable {
    pub fn new() -> Self {
        SessionTable::default()
    }

    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// Records the session `client_id` the server created in answer to the
    /// forwarded `initialize` (`body`, `headers` without credentials and
    /// hop-by-hop fields), whose answer chose `protocol_version`. A session
    /// already recorded under that id is replaced; a reopened session whose
    /// upstream id the server now gives to a new session is stale and is
    /// forgotten. When full, the least recently used session is forgotten.
    /// It must only be called for a 200 to an `initialize` sent without a
    /// session id that carried exactly one `Mcp-Session-Id`.
    pub fn record<'h>(
        &mut self,
        client_id: &[u8],
        body: &[u8],
        headers: impl IntoIterator<Item = (&'h [u8], &'h [u8])>,
        protocol_version: &str,
        now: Instant,
    ) -> Result<(), NotTracked> {
        check_id(client_id)?;
        if body.len() > MAX_RECORDED_INITIALIZE {
            return Err(NotTracked::InitializeTooLarge);
        }
        while let Some(i) =
            self.sessions.iter().position(|s| &*s.client_id == client_id || s.upstream_id() == client_id)
        {
            self.remove(i);
        }
        if self.sessions.len() >= MAX_SESSIONS {
            let lru = self.sessions.iter().enumerate().min_by_key(|(_, s)| s.last_used).map(|(i, _)| i);
            if let Some(i) = lru {
                self.remove(i);
            }
        }
        self.sessions.push(Session {
            client_id: client_id.into(),
            upstream_id: None,
            initialize: body.into(),
            headers: headers.into_iter().map(|(n, v)| (n.into(), v.into())).collect(),
            protocol_version: protocol_version.into(),
            initialized_sent: false,
            last_used: now,
            reopening: false,
            last_reopen: None,
        });
        Ok(())
    }

    /// Sets the `protocolVersion` the answer to the session's `initialize`
    /// chose (read from the answer's body after the session was recorded
    /// from its head). False when it is not recorded.
    pub fn set_protocol_version(&mut self, client_id: &[u8], version: &str) -> bool {
        self.get_mut(client_id).map(|s| s.protocol_version = version.into()).is_some()
    }

    /// The session the client knows as `client_id`.
    pub fn get(&self, client_id: &[u8]) -> Option<&Session> {
        self.sessions.iter().find(|s| &*s.client_id == client_id)
    }

    /// Marks the session used at `now` (a request carried its id); false
    /// when it is not recorded.
    pub fn touch(&mut self, client_id: &[u8], now: Instant) -> bool {
        self.get_mut(client_id).map(|s| s.last_used = now).is_some()
    }

    /// The client sent `notifications/initialized` on the session.
    pub fn note_initialized(&mut self, client_id: &[u8], now: Instant) -> bool {
        self.get_mut(client_id)
            .map(|s| {
                s.initialized_sent = true;
                s.last_used = now;
            })
            .is_some()
    }

    /// Forgets the session: the client's DELETE passed (whatever the
    /// upstream answered), so the session really ended and must never be
    /// re-initialised. False when it was not recorded.
    pub fn forget(&mut self, client_id: &[u8]) -> bool {
        match self.sessions.iter().position(|s| &*s.client_id == client_id) {
            Some(i) => {
                self.remove(i);
                true
            }
            None => false,
        }
    }

    /// Forgets the sessions idle for `SESSION_IDLE_TIMEOUT` or more at
    /// `now`; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let before = self.sessions.len();
        self.sessions.retain(|s| now.saturating_duration_since(s.last_used) < SESSION_IDLE_TIMEOUT);
        self.recount();
        before - self.sessions.len()
    }

    /// The id to send upstream in place of `client_id`: `Some` only for a
    /// reopened session. `None` means the request goes out unchanged.
    pub fn upstream_id_for(&self, client_id: &[u8]) -> Option<&[u8]> {
        if self.reopened == 0 {
            return None;
        }
        self.get(client_id).and_then(|s| s.upstream_id.as_deref())
    }

    /// The id to show the client in place of the upstream's `upstream_id`:
    /// `Some` only for the current upstream id of a reopened session. `None`
    /// means the response goes out unchanged.
    pub fn client_id_for(&self, upstream_id: &[u8]) -> Option<&[u8]> {
        if self.reopened == 0 {
            return None;
        }
        self.sessions.iter().find(|s| s.upstream_id.as_deref() == Some(upstream_id)).map(|s| &*s.client_id)
    }

    /// Starts a reopen of the session after its upstream answered 404: at
    /// most one in flight per session (later requests wait for it) and at
    /// most one started per `REOPEN_INTERVAL` (a server that answers 404 to
    /// everything must not cause a storm). Each success must be followed by
    /// one [`SessionTable::finish_reopen`].
    pub fn try_begin_reopen(&mut self, client_id: &[u8], now: Instant) -> Result<(), ReopenRefused> {
        let s = self.get_mut(client_id).ok_or(ReopenRefused::Unknown)?;
        let since = s.last_reopen.map(|t| now.saturating_duration_since(t));
        // A reopen whose leader went away (its client closed mid-replay)
        // never finishes: after REOPEN_WAIT the next 404 takes it over.
        if s.reopening && since.is_some_and(|d| d < REOPEN_WAIT) {
            return Err(ReopenRefused::InFlight);
        }
        if !s.reopening && since.is_some_and(|d| d < REOPEN_INTERVAL) {
            return Err(ReopenRefused::TooSoon);
        }
        s.reopening = true;
        s.last_reopen = Some(now);
        s.last_used = now;
        Ok(())
    }

    /// Ends the reopen begun by [`SessionTable::try_begin_reopen`]. With the
    /// new upstream id (the caller checked the 200, the one id and the same
    /// protocol version), maps the session to it from now on. On any
    /// failure the session is forgotten: the client gets the original 404
    /// and starts a new session itself, as MCP Session Management requires.
    pub fn finish_reopen(
        &mut self,
        client_id: &[u8],
        outcome: Result<&[u8], ReplayFailed>,
        now: Instant,
    ) -> Result<(), ReopenFailed> {
        let i = self.sessions.iter().position(|s| &*s.client_id == client_id).ok_or(ReopenFailed::Unknown)?;
        if !self.sessions.get(i).is_some_and(|s| s.reopening) {
            return Err(ReopenFailed::NotInFlight);
        }
        let failure = match outcome {
            Err(ReplayFailed) => Some(ReopenFailed::Replay),
            Ok(new) if check_id(new).is_err() => Some(ReopenFailed::BadId),
            Ok(new) if self.sessions.iter().any(|s| &*s.client_id == new || s.upstream_id() == new) => {
                Some(ReopenFailed::IdInUse)
            }
            Ok(_) => None,
        };
        if let Some(failure) = failure {
            self.remove(i);
            return Err(failure);
        }
        if let (Some(s), Ok(new)) = (self.sessions.get_mut(i), outcome) {
            if s.upstream_id.is_none() {
                self.reopened += 1;
            }
            s.upstream_id = Some(new.into());
            s.reopening = false;
            s.last_used = now;
        }
        Ok(())
    }

    fn get_mut(&mut self, client_id: &[u8]) -> Option<&mut Session> {
        self.sessions.iter_mut().find(|s| &*s.client_id == client_id)
    }

    fn remove(&mut self, i: usize) {
        if i < self.sessions.len() && self.sessions.swap_remove(i).upstream_id.is_some() {
            self.reopened -= 1;
        }
    }

    fn recount(&mut self) {
        self.reopened = self.sessions.iter().filter(|s| s.upstream_id.is_some()).count();
    }
}

fn check_id(id: &[u8]) -> Result<(), NotTracked> {
    if id.is_empty() {
        Err(NotTracked::EmptyId)
    } else if id.len() > MAX_SESSION_ID_LEN {
        Err(NotTracked::IdTooLong)
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const INIT: &[u8] = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{}}"#;
    const HEADERS: &[(&[u8], &[u8])] =
        &[(b"accept", b"application/json, text/event-stream"), (b"user-agent", b"node")];

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    fn table_with(ids: &[&[u8]], t0: Instant) -> SessionTable {
        let mut t = SessionTable::new();
        for (i, id) in ids.iter().enumerate() {
            t.record(id, INIT, HEADERS.iter().copied(), "2025-06-18", t0 + secs(i as u64)).unwrap();
        }
        t
    }

    #[test]
    fn record_keeps_what_a_replay_needs() {
        let t0 = Instant::now();
        let mut t = table_with(&[b"c1"], t0);
        let s = t.get(b"c1").unwrap();
        assert_eq!(s.client_id(), b"c1");
        assert_eq!(s.upstream_id(), b"c1");
        assert_eq!(s.initialize_body(), INIT);
        assert_eq!(s.headers().collect::<Vec<_>>(), HEADERS);
        assert_eq!(s.protocol_version(), "2025-06-18");
        assert!(!s.initialized_sent());
        assert!(t.note_initialized(b"c1", t0 + secs(5)));
        assert!(t.get(b"c1").unwrap().initialized_sent());
        assert_eq!(t.get(b"c1").unwrap().last_used(), t0 + secs(5));
        assert!(!t.note_initialized(b"c2", t0));
        assert!(!t.touch(b"c2", t0));
    }

    #[test]
    fn what_is_not_tracked() {
        let t0 = Instant::now();
        let long_id = vec![b'a'; MAX_SESSION_ID_LEN + 1];
        let max_id = vec![b'a'; MAX_SESSION_ID_LEN];
        let big = vec![b' '; MAX_RECORDED_INITIALIZE + 1];
        let max = vec![b' '; MAX_RECORDED_INITIALIZE];
        let cases: &[(&[u8], &[u8], Result<(), NotTracked>)] = &[
            (b"", INIT, Err(NotTracked::EmptyId)),
            (&long_id, INIT, Err(NotTracked::IdTooLong)),
            (&max_id, INIT, Ok(())),
            (b"c", &big, Err(NotTracked::InitializeTooLarge)),
            (b"c", &max, Ok(())),
        ];
        for (id, body, want) in cases {
            let mut t = SessionTable::new();
            assert_eq!(t.record(id, body, [], "v", t0), *want, "{} {}", id.len(), body.len());
            assert_eq!(t.len(), usize::from(want.is_ok()));
        }
    }

    #[test]
    fn least_recently_used_is_evicted() {
        let t0 = Instant::now();
        let ids: Vec<Vec<u8>> = (0..MAX_SESSIONS).map(|i| format!("s{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = ids.iter().map(|v| &v[..]).collect();
        let mut t = table_with(&refs, t0);
        assert_eq!(t.len(), MAX_SESSIONS);
        // s0 is the oldest, but used again: s1 is now the least recent.
        assert!(t.touch(b"s0", t0 + secs(1000)));
        t.record(b"new", INIT, [], "v", t0 + secs(1001)).unwrap();
        assert_eq!(t.len(), MAX_SESSIONS);
        assert!(t.get(b"s1").is_none());
        for id in [&b"s0"[..], b"s2", b"new"] {
            assert!(t.get(id).is_some());
        }
        // Recording an id again replaces it, evicting nothing.
        t.record(b"s2", b"{}", [], "v2", t0 + secs(1002)).unwrap();
        assert_eq!(t.len(), MAX_SESSIONS);
        assert_eq!(t.get(b"s2").unwrap().protocol_version(), "v2");
    }

    #[test]
    fn idle_sessions_expire_after_a_day() {
        let t0 = Instant::now();
        let mut t = table_with(&[b"a", b"b"], t0);
        assert_eq!(t.expire(t0 + SESSION_IDLE_TIMEOUT - secs(1)), 0);
        assert_eq!(t.expire(t0 + SESSION_IDLE_TIMEOUT), 1);
        assert!(t.get(b"a").is_none());
        assert!(t.get(b"b").is_some());
        // An instant before the last use (never happens; no panic).
        assert_eq!(t.expire(t0), 0);
        assert!(t.touch(b"b", t0 + SESSION_IDLE_TIMEOUT));
        assert_eq!(t.expire(t0 + SESSION_IDLE_TIMEOUT * 2 - secs(1)), 0);
    }

    #[test]
    fn forget_ends_a_session_for_good() {
        let t0 = Instant::now();
        let mut t = table_with(&[b"a"], t0);
        assert!(t.forget(b"a"));
        assert!(!t.forget(b"a"));
        assert_eq!(t.try_begin_reopen(b"a", t0), Err(ReopenRefused::Unknown));
    }

    #[test]
    fn nothing_maps_until_a_reopen() {
        let t0 = Instant::now();
        let t = table_with(&[b"a", b"b"], t0);
        for id in [&b"a"[..], b"b", b"x"] {
            assert_eq!(t.upstream_id_for(id), None);
            assert_eq!(t.client_id_for(id), None);
        }
    }

    #[test]
    fn a_reopen_maps_both_directions() {
        let t0 = Instant::now();
        let mut t = table_with(&[b"c", b"other"], t0);
        t.try_begin_reopen(b"c", t0 + secs(10)).unwrap();
        assert!(t.get(b"c").unwrap().is_reopening());
        assert_eq!(t.upstream_id_for(b"c"), None, "nothing maps while in flight");
        t.finish_reopen(b"c", Ok(b"u1"), t0 + secs(10)).unwrap();
        assert_eq!(t.upstream_id_for(b"c"), Some(&b"u1"[..]));
        assert_eq!(t.client_id_for(b"u1"), Some(&b"c"[..]));
        assert_eq!(t.client_id_for(b"c"), None);
        assert_eq!(t.upstream_id_for(b"other"), None);
        assert_eq!(t.get(b"c").unwrap().upstream_id(), b"u1");
        // A second reopen replaces the mapping.
        t.try_begin_reopen(b"c", t0 + secs(12)).unwrap();
        t.finish_reopen(b"c", Ok(b"u2"), t0 + secs(12)).unwrap();
        assert_eq!(t.upstream_id_for(b"c"), Some(&b"u2"[..]));
        assert_eq!(t.client_id_for(b"u1"), None);
        assert_eq!(t.client_id_for(b"u2"), Some(&b"c"[..]));
        // Forgetting ends the mapping.
        assert!(t.forget(b"c"));
        assert_eq!(t.client_id_for(b"u2"), None);
        assert_eq!(t.reopened, 0);
    }

    #[test]
    fn the_reopen_gate() {
        let t0 = Instant::now();
        let mut t = table_with(&[b"c"], t0);
        let ms = Duration::from_millis;
        let steps: &[(Duration, Result<(), ReopenRefused>)] = &[
            (ms(0), Ok(())),
            (ms(10), Err(ReopenRefused::InFlight)),
            (ms(2000), Err(ReopenRefused::InFlight)),
        ];
        for (at, want) in steps {
            assert_eq!(t.try_begin_reopen(b"c", t0 + *at), *want, "{at:?}");
        }
        t.finish_reopen(b"c", Ok(b"u"), t0 + ms(20)).unwrap();
        // One per second, counted from the start of the last one.
        assert_eq!(t.try_begin_reopen(b"c", t0 + ms(999)), Err(ReopenRefused::TooSoon));
        assert_eq!(t.try_begin_reopen(b"c", t0 + ms(1000)), Ok(()));
        assert_eq!(t.try_begin_reopen(b"x", t0), Err(ReopenRefused::Unknown));
        // A leader that never finishes (its client went away) is taken over
        // once REOPEN_WAIT has passed since it began.
        let begun = t0 + ms(1000);
        assert_eq!(t.try_begin_reopen(b"c", begun + REOPEN_WAIT - ms(1)), Err(ReopenRefused::InFlight));
        assert_eq!(t.try_begin_reopen(b"c", begun + REOPEN_WAIT), Ok(()));
        assert!(t.get(b"c").is_some_and(Session::is_reopening));
    }

    #[test]
    fn a_failed_reopen_forgets_the_session() {
        let t0 = Instant::now();
        let long_id = vec![b'u'; MAX_SESSION_ID_LEN + 1];
        let cases: &[(Result<&[u8], ReplayFailed>, ReopenFailed)] = &[
            (Err(ReplayFailed), ReopenFailed::Replay),
            (Ok(b"c"), ReopenFailed::IdInUse),
            (Ok(b"other"), ReopenFailed::IdInUse),
            (Ok(b"u-other"), ReopenFailed::IdInUse),
            (Ok(b""), ReopenFailed::BadId),
            (Ok(&long_id), ReopenFailed::BadId),
        ];
        for (outcome, want) in cases {
            let mut t = table_with(&[b"c", b"other"], t0);
            t.try_begin_reopen(b"other", t0).unwrap();
            t.finish_reopen(b"other", Ok(b"u-other"), t0).unwrap();
            t.try_begin_reopen(b"c", t0).unwrap();
            assert_eq!(t.finish_reopen(b"c", *outcome, t0), Err(*want), "{outcome:?}");
            assert!(t.get(b"c").is_none(), "{outcome:?}");
            assert_eq!(t.client_id_for(b"u-other"), Some(&b"other"[..]), "the other session is kept");
        }
        // Nothing in flight, or unknown: no change.
        let mut t = table_with(&[b"c"], t0);
        assert_eq!(t.finish_reopen(b"c", Ok(b"u"), t0), Err(ReopenFailed::NotInFlight));
        assert!(t.get(b"c").is_some());
        assert_eq!(t.finish_reopen(b"x", Ok(b"u"), t0), Err(ReopenFailed::Unknown));
    }

    #[test]
    fn a_new_session_with_a_mapped_upstream_id_replaces_the_stale_mapping() {
        let t0 = Instant::now();
        let mut t = table_with(&[b"c"], t0);
        t.try_begin_reopen(b"c", t0).unwrap();
        t.finish_reopen(b"c", Ok(b"u"), t0).unwrap();
        t.record(b"u", INIT, [], "v", t0 + secs(1)).unwrap();
        assert!(t.get(b"c").is_none());
        assert_eq!(t.client_id_for(b"u"), None);
        assert_eq!(t.upstream_id_for(b"u"), None);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn eviction_while_reopening_is_reported() {
        let t0 = Instant::now();
        let ids: Vec<Vec<u8>> = (0..MAX_SESSIONS).map(|i| format!("s{i}").into_bytes()).collect();
        let refs: Vec<&[u8]> = ids.iter().map(|v| &v[..]).collect();
        let mut t = table_with(&refs, t0);
        t.try_begin_reopen(b"s0", t0).unwrap();
        // s0's last use is t0 (the reopen touched it), s1's t0 + 1 s.
        t.record(b"new", INIT, [], "v", t0 + secs(100)).unwrap();
        assert_eq!(t.finish_reopen(b"s0", Ok(b"u"), t0 + secs(100)), Err(ReopenFailed::Unknown));
        assert_eq!(t.client_id_for(b"u"), None);
    }
}
