//! The tool policy on the legacy (2024-11-05) HTTP+SSE transport, where a
//! request and its answer travel on different connections: the client
//! POSTs `/messages/?session_id=X` (answered 202) and the answer arrives as
//! a `message` event on the `GET /sse` stream that announced session X in
//! its `endpoint` event.
//!
//! - `Routes` is the loop's table of the legacy streams it relays, by
//!   session: what the POSTs of other connections owe each stream (the ids
//!   of `tools/list` requests whose answers must be filtered, and the
//!   proxy's own answers to send as `message` events), and which streams
//!   must be driven to send them.
//! - `LegacyStream` is such a stream's body rewriter: the `endpoint` event
//!   rewritten (`EndpointRewriter`) and its session learned, a `ListFilter`
//!   per pending `tools/list`, and the proxy's events written between the
//!   upstream's events, never inside one.
//!
//! Pure: bytes in, bytes out; the table holds connection ids, not sockets.

use super::sse::{write_message_event, EndpointRewriter, EventSink, Framer};
use super::stamp::StampMap;
use super::tools::{ListFilter, ListOptions, ListReport, Policy};
use crate::limits::{MAX_LEGACY_QUEUED, MAX_LEGACY_STREAMS, MAX_PENDING_LISTS, MAX_SSE_SCAN};
use crate::mcp::initialize::Format;

/// The raw `session_id` query value of a legacy `POST .../messages?session_id=X`
/// target; `None` for any other target.
pub fn post_session(target: &[u8]) -> Option<&[u8]> {
    let q = memchr::memchr(b'?', target)?;
    let path = target.get(..q).unwrap_or_default();
    let path = path.strip_suffix(b"/").unwrap_or(path);
    if !path.ends_with(b"/messages") {
        return None;
    }
    let query = target.get(q + 1..).unwrap_or_default();
    let query = query.split(|&b| b == b'#').next().unwrap_or_default();
    query.split(|&b| b == b'&').find_map(|kv| kv.strip_prefix(b"session_id=")).filter(|s| !s.is_empty())
}

/// The session an `endpoint` event names: the `session_id` of its `data`
/// URL (absolute or relative), from the first `endpoint` event in `stream`
/// that is dispatched (its blank line came) with one `data` line, as
/// `sse::Framer` reads the stream.
pub fn endpoint_session(stream: &[u8]) -> Option<Box<[u8]>> {
    match EndpointSession::default().feed(stream) {
        Endpoint::Named(session) => Some(session),
        Endpoint::Pending | Endpoint::Unnamed => None,
    }
}

/// `endpoint_session` read as the stream arrives, in any split.
#[derive(Debug, Default)]
struct EndpointSession {
    framer: Framer,
    event: EndpointData,
    /// Bytes read so far.
    read: usize,
}

/// What the first endpoint event with one `data` line said.
#[derive(Debug, PartialEq, Eq)]
enum Endpoint {
    /// No such event yet.
    Pending,
    Named(Box<[u8]>),
    /// Its URL is no `messages` URL with a `session_id`.
    Unnamed,
}

impl EndpointSession {
    fn feed(&mut self, bytes: &[u8]) -> Endpoint {
        self.read = self.read.saturating_add(bytes.len());
        let mut rest = bytes;
        while !rest.is_empty() {
            let (n, dispatched) = self.framer.feed(rest, &mut self.event);
            rest = rest.get(n..).unwrap_or_default();
            if dispatched && std::mem::take(&mut self.event.found) {
                return match url_session(&self.event.data) {
                    Some(session) => Endpoint::Named(session.into()),
                    None => Endpoint::Unnamed,
                };
            }
        }
        Endpoint::Pending
    }
}

/// The current event's data, as `Framer` reads it.
#[derive(Debug, Default)]
struct EndpointData {
    data: Vec<u8>,
    endpoint: bool,
    /// The event has had more than one `data` line.
    several: bool,
    /// It was dispatched, an endpoint event with one `data` line.
    found: bool,
}

impl EventSink for EndpointData {
    fn data(&mut self, bytes: &[u8]) {
        // The LF joining two data lines comes alone; no value holds one.
        if bytes == b"\n" {
            self.several = true;
        }
        if !self.several {
            self.data.extend_from_slice(bytes);
        }
    }

    fn event_type(&mut self, value: &[u8]) {
        self.endpoint = value == b"endpoint";
    }

    fn dispatch(&mut self, had_data: bool) {
        self.found = had_data && self.endpoint && !self.several;
        if !self.found {
            self.data.clear();
        }
        self.endpoint = false;
        self.several = false;
    }
}

/// The session an endpoint URL names: the `session_id` of its path's
/// `messages` target, the path of an absolute URL starting at the first
/// '/' after "scheme://".
fn url_session(url: &[u8]) -> Option<&[u8]> {
    let path_at = match memchr::memmem::find(url, b"://") {
        Some(s) => s + 3 + memchr::memchr(b'/', url.get(s + 3..).unwrap_or_default())?,
        None => 0,
    };
    post_session(url.get(path_at..).unwrap_or_default())
}

/// One legacy stream the proxy relays.
#[derive(Debug)]
struct Route {
    session: Box<[u8]>,
    conn: u64,
    /// `tools/list` ids (JSON text) whose answers this stream must filter.
    lists: Vec<Box<[u8]>>,
    /// Complete events the proxy owes the stream's client.
    events: Vec<u8>,
}

/// What a POST owes a stream, taken by that stream's connection.
#[derive(Debug, Default)]
pub struct Owed {
    pub lists: Vec<Box<[u8]>>,
    pub events: Vec<u8>,
}

/// The legacy streams the proxy relays, by session (see the module doc).
#[derive(Debug, Default)]
pub struct Routes {
    routes: Vec<Route>,
    /// Connections owed events, to be driven after this round.
    wake: Vec<u64>,
}

impl Routes {
    /// The stream on connection `conn` announced `session`. Bounded: past
    /// `MAX_LEGACY_STREAMS` the oldest is forgotten (its POSTs are then
    /// answered as if it were not relayed here).
    pub fn open(&mut self, session: Box<[u8]>, conn: u64) {
        self.routes.retain(|r| r.conn != conn && r.session != session);
        if self.routes.len() >= MAX_LEGACY_STREAMS {
            self.routes.remove(0);
        }
        self.routes.push(Route { session, conn, lists: Vec::new(), events: Vec::new() });
    }

    /// Connection `conn`'s stream is over (or the connection is gone).
    pub fn close(&mut self, conn: u64) {
        self.routes.retain(|r| r.conn != conn);
    }

    /// Whether the session's stream is relayed here.
    pub fn has(&self, session: &[u8]) -> bool {
        self.routes.iter().any(|r| &*r.session == session)
    }

    /// The answer to `tools/list` request `id` on `session`'s stream must be
    /// filtered; false when that stream is not relayed here or has too many
    /// lists pending.
    pub fn expect_list(&mut self, session: &[u8], id: &[u8]) -> bool {
        let Some(r) = self.routes.iter_mut().find(|r| &*r.session == session) else { return false };
        if r.lists.len() >= MAX_PENDING_LISTS {
            return false;
        }
        r.lists.push(id.into());
        true
    }

    /// Queues `message` (one JSON-RPC message) as a `message` event for
    /// `session`'s stream; false when that stream is not relayed here or
    /// already owes `MAX_LEGACY_QUEUED` bytes.
    pub fn send(&mut self, session: &[u8], message: &[u8]) -> bool {
        let Some(r) = self.routes.iter_mut().find(|r| &*r.session == session) else { return false };
        if r.events.len() + message.len() > MAX_LEGACY_QUEUED {
            return false;
        }
        write_message_event(message, &mut r.events);
        if !self.wake.contains(&r.conn) {
            self.wake.push(r.conn);
        }
        true
    }

    /// What connection `conn`'s stream is owed; `None` when nothing.
    pub fn take(&mut self, conn: u64) -> Option<Owed> {
        let r = self.routes.iter_mut().find(|r| r.conn == conn)?;
        if r.lists.is_empty() && r.events.is_empty() {
            return None;
        }
        Some(Owed { lists: std::mem::take(&mut r.lists), events: std::mem::take(&mut r.events) })
    }

    /// The connections to drive: they are owed events.
    pub fn take_wakes(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.wake)
    }

    pub fn len(&self) -> usize {
        self.routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }
}

/// The body rewriter of a legacy `GET /sse` stream (see the module doc).
#[derive(Debug)]
pub struct LegacyStream {
    endpoint: EndpointRewriter,
    /// The session the endpoint event named, until the connection has
    /// registered it (`take_new_session`).
    new_session: Option<Box<[u8]>>,
    filters: Vec<ListFilter>,
    /// The proxy's events waiting for a boundary.
    events: Vec<u8>,
    /// The stream as written so far (`at_boundary`: where an event of the
    /// proxy's may go).
    boundary: super::sse::Framer,
    outcomes: Vec<ListReport>,
    /// The stream read for its endpoint event's session (bounded by
    /// `MAX_SSE_SCAN`; `None` once found or given up).
    session_scan: Option<Box<EndpointSession>>,
    stage: Vec<u8>,
    spare: Vec<u8>,
}

impl LegacyStream {
    pub fn new(endpoint: EndpointRewriter) -> LegacyStream {
        LegacyStream {
            endpoint,
            new_session: None,
            filters: Vec::new(),
            events: Vec::new(),
            boundary: super::sse::Framer::default(),
            outcomes: Vec::new(),
            session_scan: Some(Box::default()),
            stage: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// The session the stream announced, once, for the connection to
    /// register in `Routes`.
    pub fn take_new_session(&mut self) -> Option<Box<[u8]>> {
        self.new_session.take()
    }

    /// What POSTs owe the stream: a filter per pending `tools/list`, and
    /// events to write at the next boundary.
    pub fn owe(&mut self, owed: Owed, policy: &Policy, map: &StampMap, options: ListOptions, enforce: bool) {
        for id in owed.lists {
            self.filters.push(ListFilter::new(Format::EventStream, &id, policy, map, options, enforce));
        }
        self.events.extend_from_slice(&owed.events);
    }

    /// Finished lists' outcomes (stamps learned, what was hidden or refused).
    pub fn take_outcomes(&mut self) -> Vec<ListReport> {
        std::mem::take(&mut self.outcomes)
    }

    pub fn feed(&mut self, data: &[u8], out: &mut Vec<u8>) {
        let mut stage = std::mem::take(&mut self.stage);
        stage.clear();
        if self.endpoint.is_done() {
            stage.extend_from_slice(data);
        } else {
            self.endpoint.feed(data, &mut stage);
        }
        self.learn_session(&stage);
        self.through_filters(&mut stage, |f, input, out| f.feed(input, out));
        self.write(&stage, out);
        self.stage = stage;
    }

    /// The session, from the first endpoint event (in whatever reads it
    /// came); given up past `MAX_SSE_SCAN` bytes.
    fn learn_session(&mut self, stage: &[u8]) {
        let Some(scan) = self.session_scan.as_mut() else { return };
        match scan.feed(stage) {
            Endpoint::Named(session) => {
                self.new_session = Some(session);
                self.session_scan = None;
            }
            Endpoint::Unnamed => {
                log::debug!("legacy SSE: the endpoint event names no session: it is not routed");
                self.session_scan = None;
            }
            Endpoint::Pending if scan.read > MAX_SSE_SCAN => {
                log::debug!(
                    "legacy SSE: no endpoint event in the first {MAX_SSE_SCAN} bytes: its session is not routed"
                );
                self.session_scan = None;
            }
            Endpoint::Pending => {}
        }
    }

    /// Nothing arrived: the proxy's events go out if the stream is between
    /// events.
    pub fn idle(&mut self, out: &mut Vec<u8>) {
        if !self.events.is_empty() && self.boundary.at_boundary() && self.endpoint.is_done() {
            out.append(&mut self.events);
        }
    }

    pub fn finish(&mut self, out: &mut Vec<u8>) {
        let mut stage = std::mem::take(&mut self.stage);
        stage.clear();
        if !self.endpoint.is_done() {
            self.endpoint.finish(&mut stage);
        }
        self.learn_session(&stage);
        // Every filter finishes, each on what the ones before it let out.
        let mut filters = std::mem::take(&mut self.filters);
        for f in &mut filters {
            let mut next = std::mem::take(&mut self.spare);
            next.clear();
            f.feed(&stage, &mut next);
            f.finish(&mut next);
            self.outcomes.push(f.take_outcome());
            self.spare = std::mem::replace(&mut stage, next);
        }
        self.write(&stage, out);
        if self.boundary.at_boundary() {
            out.append(&mut self.events);
        }
        self.stage = stage;
    }

    /// `stage` through each pending filter in turn; finished filters leave.
    fn through_filters(&mut self, stage: &mut Vec<u8>, step: impl Fn(&mut ListFilter, &[u8], &mut Vec<u8>)) {
        if self.filters.is_empty() {
            return;
        }
        for f in &mut self.filters {
            let mut next = std::mem::take(&mut self.spare);
            next.clear();
            step(f, stage, &mut next);
            self.spare = std::mem::replace(stage, next);
        }
        let outcomes = &mut self.outcomes;
        self.filters.retain_mut(|f| {
            if f.is_done() {
                outcomes.push(f.take_outcome());
                return false;
            }
            true
        });
    }

    /// Writes `bytes`, the proxy's events at the first boundary.
    fn write(&mut self, bytes: &[u8], out: &mut Vec<u8>) {
        let mut rest = bytes;
        if !self.events.is_empty() && self.endpoint.is_done() {
            if !self.boundary.at_boundary() {
                match self.boundary.to_boundary(rest) {
                    Some(at) => {
                        out.extend_from_slice(rest.get(..at).unwrap_or_default());
                        rest = rest.get(at..).unwrap_or_default();
                    }
                    None => {
                        out.extend_from_slice(rest);
                        return;
                    }
                }
            }
            out.append(&mut self.events);
        }
        let mut unread = rest;
        while let Some(at) = self.boundary.to_boundary(unread) {
            unread = unread.get(at..).unwrap_or_default();
        }
        out.extend_from_slice(rest);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::tools::ToolFlags;

    #[test]
    fn post_session_reads_the_session_id_of_a_messages_target() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"/messages/?session_id=abc", Some(b"abc")),
            (b"/messages?session_id=abc&x=1", Some(b"abc")),
            (b"/p/messages/?x=1&session_id=a%2Fb", Some(b"a%2Fb")),
            (b"/messages/?session_id=", None),
            (b"/messages/", None),
            (b"/mcp?session_id=abc", None),
            (b"/messages/?sessionid=abc", None),
        ];
        for (target, want) in cases {
            assert_eq!(post_session(target), *want, "{}", String::from_utf8_lossy(target));
        }
    }

    #[test]
    fn endpoint_session_reads_relative_and_absolute_urls() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"event: endpoint\r\ndata: /messages/?session_id=ab12\r\n\r\n", Some(b"ab12")),
            (b": ping\n\nevent: endpoint\ndata: http://h:1/messages/?session_id=x\n\n", Some(b"x")),
            (b"data: /messages/?session_id=x\n\n", None),
            (b"event: endpoint\ndata: /elsewhere?session_id=x\n\n", None),
        ];
        for (stream, want) in cases {
            assert_eq!(endpoint_session(stream).as_deref(), *want, "{}", String::from_utf8_lossy(stream));
        }
    }

    #[test]
    fn the_session_is_read_as_the_stream_arrives_in_any_split() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            // The stream's BOM is not part of the first field's name.
            (b"\xEF\xBB\xBFevent: endpoint\r\ndata: /messages/?session_id=b\r\n\r\n", Some(b"b")),
            (b"event: endpoint\rdata: /messages/?session_id=c\r\r", Some(b"c")),
            // Two data lines are no URL; `event` given twice, the last wins.
            (b"event: endpoint\ndata: /messages/?session_id=x\ndata: y\n\n", None),
            (b"event: endpoint\nevent: message\ndata: /messages/?session_id=x\n\n", None),
            (b"event: message\nevent: endpoint\ndata: /messages/?session_id=d\n\n", Some(b"d")),
            // Not dispatched: the blank line never came.
            (b"event: endpoint\ndata: /messages/?session_id=x\n", None),
            // The first endpoint event decides, even naming no session.
            (b"event: endpoint\ndata: /m\n\nevent: endpoint\ndata: /messages/?session_id=x\n\n", None),
        ];
        for (stream, want) in cases {
            let text = String::from_utf8_lossy(stream);
            assert_eq!(endpoint_session(stream).as_deref(), *want, "{text}");
            for i in 0..=stream.len() {
                let mut scan = EndpointSession::default();
                let first = scan.feed(&stream[..i]);
                let got = if first == Endpoint::Pending { scan.feed(&stream[i..]) } else { first };
                let got = match got {
                    Endpoint::Named(session) => Some(session),
                    Endpoint::Pending | Endpoint::Unnamed => None,
                };
                assert_eq!(got.as_deref(), *want, "{text} cut at {i}");
            }
        }
    }

    #[test]
    fn routes_queue_for_their_session_and_wake_its_connection_once() {
        let mut r = Routes::default();
        assert!(!r.send(b"s1", b"{}"), "no stream yet");
        r.open(b"s1".as_slice().into(), 7);
        r.open(b"s2".as_slice().into(), 8);
        assert!(r.send(b"s1", b"{\"a\":1}"));
        assert!(r.send(b"s1", b"{\"a\":2}"));
        assert!(r.expect_list(b"s2", b"3"));
        assert_eq!(r.take_wakes(), vec![7]);
        let owed = r.take(7).unwrap();
        assert_eq!(
            owed.events,
            b"event: message\r\ndata: {\"a\":1}\r\n\r\nevent: message\r\ndata: {\"a\":2}\r\n\r\n"
        );
        assert!(owed.lists.is_empty());
        assert!(r.take(7).is_none(), "taken once");
        assert_eq!(&*r.take(8).unwrap().lists[0], b"3");
        // A session announced again on another connection moves there.
        r.open(b"s1".as_slice().into(), 9);
        assert!(r.send(b"s1", b"{}"));
        assert_eq!(r.take_wakes(), vec![9]);
        r.close(9);
        assert!(!r.has(b"s1") && r.has(b"s2"));
        for i in 0..MAX_LEGACY_STREAMS as u64 + 5 {
            r.open(i.to_string().into_bytes().into(), 100 + i);
        }
        assert_eq!(r.len(), MAX_LEGACY_STREAMS);
    }

    fn stream() -> LegacyStream {
        LegacyStream::new(EndpointRewriter::new(b"up:1", b"px:2"))
    }

    const START: &[u8] = b"event: endpoint\r\ndata: http://up:1/messages/?session_id=S\r\n\r\n";

    /// Feeds `parts`, queues what is owed after the part `owe_after`; the output.
    fn run_owing(
        parts: &[&[u8]],
        owe_after: usize,
        events: &[u8],
        lists: &[&[u8]],
        deny: &[&str],
    ) -> (Vec<u8>, Option<Box<[u8]>>) {
        let policy = Policy::from_flags(&ToolFlags {
            allow: None,
            deny: deny.iter().map(|s| s.to_string()).collect(),
            show_identity_params: false,
            identity_params: vec!["sender".into()],
        });
        let map = StampMap::agentchattr();
        let mut s = stream();
        let mut out = Vec::new();
        let mut session = None;
        for (i, p) in parts.iter().enumerate() {
            s.feed(p, &mut out);
            if i == 0 {
                session = s.take_new_session();
            }
            if i == owe_after {
                let owed =
                    Owed { lists: lists.iter().map(|l| (*l).into()).collect(), events: events.to_vec() };
                s.owe(owed, &policy, &map, ListOptions { learn_room: 8, insert_cache_scope: false }, true);
                s.idle(&mut out);
            }
        }
        s.finish(&mut out);
        (out, session)
    }

    fn run(parts: &[&[u8]], events: &[u8], lists: &[&[u8]], deny: &[&str]) -> (Vec<u8>, Option<Box<[u8]>>) {
        run_owing(parts, 0, events, lists, deny)
    }

    #[test]
    fn the_endpoint_is_rewritten_and_its_session_learned() {
        let (out, session) = run(&[START], b"", &[], &[]);
        assert_eq!(out, b"event: endpoint\r\ndata: http://px:2/messages/?session_id=S\r\n\r\n");
        assert_eq!(session.as_deref(), Some(&b"S"[..]));
    }

    #[test]
    fn the_proxys_events_go_between_events_whatever_the_split() {
        let mut ours = Vec::new();
        write_message_event(b"{\"jsonrpc\":\"2.0\",\"id\":1,\"error\":{}}", &mut ours);
        let tail: &[u8] = b": ping\r\n\r\nevent: message\ndata: {\"x\":\n\n\rdata: 1\r\r";
        for cut in 0..=tail.len() {
            let (a, b) = tail.split_at(cut);
            let (out, _) = run_owing(&[START, a, b], 1, &ours, &[], &[]);
            let text = String::from_utf8_lossy(&out).into_owned();
            let pos = memchr::memmem::find(&out, &ours).unwrap_or_else(|| panic!("cut {cut}: {text}"));
            // What is around our event is the upstream's, whole.
            let mut without = out.clone();
            without.drain(pos..pos + ours.len());
            let mut want = b"event: endpoint\r\ndata: http://px:2/messages/?session_id=S\r\n\r\n".to_vec();
            want.extend_from_slice(tail);
            assert_eq!(without, want, "cut {cut}");
            let before = &out[..pos];
            let boundary = before.ends_with(b"\n\n")
                || before.ends_with(b"\r\n\r\n")
                || before.ends_with(b"\r\r")
                || before.ends_with(b"\n\r");
            assert!(boundary, "cut {cut}: not between events: {text}");
        }
    }

    #[test]
    fn a_pending_list_answer_on_the_stream_is_filtered_and_others_pass() {
        let list = br#"{"jsonrpc":"2.0","id":4,"result":{"tools":[{"name":"chat_send","inputSchema":{"type":"object","properties":{"sender":{"type":"string"},"message":{"type":"string"}},"required":["sender","message"]}},{"name":"chat_rules","inputSchema":{"type":"object"}}]}}"#;
        // Another request's answer passes as it came; a list under an id
        // nobody owes is read as one all the same (fail closed).
        let other = br#"{"jsonrpc":"2.0","id":3,"result":{"content":[{"type":"text","text":"chat_rules"}]}}"#;
        let stray =
            br#"{"jsonrpc":"2.0","id":5,"result":{"tools":[{"name":"chat_rules"},{"name":"chat_read"}]}}"#;
        let mut body = START.to_vec();
        for m in [&other[..], &stray[..], &list[..]] {
            body.extend_from_slice(b"event: message\r\ndata: ");
            body.extend_from_slice(m);
            body.extend_from_slice(b"\r\n\r\n");
        }
        let (out, _) = run(&[START, &body[START.len()..]], b"", &[b"4"], &["chat_rules"]);
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains(std::str::from_utf8(other).unwrap()), "id 3 is not the list: {text}");
        assert!(
            text.contains(r#"{"jsonrpc":"2.0","id":5,"result":{"tools":[{"name":"chat_read"}]}}"#),
            "{text}"
        );
        let last = text.rsplit("data: ").next().unwrap();
        assert!(!last.contains("chat_rules") && !last.contains("sender"), "{text}");
        assert!(last.contains("chat_send"), "{text}");
    }

    #[test]
    fn a_stream_that_ends_without_the_pending_list_answers_it_with_an_error() {
        let (out, _) = run(&[START], b"", &[b"\"q\""], &["x"]);
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("\r\n\r\n") && text.contains(r#""id":"q","error""#), "{text}");
    }
}
