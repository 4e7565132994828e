//! The legacy HTTP+SSE transport (MCP 2024-11-05) on the wire: `GET /sse`
//! streamed with its `endpoint` event rewritten when it names the upstream
//! by an absolute URL, and `POST /messages/?session_id=...` relayed with its
//! query intact and stamped.

use std::io::Write;
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{decode_chunked, request, response, Next, RawClient, Req, StubUpstream};

const TOKEN: &str = "tok-sse-SECRET";

/// An upstream whose `GET /sse` announces `endpoint` (split across two
/// chunks, CRLF line ends), sends a `message` event quoting the same URL,
/// a comment and a retry line, then a second event 1 s later.
fn legacy_upstream(endpoint_for: fn(u16) -> String) -> StubUpstream {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    StubUpstream::on(listener, move |req: &Req, s: &mut TcpStream| {
        if req.method == "POST" {
            let _ = s.write_all(&response("202 Accepted", &[("Content-Type", "text/plain")], b"Accepted"));
            return Next::KeepAlive;
        }
        let endpoint = endpoint_for(port);
        let first = format!("event: endpoint\r\ndata: {endpoint}\r\n\r\n");
        let (a, b) = first.split_at(first.len() / 2);
        let quoted = format!(
            ": ping\r\nretry: 3000\r\n\r\nevent: message\r\ndata: {{\"see\":\"{endpoint}\"}}\r\n\r\n"
        );
        let mut out =
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-store\r\nTransfer-Encoding: chunked\r\n\r\n"
                .to_vec();
        for part in [a, b, &quoted] {
            out.extend_from_slice(format!("{:x}\r\n{part}\r\n", part.len()).as_bytes());
        }
        let _ = s.write_all(&out);
        std::thread::sleep(Duration::from_secs(1));
        let late = "event: message\r\ndata: late\r\n\r\n";
        let _ = s.write_all(format!("{:x}\r\n{late}\r\n0\r\n\r\n", late.len()).as_bytes());
        Next::Close
    })
}

/// `GET /sse` as a legacy client sends it.
fn get_sse(p: &ProxyProcess) -> Vec<u8> {
    request("GET", "/sse", &format!("127.0.0.1:{}", p.port), &[("Accept", "text/event-stream")], b"")
}

fn read_stream(p: &ProxyProcess) -> (String, Option<Duration>, String) {
    let mut c = RawClient::new(p.connect());
    c.send(&get_sse(p));
    let start = Instant::now();
    let head = c.read_head();
    assert_eq!(head.status, 200);
    assert_eq!(head.one("transfer-encoding"), "chunked");
    let (first, _) = c.read_until(b"event: message\r\ndata: {", Duration::from_secs(5));
    let first_at = first.map(|t| t - start);
    let (_, _) = c.read_until(b"late\r\n\r\n\r\n0\r\n\r\n", Duration::from_secs(5));
    let raw = c.unread().to_vec();
    let (body, _, _) = decode_chunked(&raw).expect("valid chunked framing from the proxy");
    (String::from_utf8(body).unwrap(), first_at, String::from_utf8_lossy(&raw).into_owned())
}

#[test]
fn absolute_upstream_endpoint_is_rewritten_and_message_events_left_alone() {
    let up = legacy_upstream(|port| format!("http://127.0.0.1:{port}/messages/?session_id=0123abcd"));
    let p = ProxyProcess::builder(format!("http://127.0.0.1:{}/sse", up.port))
        .agent("gemini")
        .token(TOKEN)
        .start();
    let (body, first_at, raw) = read_stream(&p);
    let upstream_url = format!("http://127.0.0.1:{}/messages/?session_id=0123abcd", up.port);
    let proxy_url = format!("http://127.0.0.1:{}/messages/?session_id=0123abcd", p.port);
    let expected = format!(
        "event: endpoint\r\ndata: {proxy_url}\r\n\r\n: ping\r\nretry: 3000\r\n\r\nevent: message\r\ndata: {{\"see\":\"{upstream_url}\"}}\r\n\r\nevent: message\r\ndata: late\r\n\r\n"
    );
    assert_eq!(body, expected, "raw: {raw:?}");
    // The early events were streamed, not held until the late one.
    assert!(first_at.is_some_and(|t| t < Duration::from_millis(800)), "first events at {first_at:?}");
}

#[test]
fn relative_endpoint_passes_byte_for_byte() {
    let up = legacy_upstream(|_| "/messages/?session_id=0123abcd".to_string());
    let p = ProxyProcess::builder(format!("http://127.0.0.1:{}/sse", up.port))
        .agent("gemini")
        .token(TOKEN)
        .start();
    let (body, _, _) = read_stream(&p);
    assert!(body.starts_with("event: endpoint\r\ndata: /messages/?session_id=0123abcd\r\n\r\n"), "{body}");
}

#[test]
fn messages_post_keeps_its_query_and_is_stamped() {
    let up = legacy_upstream(|_| "/messages/?session_id=0123abcd".to_string());
    let p = ProxyProcess::builder(format!("http://127.0.0.1:{}/sse", up.port))
        .agent("gemini")
        .token(TOKEN)
        .start();
    let body = br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"mallory","message":"m"}}}"#;
    let mut c = RawClient::new(p.connect());
    c.send(&request(
        "POST",
        "/messages/?session_id=0123abcd",
        &format!("127.0.0.1:{}", p.port),
        &[("Content-Type", "application/json"), ("Authorization", "Bearer spoof")],
        body,
    ));
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 202);
    assert_eq!(resp.body, b"Accepted");
    let req = up.only_request();
    assert_eq!(req.target, "/messages/?session_id=0123abcd");
    assert_eq!(req.head.all("authorization"), vec![format!("Bearer {TOKEN}")]);
    let v: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
    assert_eq!(v["params"]["arguments"]["sender"], "gemini");
}

#[test]
fn content_length_event_stream_is_rewritten_and_reframed_with_a_last_chunk() {
    // An upstream that sends its legacy stream with a Content-Length: the
    // rewrite changes the length, so the proxy answers chunked and must
    // end the body with the last chunk.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let up = StubUpstream::on(listener, move |_req: &Req, s: &mut TcpStream| {
        let body = format!(
            "event: endpoint\ndata: http://127.0.0.1:{port}/messages/?session_id=1\n\nevent: message\ndata: x\n\n"
        );
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let _ = s.write_all(head.as_bytes());
        let (a, b) = body.split_at(30);
        let _ = s.write_all(a.as_bytes());
        std::thread::sleep(Duration::from_millis(100));
        let _ = s.write_all(b.as_bytes());
        Next::KeepAlive
    });
    let p = ProxyProcess::builder(format!("http://127.0.0.1:{}/sse", up.port))
        .agent("gemini")
        .token(TOKEN)
        .start();
    let mut c = RawClient::new(p.connect());
    c.send(&get_sse(&p));
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200);
    assert_eq!(resp.one("transfer-encoding"), "chunked");
    assert!(!resp.has("content-length"));
    assert_eq!(
        String::from_utf8_lossy(&resp.body),
        format!("event: endpoint\ndata: http://127.0.0.1:{}/messages/?session_id=1\n\nevent: message\ndata: x\n\n", p.port)
    );
    // The connection is still usable: the body really ended.
    c.send(&get_sse(&p));
    assert_eq!(c.read_response("GET").status, 200);
}

#[test]
fn empty_content_length_event_stream_is_reframed_with_its_last_chunk() {
    // `Content-Length: 0` on a legacy stream: the rewrite makes the proxy
    // answer chunked, and with no body byte to relay its last chunk must
    // still be written, or the client waits for the end of a body forever.
    let up = StubUpstream::start(|_req: &Req, s: &mut TcpStream| {
        let _ =
            s.write_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: 0\r\n\r\n");
        Next::KeepAlive
    });
    let p = ProxyProcess::builder(format!("http://127.0.0.1:{}/sse", up.port))
        .agent("gemini")
        .token(TOKEN)
        .start();
    let mut c = RawClient::new(p.connect());
    for _ in 0..2 {
        c.send(&get_sse(&p));
        let resp = c.read_response("GET");
        assert_eq!(resp.status, 200);
        assert_eq!(resp.one("transfer-encoding"), "chunked");
        assert!(resp.body.is_empty(), "{:?}", resp.body);
    }
}
