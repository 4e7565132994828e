//! `--stdio` under faults, as a hostile host and a faulty upstream would try
//! it: a host that floods stdin (whatever its write sizes), ids JSON-RPC
//! does not allow, an upstream that stalls under each timeout, a legacy SSE
//! server that cannot start, and a `ping` behind 64 held calls. Each
//! asserts the promise it breaks today: bounded memory, exactly one answer
//! per request, and every wait ended by an answer carrying the request's id.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::{mpsc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{
    answer_of, calls_of, error_code, handshake, mcp_upstream, slow_upstream, start, tool_call, ANSWER,
};
use crate::support::exchange::chunk;
use crate::support::setup::{dead_port, INITIALIZE, SSE_HEAD};
use crate::support::stdio_proxy::StdioProxy;
use crate::support::wire::{response, Next, Req, StubUpstream};

/// JSON-RPC's Invalid Request.
const INVALID_REQUEST: i64 = -32600;

/// Every message on stdout until none comes for `quiet`, batches flattened.
fn drain_all(p: &mut StdioProxy, quiet: Duration) -> Vec<Value> {
    let mut out = Vec::new();
    while let Some(v) = p.try_next(quiet) {
        match v {
            Value::Array(batch) => out.extend(batch),
            v => out.push(v),
        }
    }
    out
}

// ----------------------------------------------------------------------
// 1. A flood on stdin

/// Requests in each flood.
#[cfg(target_os = "linux")]
const FLOOD: usize = 20_000;
/// The bound on the proxy's peak resident memory under a flood.
#[cfg(target_os = "linux")]
const FLOOD_PEAK_KIB: u64 = 16 * 1024;

/// Writes `FLOOD` `tools/call` lines of about `line_len` bytes to stdin,
/// `write_size` bytes per write, against an upstream taking 1 ms a call.
/// Asserts each request answered exactly once, and that after each write
/// returned few requests were held unsent inside the proxy (what stdin's
/// pipe holds, one read and the queue); returns the peak RSS in KiB.
#[cfg(target_os = "linux")]
fn flood(write_size: usize, line_len: usize) -> u64 {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    let up = mcp_upstream(move |_, v, s| {
        if v["method"] != "tools/call" {
            return None;
        }
        seen.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(1));
        let answer = json!({"jsonrpc": "2.0", "id": v["id"], "result": {"content": []}});
        let _ = s.write_all(&super::json_response("200 OK", &[], &answer));
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let pad = "p".repeat(line_len.saturating_sub(110));
    let mut input = Vec::new();
    for id in 0..FLOOD {
        input.extend_from_slice(tool_call(json!(id), "work", json!({"pad": pad})).to_string().as_bytes());
        input.push(b'\n');
    }
    let per_line = input.len() / FLOOD;
    let mut stdin = p.take_stdin();
    let counter = calls.clone();
    let writer = std::thread::spawn(move || {
        let mut held_max = 0;
        let mut written = 0;
        for piece in input.chunks(write_size) {
            stdin.write_all(piece).expect("write stdin");
            written += piece.len();
            // Whole lines written, less those the upstream has: in the pipe
            // or inside the proxy.
            let held = (written / per_line).saturating_sub(counter.load(Ordering::SeqCst));
            held_max = held_max.max(held);
        }
        (held_max, stdin)
    });
    let mut answers: HashMap<u64, usize> = HashMap::new();
    let t0 = Instant::now();
    while answers.len() < FLOOD {
        assert!(t0.elapsed() < Duration::from_secs(120), "{} of {FLOOD} answered in 120 s", answers.len());
        let Some(v) = p.try_next(Duration::from_secs(10)) else { continue };
        assert!(v["result"].is_object(), "not a result: {v}");
        let id = v["id"].as_u64().unwrap_or_else(|| panic!("an answer with an id not sent: {v}"));
        *answers.entry(id).or_default() += 1;
    }
    let (held_max, stdin) = writer.join().expect("writer");
    drop(stdin);
    let peak = crate::support::procfs::peak_rss_kib(p.pid());
    p.wait_exit(Duration::from_secs(10));
    let extra = drain_all(&mut p, Duration::from_millis(300));
    assert!(extra.is_empty(), "more than one answer per request: {:?}", &extra[..extra.len().min(5)]);
    assert!(answers.values().all(|&n| n == 1), "an id answered twice");
    assert_eq!(calls.load(Ordering::SeqCst), FLOOD, "each request sent once");
    // stdin's pipe (64 KiB) and one read (64 KiB), 64 queued, 32 in flight,
    // and slack for the race between a write returning and the count.
    let bound = 2 * 64 * 1024 / per_line + 64 + 32 + 64;
    assert!(
        held_max <= bound,
        "after a write of {write_size} B returned, {held_max} requests of {per_line} B were not sent yet (bound {bound})"
    );
    eprintln!(
        "flood: writes of {write_size} B, {per_line} B a line: peak RSS {peak} KiB, at most {held_max} held"
    );
    peak
}

#[cfg(target_os = "linux")]
#[test]
fn a_flood_on_stdin_is_read_only_as_fast_as_it_is_sent_whatever_the_write_size() {
    for (write_size, line_len) in [(4 * 1024, 200), (4 * 1024 * 1024, 200), (50 * 1024 * 1024, 2_700)] {
        let peak = flood(write_size, line_len);
        assert!(
            peak <= FLOOD_PEAK_KIB,
            "writes of {write_size} B: peak RSS {peak} KiB, over {FLOOD_PEAK_KIB} KiB"
        );
    }
}

// ----------------------------------------------------------------------
// 2. Ids JSON-RPC does not allow

#[test]
fn every_id_kind_gets_exactly_one_answer_and_an_id_json_rpc_refuses_is_never_forwarded() {
    let up = super::plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let refused =
        [r#"{"a":1}"#, "[1]", "[]", "true", "false", r#""\ud800""#, r#""x\udc00y""#, "1e400", "-1e400"];
    for (n, id) in refused.iter().enumerate() {
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"chat_read"}}}}"#);
        p.send(line.as_bytes());
        let after = json!(format!("after-{n}"));
        p.send_json(&tool_call(after.clone(), "chat_send", json!({})));
        let mut got = vec![p.answer_to(&after, ANSWER)];
        got.extend(drain_all(&mut p, Duration::from_millis(400)));
        got.extend(p.pending());
        let theirs: Vec<&Value> = got.iter().filter(|v| v["id"] != after).collect();
        assert_eq!(theirs.len(), 1, "id {id}: not exactly one answer: {got:?}");
        assert_eq!(error_code(theirs[0], &Value::Null), INVALID_REQUEST, "id {id}: {got:?}");
        while p.try_next(Duration::ZERO).is_some() {}
    }
    assert!(
        calls_of(&up, "chat_read").is_empty(),
        "a refused id was forwarded: {:?}",
        calls_of(&up, "chat_read")
    );

    let allowed = [r#""abc""#, r#""""#, "7", "0", "-3", "7.5", "1e5", r#""\u00e9""#, "null"];
    for id in allowed {
        let line =
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"chat_send"}}}}"#);
        p.send(line.as_bytes());
        let got = drain_all(&mut p, Duration::from_millis(600));
        let want: Value = serde_json::from_str(id).unwrap();
        assert_eq!(got.len(), 1, "id {id}: not exactly one answer: {got:?}");
        assert_eq!(got[0]["id"], want, "id {id}: {got:?}");
        assert!(got[0]["result"].is_object(), "id {id}: {got:?}");
    }

    // A batch: the refused element is answered by the proxy, the rest sent.
    p.send(br#"[{"jsonrpc":"2.0","id":true,"method":"tools/call","params":{"name":"chat_read"}},{"jsonrpc":"2.0","id":50,"method":"tools/call","params":{"name":"chat_send"}}]"#);
    let got = drain_all(&mut p, Duration::from_millis(600));
    assert_eq!(got.len(), 2, "{got:?}");
    let refused: Vec<&Value> = got.iter().filter(|v| v["id"].is_null()).collect();
    assert_eq!(refused.len(), 1, "{got:?}");
    assert_eq!(error_code(refused[0], &Value::Null), INVALID_REQUEST);
    assert!(got.iter().any(|v| v["id"] == 50 && v["result"].is_object()), "{got:?}");
    assert!(calls_of(&up, "chat_read").is_empty(), "a refused id was forwarded in a batch");
    p.end_session(Duration::from_secs(5));
}

// ----------------------------------------------------------------------
// 3. Every timeout ends in an answer

/// An upstream that answers `tools/call` of `stall` with an event stream
/// that stops mid-event, and `tools/call` of `mute` with nothing at all.
fn stalling_upstream() -> StubUpstream {
    mcp_upstream(|_, v, s| {
        match v["params"]["name"].as_str() {
            Some("stall") => {
                let mut part = SSE_HEAD.to_vec();
                part.extend(chunk(b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":"));
                let _ = s.write_all(&part);
            }
            Some("mute") => {}
            _ => return None,
        }
        std::thread::sleep(Duration::from_secs(20));
        Some(Next::Close)
    })
}

/// Sends a call of `tool` (id "t") and asserts its error comes within
/// `limit` (and not before `not_before`).
#[track_caller]
fn error_within(p: &mut StdioProxy, tool: &str, not_before: Duration, limit: Duration, close_stdin: bool) {
    let t0 = Instant::now();
    p.send_json(&tool_call(json!("t"), tool, json!({})));
    if close_stdin {
        p.close_stdin();
    }
    let answer = p.answer_to(&json!("t"), limit + Duration::from_secs(3));
    let took = t0.elapsed();
    error_code(&answer, &json!("t"));
    assert!(took <= limit, "the error came after {took:?}, later than {limit:?}: {answer}");
    assert!(took >= not_before, "the error came after {took:?}, before the timeout: {answer}");
}

/// The slack allowed beyond a timeout (the promise is 0.5 s; a loaded CI
/// machine gets a little more).
const SLACK: Duration = Duration::from_millis(900);

#[test]
fn a_stream_that_stalls_is_answered_when_the_idle_timeout_ends_it() {
    let up = stalling_upstream();
    for secs in [3, 6] {
        let mut p = start(&up.url(), &["--idle-timeout", &secs.to_string()]);
        handshake(&mut p);
        let t = Duration::from_secs(secs);
        error_within(&mut p, "stall", t - Duration::from_millis(300), t + SLACK, false);
        p.end_session(Duration::from_secs(5));
    }
}

#[test]
fn an_upstream_that_never_answers_is_answered_when_the_response_timeout_ends_it() {
    let up = stalling_upstream();
    let mut p = start(&up.url(), &["--response-timeout", "3"]);
    handshake(&mut p);
    let t = Duration::from_secs(3);
    error_within(&mut p, "mute", t - Duration::from_millis(300), t + SLACK, false);
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_request_in_flight_when_stdin_ends_is_answered_when_the_drain_ends() {
    let up = stalling_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    // The drain is 5 s.
    let t = Duration::from_secs(5);
    error_within(&mut p, "stall", t - Duration::from_millis(300), t + SLACK, true);
    assert!(p.wait_exit(Duration::from_secs(5)).is_some_and(|s| s.success()), "{}", p.stderr_text());
    p.assert_stdout_clean();
}

// ----------------------------------------------------------------------
// 4. A legacy SSE server that cannot start

/// A legacy SSE server at `/sse` on `listener`: its stream offers one
/// session's endpoint and carries the answers to what is POSTed there.
fn legacy_upstream_on(listener: TcpListener) -> StubUpstream {
    let (tx, rx) = mpsc::channel::<Value>();
    let (tx, rx) = (Mutex::new(tx), Mutex::new(rx));
    StubUpstream::on(listener, move |req: &Req, s: &mut TcpStream| {
        if req.method == "GET" {
            let mut head = SSE_HEAD.to_vec();
            head.extend(chunk(b"event: endpoint\ndata: /messages/?session_id=one\n\n"));
            if s.write_all(&head).is_err() {
                return Next::Close;
            }
            let rx = rx.lock().unwrap();
            while let Ok(answer) = rx.recv_timeout(Duration::from_secs(15)) {
                if s.write_all(&chunk(format!("event: message\ndata: {answer}\n\n").as_bytes())).is_err() {
                    break;
                }
            }
            return Next::Close;
        }
        let _ = s.write_all(&response("202 Accepted", &[], b"Accepted"));
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        if let Some(a) = answer_of(&v) {
            let _ = tx.lock().unwrap().send(a);
        }
        Next::KeepAlive
    })
}

#[test]
fn initialize_for_a_legacy_server_that_refuses_connections_gets_the_outage_error_and_the_next_tries_again() {
    let port = dead_port();
    let mut p = start(&format!("http://127.0.0.1:{port}/sse"), &["--connect-timeout", "2"]);
    let t0 = Instant::now();
    p.send(INITIALIZE);
    let answer = p.answer_to(&json!(1), Duration::from_secs(10));
    let took = t0.elapsed();
    error_code(&answer, &json!(1));
    assert!(took <= Duration::from_secs(3) + SLACK, "the outage error came after {took:?}");
    // The server comes up: the next initialize opens the stream again.
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the dead port");
    let _up = legacy_upstream_on(listener);
    p.send(INITIALIZE);
    let answer = p.answer_to(&json!(1), ANSWER);
    assert!(answer["result"]["protocolVersion"].is_string(), "{answer}");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn initialize_for_a_legacy_stream_that_never_names_its_endpoint_gets_the_outage_error_and_the_next_tries_again(
) {
    let up = StubUpstream::start(|req, s| {
        if req.method != "GET" {
            let _ = s.write_all(&response("404 Not Found", &[], b""));
            return Next::KeepAlive;
        }
        // A stream of keep-alive comments, never an endpoint.
        let _ = s.write_all(SSE_HEAD);
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(20) && s.write_all(&chunk(b": ping\n\n")).is_ok() {
            std::thread::sleep(Duration::from_millis(500));
        }
        Next::Close
    });
    let mut p = start(&format!("http://127.0.0.1:{}/sse", up.port), &["--connect-timeout", "2"]);
    let gets = || up.requests().iter().filter(|r| r.method == "GET").count();
    for round in 0..2 {
        let t0 = Instant::now();
        p.send(INITIALIZE);
        let answer = p.answer_to(&json!(1), Duration::from_secs(10));
        let took = t0.elapsed();
        error_code(&answer, &json!(1));
        assert!(
            took <= Duration::from_secs(3) + SLACK,
            "round {round}: the outage error came after {took:?}"
        );
        assert_eq!(gets(), round + 1, "round {round}: one stream per try");
    }
    p.end_session(Duration::from_secs(5));
}

// ----------------------------------------------------------------------
// 5. A ping behind held calls

#[test]
fn a_ping_behind_64_held_calls_is_answered_by_the_proxy_within_a_second_or_so() {
    let up = slow_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    for id in 0..64 {
        p.send_json(&tool_call(json!(100 + id), "slow", json!({"ms": 8000})));
    }
    // 32 in flight (the cap), 32 queued behind them.
    let t0 = Instant::now();
    while calls_of(&up, "slow").len() < 32 {
        assert!(t0.elapsed() < ANSWER, "only {} calls reached the upstream", calls_of(&up, "slow").len());
        std::thread::sleep(Duration::from_millis(20));
    }
    let t0 = Instant::now();
    p.send(br#"{"jsonrpc":"2.0","id":"p","method":"ping"}"#);
    let answer = p.answer_to(&json!("p"), Duration::from_secs(5));
    let took = t0.elapsed();
    assert_eq!(answer["result"], json!({}), "{answer}");
    assert!(took <= Duration::from_secs(1) + SLACK, "the ping waited {took:?}");
    assert!(took >= Duration::from_millis(900), "answered before it waited its second: {took:?}");
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !super::posted(&up).iter().any(|v| v["method"] == "ping"),
        "the ping the proxy answered was sent upstream too"
    );
}
