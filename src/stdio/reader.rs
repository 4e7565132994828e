//! One HTTP response of the exchange, read back by the stdio front-end:
//! the head, the body's framing (`http::body::Decoder`), then its content
//! turned into JSON-RPC messages of one line each. A JSON body is one
//! message (an object, or a batch's array); an event stream gives one per
//! `message` event (its data over any number of `data:` lines), and the
//! legacy transport's `endpoint` event. Pure but for `Emit`, the stdout
//! queue a message too large to hold is streamed into.

use crate::http::body::Decoder;
use crate::http::chunked::Piece;
use crate::http::head::{parse_response, ResponseHead};
use crate::http::headers::name;
use crate::mcp::sse::{EventSink, Framer};

use super::out::Emit;

/// A message up to this size is held whole, so the front-end can read it
/// (its id, whether it answers a request) before it goes out; past it, the
/// message is written as it streams, holding the stdout line.
pub const HELD_MESSAGE: usize = 64 * 1024;
/// Content bytes worked on per step: what may pass the stdout queue's bound.
const STEP: usize = 16 * 1024;
/// The text of a body that is not JSON-RPC, kept for an error message.
const TEXT_KEPT: usize = 512;

/// What reading a response found.
#[derive(Debug, PartialEq, Eq)]
pub enum Event {
    Head(Head),
    /// A whole message, on one line (no `\n`).
    Message(Vec<u8>),
    /// A message too large to hold went out as it came.
    Streamed,
    /// The legacy transport's `endpoint` event: its data, as sent.
    Endpoint(Vec<u8>),
    /// The response is over; `text` is the start of a body that held no
    /// message (a plain-text error).
    End {
        text: String,
    },
    /// The response cannot be read (a framing or head error).
    Broken(String),
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Head {
    pub status: u16,
    pub reason: String,
    pub session: Option<String>,
    pub keep_alive: bool,
    pub event_stream: bool,
}

#[derive(Debug, Default, PartialEq, Eq)]
enum At {
    #[default]
    Head,
    Body,
    /// The body is over: messages out, `End` not yet returned.
    Ending,
    Done,
}

#[derive(Debug)]
enum Content {
    Json,
    Sse(Framer),
    Text,
}

#[derive(Debug)]
pub struct Reader {
    at: At,
    decoder: Decoder,
    content: Content,
    /// Content bytes taken from the pipe, not yet worked on (from `pending_at`).
    pending: Vec<u8>,
    pending_at: usize,
    msg: Assembly,
    text: Vec<u8>,
    /// Nothing but whitespace came in the body so far (a JSON body).
    blank: bool,
    /// The connection closed: no more bytes will come.
    eof: bool,
}

impl Default for Reader {
    fn default() -> Reader {
        Reader {
            at: At::Head,
            decoder: Decoder::None,
            content: Content::Text,
            pending: Vec::new(),
            pending_at: 0,
            msg: Assembly::default(),
            text: Vec::new(),
            blank: true,
            eof: false,
        }
    }
}

impl Reader {
    /// Reads from `input` (what the connection wrote) until an event or the
    /// end of the input; returns the bytes of `input` consumed. Stops
    /// without consuming while a streamed message waits for stdout room.
    pub fn pump(&mut self, input: &[u8], emit: &mut Emit<'_>) -> (usize, Option<Event>) {
        let mut used = 0;
        loop {
            if self.pending_at < self.pending.len() {
                if self.msg.blocked(emit) {
                    return (used, None);
                }
                if let Some(e) = self.work(emit) {
                    return (used, Some(e));
                }
                continue;
            }
            self.pending.clear();
            self.pending_at = 0;
            let rest = input.get(used..).unwrap_or_default();
            match self.at {
                At::Head => match parse_response(rest, false) {
                    Ok(None) if self.eof => {
                        self.at = At::Done;
                        let why = "the connection closed before a response";
                        return (used, Some(Event::Broken(why.into())));
                    }
                    Ok(None) => return (used, None),
                    Err(e) => {
                        self.at = At::Done;
                        return (used, Some(Event::Broken(format!("response head: {e}"))));
                    }
                    Ok(Some(h)) => {
                        used += h.len;
                        if h.is_interim() {
                            continue;
                        }
                        return (used, Some(Event::Head(self.begin(&h))));
                    }
                },
                At::Body => {
                    if self.decoder.is_done() {
                        self.at = At::Ending;
                        continue;
                    }
                    match self.decoder.step(rest) {
                        Ok(None) if self.eof && self.decoder.until_close() => self.at = At::Ending,
                        Ok(None) if self.eof => {
                            self.at = At::Done;
                            let why = "the connection closed inside the response body";
                            return (used, Some(Event::Broken(why.into())));
                        }
                        Ok(None) => return (used, None),
                        Ok(Some((n, piece))) => {
                            if piece == Piece::Data {
                                self.pending.extend_from_slice(rest.get(..n).unwrap_or_default());
                            }
                            used += n;
                        }
                        Err(e) => {
                            self.at = At::Done;
                            return (used, Some(Event::Broken(format!("response body framing: {e:?}"))));
                        }
                    }
                }
                At::Ending => {
                    self.at = At::Done;
                    if let Some(e) = self.finish(emit) {
                        // `End` on the next call.
                        self.at = At::Ending;
                        return (used, Some(e));
                    }
                    let text = String::from_utf8_lossy(&self.text).into_owned();
                    return (used, Some(Event::End { text }));
                }
                At::Done => return (used, None),
            }
        }
    }

    /// The connection closed after `input` (all it wrote): a body that
    /// runs to the close is over, any other is cut. Call until the reader
    /// is done; `None` while a streamed message waits for stdout.
    pub fn closed(&mut self, input: &[u8], emit: &mut Emit<'_>) -> (usize, Option<Event>) {
        self.eof = true;
        self.pump(input, emit)
    }

    /// Whether the response was read to its end.
    pub fn is_done(&self) -> bool {
        self.at == At::Done
    }

    fn begin(&mut self, h: &ResponseHead) -> Head {
        let content_type = h.headers.get_name(name::CONTENT_TYPE).unwrap_or_default();
        let media = content_type.split(|&b| b == b';').next().unwrap_or_default();
        let media = crate::http::headers::trim_ows(media);
        let event_stream = media.eq_ignore_ascii_case(b"text/event-stream");
        self.content = if event_stream {
            Content::Sse(Framer::default())
        } else if media.eq_ignore_ascii_case(b"application/json") {
            Content::Json
        } else {
            Content::Text
        };
        self.decoder = Decoder::new(h.framing);
        self.at = At::Body;
        let session = h.headers.get(b"mcp-session-id").map(|v| String::from_utf8_lossy(v).into_owned());
        Head {
            status: h.status,
            reason: String::from_utf8_lossy(&h.reason).into_owned(),
            session,
            keep_alive: h.keep_alive,
            event_stream,
        }
    }

    /// Works on up to `STEP` pending content bytes.
    fn work(&mut self, emit: &mut Emit<'_>) -> Option<Event> {
        let end = (self.pending_at + STEP).min(self.pending.len());
        let chunk = self.pending.get(self.pending_at..end).unwrap_or_default();
        match &mut self.content {
            Content::Json => {
                if self.blank && chunk.iter().all(|&b| crate::mcp::json::is_ws(b)) {
                    self.pending_at = end;
                    return None;
                }
                self.blank = false;
                self.msg.data(chunk, emit);
                self.pending_at = end;
                None
            }
            Content::Text => {
                let room = TEXT_KEPT.saturating_sub(self.text.len());
                self.text.extend_from_slice(chunk.get(..room.min(chunk.len())).unwrap_or_default());
                self.pending_at = end;
                None
            }
            Content::Sse(framer) => {
                let mut sink = Sink { msg: &mut self.msg, emit, event: None };
                let (n, _) = framer.feed(chunk, &mut sink);
                self.pending_at += n;
                sink.event
            }
        }
    }

    /// The body is over: a JSON body's message (an event stream's last
    /// event without its blank line is not dispatched, as the spec says).
    fn finish(&mut self, emit: &mut Emit<'_>) -> Option<Event> {
        match self.content {
            Content::Json if !self.blank => {
                self.blank = true;
                Some(self.msg.end(emit))
            }
            _ => {
                self.msg.reset(emit);
                None
            }
        }
    }
}

/// The event stream's fields, into the message being assembled.
struct Sink<'a, 'e> {
    msg: &'a mut Assembly,
    emit: &'a mut Emit<'e>,
    event: Option<Event>,
}

impl EventSink for Sink<'_, '_> {
    fn data(&mut self, bytes: &[u8]) {
        self.msg.data(bytes, self.emit);
    }

    fn event_type(&mut self, value: &[u8]) {
        self.msg.kind = match value {
            b"" | b"message" => Kind::Message,
            b"endpoint" => Kind::Endpoint,
            _ => Kind::Other,
        };
    }

    fn dispatch(&mut self, had_data: bool) {
        self.event = match (had_data, self.msg.kind) {
            (true, Kind::Message) => Some(self.msg.end(self.emit)),
            (true, Kind::Endpoint) if !self.msg.streaming => {
                Some(Event::Endpoint(std::mem::take(&mut self.msg.raw)))
            }
            _ => None,
        };
        self.msg.reset(self.emit);
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Kind {
    #[default]
    Message,
    Endpoint,
    Other,
}

/// One message being read: held raw up to `HELD_MESSAGE`, then written to
/// stdout on one line as it streams.
#[derive(Debug, Default)]
struct Assembly {
    raw: Vec<u8>,
    kind: Kind,
    streaming: bool,
    line: OneLine,
    out: Vec<u8>,
}

impl Assembly {
    /// Whether reading must wait: a streamed message for stdout room, or
    /// one grown past `HELD_MESSAGE` for the stdout line (another message
    /// holds it). Starts streaming when it can.
    fn blocked(&mut self, emit: &mut Emit<'_>) -> bool {
        if self.streaming {
            return !emit.has_room();
        }
        if self.raw.len() <= HELD_MESSAGE {
            return false;
        }
        match self.kind {
            Kind::Message if emit.take_line() => {
                self.streaming = true;
                let raw = std::mem::take(&mut self.raw);
                self.write(&raw, emit);
                !emit.has_room()
            }
            Kind::Message => true,
            // An endpoint URL is never this long: dropped.
            Kind::Endpoint | Kind::Other => {
                self.raw.clear();
                self.kind = Kind::Other;
                false
            }
        }
    }

    fn data(&mut self, bytes: &[u8], emit: &mut Emit<'_>) {
        match (self.kind, self.streaming) {
            (Kind::Other, _) => {}
            (_, false) => self.raw.extend_from_slice(bytes),
            (_, true) => self.write(bytes, emit),
        }
    }

    fn write(&mut self, bytes: &[u8], emit: &mut Emit<'_>) {
        self.out.clear();
        for &b in bytes {
            self.line.push(b, &mut self.out);
        }
        emit.write(&self.out);
    }

    /// The message is over: whole, or its streamed line ended.
    fn end(&mut self, emit: &mut Emit<'_>) -> Event {
        let event = if self.streaming {
            emit.write(b"\n");
            Event::Streamed
        } else {
            Event::Message(one_line(&self.raw))
        };
        self.reset(emit);
        event
    }

    fn reset(&mut self, emit: &mut Emit<'_>) {
        if self.streaming {
            emit.release_line();
        }
        self.raw.clear();
        self.kind = Kind::Message;
        self.streaming = false;
        self.line = OneLine::default();
    }
}

/// JSON text on one line: whitespace outside strings dropped, control
/// characters inside strings (which JSON forbids raw) escaped as `\u00XX`,
/// so no `\n` or `\r` can reach the output whatever the input.
#[derive(Clone, Copy, Debug, Default)]
pub struct OneLine {
    in_string: bool,
    escaped: bool,
}

impl OneLine {
    pub fn push(&mut self, b: u8, out: &mut Vec<u8>) {
        if self.in_string {
            if std::mem::take(&mut self.escaped) {
                match b {
                    // `\` then a raw control character: `\u00XX` after it.
                    0..=0x1f => push_control(b, out, false),
                    _ => out.push(b),
                }
            } else if b == b'\\' {
                self.escaped = true;
                out.push(b);
            } else if b == b'"' {
                self.in_string = false;
                out.push(b);
            } else if b < 0x20 {
                push_control(b, out, true);
            } else {
                out.push(b);
            }
        } else if !crate::mcp::json::is_ws(b) {
            self.in_string = b == b'"';
            out.push(b);
        }
    }
}

fn push_control(b: u8, out: &mut Vec<u8>, backslash: bool) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    if backslash {
        out.push(b'\\');
    }
    out.extend_from_slice(b"u00");
    out.push(HEX[usize::from(b >> 4)]);
    out.push(HEX[usize::from(b & 15)]);
}

/// `text` on one line (see `OneLine`).
pub fn one_line(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut line = OneLine::default();
    for &b in text {
        line.push(b, &mut out);
    }
    out
}
