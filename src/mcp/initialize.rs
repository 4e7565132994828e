//! How an answer's body is framed (`Format`, from its `Content-Type`), and
//! the `message` events of a whole event stream (`for_each_message_event`,
//! over `sse::Framer`): what the answer reader (`version_scan`), the list
//! filter and the tests' serde_json oracle (`answer_twin.rs`) share. The
//! relay reads answers with `version_scan`, incrementally and whatever
//! their size.

/// How the answer's body is framed, from its `Content-Type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// `application/json`: one JSON-RPC message (or a batch).
    Json,
    /// `text/event-stream`: SSE events, each `message` event one message.
    EventStream,
}

impl Format {
    /// The format of a `Content-Type` value (media type compared ASCII
    /// case-insensitively, parameters ignored: RFC 9110 §8.3.1); `None`
    /// for any other type.
    pub fn from_content_type(value: &[u8]) -> Option<Format> {
        let media = value.split(|&c| c == b';').next().unwrap_or_default().trim_ascii();
        if media.eq_ignore_ascii_case(b"application/json") {
            Some(Format::Json)
        } else if media.eq_ignore_ascii_case(b"text/event-stream") {
            Some(Format::EventStream)
        } else {
            None
        }
    }
}

/// Calls `f(data)` for each dispatched event of type `message` in `stream`,
/// until `f` returns false. Follows WHATWG HTML §9.2.6 "Interpreting an
/// event stream": lines end with CRLF, LF or CR; one leading BOM is
/// ignored; `:` starts a comment; one space after the field's colon is
/// dropped; `data` lines are joined with LF; a blank line dispatches an
/// event that has data, typed `message` unless an `event` field names
/// another; an event cut by the end of the bytes is not dispatched.
pub fn for_each_message_event(stream: &[u8], mut f: impl FnMut(&[u8]) -> bool) {
    let mut framer = super::sse::Framer::default();
    let mut sink = MessageData::default();
    let mut rest = stream;
    loop {
        let (n, dispatched) = framer.feed(rest, &mut sink);
        rest = rest.get(n..).unwrap_or_default();
        if !dispatched {
            return;
        }
        if std::mem::take(&mut sink.ready) && !f(&sink.data) {
            return;
        }
        sink.data.clear();
        sink.message = true;
    }
}

/// The data of the event being read, and whether it is a `message` event.
struct MessageData {
    data: Vec<u8>,
    message: bool,
    /// Dispatched with data, typed `message`.
    ready: bool,
}

impl Default for MessageData {
    fn default() -> Self {
        MessageData { data: Vec::new(), message: true, ready: false }
    }
}

impl super::sse::EventSink for MessageData {
    fn data(&mut self, bytes: &[u8]) {
        self.data.extend_from_slice(bytes);
    }

    fn event_type(&mut self, value: &[u8]) {
        self.message = value.is_empty() || value == b"message";
    }

    fn dispatch(&mut self, had_data: bool) {
        self.ready = had_data && self.message;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_from_content_type() {
        let cases: &[(&[u8], Option<Format>)] = &[
            (b"application/json", Some(Format::Json)),
            (b"Application/JSON; charset=utf-8", Some(Format::Json)),
            (b" text/event-stream ", Some(Format::EventStream)),
            (b"text/event-stream;charset=utf-8", Some(Format::EventStream)),
            (b"text/plain", None),
            (b"application/json-seq", None),
            (b"", None),
        ];
        for (value, want) in cases {
            assert_eq!(Format::from_content_type(value), *want, "{:?}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn sse_events_are_split_like_the_spec() {
        let events = |s: &[u8]| {
            let mut out = Vec::new();
            for_each_message_event(s, |d| {
                out.push(String::from_utf8_lossy(d).into_owned());
                true
            });
            out
        };
        assert_eq!(events(b"data: a\ndata:  b\ndata\n\n"), ["a\n b\n"]);
        assert_eq!(events(b"data: a\r\n\r\ndata: b\r\r\ndata: c\n\n"), ["a", "b", "c"]);
        assert_eq!(events(b"\xEF\xBB\xBFdata: a\n\n\xEF\xBB\xBFdata: b\n\n"), ["a"]);
        assert_eq!(events(b"event: message\nevent: x\ndata: a\n\nevent:\ndata: b\n\n"), ["b"]);
        assert_eq!(events(b":data: x\n\ndata: \n\n"), [""]);
        assert!(events(b"").is_empty());
        // Stops when told to.
        let mut n = 0;
        for_each_message_event(b"data: 1\n\ndata: 2\n\n", |_| {
            n += 1;
            false
        });
        assert_eq!(n, 1);
    }
}
