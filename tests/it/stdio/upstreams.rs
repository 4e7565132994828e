//! Stand-ins for what a real server cannot be made to do on demand: event
//! stream answers in every form, server-to-client requests the host answers,
//! batches, a slow call beside a fast one, cancellation, a session the
//! upstream does not know, an upstream that is not there, an error answer
//! under a foreign id, legacy SSE (a real FastMCP) and the fallback to it.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::{
    answer_of, error_code, handshake, json_response, mcp_upstream, posted, slow_upstream, start, tool_call,
    ANSWER,
};
use crate::support::exchange::chunk;
use crate::support::setup::{
    assert_credentials, dead_port, AGENT, INITIALIZE, INITIALIZED, SESSION, SSE_HEAD,
};
use crate::support::wire::{response, Next, Req, StubUpstream};

/// What the host sent the stand-in (its answers to the server's requests),
/// for the handler that waits on them.
#[derive(Clone, Default)]
struct Mailbox(Arc<(Mutex<Vec<Value>>, Condvar)>);

impl Mailbox {
    fn put(&self, v: Value) {
        self.0 .0.lock().unwrap().push(v);
        self.0 .1.notify_all();
    }

    /// The first message with `id` (waits up to `ANSWER`).
    fn take(&self, id: &Value) -> Option<Value> {
        let deadline = Instant::now() + ANSWER;
        let mut got = self.0 .0.lock().unwrap();
        loop {
            if let Some(at) = got.iter().position(|v| &v["id"] == id) {
                return Some(got.remove(at));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            got = self.0 .1.wait_timeout(got, left).unwrap().0;
        }
    }
}

/// One SSE event (its text as given) as a chunk of a chunked body.
fn event(text: &str) -> Vec<u8> {
    chunk(text.as_bytes())
}

fn message_event(v: &Value) -> Vec<u8> {
    event(&format!("event: message\ndata: {v}\n\n"))
}

/// A host's answer to a server request is accepted (202) and kept in `mail`.
fn accept_answers(mail: &Mailbox, v: &Value, s: &mut TcpStream) -> Option<Next> {
    if v.get("method").is_some() || v.get("id").is_none() {
        return None;
    }
    mail.put(v.clone());
    let _ = s.write_all(&response("202 Accepted", &[], b""));
    Some(Next::KeepAlive)
}

#[test]
fn an_event_stream_answer_with_multi_line_data_and_pretty_json_becomes_one_line_per_message() {
    let up = mcp_upstream(|_, v, s| {
        if v["params"]["name"] != "pretty" {
            return None;
        }
        let id = v["id"].to_string();
        let mut body = SSE_HEAD.to_vec();
        // A notification over three data: lines, CRLF endings, a comment and a retry field.
        body.extend(event(
            ": a comment\r\nretry: 100\r\nevent: message\r\ndata: {\"jsonrpc\":\"2.0\",\r\ndata:  \"method\":\"notifications/progress\",\r\ndata:  \"params\":{\"progressToken\":1,\"progress\":1,\"message\":\"tab\\tand\\nnewline\"}}\r\n\r\n",
        ));
        // The answer pretty-printed, a string broken over two data: lines
        // (a raw line break inside a string once joined), split across chunks.
        let pretty = format!(
            "id: 7\ndata: {{\ndata:   \"jsonrpc\": \"2.0\",\ndata:   \"id\": {id},\ndata:   \"result\": {{\ndata:     \"content\": [],\ndata:     \"text\": \"first\ndata: second\"\ndata:   }}\ndata: }}\n\n"
        );
        let (a, b) = pretty.split_at(pretty.len() / 2);
        body.extend(event(a));
        body.extend(event(b));
        body.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&body);
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_json(&tool_call(json!(5), "pretty", json!({})));
    let progress = p.next(ANSWER);
    assert_eq!(
        progress,
        json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1,"message":"tab\tand\nnewline"}})
    );
    let answer = p.next(ANSWER);
    assert_eq!(answer, json!({"jsonrpc":"2.0","id":5,"result":{"content":[],"text":"first\nsecond"}}));
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_server_request_on_the_posts_event_stream_is_answered_by_the_host_as_a_post() {
    let mail = Mailbox::default();
    let theirs = mail.clone();
    let up = mcp_upstream(move |_, v, s| {
        if let Some(next) = accept_answers(&theirs, v, s) {
            return Some(next);
        }
        if v["params"]["name"] != "ask_roots" {
            return None;
        }
        let mut head = SSE_HEAD.to_vec();
        head.extend(message_event(&json!({"jsonrpc":"2.0","id":"srv-1","method":"roots/list"})));
        let _ = s.write_all(&head);
        let roots = theirs.take(&json!("srv-1")).map(|a| a["result"]["roots"].clone());
        let answer = json!({"jsonrpc":"2.0","id":v["id"],"result":{"content":[],"roots_seen":roots}});
        let mut tail = message_event(&answer);
        tail.extend_from_slice(b"0\r\n\r\n");
        let _ = s.write_all(&tail);
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_json(&tool_call(json!("t-1"), "ask_roots", json!({})));
    let request = p.wait_for("roots/list", ANSWER, |v| v["method"] == "roots/list");
    assert_eq!(request, json!({"jsonrpc":"2.0","id":"srv-1","method":"roots/list"}));
    let roots = json!([{"uri": "file:///work/project", "name": "project"}]);
    p.send_json(&json!({"jsonrpc":"2.0","id":"srv-1","result":{"roots": roots}}));
    let answer = p.answer_to(&json!("t-1"), ANSWER);
    assert_eq!(answer["result"]["roots_seen"], roots, "the upstream got the host's answer: {answer}");
    let post = up
        .requests()
        .into_iter()
        .find(|r| r.method == "POST" && String::from_utf8_lossy(&r.body).contains("\"srv-1\""))
        .expect("the host's answer POSTed");
    assert_eq!(post.head.all("mcp-session-id"), [SESSION]);
    assert_credentials(&post);
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_server_request_on_the_get_stream_is_answered_by_the_host_as_a_post() {
    let mail = Mailbox::default();
    let theirs = mail.clone();
    let asked = Arc::new(Mutex::new(false));
    let up = mcp_upstream(move |req, v, s| {
        if let Some(next) = accept_answers(&theirs, v, s) {
            return Some(next);
        }
        if req.method != "GET" {
            return None;
        }
        let _ = s.write_all(SSE_HEAD);
        if !std::mem::replace(&mut *asked.lock().unwrap(), true) {
            let ask = json!({"jsonrpc":"2.0","id":77,"method":"elicitation/create","params":{"message":"Which branch?","requestedSchema":{"type":"object","properties":{"branch":{"type":"string"}}}}});
            let _ = s.write_all(&message_event(&ask));
            let got = theirs.take(&json!(77)).unwrap_or(Value::Null);
            let note = json!({"jsonrpc":"2.0","method":"notifications/message","params":{"level":"info","data":got}});
            let _ = s.write_all(&message_event(&note));
        }
        // Held open (a comment now and then) until the proxy closes it.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(15) && s.write_all(&event(": keep-alive\n\n")).is_ok() {
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(Next::Close)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let ask = p.wait_for("elicitation/create", ANSWER, |v| v["method"] == "elicitation/create");
    assert_eq!(ask["id"], 77, "{ask}");
    let reply = json!({"jsonrpc":"2.0","id":77,"result":{"action":"accept","content":{"branch":"main"}}});
    p.send_json(&reply);
    let note = p.wait_for("the server's notification", ANSWER, |v| v["method"] == "notifications/message");
    assert_eq!(note["params"]["data"], reply, "the upstream got the host's answer as sent: {note}");
    let get = up.requests().into_iter().find(|r| r.method == "GET").expect("a GET stream");
    assert_eq!(get.head.all("mcp-session-id"), [SESSION]);
    assert_eq!(get.head.all("accept"), ["text/event-stream"]);
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_batch_gets_its_answers_on_one_line_and_its_calls_are_stamped() {
    let up = mcp_upstream(|_, _, _| None);
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_json(&json!([
        {"jsonrpc":"2.0","id":"b1","method":"tools/list"},
        {"jsonrpc":"2.0","id":"b2","method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"mallory"}}},
        {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}},
    ]));
    let answer = p.next(ANSWER);
    let batch = answer.as_array().unwrap_or_else(|| panic!("not a batch answer: {answer}"));
    let ids: Vec<&Value> = batch.iter().map(|a| &a["id"]).collect();
    assert_eq!(ids, [&json!("b1"), &json!("b2")], "{answer}");
    assert_eq!(batch[1]["result"]["arguments"]["sender"], AGENT, "{answer}");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_slow_tool_call_does_not_hold_back_a_fast_one_sent_after_it() {
    let up = slow_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let t0 = Instant::now();
    p.send_json(&tool_call(json!("slow"), "slow", json!({"ms": 2000})));
    p.send_json(&tool_call(json!("fast"), "chat_read", json!({})));
    let first = p.next(ANSWER);
    let fast_took = t0.elapsed();
    assert_eq!(first["id"], "fast", "the fast answer comes first: {first}");
    assert!(fast_took < Duration::from_secs(1), "the fast answer took {fast_took:?}");
    let second = p.next(ANSWER);
    assert_eq!(second["id"], "slow", "{second}");
    assert!(t0.elapsed() >= Duration::from_secs(2));
    p.end_session(Duration::from_secs(5));
}

#[test]
fn notifications_cancelled_is_forwarded_while_the_call_is_in_flight() {
    let up = slow_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_json(&tool_call(json!("c1"), "slow", json!({"ms": 1500})));
    let cancel = json!({"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"c1","reason":"the user stopped it"}});
    p.send_json(&cancel);
    let t0 = Instant::now();
    let seen = loop {
        let found =
            up.requests().into_iter().find(|r| r.method == "POST" && r.body == cancel.to_string().as_bytes());
        if let Some(r) = found {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(1),
            "no cancellation upstream within 1 s: {:?}",
            posted(&up)
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(seen.head.all("mcp-session-id"), [SESSION]);
    // The stand-in ignores it and answers anyway; the answer still reaches the host.
    assert_eq!(p.answer_to(&json!("c1"), ANSWER)["result"]["method"], "tools/call");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn an_upstream_404_for_an_unrecorded_session_answers_each_request_with_its_id() {
    const NOT_FOUND: &str =
        r#"{"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}"#;
    let up = mcp_upstream(|req, v, s| {
        if v["method"] == "initialize" {
            // No protocolVersion: the proxy cannot record the session for a replay.
            let answer = json!({"jsonrpc":"2.0","id":v["id"],"result":{"capabilities":{},"serverInfo":{"name":"x","version":"1"}}});
            let _ = s.write_all(&json_response("200 OK", &[("Mcp-Session-Id", SESSION)], &answer));
            return Some(Next::KeepAlive);
        }
        if req.method == "POST" && v.get("id").is_some() || v.is_array() {
            let _ = s.write_all(&response(
                "404 Not Found",
                &[("Content-Type", "application/json")],
                NOT_FOUND.as_bytes(),
            ));
            return Some(Next::KeepAlive);
        }
        None
    });
    let mut p = start(&up.url(), &[]);
    p.send(INITIALIZE);
    assert!(p.answer_to(&json!(1), ANSWER)["result"].is_object());
    p.send(INITIALIZED);
    for id in [json!(2), json!("call-3")] {
        let answer = p.call(&tool_call(id.clone(), "chat_read", json!({})));
        assert_eq!(error_code(&answer, &id), -32600, "{answer}");
        assert_eq!(answer["error"]["message"], "Session not found", "the server's own error: {answer}");
    }
    p.send_json(&json!([
        {"jsonrpc":"2.0","id":"b1","method":"tools/list"},
        {"jsonrpc":"2.0","id":"b2","method":"tools/list"},
    ]));
    // The batch's answer: the server's error under each request's id.
    let answer = p.next(ANSWER);
    let batch = answer.as_array().unwrap_or_else(|| panic!("not a batch answer: {answer}"));
    assert_eq!(batch.len(), 2, "{answer}");
    for (a, id) in batch.iter().zip([json!("b1"), json!("b2")]) {
        assert_eq!(error_code(a, &id), -32600, "{answer}");
        assert_eq!(a["error"]["message"], "Session not found", "{answer}");
    }
    p.end_session(Duration::from_secs(5));
    assert!(p.pending().is_empty(), "an answer the host did not ask for: {:?}", p.pending());
}

#[test]
fn an_unreachable_upstream_answers_each_request_with_its_id_and_the_process_keeps_serving() {
    let port = dead_port();
    let mut p = start(&format!("http://127.0.0.1:{port}/mcp"), &[]);
    p.send(INITIALIZE);
    let answer = p.answer_to(&json!(1), ANSWER);
    error_code(&answer, &json!(1));
    let message = answer["error"]["message"].as_str().unwrap_or("").to_ascii_lowercase();
    assert!(message.contains("refused") || message.contains("unreachable"), "the cause is named: {answer}");
    let answer = p.call(&tool_call(json!("u-2"), "chat_read", json!({})));
    error_code(&answer, &json!("u-2"));
    // The upstream comes up on that port: the same process serves it.
    let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the dead port again");
    let up = StubUpstream::on(listener, |req, s| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let _ = s.write_all(&super::default_answer(req, &v));
        Next::KeepAlive
    });
    handshake(&mut p);
    let answer = p.call(&tool_call(json!(4), "chat_send", json!({"sender": "x"})));
    assert_eq!(answer["result"]["arguments"]["sender"], AGENT, "{answer}");
    p.end_session(Duration::from_secs(5));
    assert!(up.requests().iter().any(|r| r.method == "DELETE"));
}

#[test]
fn an_error_answer_under_a_foreign_id_comes_out_with_the_requests_id() {
    // agentchattr answers the `server/discover` Claude Code sends first this way.
    let up = mcp_upstream(|_, v, s| {
        if v["method"] != "server/discover" {
            return None;
        }
        let body = json!({"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Bad Request: Missing session ID"}});
        let _ = s.write_all(&json_response("400 Bad Request", &[], &body));
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    let t0 = Instant::now();
    let answer = p.call(&json!({"jsonrpc":"2.0","id":0,"method":"server/discover","params":{}}));
    assert_eq!(
        answer,
        json!({"jsonrpc":"2.0","id":0,"error":{"code":-32600,"message":"Bad Request: Missing session ID"}})
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "took {:?}", t0.elapsed());
    // The host falls back to initialize.
    handshake(&mut p);
    p.end_session(Duration::from_secs(5));
}

/// A legacy SSE server at `/mcp` that refuses a streamable `initialize`
/// (405) and whose GET offers `endpoint`: messages POSTed there (202) are
/// answered on the stream.
fn legacy_only_upstream() -> StubUpstream {
    let (tx, rx) = std::sync::mpsc::channel::<Value>();
    let tx = Mutex::new(tx);
    let rx = Mutex::new(rx);
    StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        match (req.method.as_str(), req.target.as_str()) {
            ("POST", "/mcp") => {
                let _ = s.write_all(&response("405 Method Not Allowed", &[("Allow", "GET")], b""));
                Next::KeepAlive
            }
            ("GET", "/mcp") => {
                let mut head = SSE_HEAD.to_vec();
                head.extend(event("event: endpoint\ndata: /messages/?session_id=legacy-1\n\n"));
                if s.write_all(&head).is_err() {
                    return Next::Close;
                }
                let rx = rx.lock().unwrap();
                let t0 = Instant::now();
                while t0.elapsed() < Duration::from_secs(15) {
                    let out = match rx.recv_timeout(Duration::from_millis(100)) {
                        Ok(answer) => message_event(&answer),
                        Err(_) => event(": ping\n\n"),
                    };
                    if s.write_all(&out).is_err() {
                        break;
                    }
                }
                Next::Close
            }
            ("POST", "/messages/?session_id=legacy-1") => {
                let _ = s.write_all(&response("202 Accepted", &[], b"Accepted"));
                let answers: Vec<Value> = match &v {
                    Value::Array(b) => b.iter().filter_map(answer_of).collect(),
                    v => answer_of(v).into_iter().collect(),
                };
                for a in answers {
                    let _ = tx.lock().unwrap().send(a);
                }
                Next::KeepAlive
            }
            _ => {
                let _ = s.write_all(&response("404 Not Found", &[], b""));
                Next::KeepAlive
            }
        }
    })
}

#[test]
fn an_upstream_that_refuses_a_streamable_initialize_and_offers_an_endpoint_is_used_as_legacy_sse() {
    let up = legacy_only_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let answer = p.call(&tool_call(json!(3), "chat_send", json!({"sender": "mallory", "message": "m"})));
    assert_eq!(answer["result"]["arguments"]["sender"], AGENT, "{answer}");
    p.end_session(Duration::from_secs(5));
    let reqs = up.requests();
    let seen: Vec<String> = reqs.iter().map(|r| format!("{} {}", r.method, r.target)).collect();
    assert_eq!(seen[..2], ["POST /mcp", "GET /mcp"], "{seen:?}");
    let messages: Vec<Value> = reqs
        .iter()
        .filter(|r| r.target == "/messages/?session_id=legacy-1")
        .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
        .collect();
    let methods: Vec<&str> = messages.iter().filter_map(|m| m["method"].as_str()).collect();
    assert_eq!(methods, ["initialize", "notifications/initialized", "tools/call"], "{seen:?}");
    for r in &reqs {
        assert_credentials(r);
    }
}

/// Unix only: the py1 venv (bin/python).
#[cfg(unix)]
#[test]
fn a_legacy_sse_fastmcp_server_is_reached_at_its_sse_url() {
    use crate::support::setup::TOKEN;
    let server = crate::support::realenv::FastMcp::start(crate::support::realenv::py1(), "sse", TOKEN);
    let mut p = start(&server.url("/sse"), &[]);
    p.send(INITIALIZE);
    let init = p.answer_to(&json!(1), ANSWER);
    assert!(init["result"]["protocolVersion"].is_string(), "{init}");
    p.send(INITIALIZED);
    let list = p.call(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    let tools = list["result"]["tools"].as_array().map_or(0, Vec::len);
    assert!(tools >= 4, "{list}");
    let answer = p.call(&tool_call(json!(3), "chat_send", json!({"sender": "mallory", "message": "legacy"})));
    let text = answer["result"]["content"][0]["text"].as_str().unwrap_or("");
    let seen: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {answer}"));
    assert_eq!(seen["sender"], AGENT, "{seen}");
    assert_eq!(seen["authorization"], json!([format!("Bearer {TOKEN}")]), "{seen}");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_body_that_is_not_json_rpc_never_reaches_stdout_and_the_request_gets_an_error_with_its_id() {
    let up = mcp_upstream(|req, v, s| {
        let answer = match (req.method.as_str(), v["params"]["name"].as_str()) {
            // A GET answered with JSON (a server that offers no stream, badly).
            ("GET", _) => json_response("200 OK", &[], &json!({"hello": "world"})),
            ("POST", Some("json")) => json_response("200 OK", &[], &json!({"ok": true})),
            ("POST", Some("detail")) => json_response("404 Not Found", &[], &json!({"detail": "Not Found"})),
            ("POST", Some("text")) => {
                response("500 Internal Server Error", &[("Content-Type", "text/plain")], b"oops")
            }
            _ => return None,
        };
        let _ = s.write_all(&answer);
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    for (id, tool, cause) in
        [("j", "json", "held no response"), ("d", "detail", "404"), ("t", "text", "oops")]
    {
        let answer = p.call(&tool_call(json!(id), tool, json!({})));
        error_code(&answer, &json!(id));
        let message = answer["error"]["message"].as_str().unwrap_or("");
        assert!(message.contains(cause), "{tool}: {answer}");
    }
    // A GET answered with anything but an event stream offers none: it is not asked again.
    std::thread::sleep(Duration::from_millis(2500));
    let gets = up.requests().iter().filter(|r| r.method == "GET").count();
    assert_eq!(gets, 1, "GETs after one answered with JSON");
    p.end_session(Duration::from_secs(5));
    assert!(p.pending().is_empty(), "{:?}", p.pending());
}

#[test]
fn a_message_too_large_to_hold_streams_whole_while_other_answers_wait_for_the_line() {
    // 1 MiB of text in a pretty-printed answer over many data: lines, sent in
    // pieces: it streams to stdout (past 64 KiB) while a fast answer comes.
    let text: String = (0..1024 * 1024).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
    let theirs = text.clone();
    let up = mcp_upstream(move |_, v, s| {
        if v["params"]["name"] != "big" {
            return None;
        }
        let pretty = serde_json::to_string_pretty(
            &json!({"jsonrpc":"2.0","id":v["id"],"result":{"content":[],"text":theirs}}),
        )
        .unwrap_or_default();
        let mut event = String::from("event: message\n");
        for line in pretty.lines() {
            event.push_str("data: ");
            event.push_str(line);
            event.push('\n');
        }
        event.push('\n');
        let _ = s.write_all(SSE_HEAD);
        for piece in event.as_bytes().chunks(event.len() / 8 + 1) {
            std::thread::sleep(Duration::from_millis(60));
            if s.write_all(&chunk(piece)).is_err() {
                return Some(Next::Close);
            }
        }
        let _ = s.write_all(b"0\r\n\r\n");
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    p.send_json(&tool_call(json!("big"), "big", json!({})));
    std::thread::sleep(Duration::from_millis(150));
    p.send_json(&tool_call(json!("small"), "chat_read", json!({})));
    let big = p.answer_to(&json!("big"), ANSWER);
    assert!(big["result"]["text"] == text.as_str(), "the large answer is cut or changed");
    let small = p.answer_to(&json!("small"), ANSWER);
    assert_eq!(small["result"]["method"], "tools/call");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn forty_calls_at_once_are_all_answered_with_at_most_32_in_flight() {
    let now = Arc::new(Mutex::new((0usize, 0usize)));
    let theirs = now.clone();
    let up = mcp_upstream(move |_, v, s| {
        if v["params"]["name"] != "wait" {
            return None;
        }
        {
            let mut n = theirs.lock().unwrap();
            n.0 += 1;
            n.1 = n.1.max(n.0);
        }
        std::thread::sleep(Duration::from_millis(500));
        theirs.lock().unwrap().0 -= 1;
        let _ = s.write_all(&json_response("200 OK", &[], &answer_of(v).unwrap_or(Value::Null)));
        Some(Next::KeepAlive)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let t0 = Instant::now();
    for id in 0..40 {
        p.send_json(&tool_call(json!(id), "wait", json!({})));
    }
    for id in 0..40 {
        let answer = p.answer_to(&json!(id), ANSWER);
        assert_eq!(answer["result"]["method"], "tools/call", "{answer}");
    }
    let took = t0.elapsed();
    let most = now.lock().unwrap().1;
    assert_eq!(most, 32, "calls in flight at once upstream");
    assert!(took < Duration::from_secs(3), "40 calls of 0.5 s took {took:?}");
    p.end_session(Duration::from_secs(5));
}

/// A legacy SSE server at `/sse` whose stream `n` offers the endpoint of
/// session `s<n>`, answers that session's messages, and ends after it has
/// carried the answer to a call of the tool `end_stream`.
fn legacy_restarting_upstream() -> StubUpstream {
    use std::collections::HashMap;
    use std::sync::mpsc::{channel, Sender};
    let streams: Arc<Mutex<HashMap<String, Sender<Value>>>> = Arc::default();
    let opened = Arc::new(Mutex::new(0));
    StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        if req.method == "GET" && req.target == "/sse" {
            let session = {
                let mut n = opened.lock().unwrap();
                *n += 1;
                format!("s{n}")
            };
            let (tx, rx) = channel();
            streams.lock().unwrap().insert(session.clone(), tx);
            let mut head = SSE_HEAD.to_vec();
            head.extend(event(&format!("event: endpoint\ndata: /messages/?session_id={session}\n\n")));
            let _ = s.write_all(&head);
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(15) {
                let Ok(answer) = rx.recv_timeout(Duration::from_millis(100)) else { continue };
                let end = answer["result"]["arguments"]["end"] == true;
                if s.write_all(&message_event(&answer)).is_err() || end {
                    break;
                }
            }
            let _ = s.write_all(b"0\r\n\r\n");
            return Next::Close;
        }
        let session = req.target.strip_prefix("/messages/?session_id=").unwrap_or("").to_string();
        let tx = streams.lock().unwrap().get(&session).cloned();
        let Some(tx) = tx else {
            let _ = s.write_all(&response("404 Not Found", &[], b"Could not find session"));
            return Next::KeepAlive;
        };
        // The answer goes on the stream before the POST's own 202, as it may.
        if let Some(mut a) = answer_of(&v) {
            if v["params"]["name"] == "end_stream" {
                a["result"]["arguments"] = json!({"end": true});
            }
            let _ = tx.send(a);
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = s.write_all(&response("202 Accepted", &[], b"Accepted"));
        Next::KeepAlive
    })
}

#[test]
fn a_lost_legacy_stream_is_opened_again_and_the_session_set_up_anew_unseen_by_the_host() {
    let up = legacy_restarting_upstream();
    let mut p = start(&format!("http://127.0.0.1:{}/sse", up.port), &[]);
    handshake(&mut p);
    let answer = p.call(&tool_call(json!("e"), "end_stream", json!({})));
    assert_eq!(answer["result"]["arguments"]["end"], true, "{answer}");
    // The stream ended with that answer. The next call is made once the
    // proxy has seen the end (it asks for a new stream): a call that races
    // the end is sent on the old session and gets an error naming the lost
    // stream instead of being sent twice (a tool call is not repeated), and
    // under wine the end can be read a little after the answer.
    let t0 = Instant::now();
    let streams = || up.requests().iter().filter(|r| r.method == "GET" && r.target == "/sse").count();
    while streams() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the proxy never asked for a new stream");
        std::thread::sleep(Duration::from_millis(20));
    }
    let answer = p.call(&tool_call(json!("after"), "chat_send", json!({"sender": "x"})));
    assert_eq!(answer["result"]["arguments"]["sender"], AGENT, "{answer}");
    p.end_session(Duration::from_secs(5));
    assert!(p.pending().is_empty(), "the host saw more than its answers: {:?}", p.pending());
    let on = |session: &str| -> Vec<Value> {
        up.requests()
            .iter()
            .filter(|r| r.target == format!("/messages/?session_id={session}"))
            .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
            .collect()
    };
    let methods = |msgs: Vec<Value>| -> Vec<String> {
        msgs.iter().map(|m| m["method"].as_str().unwrap_or("?").to_string()).collect()
    };
    assert_eq!(methods(on("s1")), ["initialize", "notifications/initialized", "tools/call"]);
    assert_eq!(methods(on("s2")), ["initialize", "notifications/initialized", "tools/call"]);
    assert_eq!(on("s2")[0]["params"], on("s1")[0]["params"], "the host's initialize, replayed");
}

/// A server refuses requests before `notifications/initialized` (the Python
/// SDK's raises "Received request before initialization was complete"): the
/// host writes it and its next request at once, and the proxy must not let
/// the request overtake it on another connection.
#[test]
fn no_request_overtakes_notifications_initialized() {
    let answered_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let arrived_at: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (answered, arrived) = (answered_at.clone(), arrived_at.clone());
    let up = mcp_upstream(move |_, v, s| match v["method"].as_str() {
        Some("notifications/initialized") => {
            std::thread::sleep(Duration::from_millis(300));
            let _ = s.write_all(&response("202 Accepted", &[], b""));
            *answered.lock().unwrap() = Some(Instant::now());
            Some(Next::KeepAlive)
        }
        Some("tools/list") => {
            *arrived.lock().unwrap() = Some(Instant::now());
            None
        }
        _ => None,
    });
    let mut p = start(&up.url(), &[]);
    p.send(INITIALIZE);
    p.answer_to(&json!(1), ANSWER);
    p.send(INITIALIZED);
    let list = p.call(&json!({"jsonrpc":"2.0","id":2,"method":"tools/list"}));
    assert!(list["result"]["tools"].is_array(), "{list}");
    let (answered, arrived) = (*answered_at.lock().unwrap(), *arrived_at.lock().unwrap());
    assert!(
        answered.zip(arrived).is_some_and(|(a, b)| b >= a),
        "tools/list reached the upstream before notifications/initialized was accepted"
    );
    p.end_session(Duration::from_secs(5));
}

#[test]
fn an_answer_cut_by_the_upstream_gets_an_error_with_its_id_naming_the_cut() {
    let up = mcp_upstream(|_, v, s| {
        if v["params"]["name"] != "cut" {
            return None;
        }
        let mut part = SSE_HEAD.to_vec();
        part.extend(message_event(&json!({"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,"progress":1}})));
        part.extend(event("event: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":"));
        let _ = s.write_all(&part);
        Some(Next::Close)
    });
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let t0 = Instant::now();
    let answer = p.call(&tool_call(json!("c"), "cut", json!({})));
    error_code(&answer, &json!("c"));
    assert!(t0.elapsed() < Duration::from_secs(1), "the cut was told after {:?}", t0.elapsed());
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("cut") || message.contains("closed"), "{answer}");
    let progress = p.pending();
    assert_eq!(progress.len(), 1, "the progress before the cut arrived: {progress:?}");
    let answer = p.call(&tool_call(json!("next"), "chat_read", json!({})));
    assert_eq!(answer["result"]["method"], "tools/call", "the session goes on: {answer}");
    p.end_session(Duration::from_secs(5));
}
