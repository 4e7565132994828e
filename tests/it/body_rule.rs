//! Every request body is scanned, whatever its method, path, Content-Type or
//! framing: a tools/call of a mapped tool is stamped, a body that is not JSON
//! is refused with 400 and never forwarded, and a chunk that would take the
//! body past the 8 MiB bound is refused before its data is read.

use std::io::Write;
use std::time::{Duration, Instant};

use crate::support::exchange::{assert_healthy, chunk, client, host, ok_upstream};
use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{request, Resp};

const AGENT: &str = "claude-prime";
const TOKEN: &str = "tok-BODYRULE-77";
const SPOOF: &[u8] =
    br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"mallory","message":"hi"}}}"#;

#[track_caller]
fn send(p: &ProxyProcess, raw: &[u8]) -> Resp {
    let mut c = client(p);
    c.send(raw);
    c.read_response("POST")
}

#[track_caller]
fn assert_sender_is_agent(body: &[u8]) {
    let v: serde_json::Value = serde_json::from_slice(body).expect("upstream body is JSON");
    assert_eq!(v["params"]["arguments"]["sender"], AGENT, "upstream saw {v}");
    assert_eq!(v["params"]["arguments"]["message"], "hi", "upstream saw {v}");
}

#[track_caller]
fn assert_refused_as_not_json(resp: &Resp) {
    assert_eq!(resp.status, 400, "{:?}", resp.raw_text());
    assert!(resp.one("content-type").starts_with("application/json"), "{:?}", resp.raw_text());
    let v: serde_json::Value = serde_json::from_slice(&resp.body).expect("error body is JSON");
    assert_eq!(v["error"]["code"], -32700, "{v}");
}

#[test]
fn spoofed_sender_is_stamped_whatever_the_content_type_and_method() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let h = host(&p);
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("POST", &[("Content-Type", "text/plain")]),
        ("POST", &[]),
        ("POST", &[("Content-Type", "application/x-www-form-urlencoded")]),
        ("PUT", &[("Content-Type", "text/plain")]),
        ("POST", &[("Content-Type", "application/json")]),
    ];
    for (i, (method, fields)) in cases.iter().enumerate() {
        let resp = send(&p, &request(method, "/mcp", &h, fields, SPOOF));
        assert_eq!(resp.status, 200, "{method} {fields:?}: {:?}", resp.raw_text());
        let reqs = up.wait_requests(i + 1, Duration::from_secs(5));
        let seen = &reqs[i];
        assert_sender_is_agent(&seen.body);
        assert!(!seen.raw_text().contains("mallory"), "{method} {fields:?}: {}", seen.raw_text());
        assert_eq!(seen.head.one("content-length"), seen.body.len().to_string());
    }
}

#[test]
fn chunked_text_plain_spoof_is_dechunked_and_stamped() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let mut raw = request(
        "POST",
        "/messages/?session_id=abc",
        &host(&p),
        &[("Content-Type", "text/plain"), ("Transfer-Encoding", "chunked")],
        b"",
    );
    for part in SPOOF.chunks(10) {
        raw.extend_from_slice(&chunk(part));
    }
    raw.extend_from_slice(b"0\r\n\r\n");
    let resp = send(&p, &raw);
    assert_eq!(resp.status, 200, "{:?}", resp.raw_text());
    let seen = up.only_request();
    assert_sender_is_agent(&seen.body);
    assert!(!seen.head.has("transfer-encoding"), "{}", seen.raw_text());
}

#[test]
fn bodies_that_are_not_json_get_400_and_never_reach_the_upstream() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let h = host(&p);
    let cases: &[(&str, &[(&str, &str)], &[u8])] = &[
        // No label, a wrong one, and a lying one.
        ("POST", &[], b"sender=mallory&message=hi"),
        ("POST", &[("Content-Type", "text/plain")], b"chat_send as mallory"),
        ("POST", &[("Content-Type", "application/json")], b"{\"method\":\"tools/call\""),
        ("PUT", &[("Content-Type", "application/octet-stream")], b"\xff\xfe\x00garbage"),
        ("GET", &[("Content-Length", "5")], b"hello"),
    ];
    for (method, fields, body) in cases {
        let resp = send(&p, &request(method, "/mcp", &h, fields, body));
        assert_refused_as_not_json(&resp);
        assert_eq!(up.request_count(), 0, "{method} {fields:?} {body:?} was forwarded");
    }
    assert_healthy(&p, &up);
}

#[test]
fn chunk_announcing_past_8_mib_gets_413_before_its_data_is_sent() {
    let up = ok_upstream();
    let p = ProxyProcess::builder(up.url()).agent(AGENT).token(TOKEN).start();
    let mut c = client(&p);
    c.send(&request(
        "POST",
        "/mcp",
        &host(&p),
        &[("Content-Type", "application/json"), ("Transfer-Encoding", "chunked")],
        b"",
    ));
    // 16 MiB announced; none of it sent yet.
    let t0 = Instant::now();
    c.send(b"1000000\r\n");
    let resp = c.read_response("POST");
    assert_eq!(resp.status, 413, "{:?}", resp.raw_text());
    assert!(t0.elapsed() < Duration::from_secs(2), "413 took {:?}", t0.elapsed());
    // The client goes on sending 1 MiB anyway; nothing reaches the upstream.
    let _ = c.stream.write_all(&vec![b'x'; 1024 * 1024]);
    assert!(c.closed_within(Duration::from_secs(5)));
    // A second chunk that crosses the bound is refused as well.
    let mut c = client(&p);
    let mut raw = request("POST", "/mcp", &host(&p), &[("Transfer-Encoding", "chunked")], b"");
    raw.extend_from_slice(format!("{:x}\r\n", 5 * 1024 * 1024).as_bytes());
    raw.extend_from_slice(&vec![b' '; 5 * 1024 * 1024]);
    raw.extend_from_slice(format!("\r\n{:x}\r\n", 4 * 1024 * 1024).as_bytes());
    c.send(&raw);
    assert_eq!(c.read_response("POST").status, 413);
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}
