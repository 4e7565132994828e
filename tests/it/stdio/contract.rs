//! The stdio contract: stdout carries JSON-RPC lines only, a line that is not
//! JSON-RPC is answered and the session goes on, `--stdio` refuses a listener
//! and `--control-stdin`, `--metrics-listen` works beside it, and the end of
//! the session: stdin's EOF and SIGTERM DELETE it upstream, answers in flight
//! at stdin's end still arrive.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{deleted, error_code, handshake, plain_upstream, slow_upstream, start, tool_call, ANSWER};
use crate::support::setup::{assert_credentials, dead_port, TOOLS_LIST};

#[test]
fn stdout_carries_only_json_rpc_and_a_line_that_is_not_json_rpc_is_answered_with_id_null() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let list = p.call(&serde_json::from_slice(TOOLS_LIST).unwrap());
    assert_eq!(list["result"]["tools"][0]["name"], "chat_send", "{list}");
    for (line, code) in [
        (&b"this is not json"[..], -32700),
        (b"{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":", -32700),
        (b"42", -32600),
        (b"[]", -32600),
    ] {
        p.send(line);
        let answer = p.next(ANSWER);
        assert_eq!(error_code(&answer, &Value::Null), code, "{}: {answer}", String::from_utf8_lossy(line));
    }
    // Blank lines and CRLF endings are no messages: nothing answers them.
    p.send_raw(b"\n  \r\n");
    let answer = p.call(&tool_call(json!(9), "chat_read", json!({})));
    assert_eq!(answer["result"]["method"], "tools/call", "the session goes on: {answer}");
    p.end_session(Duration::from_secs(5));
    assert!(p.pending().is_empty(), "unexpected messages: {:?}", p.pending());
    // The log (RUST_LOG=debug) went to stderr, not stdout.
    assert!(p.stderr_text().contains("stdio"), "no log on stderr:\n{}", p.stderr_text());
    let posted = super::posted(&up);
    assert_eq!(posted.len(), 4, "only the four JSON-RPC messages went upstream: {posted:?}");
}

#[test]
fn stdio_beside_listen_or_control_stdin_exits_2_with_nothing_on_stdout() {
    let url = format!("http://127.0.0.1:{}/mcp", dead_port());
    for extra in [&["--listen", "127.0.0.1:0"][..], &["--control-stdin"]] {
        let mut p = start(&url, extra);
        let status = p.wait_exit(Duration::from_secs(5));
        assert_eq!(status.and_then(|s| s.code()), Some(2), "{extra:?}: {status:?}\n{}", p.stderr_text());
        p.wait_stdout_eof();
        assert_eq!(p.stdout_read(), (0, 0), "{extra:?}: stdout must stay empty");
        assert!(p.stderr_text().contains("--stdio"), "{extra:?}: {}", p.stderr_text());
    }
}

/// The counter line `name{labels} N` in `text`.
fn counter(text: &str, series: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn metrics_listen_beside_stdio_prints_its_port_on_stderr_and_counts_the_stdio_requests() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &["--metrics-listen", "127.0.0.1:0"]);
    handshake(&mut p);
    p.call(&serde_json::from_slice(TOOLS_LIST).unwrap());
    for id in 10..13 {
        p.call(&tool_call(json!(id), "chat_send", json!({"message": "m"})));
    }
    let (status, _) = p.metrics_get("/healthz");
    assert_eq!(status, 200);
    let want = [
        ("mcp_proxy_requests_total{method=\"initialize\",outcome=\"ok\"}", 1),
        ("mcp_proxy_requests_total{method=\"tools/list\",outcome=\"ok\"}", 1),
        ("mcp_proxy_requests_total{method=\"tools/call\",outcome=\"ok\"}", 3),
        ("mcp_proxy_tool_calls_total{tool=\"chat_send\",outcome=\"ok\"}", 3),
    ];
    let t0 = Instant::now();
    let text = loop {
        let (status, text) = p.metrics_get("/metrics");
        assert_eq!(status, 200, "{text}");
        if want.iter().all(|(s, n)| counter(&text, s) == Some(*n)) || t0.elapsed() > Duration::from_secs(5) {
            break text;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    for (series, n) in want {
        assert_eq!(counter(&text, series), Some(n), "{series}:\n{text}");
    }
    p.end_session(Duration::from_secs(5));
}

#[test]
fn stdin_eof_deletes_the_session_upstream_and_exits_0() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.call(&tool_call(json!("a"), "chat_read", json!({})));
    let took = p.end_session(Duration::from_secs(5));
    let delete = deleted(&up, Duration::ZERO);
    assert_credentials(&delete);
    // The DELETE is the last request sent: only the GET stream's own record
    // (the stand-in notes a stream when it ends) may come after it.
    let requests = up.requests();
    let at = requests.iter().rposition(|r| r.method == "DELETE").expect("a DELETE");
    let after: Vec<_> = requests[at + 1..].iter().map(|r| r.method.clone()).collect();
    assert!(after.iter().all(|m| m == "GET"), "sent after the DELETE: {after:?}");
    assert!(took < Duration::from_secs(2), "an idle session took {took:?} to end");
}

/// SIGTERM with a call in flight: the session is DELETEd and the process
/// exits 0 at once, without waiting for the answer as stdin's end would.
#[cfg(unix)]
#[test]
fn sigterm_deletes_the_session_and_exits_0_without_waiting_for_answers() {
    let up = slow_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_json(&tool_call(json!(7), "slow", json!({"ms": 4000})));
    let t0 = Instant::now();
    while super::calls_of(&up, "slow").is_empty() {
        assert!(t0.elapsed() < ANSWER, "the slow call never reached the upstream");
        std::thread::sleep(Duration::from_millis(10));
    }
    let t0 = Instant::now();
    p.signal("TERM");
    let status = p.wait_exit(Duration::from_secs(5));
    let took = t0.elapsed();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}\n{}", p.stderr_text());
    assert!(took < Duration::from_secs(3), "SIGTERM took {took:?} with a 4 s call in flight");
    deleted(&up, Duration::ZERO);
    p.wait_stdout_eof();
    p.assert_stdout_clean();
}

#[test]
fn stdin_closed_with_calls_in_flight_gets_their_answers_then_the_delete() {
    let up = slow_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let t0 = Instant::now();
    for id in 1..=3 {
        p.send_json(&tool_call(json!(format!("slow-{id}")), "slow", json!({"ms": 1500})));
    }
    p.close_stdin();
    for id in 1..=3 {
        let answer = p.answer_to(&json!(format!("slow-{id}")), Duration::from_secs(5));
        assert_eq!(answer["result"]["method"], "tools/call", "{answer}");
    }
    let answered = t0.elapsed();
    assert!(answered < Duration::from_secs(5), "the answers took {answered:?}");
    let status = p.wait_exit(Duration::from_secs(5));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}\n{}", p.stderr_text());
    let reqs = up.requests();
    assert_eq!(reqs.last().map(|r| r.method.as_str()), Some("DELETE"), "the DELETE comes last: {reqs:#?}");
    assert_eq!(super::calls_of(&up, "slow").len(), 3);
    p.wait_stdout_eof();
    p.assert_stdout_clean();
}

#[test]
fn a_last_line_without_its_newline_is_read_at_stdin_eof() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_raw(br#"{"jsonrpc":"2.0","id":"last","method":"tools/call","params":{"name":"chat_read"}}"#);
    p.close_stdin();
    let answer = p.answer_to(&json!("last"), ANSWER);
    assert_eq!(answer["result"]["method"], "tools/call", "{answer}");
    assert_eq!(p.wait_exit(Duration::from_secs(5)).and_then(|s| s.code()), Some(0));
    deleted(&up, Duration::ZERO);
    p.wait_stdout_eof();
    p.assert_stdout_clean();
}

#[test]
fn a_host_that_closes_stdout_ends_the_session_with_its_delete_and_exit_0() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.close_stdout_after_next_line();
    p.call(&tool_call(json!(1), "chat_read", json!({})));
    // stdout is closed now: the next answer cannot be written.
    p.send_json(&tool_call(json!(2), "chat_read", json!({})));
    let status = p.wait_exit(Duration::from_secs(5));
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{status:?}\n{}", p.stderr_text());
    deleted(&up, Duration::ZERO);
}
