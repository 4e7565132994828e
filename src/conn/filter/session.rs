//! MCP session bookkeeping on the relay path (MCP Session Management): the
//! sessions seen created through this proxy are recorded, so that an
//! upstream restart under one of them gets an answer the session survives
//! (`reopen`); the `protocolVersion` their `initialize` got is read as the
//! answer is relayed; and a re-initialised session's ids are mapped.

use crate::conn::exchange::Exchange;
use crate::conn::Ctx;
use crate::http::head::ResponseHead;
use crate::http::headers::{name, HeaderList};
use crate::mcp::initialize::Format;
use crate::mcp::rpc;
use crate::mcp::session::SessionTable;
use crate::mcp::version_scan::{Scan, VersionScan, Why};
use log::{debug, warn};
use smallvec::SmallVec;

/// The exchange's MCP session, as its request named it.
#[derive(Default)]
pub(in crate::conn) struct SessionState {
    /// The client's `Mcp-Session-Id`, as sent (empty: none).
    pub(in crate::conn) id: SmallVec<[u8; 64]>,
    /// `id` names a session this proxy saw created.
    pub(in crate::conn) known: bool,
    /// The reading of a recorded `initialize`'s answer as it is relayed,
    /// kept until its `protocolVersion` is found (no copy of the answer).
    pub(in crate::conn) capture: Option<Box<VersionCapture>>,
}

impl SessionState {
    /// A new exchange names the session `id` (empty: none).
    pub(in crate::conn) fn begin(&mut self, id: &[u8]) {
        self.id = SmallVec::from_slice(id);
        self.known = false;
        self.capture = None;
    }
}

/// Reads the `protocolVersion` from the body of an answer to a recorded
/// `initialize` as it is relayed, whatever the body's size (agentchattr's
/// is about 6 KB): what it keeps is a few small fields, never the body
/// (`VersionScan`), and it is dropped once the field is found. It only
/// reads: the relay is neither delayed nor altered.
#[derive(Debug)]
pub struct VersionCapture {
    client_id: Box<[u8]>,
    scan: VersionScan,
}

/// Where a capture stands after some payload.
#[derive(Debug, PartialEq, Eq)]
pub enum Captured {
    /// Not yet: keep feeding.
    Reading,
    /// The version is recorded for the session: drop the capture.
    Recorded,
    /// Over without a version (the session is never replayed: a replay's
    /// answer could not be checked): drop it, and say why once.
    Failed(Why),
}

impl VersionCapture {
    /// A capture for the session `client_id` whose `initialize` had the id
    /// `request_id` (its JSON text), answered with `content_type`; `None`
    /// when the answer is neither JSON nor SSE.
    pub fn new(client_id: &[u8], request_id: &[u8], content_type: &[u8]) -> Option<VersionCapture> {
        let format = Format::from_content_type(content_type)?;
        Some(VersionCapture { client_id: client_id.into(), scan: VersionScan::new(format, request_id)? })
    }

    /// Reads payload bytes (no transfer framing) as they are relayed.
    pub fn feed(&mut self, data: &[u8], table: &mut SessionTable) -> Captured {
        self.scan.feed(data);
        self.settle(table)
    }

    /// The body is over.
    pub fn finish(&mut self, table: &mut SessionTable) -> Captured {
        self.scan.finish();
        self.settle(table)
    }

    fn settle(&self, table: &mut SessionTable) -> Captured {
        match self.scan.state() {
            Scan::Pending => Captured::Reading,
            Scan::Version(v) => {
                table.set_protocol_version(&self.client_id, v);
                Captured::Recorded
            }
            Scan::Missing(why) => Captured::Failed(*why),
        }
    }
}

/// Feeds relayed payload of a recorded `initialize`'s answer to its capture
/// (`None`: the body is over, whole or cut) and drops the capture once it is
/// done; when it found no version, says why, once, at warn.
#[inline]
pub fn feed_capture(
    slot: &mut Option<Box<VersionCapture>>,
    data: Option<&[u8]>,
    sessions: &std::cell::RefCell<SessionTable>,
    conn: u64,
) {
    if slot.is_some() {
        feed_capture_now(slot, data, sessions, conn);
    }
}

#[cold]
fn feed_capture_now(
    slot: &mut Option<Box<VersionCapture>>,
    data: Option<&[u8]>,
    sessions: &std::cell::RefCell<SessionTable>,
    conn: u64,
) {
    let Some(c) = slot.as_deref_mut() else { return };
    let state = {
        let mut table = sessions.borrow_mut();
        match data {
            Some(d) => c.feed(d, &mut table),
            None => c.finish(&mut table),
        }
    };
    match state {
        Captured::Reading => {}
        Captured::Recorded => *slot = None,
        Captured::Failed(why) => {
            warn!(
                "conn {conn}: no protocol version in the answer to initialize ({why}): \
                 its session cannot be re-initialised after an upstream restart"
            );
            *slot = None;
        }
    }
}

/// Request side of the mapping: a request carrying the client's id C of a
/// reopened session goes upstream with U'. Until a first reopen the table
/// maps nothing and the request is left byte-exact.
fn map_request_session(headers: &mut HeaderList, client_id: &[u8], table: &SessionTable) {
    if client_id.is_empty() {
        return;
    }
    if let Some(upstream_id) = table.upstream_id_for(client_id) {
        // Both ids passed the table's check (visible ASCII): `set` cannot
        // refuse them.
        let _ = headers.set_name(name::MCP_SESSION_ID, upstream_id);
    }
}

/// Response side: the client never sees U' (a client adopts any session id
/// it is sent: the TypeScript SDK does), only its own C.
fn map_response_session(headers: &mut HeaderList, table: &SessionTable) {
    let Some(id) = headers.get_name(name::MCP_SESSION_ID) else { return };
    if let Some(client_id) = table.client_id_for(id).map(<[u8]>::to_vec) {
        let _ = headers.set_name(name::MCP_SESSION_ID, &client_id);
    }
}

/// Whether `body` may name the method `notifications/initialized`: without
/// a backslash no JSON string in it is escaped, so the name must appear as
/// is. Spares the parse of every other in-session POST body (tools/call)
/// on its answer.
fn may_name_initialized(body: &[u8]) -> bool {
    memchr::memchr(b'\\', body).is_some() || memchr::memmem::find(body, rpc::INITIALIZED.as_bytes()).is_some()
}

impl Exchange {
    /// At the request, once it is whole: whether it names a session this
    /// proxy recorded (which keeps it alive in the table), and its id
    /// mapped to the upstream's for a re-initialised session (C -> U';
    /// nothing until a first one).
    pub(in crate::conn) fn session_at_request(&mut self, ctx: &Ctx) {
        let id = &self.session.id;
        self.session.known = !id.is_empty() && ctx.sessions.borrow_mut().touch(id, ctx.now);
        map_request_session(&mut self.req.headers, id, &ctx.sessions.borrow());
    }

    /// At the response head: the upstream's id mapped back (U' -> C, before
    /// a DELETE's answer forgets the session), then `note_session`, whose
    /// capture the relay feeds.
    pub(in crate::conn) fn session_at_response(&mut self, conn: u64, resp: &mut ResponseHead, ctx: &Ctx) {
        map_response_session(&mut resp.headers, &ctx.sessions.borrow());
        self.session.capture = self.note_session(conn, resp, ctx).map(Box::new);
    }

    /// On a response head (`conn`: the connection's id, for the log): a
    /// session is created by a 200 to an `initialize`
    /// POST without a session id that carries one `Mcp-Session-Id` (a
    /// second, different one is refused by the parser); the client's DELETE
    /// is the only signal that a session really ended, whatever the upstream
    /// answered. Returns the capture that reads the chosen `protocolVersion` from the
    /// body of a recorded `initialize`'s answer as it is relayed.
    fn note_session(&self, conn: u64, resp: &ResponseHead, ctx: &Ctx) -> Option<VersionCapture> {
        let ex = self;
        let mut table = ctx.sessions.borrow_mut();
        match ex.req.method.as_slice() {
            b"DELETE" if !ex.session.id.is_empty() => {
                table.forget(&ex.session.id);
            }
            b"POST" if ex.session.id.is_empty() && resp.status == 200 => {
                let id = resp.headers.get_name(name::MCP_SESSION_ID)?;
                // One message (not a batch), read from the stamp scan's
                // envelope.
                let init = ex
                    .plan
                    .messages(&ex.body)?
                    .next()
                    .filter(|m| !ex.plan.is_batch() && m.is_method(rpc::INITIALIZE))?;
                // What a replay needs: end-to-end fields without the
                // credentials (the identity current at replay time is used).
                let fields = ex.req.headers.iter().map(|h| (h.name(), h.value())).filter(|(name, _)| {
                    !matches!(*name, b"authorization" | b"x-agent-token" | b"host" | b"content-length")
                });
                table.expire(ctx.now);
                match table.record(id, &ex.body, fields, "", ctx.now) {
                    Ok(()) => {
                        debug!("conn {}: MCP session recorded", conn);
                        let content_type = resp.headers.get_name(name::CONTENT_TYPE).unwrap_or_default();
                        let capture = VersionCapture::new(id, init.id().json(), content_type);
                        if capture.is_none() {
                            warn!(
                                "conn {}: the answer to initialize is neither JSON nor an event stream: \
                                 its session cannot be re-initialised after an upstream restart",
                                conn
                            );
                        }
                        return capture;
                    }
                    Err(why) => warn!(
                        "conn {}: MCP session not tracked ({why:?}): it will not survive an upstream restart",
                        conn
                    ),
                }
            }
            b"POST"
                if ex.session.known
                    && table.get(&ex.session.id).is_some_and(|s| !s.initialized_sent())
                    && may_name_initialized(&ex.body)
                    && ex
                        .plan
                        .messages(&ex.body)
                        .is_some_and(|mut ms| ms.any(|m| m.is_method(rpc::INITIALIZED))) =>
            {
                table.note_initialized(&ex.session.id, ctx.now);
            }
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn table_with(id: &[u8]) -> SessionTable {
        let mut t = SessionTable::new();
        t.record(id, b"{}", std::iter::empty(), "", Instant::now()).unwrap();
        t
    }

    #[test]
    fn only_bodies_that_may_name_initialized_are_parsed() {
        let named = |body: &[u8]| {
            rpc::parse(body).is_ok_and(|b| b.messages().iter().any(|m| m.is_method(rpc::INITIALIZED)))
        };
        for body in [
            &br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#[..],
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","method":"notifications/initialized"}]"#,
            br#"{"jsonrpc":"2.0","method":"notifications\/initialized"}"#,
            br#"{"jsonrpc":"2.0","method":"notifications\u002finitialized"}"#,
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"x","arguments":{}}}"#,
            br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"notifications/initialized"}}"#,
            b"",
            b"not json",
        ] {
            if named(body) {
                assert!(may_name_initialized(body), "{}", String::from_utf8_lossy(body));
            }
        }
        assert!(!may_name_initialized(br#"{"jsonrpc":"2.0","id":7,"method":"tools/call"}"#));
        assert!(named(br#"{"jsonrpc":"2.0","method":"notifications\u002finitialized"}"#));
    }

    #[test]
    fn json_answer_in_pieces() {
        let mut t = table_with(b"c1");
        let mut c = VersionCapture::new(b"c1", b"1", b"application/json").unwrap();
        let body = br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-06-18"}}"#;
        assert_eq!(c.feed(&body[..20], &mut t), Captured::Reading);
        assert_eq!(c.feed(&body[20..], &mut t), Captured::Recorded);
        assert_eq!(t.get(b"c1").unwrap().protocol_version(), "2025-06-18");
    }

    #[test]
    fn sse_answer_of_any_size_and_failures() {
        let mut t = table_with(b"c1");
        let mut c = VersionCapture::new(b"c1", b"\"a\"", b"text/event-stream").unwrap();
        let body = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":\"a\",\"result\":{\"protocolVersion\":\"v9\"}}\n\n";
        assert_eq!(c.feed(body, &mut t), Captured::Recorded);
        assert_eq!(t.get(b"c1").unwrap().protocol_version(), "v9");

        // Far past the 4 KiB the capture once stopped at.
        let mut t = table_with(b"c2");
        let mut c = VersionCapture::new(b"c2", b"1", b"text/event-stream").unwrap();
        assert_eq!(c.feed(&[b':'; 64 * 1024], &mut t), Captured::Reading);
        assert_eq!(c.feed(b"\n\ndata: {\"id\":1,\"result\":{\"instructions\":\"", &mut t), Captured::Reading);
        for _ in 0..64 {
            assert_eq!(c.feed(&[b'i'; 16 * 1024], &mut t), Captured::Reading);
        }
        assert_eq!(c.feed(b"\",\"protocolVersion\":\"2025-11-25\"}}\n\n", &mut t), Captured::Recorded);
        assert_eq!(t.get(b"c2").unwrap().protocol_version(), "2025-11-25");

        let mut c = VersionCapture::new(b"c1", b"1", b"text/event-stream").unwrap();
        assert_eq!(c.feed(b"data: {\"id\":1,\"result\":{", &mut t), Captured::Reading);
        assert_eq!(c.finish(&mut t), Captured::Failed(Why::Ended { events: 0, not_json: 0 }));
        assert!(VersionCapture::new(b"c1", b"1", b"text/plain").is_none());
    }

    #[test]
    fn ids_map_only_after_a_reopen() {
        let now = Instant::now();
        let mut t = table_with(b"c1");
        let mut h = HeaderList::default();
        h.set(b"mcp-session-id", b"c1").unwrap();
        map_request_session(&mut h, b"c1", &t);
        map_response_session(&mut h, &t);
        assert_eq!(h.get(b"mcp-session-id"), Some(&b"c1"[..]));

        t.try_begin_reopen(b"c1", now).unwrap();
        t.finish_reopen(b"c1", Ok(b"u2"), now).unwrap();
        map_request_session(&mut h, b"c1", &t);
        assert_eq!(h.get(b"mcp-session-id"), Some(&b"u2"[..]));
        map_response_session(&mut h, &t);
        assert_eq!(h.get(b"mcp-session-id"), Some(&b"c1"[..]));
        map_request_session(&mut h, b"", &t);
        assert_eq!(h.get(b"mcp-session-id"), Some(&b"c1"[..]));
    }
}
