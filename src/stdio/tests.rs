use super::out::Stdout;
use super::reader::{one_line, Event, Reader, HELD_MESSAGE};
use super::*;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// A stdout whose writer appends to a shared buffer.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::ErrorKind::Other)?.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn stdout() -> (Stdout, Shared) {
    let sink = Shared::default();
    (Stdout::start(sink.clone(), || {}).expect("thread"), sink)
}

/// Reads `response` fed in pieces of `split` bytes; returns the events.
fn read(response: &[u8], split: usize, out: &mut Stdout) -> Vec<Event> {
    let mut reader = Reader::default();
    let mut events = Vec::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut fed = 0;
    for _ in 0..response.len() * 4 + 16 {
        if fed < response.len() {
            let end = (fed + split).min(response.len());
            pending.extend_from_slice(&response[fed..end]);
            fed = end;
        }
        let mut emit = out.emit(7);
        let (n, e) = if fed == response.len() && reader_wants_close(&events) {
            reader.closed(&pending, &mut emit)
        } else {
            reader.pump(&pending, &mut emit)
        };
        pending.drain(..n);
        if let Some(e) = e {
            let end = matches!(e, Event::End { .. } | Event::Broken(_));
            events.push(e);
            if end {
                break;
            }
        }
    }
    events
}

fn reader_wants_close(_events: &[Event]) -> bool {
    false
}

fn messages(events: &[Event]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Message(m) => Some(String::from_utf8_lossy(m).into_owned()),
            _ => None,
        })
        .collect()
}

fn chunked(body: &[u8], size: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for c in body.chunks(size.max(1)) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    out
}

const PRETTY: &str = "{\n  \"jsonrpc\": \"2.0\",\n  \"id\": 4,\n  \"result\": {\"text\": \"a b\\n c\"}\n}\n";
const ONE: &str = r#"{"jsonrpc":"2.0","id":4,"result":{"text":"a b\n c"}}"#;

#[test]
fn a_json_answer_becomes_one_line_whatever_its_framing_and_split() {
    for framing in ["length", "chunked"] {
        let mut response =
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\n".to_vec();
        match framing {
            "length" => {
                response.extend_from_slice(format!("Content-Length: {}\r\n\r\n", PRETTY.len()).as_bytes());
                response.extend_from_slice(PRETTY.as_bytes());
            }
            _ => {
                response.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
                response.extend_from_slice(&chunked(PRETTY.as_bytes(), 5));
            }
        }
        for split in 1..=response.len() {
            let (mut out, _) = stdout();
            let events = read(&response, split, &mut out);
            let Some(Event::Head(h)) = events.first() else {
                panic!("{framing}/{split}: no head: {events:?}")
            };
            assert_eq!((h.status, h.session.as_deref(), h.event_stream), (200, Some("s1"), false));
            assert_eq!(messages(&events), [ONE], "{framing}/{split}");
            assert!(matches!(events.last(), Some(Event::End { .. })), "{framing}/{split}: {events:?}");
        }
    }
}

#[test]
fn an_event_streams_data_lines_and_line_endings_give_one_message_per_event() {
    // Data over several lines, pretty JSON, CRLF / CR / LF line ends, a
    // comment, an event of another type, a BOM.
    for eol in ["\n", "\r\n", "\r"] {
        let stream = [
            "\u{feff}: hello",
            "event: message",
            "data: {\"jsonrpc\": \"2.0\",",
            "data:  \"method\": \"notifications/progress\"}",
            "",
            "event: other",
            "data: {\"not\": \"for the host\"}",
            "",
            "id: 9",
            "data: {",
            "data:   \"jsonrpc\": \"2.0\", \"id\": 4,",
            "data:   \"result\": {\"text\": \"a b\\n c\"}",
            "data: }",
            "",
            "",
        ]
        .join(eol);
        let mut response =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        response.extend_from_slice(&chunked(stream.as_bytes(), 7));
        for split in 1..=response.len() {
            let (mut out, _) = stdout();
            let events = read(&response, split, &mut out);
            assert_eq!(
                messages(&events),
                [r#"{"jsonrpc":"2.0","method":"notifications/progress"}"#, ONE],
                "{eol:?}/{split}"
            );
            assert!(matches!(events.last(), Some(Event::End { .. })));
        }
    }
}

#[test]
fn the_legacy_endpoint_event_is_given_apart_from_messages() {
    let stream = "event: endpoint\ndata: /messages/?session_id=abc\n\ndata: {\"id\":1}\n\n";
    let response = format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n{stream}");
    let (mut out, _) = stdout();
    let mut reader = Reader::default();
    let mut emit = out.emit(1);
    let mut input = response.as_bytes();
    let mut events = Vec::new();
    while let (n, Some(e)) = reader.pump(input, &mut emit) {
        input = &input[n..];
        events.push(e);
    }
    assert_eq!(events.get(1), Some(&Event::Endpoint(b"/messages/?session_id=abc".to_vec())));
    assert_eq!(events.get(2), Some(&Event::Message(br#"{"id":1}"#.to_vec())));
    // The stream runs until the connection closes.
    let (_, e) = reader.closed(b"", &mut emit);
    assert!(matches!(e, Some(Event::End { .. })), "{e:?}");
}

#[test]
fn raw_control_characters_never_reach_a_line() {
    assert_eq!(one_line(b"{\"a\":\"x\ny\"}\n"), br#"{"a":"x\u000ay"}"#);
    assert_eq!(one_line(b"{\"a\":\"x\\\ny\"}"), br#"{"a":"x\u000ay"}"#);
    assert_eq!(one_line(b" [ 1 ,\r\n 2 ]\t"), b"[1,2]");
    for b in 0u8..0x20 {
        let text = [b'"', b, b'"'];
        let line = one_line(&text);
        assert!(!line.iter().any(|&c| c < 0x20), "{b:#x}: {line:?}");
    }
}

#[test]
fn a_message_too_large_to_hold_streams_on_one_line_holding_the_line() {
    let big = format!("{{\"id\":1,\"result\":\"{}\"}}", "x".repeat(HELD_MESSAGE * 3));
    let response = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{big}",
        big.len()
    );
    let (mut out, sink) = stdout();
    let mut reader = Reader::default();
    let mut input = response.as_bytes();
    let mut events = Vec::new();
    let mut consumed = 0;
    for _ in 0..10_000 {
        let mut emit = out.emit(1);
        let (n, e) = reader.pump(input, &mut emit);
        input = &input[n..];
        consumed += n;
        // Streaming: another exchange cannot put a line in the middle.
        if consumed > HELD_MESSAGE * 2 && !input.is_empty() {
            assert!(!out.emit(2).line(b"{}"), "a line inside a streamed message");
        }
        out.flush();
        if let Some(e) = e {
            let end = matches!(e, Event::End { .. });
            events.push(e);
            if end {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(events.contains(&Event::Streamed), "{:?}", events.len());
    out.close();
    for _ in 0..1000 {
        if out.is_idle() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let written = sink.0.lock().map(|b| b.clone()).unwrap_or_default();
    let lines: Vec<&[u8]> = written.split(|&b| b == b'\n').filter(|l| !l.is_empty()).collect();
    assert_eq!(lines.first().map(|l| l.len()), Some(big.len()));
    assert_eq!(lines.first().copied(), Some(big.as_bytes()));
}

#[test]
fn a_cut_or_headless_response_is_broken() {
    let (mut out, _) = stdout();
    let mut r = Reader::default();
    let (_, e) = r.closed(b"HTTP/1.1 200 OK\r\n", &mut out.emit(1));
    assert!(matches!(e, Some(Event::Broken(_))), "{e:?}");
    let mut r = Reader::default();
    let head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\n\r\n{\"a\"";
    let mut emit = out.emit(1);
    let (n, e) = r.pump(head, &mut emit);
    assert!(matches!(e, Some(Event::Head(_))));
    let (_, e) = r.closed(&head[n..], &mut emit);
    assert!(matches!(e, Some(Event::Broken(_))), "{e:?}");
}

#[test]
fn ids_compare_as_clients_compare_them_and_an_error_takes_the_request_id() {
    assert!(same_id(b"1", b"1.0"));
    assert!(same_id(b"\"7\"", b"7"));
    assert!(!same_id(b"\"server-error\"", b"1"));
    let m = br#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"x"}}"#;
    assert_eq!(answered_ids(m), vec![(b"\"server-error\"".to_vec(), true)]);
    let fixed = with_id(m, b"5").unwrap_or_default();
    assert_eq!(fixed, br#"{"jsonrpc":"2.0","id":5,"error":{"code":-32600,"message":"x"}}"#);
    let batch = br#"[{"id":1,"result":{}},{"method":"x","id":9},{"id":2,"error":{}}]"#;
    assert_eq!(answered_ids(batch), vec![(b"1".to_vec(), false), (b"2".to_vec(), true)]);
    let init = br#"{"id":1,"result":{"protocolVersion":"2025-06-18"}}"#;
    assert_eq!(protocol_of(init).as_deref(), Some("2025-06-18"));
    assert_eq!(protocol_of(br#"{"id":1,"result":{"protocolVersion":"a\r\nb"}}"#), None);
}

#[test]
fn an_endpoint_resolves_to_a_path_on_the_proxy() {
    for (data, want) in [
        ("/messages/?session_id=1", "/messages/?session_id=1"),
        ("http://127.0.0.1:0/messages/?session_id=1", "/messages/?session_id=1"),
        ("HTTPS://x.example/m?s=1", "/m?s=1"),
        ("messages?s=1", "/a/messages?s=1"),
        ("?s=1", "/a/sse?s=1"),
    ] {
        assert_eq!(resolve_endpoint("/a/sse", data.as_bytes()).as_deref(), Some(want), "{data}");
    }
    assert_eq!(resolve_endpoint("/sse", b""), None);
    assert_eq!(resolve_endpoint("/sse", b"/a b"), None);
}

#[test]
fn only_json_rpc_reaches_the_host() {
    for yes in [
        &br#"{"jsonrpc":"2.0","id":1,"result":{}}"#[..],
        br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#,
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-1,"message":"x"}}"#,
        br#"[{"jsonrpc":"2.0","id":1,"result":1},{"jsonrpc":"2.0","id":2,"error":{}}]"#,
    ] {
        assert!(is_jsonrpc(yes), "{}", String::from_utf8_lossy(yes));
    }
    for no in [
        &br#"{"error":"invalid_token","error_description":"expired"}"#[..],
        br#"{"result":"not JSON-RPC"}"#,
        br#"{"jsonrpc":"1.0","id":1,"result":{}}"#,
        br#"{"jsonrpc":"2.0","id":1}"#,
        br#"{error:invalid_token}"#,
        br#"[]"#,
        br#"[{"jsonrpc":"2.0","id":1,"result":1},2]"#,
        b"\x05",
        b"42",
    ] {
        assert!(!is_jsonrpc(no), "{}", String::from_utf8_lossy(no));
    }
}

#[test]
fn one_error_to_a_batch_under_a_foreign_id_answers_each_request_under_its_own() {
    let m = br#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"x"}}"#;
    let owed = [b"1".to_vec(), b"\"b\"".to_vec()];
    let fixed = batch_error(m, &answered_ids(m), &owed).unwrap_or_default();
    assert_eq!(
        String::from_utf8_lossy(&fixed),
        r#"[{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"x"}},{"jsonrpc":"2.0","id":"b","error":{"code":-32600,"message":"x"}}]"#
    );
    // An error under one of the batch's ids, a result, or nothing owed: as it came.
    let own = br#"{"jsonrpc":"2.0","id":1,"error":{"code":-32600,"message":"x"}}"#;
    assert_eq!(batch_error(own, &answered_ids(own), &owed), None);
    let result = br#"{"jsonrpc":"2.0","id":"server-error","result":{}}"#;
    assert_eq!(batch_error(result, &answered_ids(result), &owed), None);
    assert_eq!(batch_error(m, &answered_ids(m), &[]), None);
}

#[test]
fn only_json_rpc_messages_and_batches_of_them_count_as_messages() {
    for m in [
        &br#"{"jsonrpc":"2.0","id":1,"result":{}}"#[..],
        br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}}"#,
        br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#,
        br#"[{"jsonrpc":"2.0","id":1,"result":{}},{"jsonrpc":"2.0","method":"x"}]"#,
    ] {
        assert!(is_jsonrpc(m), "{}", String::from_utf8_lossy(m));
    }
    for m in [
        &br#"{"ok":true}"#[..],
        br#"{"detail":"Not Found"}"#,
        b"[]",
        br#"[{"id":1,"result":{}},2]"#,
        b"7",
        b"{",
    ] {
        assert!(!is_jsonrpc(m), "{}", String::from_utf8_lossy(m));
    }
}
