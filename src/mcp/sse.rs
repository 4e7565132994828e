//! Legacy (2024-11-05) HTTP+SSE transport: rewrite the `endpoint` event of a
//! `GET /sse` stream, and `Location` values, from the upstream's origin to the
//! proxy's: the 2024-11-05 transport's `endpoint` event names the URL the
//! client must POST to, and a client resolves it against the SSE URL, so an
//! absolute upstream URL would send it around the proxy. Pure: bytes in,
//! bytes out; no I/O.
//!
//! SDK clients resolve the endpoint against the SSE URL and reject another
//! origin, so an absolute `http://<upstream>/messages/?session_id=..` must
//! become `http://<proxy>/messages/?session_id=..`. Everything else, line
//! endings included, is relayed byte for byte.

use memchr::memchr2;
use smallvec::SmallVec;

use crate::limits::{MAX_SSE_HELD_EVENT, MAX_SSE_SCAN};

/// The byte order mark an event stream may begin with, once (WHATWG HTML
/// §9.2.6), which is not part of the first field's name.
pub(crate) const UTF8_BOM: &[u8] = b"\xEF\xBB\xBF";
const HTTP_SCHEME: &[u8] = b"http://";
const HTTPS_SCHEME: &[u8] = b"https://";

type Authority = SmallVec<[u8; 64]>;

/// Incremental scanner of the start of an SSE stream (WHATWG HTML
/// §9.2.6 "Interpreting an event stream", read by [`Framer`]) that rewrites
/// the `data:` lines of the first event when that event is an `endpoint`
/// event.
///
/// The bytes of the current event are held until its dispatching blank line
/// (bounded by [`MAX_SSE_HELD_EVENT`]): only then is its type known.
#[derive(Debug)]
pub struct EndpointRewriter {
    /// The upstream's scheme, `http://` or `https://` (the proxy's own is
    /// always `http://`).
    scheme: &'static [u8],
    upstream: Authority,
    proxy: Authority,
    /// Bytes of the current event not yet sent, as they came.
    held: Vec<u8>,
    /// The stream's lines and fields.
    framer: Framer,
    /// What the framer said of the current event and line.
    event: EndpointEvent,
    /// Offsets in `held` of upstream URLs (scheme and authority) found at
    /// the start of a `data:` value; spliced only if the event turns out
    /// to be `endpoint`.
    data_authorities: SmallVec<[usize; 2]>,
    /// A block without data ended with a CR, which was sent with it: an LF
    /// right after it (in this read or the next) ends the same blank line,
    /// is sent at once and is no byte of the next event's.
    blank_cr: bool,
    /// Bytes scanned so far, bounded by [`MAX_SSE_SCAN`].
    scanned: usize,
    done: bool,
}

/// What [`Framer`] says of the event an [`EndpointRewriter`] holds.
#[derive(Debug, Default)]
struct EndpointEvent {
    /// Bytes of the current line's `data` value so far.
    value_len: usize,
    /// The last `event` field of the event was `endpoint`.
    is_endpoint: bool,
    /// The blank line that ended the event dispatched it: it had data.
    has_data: bool,
}

impl EventSink for EndpointEvent {
    fn data(&mut self, bytes: &[u8]) {
        // The LF joining two data lines comes alone; no value holds one.
        if bytes != b"\n" {
            self.value_len += bytes.len();
        }
    }

    fn event_type(&mut self, value: &[u8]) {
        self.is_endpoint = value == b"endpoint";
    }

    fn dispatch(&mut self, had_data: bool) {
        self.has_data = had_data;
    }
}

impl EndpointRewriter {
    /// `upstream_authority` e.g. `b"127.0.0.1:8200"` (host:port as in
    /// `--upstream`); `proxy_authority` e.g. `b"127.0.0.1:40123"` (the Host
    /// the client used).
    pub fn new(upstream_authority: &[u8], proxy_authority: &[u8]) -> Self {
        Self::for_upstream(false, upstream_authority, proxy_authority)
    }

    /// `new` for an upstream reached over `https` when `https`: its
    /// `https://<upstream>` URLs become `http://<proxy>` ones.
    pub fn for_upstream(https: bool, upstream_authority: &[u8], proxy_authority: &[u8]) -> Self {
        EndpointRewriter {
            scheme: if https { HTTPS_SCHEME } else { HTTP_SCHEME },
            upstream: Authority::from_slice(upstream_authority),
            proxy: Authority::from_slice(proxy_authority),
            held: Vec::new(),
            framer: Framer::default(),
            event: EndpointEvent::default(),
            data_authorities: SmallVec::new(),
            blank_cr: false,
            scanned: 0,
            // An empty upstream authority cannot be matched: nothing to do.
            done: upstream_authority.is_empty(),
        }
    }

    /// Feeds decoded (de-chunked) body bytes and appends to `out` what must
    /// be sent to the client. All of `input` is consumed: an incomplete event
    /// is held internally, bounded by [`MAX_SSE_HELD_EVENT`].
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut rest = input;
        while !self.done {
            let Some(&first) = rest.first() else { return };
            if std::mem::take(&mut self.blank_cr) && first == b'\n' {
                let (lf, tail) = rest.split_at(1);
                self.framer.feed_line(lf, &mut self.event);
                self.scanned = self.scanned.saturating_add(1);
                out.extend_from_slice(lf);
                rest = tail;
                continue;
            }
            let (n, stop) = self.framer.feed_line(rest, &mut self.event);
            let (line, tail) = rest.split_at(n.min(rest.len()));
            // The bounds count a line's bytes up to the first byte of its
            // ending, the LF of a CRLF with the line after it: that LF may
            // arrive in the next read, after the line has been handled, and
            // the decision must not depend on where reads split. An LF alone
            // is no line's content yet.
            let lf_alone = stop == Stop::Input && line == b"\n";
            if !lf_alone && self.over_bounds(line.len()) {
                self.give_up(rest, out);
                return;
            }
            self.hold(line);
            rest = tail;
            match stop {
                Stop::Input => {}
                Stop::Line { data } => self.end_of_line(data),
                Stop::Dispatch => {
                    self.blank_cr = line.last() == Some(&b'\r');
                    self.dispatch(out);
                }
            }
        }
        out.extend_from_slice(rest);
    }

    /// True once scanning is over: the first event has been dispatched (and
    /// rewritten if it was an endpoint event), or a bound was reached. From
    /// then on `feed` only copies.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// At the end of the stream: flushes any held bytes unchanged.
    pub fn finish(&mut self, out: &mut Vec<u8>) {
        self.flush_held(out);
        self.become_done();
    }

    /// A field line has ended with the last byte held; a `data` value
    /// naming the upstream is noted.
    fn end_of_line(&mut self, data: bool) {
        let value_len = std::mem::take(&mut self.event.value_len);
        if !data {
            return;
        }
        // The value is the end of the line, before its ending's first byte.
        let end = self.held.len().saturating_sub(1);
        let start = end.saturating_sub(value_len);
        let value = self.held.get(start..end).unwrap_or_default();
        if upstream_url_authority(value, self.scheme, &self.upstream).is_some() {
            self.data_authorities.push(start);
        }
    }

    /// The blank line ending an event: sends the event (rewritten if it is
    /// an endpoint event). An event without data is not dispatched (WHATWG
    /// §9.2.6), so scanning continues after it.
    fn dispatch(&mut self, out: &mut Vec<u8>) {
        if !self.event.has_data {
            self.flush_held(out);
            return;
        }
        if self.event.is_endpoint && !self.data_authorities.is_empty() {
            let mut from = 0;
            for &at in &self.data_authorities {
                // An http:// scheme stays as it was written; https:// becomes http://.
                let https = self.scheme == HTTPS_SCHEME;
                let kept = if https { at } else { at + HTTP_SCHEME.len() };
                out.extend_from_slice(self.held.get(from..kept).unwrap_or_default());
                if https {
                    out.extend_from_slice(HTTP_SCHEME);
                }
                out.extend_from_slice(&self.proxy);
                from = at + self.scheme.len() + self.upstream.len();
            }
            out.extend_from_slice(self.held.get(from..).unwrap_or_default());
        } else {
            out.extend_from_slice(&self.held);
        }
        self.become_done();
    }

    fn hold(&mut self, bytes: &[u8]) {
        self.held.extend_from_slice(bytes);
        self.scanned = self.scanned.saturating_add(bytes.len());
    }

    /// Would holding `more` bytes of the current line exceed a bound?
    fn over_bounds(&self, more: usize) -> bool {
        self.held.len().saturating_add(more) > MAX_SSE_HELD_EVENT
            || self.scanned.saturating_add(more) > MAX_SSE_SCAN
    }

    /// A bound was reached: everything held and `rest` go out unchanged and
    /// scanning stops.
    fn give_up(&mut self, rest: &[u8], out: &mut Vec<u8>) {
        log::debug!("sse: no endpoint event within bounds; relaying unchanged");
        self.flush_held(out);
        out.extend_from_slice(rest);
        self.become_done();
    }

    fn flush_held(&mut self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.held);
        self.clear_event();
    }

    /// Scanning is over for good: release the held buffer (an open stream
    /// should cost nothing once relaying is plain copying).
    fn become_done(&mut self) {
        self.clear_event();
        self.held = Vec::new();
        self.framer = Framer::default();
        self.done = true;
    }

    fn clear_event(&mut self) {
        self.held.clear();
        self.data_authorities.clear();
        self.event = EndpointEvent::default();
    }
}

/// If `value` is `http://<upstream><rest>` with `<rest>` empty or starting
/// with `/`, `?` or `#`, returns the offset of `<upstream>` in `value`.
/// Scheme and authority compare ASCII-case-insensitively; the authority must
/// match exactly (`localhost` is not `127.0.0.1`, `:8200` is not `:82001`).
fn upstream_url_authority(value: &[u8], scheme: &[u8], upstream: &[u8]) -> Option<usize> {
    if upstream.is_empty() {
        return None;
    }
    let given = value.get(..scheme.len())?;
    if !given.eq_ignore_ascii_case(scheme) {
        return None;
    }
    let authority_end = scheme.len().checked_add(upstream.len())?;
    let authority = value.get(scheme.len()..authority_end)?;
    if !authority.eq_ignore_ascii_case(upstream) {
        return None;
    }
    match value.get(authority_end) {
        None | Some(b'/' | b'?' | b'#') => Some(scheme.len()),
        Some(_) => None,
    }
}

/// Rewrites a `Location` value `http://<upstream_authority><rest>` (RFC 9110
/// §10.2.2: it names the upstream, which the client must not bypass) to
/// `http://<proxy_authority><rest>`; any other value (relative, another
/// authority or scheme) gives `None` and is relayed unchanged.
pub fn rewrite_location(
    value: &[u8],
    upstream_authority: &[u8],
    proxy_authority: &[u8],
) -> Option<SmallVec<[u8; 128]>> {
    rewrite_location_from(false, value, upstream_authority, proxy_authority)
}

/// `rewrite_location` for an upstream reached over `https` when `https`.
pub fn rewrite_location_from(
    https: bool,
    value: &[u8],
    upstream_authority: &[u8],
    proxy_authority: &[u8],
) -> Option<SmallVec<[u8; 128]>> {
    let scheme = if https { HTTPS_SCHEME } else { HTTP_SCHEME };
    let at = upstream_url_authority(value, scheme, upstream_authority)?;
    let rest = value.get(at + upstream_authority.len()..)?;
    let mut out = SmallVec::new();
    out.extend_from_slice(HTTP_SCHEME);
    out.extend_from_slice(proxy_authority);
    out.extend_from_slice(rest);
    Some(out)
}

/// What an event stream's fields say, as `Framer` reads them.
pub trait EventSink {
    /// Bytes of the current event's data: the values of its `data` lines
    /// in order, with the `\n` that joins two lines (never one after the
    /// last line). A value may come in several calls.
    fn data(&mut self, bytes: &[u8]);
    /// The `event` field's value (the last one wins), whole.
    fn event_type(&mut self, value: &[u8]);
    /// A blank line: the event is over (dispatched only if it had data).
    fn dispatch(&mut self, had_data: bool);
}

/// A sink that keeps nothing: the framer only finds where events end.
pub struct NoEvents;

impl EventSink for NoEvents {
    fn data(&mut self, _: &[u8]) {}
    fn event_type(&mut self, _: &[u8]) {}
    fn dispatch(&mut self, _: bool) {}
}

/// The one SSE event writer: a `message` event carrying `message` (JSON
/// text; each of its lines one `data:` line), every line ending with CRLF.
pub fn write_message_event(message: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(b"event: message\r\n");
    write_data(message, out);
    out.extend_from_slice(b"\r\n");
}

/// `message`'s lines as `data:` lines (a CR before a line's LF dropped).
pub fn write_data(message: &[u8], out: &mut Vec<u8>) {
    for line in message.split(|&b| b == b'\n') {
        out.extend_from_slice(b"data: ");
        out.extend_from_slice(line.strip_suffix(b"\r").unwrap_or(line));
        out.extend_from_slice(b"\r\n");
    }
}

/// An event stream read as it arrives, in any split, by WHATWG HTML §9.2.6
/// "Interpreting an event stream": lines end with CRLF, LF or CR; one
/// leading BOM is ignored; a line starting with `:` is a comment; one space
/// after the field's colon is dropped; `data` values are joined with LF; a
/// blank line dispatches. Data values pass through in runs, never held: an
/// event of any size costs the framer a few bytes. Field names and `event`
/// values are held up to 64 bytes (longer ones are no field this reader
/// knows, and are ignored).
#[derive(Debug, Default)]
pub struct Framer {
    /// BOM bytes matched at the start; `UTF8_BOM.len() + 1` once past it.
    bom: usize,
    after_cr: bool,
    at: FramerAt,
    name: SmallVec<[u8; 16]>,
    value: SmallVec<[u8; 64]>,
    field: FramerField,
    /// The space after the colon is still to be dropped.
    skip_space: bool,
    has_data: bool,
    /// A line other than a blank one came since the last dispatch.
    in_event: bool,
}

/// Where [`Framer::feed_line`] stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// At the end of the input, inside a line or at the start of one.
    Input,
    /// Right after the byte that ended a field line (its CR or LF: the LF
    /// of a CRLF is read with what follows); `data` when it was a `data`
    /// line.
    Line { data: bool },
    /// Right after the byte that ended a blank line: the event is over.
    Dispatch,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum FramerAt {
    #[default]
    LineStart,
    Name,
    Value,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum FramerField {
    #[default]
    Ignored,
    Data,
    Event,
}

const MAX_FRAMER_FIELD: usize = 64;

impl Framer {
    /// Reads `input`, calling `sink` for what it says, up to and including
    /// the first blank line (dispatch) or to the end: returns the bytes read
    /// and whether it stopped at a dispatch, so the caller can deal with one
    /// event before the next begins.
    pub fn feed(&mut self, input: &[u8], sink: &mut impl EventSink) -> (usize, bool) {
        let (n, stop) = self.read::<false>(input, sink);
        (n, stop == Stop::Dispatch)
    }

    /// `feed` that also stops at the end of every field line, for a reader
    /// that keeps the stream's bytes as they came and must know where each
    /// line (and a `data` value, the end of its line) lies in them.
    pub fn feed_line(&mut self, input: &[u8], sink: &mut impl EventSink) -> (usize, Stop) {
        self.read::<true>(input, sink)
    }

    /// Reads `input` up to the first dispatch, or with `LINES` the first
    /// line end, or to its end.
    fn read<const LINES: bool>(&mut self, input: &[u8], sink: &mut impl EventSink) -> (usize, Stop) {
        let mut at = 0;
        while let Some(&b) = input.get(at) {
            if self.bom <= UTF8_BOM.len() {
                if self.bom < UTF8_BOM.len() && UTF8_BOM.get(self.bom) == Some(&b) {
                    self.bom += 1;
                    at += 1;
                    if self.bom == UTF8_BOM.len() {
                        self.bom = UTF8_BOM.len() + 1;
                    }
                    continue;
                }
                // A partial BOM was no BOM: its bytes (none a line end)
                // start the first line.
                let partial = std::mem::replace(&mut self.bom, UTF8_BOM.len() + 1).min(UTF8_BOM.len());
                for &m in UTF8_BOM.get(..partial).unwrap_or_default() {
                    self.byte(m, sink);
                }
            }
            if self.at == FramerAt::Value && self.field == FramerField::Data && !self.skip_space {
                // A run of data bytes up to the end of the line, in one call.
                let rest = input.get(at..).unwrap_or_default();
                let run = memchr2(b'\n', b'\r', rest).unwrap_or(rest.len());
                if run > 0 {
                    self.after_cr = false;
                    sink.data(rest.get(..run).unwrap_or_default());
                    at += run;
                    continue;
                }
            }
            at += 1;
            match self.byte(b, sink) {
                Stop::Input => {}
                Stop::Line { .. } if !LINES => {}
                stop => return (at, stop),
            }
        }
        (at, Stop::Input)
    }

    /// Between events: at the start of a line, no field line since the
    /// stream began or the last blank line. An event written here cannot
    /// split one of the stream's.
    pub fn at_boundary(&self) -> bool {
        self.at == FramerAt::LineStart && !self.in_event
    }

    /// Reads `input` up to and including the first boundary it reaches
    /// (returns its offset), or all of it (`None`): where the stream can
    /// take an event of the proxy's.
    pub fn to_boundary(&mut self, input: &[u8]) -> Option<usize> {
        match self.feed(input, &mut NoEvents) {
            (n, true) => Some(n),
            (_, false) => None,
        }
    }

    /// One byte; whether it ended a line, and which.
    fn byte(&mut self, b: u8, sink: &mut impl EventSink) -> Stop {
        let after_cr = std::mem::replace(&mut self.after_cr, false);
        match b {
            b'\n' if after_cr => Stop::Input,
            b'\r' | b'\n' => {
                self.after_cr = b == b'\r';
                self.end_line(sink)
            }
            _ => {
                self.in_event = true;
                match self.at {
                    FramerAt::LineStart | FramerAt::Name => {
                        self.at = FramerAt::Name;
                        if b == b':' {
                            self.begin_value(sink);
                        } else if self.name.len() <= MAX_FRAMER_FIELD {
                            self.name.push(b);
                        }
                    }
                    FramerAt::Value => {
                        if std::mem::replace(&mut self.skip_space, false) && b == b' ' {
                            return Stop::Input;
                        }
                        match self.field {
                            FramerField::Data => sink.data(&[b]),
                            FramerField::Event if self.value.len() <= MAX_FRAMER_FIELD => self.value.push(b),
                            _ => {}
                        }
                    }
                }
                Stop::Input
            }
        }
    }

    /// The field name is over (a colon, or the end of a line without one).
    fn begin_value(&mut self, sink: &mut impl EventSink) {
        self.at = FramerAt::Value;
        self.skip_space = true;
        self.value.clear();
        self.field = match self.name.as_slice() {
            b"data" => {
                if std::mem::replace(&mut self.has_data, true) {
                    sink.data(b"\n");
                }
                FramerField::Data
            }
            b"event" => FramerField::Event,
            // Comments (an empty name), `id`, `retry` and unknown fields.
            _ => FramerField::Ignored,
        };
    }

    fn end_line(&mut self, sink: &mut impl EventSink) -> Stop {
        if self.at == FramerAt::LineStart {
            self.skip_space = false;
            self.in_event = false;
            let had_data = std::mem::take(&mut self.has_data);
            sink.dispatch(had_data);
            return Stop::Dispatch;
        }
        if self.at == FramerAt::Name {
            // A line without a colon: the whole line is the name.
            self.begin_value(sink);
        }
        self.at = FramerAt::LineStart;
        if self.field == FramerField::Event {
            sink.event_type(&self.value);
        }
        let data = self.field == FramerField::Data;
        self.name.clear();
        self.field = FramerField::Ignored;
        self.skip_space = false;
        Stop::Line { data }
    }
}

#[cfg(test)]
mod tests {
    /// Events as `Framer` gives them: (type, data) per dispatch with data.
    #[derive(Default)]
    struct Events {
        data: Vec<u8>,
        kind: Vec<u8>,
        got: Vec<(String, String)>,
    }

    impl EventSink for Events {
        fn data(&mut self, bytes: &[u8]) {
            self.data.extend_from_slice(bytes);
        }
        fn event_type(&mut self, value: &[u8]) {
            self.kind = value.to_vec();
        }
        fn dispatch(&mut self, had_data: bool) {
            if had_data {
                let kind = String::from_utf8_lossy(&self.kind).into_owned();
                self.got.push((kind, String::from_utf8_lossy(&self.data).into_owned()));
            }
            self.data.clear();
            self.kind.clear();
        }
    }

    #[test]
    fn the_framer_gives_the_same_events_at_every_split() {
        let stream: &[u8] = b"\xEF\xBB\xBF: c\r\nevent: endpoint\r\ndata: /m?s=1\r\n\r\ndata\rdata:  x\r\rid: 3\nretry: 9\n\n\
                              event\ndata:a:b\ndata: \n\nevent: e\n\n\xEF\xBB\xBFdata: no\n\ndata: cut";
        let want = vec![
            ("endpoint".to_string(), "/m?s=1".to_string()),
            (String::new(), "\n x".to_string()),
            (String::new(), "a:b\n".to_string()),
        ];
        for split in 1..=stream.len() {
            let mut framer = Framer::default();
            let mut events = Events::default();
            for piece in stream.chunks(split) {
                let mut rest = piece;
                while !rest.is_empty() {
                    let (n, _) = framer.feed(rest, &mut events);
                    rest = &rest[n..];
                }
            }
            // A BOM is dropped at the start only (later it begins a name
            // that is not `data`), and the cut event is never dispatched.
            assert_eq!(events.got, want, "split {split}");
        }
    }

    #[test]
    fn feed_line_stops_after_the_first_byte_ending_each_line() {
        let stream: &[u8] = b"\xEF\xBB\xBFdata: a\r\n: c\revent: e\n\r\ndata\n";
        let mut framer = Framer::default();
        let mut stops = Vec::new();
        let mut rest = stream;
        while !rest.is_empty() {
            let (n, stop) = framer.feed_line(rest, &mut NoEvents);
            stops.push((String::from_utf8_lossy(&rest[..n]).into_owned(), stop));
            rest = &rest[n..];
        }
        let want = [
            ("\u{FEFF}data: a\r", Stop::Line { data: true }),
            ("\n: c\r", Stop::Line { data: false }),
            ("event: e\n", Stop::Line { data: false }),
            ("\r", Stop::Dispatch),
            ("\ndata\n", Stop::Line { data: true }),
        ];
        assert_eq!(stops, want.map(|(s, stop)| (s.to_string(), stop)));
    }

    use super::*;

    const UP: &[u8] = b"127.0.0.1:8200";
    const PROXY: &[u8] = b"127.0.0.1:40123";

    fn whole(input: &[u8]) -> Vec<u8> {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        r.feed(input, &mut out);
        r.finish(&mut out);
        out
    }

    fn pieces(parts: &[&[u8]]) -> Vec<u8> {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        for p in parts {
            r.feed(p, &mut out);
        }
        r.finish(&mut out);
        out
    }

    /// Expected output: `input` with every `{U}` replaced by the upstream
    /// authority, and in `want` by the authority given.
    fn fill(template: &str, authority: &[u8]) -> Vec<u8> {
        template.replace("{U}", std::str::from_utf8(authority).unwrap()).into_bytes()
    }

    macro_rules! sse_cases {
        ($($name:ident: $input:expr => $want:expr;)*) => {
            $(
                #[test]
                fn $name() {
                    let input = fill($input, UP);
                    let want = fill($want, PROXY);
                    assert_eq!(
                        String::from_utf8_lossy(&whole(&input)),
                        String::from_utf8_lossy(&want),
                    );
                    assert_split_invariant(&input);
                }
            )*
        };
    }

    sse_cases! {
        endpoint_absolute_lf:
            "event: endpoint\ndata: http://{U}/messages/?session_id=ab\n\nevent: message\ndata: {}\n\n"
            => "event: endpoint\ndata: http://{U}/messages/?session_id=ab\n\nevent: message\ndata: {}\n\n";
        endpoint_absolute_crlf:
            "event: endpoint\r\ndata: http://{U}/messages/?session_id=ab\r\n\r\n"
            => "event: endpoint\r\ndata: http://{U}/messages/?session_id=ab\r\n\r\n";
        endpoint_absolute_cr:
            "event: endpoint\rdata: http://{U}/messages/?session_id=ab\r\r: ping\r"
            => "event: endpoint\rdata: http://{U}/messages/?session_id=ab\r\r: ping\r";
        endpoint_no_space_after_colon:
            "event:endpoint\ndata:http://{U}/m\n\n" => "event:endpoint\ndata:http://{U}/m\n\n";
        endpoint_uppercase_scheme_and_host:
            "event: endpoint\ndata: HTTP://127.0.0.1:8200/m\n\n" => "event: endpoint\ndata: HTTP://{U}/m\n\n";
        endpoint_authority_only:
            "event: endpoint\ndata: http://{U}\n\n" => "event: endpoint\ndata: http://{U}\n\n";
        endpoint_query_directly:
            "event: endpoint\ndata: http://{U}?session_id=1\n\n" => "event: endpoint\ndata: http://{U}?session_id=1\n\n";
        event_after_data:
            "data: http://{U}/messages/?s=1\nid: 7\nevent: endpoint\n\n"
            => "data: http://{U}/messages/?s=1\nid: 7\nevent: endpoint\n\n";
        endpoint_after_comments_and_retry:
            ": hello\r\nretry: 3000\r\n\r\n: pad\r\n\r\nevent: endpoint\r\nretry: 10\r\ndata: http://{U}/m\r\n\r\n"
            => ": hello\r\nretry: 3000\r\n\r\n: pad\r\n\r\nevent: endpoint\r\nretry: 10\r\ndata: http://{U}/m\r\n\r\n";
        endpoint_after_bom:
            "\u{FEFF}event: endpoint\ndata: http://{U}/m\n\n" => "\u{FEFF}event: endpoint\ndata: http://{U}/m\n\n";
        two_data_lines_both_rewritten:
            "event: endpoint\ndata: http://{U}/a\ndata: http://{U}/b\n\n"
            => "event: endpoint\ndata: http://{U}/a\ndata: http://{U}/b\n\n";
    }

    macro_rules! unchanged_cases {
        ($($name:ident: $input:expr;)*) => {
            $(
                #[test]
                fn $name() {
                    let input = fill($input, UP);
                    assert_eq!(
                        String::from_utf8_lossy(&whole(&input)),
                        String::from_utf8_lossy(&input),
                    );
                    assert_split_invariant(&input);
                }
            )*
        };
    }

    unchanged_cases! {
        relative_endpoint: "event: endpoint\r\ndata: /messages/?session_id=0123456789abcdef\r\n\r\n";
        message_event_with_upstream_url:
            "event: message\ndata: http://{U}/messages/?session_id=1\n\nevent: endpoint\ndata: http://{U}/m\n\n";
        default_message_event: "data: http://{U}/messages/\n\nevent: endpoint\ndata: http://{U}/m\n\n";
        other_authority: "event: endpoint\ndata: http://127.0.0.1:8201/m\n\n";
        localhost_is_not_127: "event: endpoint\ndata: http://localhost:8200/m\n\n";
        longer_port: "event: endpoint\ndata: http://127.0.0.1:82001/m\n\n";
        authority_prefix_of_host: "event: endpoint\ndata: http://127.0.0.1:8200.evil.example/m\n\n";
        userinfo: "event: endpoint\ndata: http://u@127.0.0.1:8200/m\n\n";
        https_scheme: "event: endpoint\ndata: https://{U}/m\n\n";
        two_spaces_after_colon: "event: endpoint\ndata:  http://{U}/m\n\n";
        endpoint_overridden_by_later_event_field:
            "event: endpoint\nevent: message\ndata: http://{U}/m\n\n";
        event_name_is_case_sensitive: "event: Endpoint\ndata: http://{U}/m\n\n";
        data_name_is_case_sensitive: "event: endpoint\nDATA: http://{U}/m\ndata: x\n\n";
        comment_only: ": ping - 2026-11-30 12:00:00\r\n\r\n";
        retry_and_id: "retry: 5000\nid: 1\n\n";
        no_trailing_blank_line: "event: endpoint\ndata: http://{U}/m\n";
        partial_last_line: "event: endpoint\ndata: http://{U}/m";
        url_later_in_value: "event: endpoint\ndata: see http://{U}/m\n\n";
    }

    /// Feeding at every split offset, and one byte at a time, gives the same
    /// output as feeding whole.
    #[track_caller]
    fn assert_split_invariant(input: &[u8]) {
        let want = whole(input);
        for i in 0..=input.len() {
            let (a, b) = input.split_at(i);
            assert_eq!(pieces(&[a, b]), want, "split at {i}");
        }
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(pieces(&bytes), want, "one byte at a time");
    }

    #[test]
    fn every_split_of_a_crlf_stream() {
        let input = fill(
            ": hi\r\nretry: 100\r\n\r\nevent: endpoint\r\ndata: http://{U}/messages/?session_id=00ff\r\n\r\n\
             event: message\r\ndata: {\"url\":\"http://{U}/x\"}\r\n\r\n: ping\r\n\r\n",
            UP,
        );
        let want = fill(
            ": hi\r\nretry: 100\r\n\r\nevent: endpoint\r\ndata: http://{U}/messages/?session_id=00ff\r\n\r\n",
            PROXY,
        );
        let mut want = want;
        want.extend_from_slice(&fill(
            "event: message\r\ndata: {\"url\":\"http://{U}/x\"}\r\n\r\n: ping\r\n\r\n",
            UP,
        ));
        assert_eq!(whole(&input), want);
        assert_split_invariant(&input);
        // Three-way splits too: the CR/LF split and the event boundary.
        for i in 0..=input.len() {
            for j in i..=input.len() {
                let got = pieces(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, want, "split at {i}, {j}");
            }
        }
    }

    /// Feeding cut at every offset, and at every pair of offsets, gives the
    /// output of feeding whole: LF, CR and CRLF endings, a BOM, comments,
    /// `event` given twice (the last wins), an endpoint event with several
    /// data lines, blocks without data before it.
    #[test]
    fn every_one_and_two_cut_split_gives_the_whole_output() {
        let streams = [
            "\u{FEFF}: hi\r\n\r\nevent: message\r\nevent: endpoint\r\ndata: http://{U}/a?s=1\r\ndata:http://{U}\r\ndata: /b\r\n\r\ndata: x\n\n",
            "event: endpoint\revent: message\rdata: http://{U}/m\r\r\revent: endpoint\rdata: http://{U}/n\r\r",
            ": a\n\nid: 1\r\n\r\n\ndata\nevent: endpoint\ndata: http://{U}/m\ndata: HTTP://{U}?q\n\n: after\n",
            "\u{FEFF}\r\n\revent:endpoint\r\ndata:  http://{U}/m\r\n\r\n",
        ];
        for template in streams {
            let input = fill(template, UP);
            let want = whole(&input);
            for i in 0..=input.len() {
                assert_eq!(pieces(&[&input[..i], &input[i..]]), want, "{template:?} cut at {i}");
                for j in i..=input.len() {
                    let got = pieces(&[&input[..i], &input[i..j], &input[j..]]);
                    assert_eq!(got, want, "{template:?} cut at {i}, {j}");
                }
            }
        }
    }

    /// A line longer than the held event's bound is relayed unchanged,
    /// wherever reads cut it, around the bound and its line ending.
    #[test]
    fn every_cut_near_an_over_long_line_gives_the_whole_output() {
        let mut input = b": c\r\n\r\nevent: endpoint\r\ndata: http://127.0.0.1:8200/".to_vec();
        input.resize(MAX_SSE_HELD_EVENT + 10, b'a');
        input.extend_from_slice(b"\r\n\r\ndata: x\r\n\r\n");
        let want = whole(&input);
        assert_eq!(want, input);
        let near: Vec<usize> = (0..12).chain(MAX_SSE_HELD_EVENT - 4..input.len() + 1).collect();
        for &i in &near {
            for &j in near.iter().filter(|&&j| j >= i) {
                let got = pieces(&[&input[..i], &input[i..j], &input[j..]]);
                assert_eq!(got, want, "cut at {i}, {j}");
            }
        }
    }

    /// The LF of a CRLF blank line that arrived in the next read was once
    /// held as the next event's first byte, so that event met the held
    /// bound one byte sooner than when the stream came whole.
    #[test]
    fn regression_a_blank_line_s_lf_in_the_next_read_is_not_the_next_event_s() {
        let mut input = b": c\r\n\r\nevent: endpoint\r\ndata: http://127.0.0.1:8200/".to_vec();
        // The endpoint event is the bound's size to the byte.
        input.resize(7 + MAX_SSE_HELD_EVENT - 3, b'a');
        input.extend_from_slice(b"\r\n\r\n");
        let want = whole(&input);
        assert_ne!(want, input, "rewritten whole");
        assert_eq!(pieces(&[&input[..6], &input[6..]]), want, "cut inside the blank line's CRLF");
    }

    #[test]
    fn cr_at_end_of_read_then_lf_is_one_line_ending() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        r.feed(b"event: endpoint\r", &mut out);
        // Were this LF a line of its own, it would dispatch an empty event.
        r.feed(b"\ndata: http://127.0.0.1:8200/m\r", &mut out);
        assert!(!r.is_done());
        r.feed(b"\n\r", &mut out);
        assert!(r.is_done());
        r.feed(b"\nevent: message\n", &mut out);
        assert_eq!(out, b"event: endpoint\r\ndata: http://127.0.0.1:40123/m\r\n\r\nevent: message\n");
    }

    /// An empty read between the CR and the LF of a CRLF once made the LF
    /// a blank line of its own (found by the three-way split test).
    #[test]
    fn regression_empty_read_between_cr_and_lf() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        r.feed(b"event: endpoint\r", &mut out);
        r.feed(b"", &mut out);
        r.feed(b"\ndata: http://127.0.0.1:8200/m\r\n\r\n", &mut out);
        assert_eq!(out, b"event: endpoint\r\ndata: http://127.0.0.1:40123/m\r\n\r\n");
    }

    #[test]
    fn done_after_first_dispatched_event() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        r.feed(b": c\n\nretry: 1\n\n", &mut out);
        assert!(!r.is_done(), "blocks without data do not dispatch");
        assert_eq!(out, b": c\n\nretry: 1\n\n", "they are sent at once");
        r.feed(b"data: x\n", &mut out);
        assert!(!r.is_done());
        r.feed(b"\nevent: endpoint\ndata: http://127.0.0.1:8200/m\n\n", &mut out);
        assert!(r.is_done());
        assert_eq!(r.held.capacity(), 0, "nothing is kept once done");
        assert_eq!(out, b": c\n\nretry: 1\n\ndata: x\n\nevent: endpoint\ndata: http://127.0.0.1:8200/m\n\n");
    }

    #[test]
    fn endpoint_event_is_sent_when_dispatched() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        r.feed(b"event: endpoint\ndata: /m\n", &mut out);
        assert!(out.is_empty(), "held until the blank line");
        r.feed(b"\n", &mut out);
        assert!(r.is_done());
        assert_eq!(out, b"event: endpoint\ndata: /m\n\n");
    }

    #[test]
    fn oversized_line_is_flushed_unchanged_and_ends_scanning() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        let mut input = b"event: endpoint\ndata: http://127.0.0.1:8200/".to_vec();
        input.resize(MAX_SSE_HELD_EVENT + 1, b'a');
        r.feed(&input, &mut out);
        assert!(r.is_done());
        assert_eq!(out, input);
        r.feed(b"\n\n", &mut out);
        input.extend_from_slice(b"\n\n");
        assert_eq!(out, input);
    }

    /// The bounds decide the same way wherever the reads split, including
    /// for a CRLF whose LF arrives in the next read.
    #[test]
    fn bounds_are_split_invariant() {
        for ending in [&b"\n"[..], b"\r", b"\r\n"] {
            for delta in 0..6 {
                let mut input = b"event: endpoint".to_vec();
                input.extend_from_slice(ending);
                input.extend_from_slice(b"data: http://127.0.0.1:8200/");
                let pad = MAX_SSE_HELD_EVENT - 2 * ending.len() - input.len() - 3 + delta;
                input.resize(input.len() + pad, b'a');
                input.extend_from_slice(ending);
                input.extend_from_slice(ending);
                input.extend_from_slice(b"data: after\n\n");
                let want = whole(&input);
                let near = MAX_SSE_HELD_EVENT.saturating_sub(8)..MAX_SSE_HELD_EVENT + 8;
                for i in near.chain([0, 1, 20, 40]) {
                    let (a, b) = input.split_at(i.min(input.len()));
                    assert_eq!(pieces(&[a, b]), want, "delta {delta} split at {i}");
                }
            }
        }
        // Around the bound: the endpoint event is rewritten just below it.
        let mut input = b"event: endpoint\ndata: http://127.0.0.1:8200/".to_vec();
        input.resize(MAX_SSE_HELD_EVENT - 3, b'a');
        input.extend_from_slice(b"\n\n");
        assert_ne!(whole(&input), input);
        input.insert(50, b'a');
        input.insert(50, b'a');
        assert_eq!(whole(&input), input);
    }

    #[test]
    fn held_event_stays_within_bound() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        for _ in 0..10_000 {
            r.feed(b"data: 0123456789\n", &mut out);
            assert!(r.held.len() <= MAX_SSE_HELD_EVENT + 1);
            if r.is_done() {
                break;
            }
        }
        assert!(r.is_done());
    }

    #[test]
    fn endless_comments_end_scanning() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        let mut sent = 0;
        while !r.is_done() {
            r.feed(b": ping\n\n", &mut out);
            sent += 8;
            assert!(sent <= MAX_SSE_SCAN + 8);
        }
        assert_eq!(out.len(), sent);
    }

    #[test]
    fn finish_flushes_partial_line() {
        let mut r = EndpointRewriter::new(UP, PROXY);
        let mut out = Vec::new();
        r.feed(b"event: endpoint\ndata: http://127.0.0.1:8200/m", &mut out);
        assert!(out.is_empty());
        r.finish(&mut out);
        assert!(r.is_done());
        assert_eq!(out, b"event: endpoint\ndata: http://127.0.0.1:8200/m");
    }

    /// A field line is split as WHATWG HTML §9.2.6 says: the name runs to
    /// the first colon and the value starts after it, one space after the
    /// colon dropped; a line without a colon is a name with an empty value,
    /// and a comment (a line starting with a colon) has an empty name.
    #[test]
    fn the_framer_splits_fields_like_the_spec() {
        /// The data, the last event type and whether the event had data.
        #[derive(Default)]
        struct Said(String, Option<String>, Option<bool>);
        impl EventSink for Said {
            fn data(&mut self, bytes: &[u8]) {
                self.0.push_str(&String::from_utf8_lossy(bytes));
            }
            fn event_type(&mut self, value: &[u8]) {
                self.1 = Some(String::from_utf8_lossy(value).into_owned());
            }
            fn dispatch(&mut self, had_data: bool) {
                self.2 = Some(had_data);
            }
        }
        for (line, data, kind) in [
            ("data: x", Some("x"), None),
            ("data:x", Some("x"), None),
            ("data:  x", Some(" x"), None),
            ("data:", Some(""), None),
            ("data", Some(""), None),
            ("data:b: c", Some("b: c"), None),
            ("a:b: c", None, None),
            ("data : x", None, None),
            (": comment", None, None),
            (":", None, None),
            ("event:endpoint ", None, Some("endpoint ")),
            ("event", None, Some("")),
        ] {
            let mut said = Said::default();
            let stream = format!("{line}\n\n");
            let (n, dispatched) = Framer::default().feed(stream.as_bytes(), &mut said);
            assert!(dispatched && n == stream.len(), "{line:?}");
            let want = (data.unwrap_or_default(), kind.map(str::to_string), Some(data.is_some()));
            assert_eq!((said.0.as_str(), said.1, said.2), want, "{line:?}");
        }
    }

    #[test]
    fn empty_upstream_authority_never_rewrites() {
        let mut r = EndpointRewriter::new(b"", PROXY);
        assert!(r.is_done());
        let mut out = Vec::new();
        r.feed(b"event: endpoint\ndata: http:///m\n\n", &mut out);
        assert_eq!(out, b"event: endpoint\ndata: http:///m\n\n");
    }

    #[test]
    fn location_rewrite() {
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"http://127.0.0.1:8200/mcp", Some(b"http://127.0.0.1:40123/mcp")),
            (b"HTTP://127.0.0.1:8200/mcp?x=1#f", Some(b"http://127.0.0.1:40123/mcp?x=1#f")),
            (b"http://127.0.0.1:8200", Some(b"http://127.0.0.1:40123")),
            (b"http://127.0.0.1:8200?q", Some(b"http://127.0.0.1:40123?q")),
            (b"/mcp", None),
            (b"http://localhost:8200/mcp", None),
            (b"http://127.0.0.1:82000/mcp", None),
            (b"http://127.0.0.1:8200@evil/mcp", None),
            (b"https://127.0.0.1:8200/mcp", None),
            (b"//127.0.0.1:8200/mcp", None),
            (b"", None),
        ];
        for (value, want) in cases {
            let got = rewrite_location(value, UP, PROXY);
            assert_eq!(got.as_deref(), *want, "{}", String::from_utf8_lossy(value));
        }
        assert_eq!(rewrite_location(b"http:///x", b"", PROXY), None);
    }

    #[test]
    fn an_https_upstream_is_rewritten_to_the_proxy_s_http_url() {
        let up: &[u8] = b"mcp.example.com";
        let cases: &[(&[u8], Option<&[u8]>)] = &[
            (b"https://mcp.example.com/mcp", Some(b"http://127.0.0.1:40123/mcp")),
            (b"HTTPS://MCP.example.com?x", Some(b"http://127.0.0.1:40123?x")),
            (b"http://mcp.example.com/mcp", None),
            (b"https://mcp.example.com:8443/mcp", None),
            (b"https://mcp.example.com.evil/mcp", None),
        ];
        for (value, want) in cases {
            let got = rewrite_location_from(true, value, up, PROXY);
            assert_eq!(got.as_deref(), *want, "{}", String::from_utf8_lossy(value));
        }
        let input: &[u8] = b"event: endpoint\r\ndata: https://mcp.example.com/messages/?session_id=1\r\n\r\nevent: message\ndata: https://mcp.example.com/x\n\n";
        let want: &[u8] = b"event: endpoint\r\ndata: http://127.0.0.1:40123/messages/?session_id=1\r\n\r\nevent: message\ndata: https://mcp.example.com/x\n\n";
        for split in 0..=input.len() {
            let mut r = EndpointRewriter::for_upstream(true, up, PROXY);
            let mut out = Vec::new();
            r.feed(&input[..split], &mut out);
            r.feed(&input[split..], &mut out);
            r.finish(&mut out);
            assert_eq!(String::from_utf8_lossy(&out), String::from_utf8_lossy(want), "split at {split}");
        }
        // An http:// endpoint is not the https upstream's: relayed as it came.
        let mut r = EndpointRewriter::for_upstream(true, up, PROXY);
        let mut out = Vec::new();
        r.feed(b"event: endpoint\ndata: http://mcp.example.com/m\n\n", &mut out);
        assert_eq!(out, b"event: endpoint\ndata: http://mcp.example.com/m\n\n");
    }

    /// A deterministic generator of SSE-like streams: split invariance, and
    /// output equal to input when the upstream authority is absent.
    #[test]
    fn generated_streams_split_invariant() {
        let atoms: &[&[u8]] = &[
            b"event: endpoint",
            b"event: message",
            b"data: http://127.0.0.1:8200/m?s=1",
            b"data: http://127.0.0.1:8201/m",
            b"data: /m",
            b"data:",
            b": ping",
            b"retry: 10",
            b"id: 3",
            b"",
            b"\r",
            b"\n",
            b"\r\n",
        ];
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        for _ in 0..300 {
            let mut input = Vec::new();
            for _ in 0..8 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                input.extend_from_slice(atoms[(seed % atoms.len() as u64) as usize]);
                input.extend_from_slice(atoms[9 + (seed >> 8) as usize % 4]);
            }
            let want = whole(&input);
            for i in 0..=input.len() {
                let (a, b) = input.split_at(i);
                assert_eq!(pieces(&[a, b]), want);
            }
            if memchr::memmem::find(&input, UP).is_none() {
                assert_eq!(want, input);
            }
        }
    }
}
