//! The tool policy in both directions against the real agentchattr: with
//! `--deny-tool chat_rules --deny-tool chat_decision`, each real client (the
//! Python SDK 1.x and 2.x, the TypeScript SDK), over streamable HTTP and over
//! legacy SSE, lists the other tools only, none with a `sender` property;
//! `chat_send` without `sender` is stored under the agent's name; a call of
//! `chat_rules` gets the proxy's error (-32602) with its id and agentchattr
//! never hears of it. A stand-in server covers what agentchattr cannot be
//! made to do (a list it answers as JSON, one that is not JSON, a list the
//! policy may not pass).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::agentchattr::{Agentchattr, TOOLS};
use crate::support::cases;
use crate::support::checks::Checks;
use crate::support::proxy_process::ProxyProcess;
use crate::support::realenv::{self, ScriptRun};
use crate::support::wire::{request, Next, Req, StubUpstream};

/// The tools the policy hides: `chat_rules` is the one called.
const DENIED: [&str; 2] = ["chat_rules", "chat_decision"];
/// What agentchattr's SDK (mcp 1.x `lowlevel.server`) logs at INFO for each `tools/call` it processes.
const AC_CALL_LOGGED: &str = "Processing request of type CallToolRequest";
/// Bound on one client run (the scripts bound themselves at 40 s).
const SCRIPT_LIMIT: Duration = Duration::from_secs(60);

/// The real client of a policy session.
#[derive(Clone, Copy, Debug)]
enum Sdk {
    /// Python SDK 1.x (agentchattr's venv): `ClientSession`.
    Py1,
    /// Python SDK 2.x: `mcp.Client`, mode "auto" (falls back to a session against FastMCP 1.x).
    Py2,
    /// TypeScript SDK (`tests/support/package.json`): `Client` on Node's fetch.
    Ts,
}

/// Which of agentchattr's MCP ports the proxy stands in front of.
#[derive(Clone, Copy, Debug)]
enum Transport {
    /// `POST /mcp` on its MCP port; answers come in the POST's response.
    StreamableHttp,
    /// `GET /sse` and `POST /messages/?session_id=..` on its SSE port; every answer comes as a `message`
    /// event on the GET stream, the POST getting only 202 Accepted.
    LegacySse,
}

impl Transport {
    fn path(self) -> &'static str {
        match self {
            Transport::StreamableHttp => "/mcp",
            Transport::LegacySse => "/sse",
        }
    }

    /// The scripts' name for it.
    fn arg(self) -> &'static str {
        match self {
            Transport::StreamableHttp => "http",
            Transport::LegacySse => "sse",
        }
    }

    fn upstream(self, ac: &Agentchattr) -> String {
        let base = match self {
            Transport::StreamableHttp => ac.mcp_base(),
            Transport::LegacySse => ac.sse_base(),
        };
        base + self.path()
    }
}

/// `policy_client.py` (`.cjs` for the TypeScript SDK) against `url`; its JSON.
#[track_caller]
fn policy_client(sdk: Sdk, transport: Transport, url: &str, message: &str) -> ScriptRun {
    let args = [url, transport.arg(), message, DENIED[0]];
    let cmd: Command = match sdk {
        Sdk::Py1 => realenv::python_script(realenv::agentchattr_py(), "policy_client.py", &args),
        Sdk::Py2 => realenv::python_script(realenv::py2(), "policy_client.py", &args),
        Sdk::Ts => realenv::node_script("policy_client.cjs", &args),
    };
    realenv::run_json(&format!("{sdk:?} policy client over {transport:?}"), cmd, SCRIPT_LIMIT)
}

/// What one policy session must show, whatever the client and transport: the client (`out`, the policy
/// script's JSON) listed agentchattr's tools but the denied ones, no schema with `sender`, not even in
/// `chat_send`'s `required`; its `chat_send` of `message` without a sender succeeded and agentchattr stored it
/// once, under the agent's registered `name`; its call of `chat_rules` was answered with the JSON-RPC error
/// -32602 (the SDK raised it as an MCP error: the answer carried the request's id), and agentchattr's log
/// (`ac_log`) never mentions the tool and shows one tool call only; the proxy logged the refusal.
fn check_policy_session(
    c: &mut Checks,
    out: &Value,
    messages: &[Value],
    (name, message): (&str, &str),
    (ac_log, proxy_log): (&str, &str),
) {
    c.check(out["error"].is_null(), format!("the client failed: {}", out["error"]));
    let listed: Vec<&str> = out["tools"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let mut want: Vec<&str> = TOOLS.iter().copied().filter(|t| !DENIED.contains(t)).collect();
    want.sort_unstable();
    c.check(
        listed == want,
        format!("tools listed {listed:?}, want agentchattr's without {DENIED:?}: {want:?}"),
    );
    c.eq("tools whose schema shows `sender`", &out["with_sender"], &json!([]));
    let required = &out["required_of_send"];
    c.check(
        required.as_array().is_some_and(|r| !r.contains(&json!("sender"))),
        format!("chat_send's required: {required}, want a list without sender"),
    );
    c.eq("chat_send without sender: is_error", &out["send"]["is_error"], &json!(false));
    c.check(
        out["send"]["text"].as_str().is_some_and(|t| t.starts_with("Sent (id=")),
        format!("chat_send without sender: agentchattr answered {}", out["send"]["text"]),
    );
    let stored: Vec<&Value> = messages.iter().filter(|m| m["text"] == message).collect();
    match stored.as_slice() {
        [m] => {
            c.eq(&format!("message {message:?}: sender as agentchattr stored it"), &m["sender"], &json!(name))
        }
        _ => c.failures.push(format!("agentchattr stored {} messages {message:?}, want 1", stored.len())),
    }
    c.eq(&format!("the call of {}: error code", DENIED[0]), &out["denied"]["code"], &json!(-32602));
    c.check(!ac_log.contains(DENIED[0]), format!("agentchattr's log mentions {}", DENIED[0]));
    // agentchattr does not log tool names; its SDK logs each call it processes, and chat_send is the only one.
    let calls = ac_log.matches(AC_CALL_LOGGED).count();
    c.check(calls == 1, format!("agentchattr processed {calls} tool calls, want 1 (chat_send)"));
    c.check(
        proxy_log.contains("which the tool policy hides"),
        "the proxy did not log the hidden tool's call",
    );
}

/// One policy session of `sdk` over `transport` through the proxy in front of a fresh agentchattr, checked
/// by [`check_policy_session`].
fn policy_holds_against_agentchattr(test: &str, sdk: Sdk, transport: Transport) {
    let started = Instant::now();
    let ac = Agentchattr::start();
    let (name, token) = ac.register("claude");
    let mut proxy = ProxyProcess::builder(transport.upstream(&ac)).agent(&name).token(&token);
    for tool in DENIED {
        proxy = proxy.arg("--deny-tool", tool);
    }
    let p = proxy.env("RUST_LOG", "info").start();
    let message = format!("policy-{sdk:?}-{}", transport.arg());
    let run = policy_client(sdk, transport, &p.url(transport.path()), &message);
    let messages = ac.messages();
    let (ac_log, proxy_log) = (ac.log_text(), p.stderr_once("which the tool policy hides"));
    eprintln!(
        "{test}: {} {}: client {:.2}s, test {:.2}s wall",
        run.json["sdk"],
        transport.arg(),
        run.elapsed.as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let mut c = Checks::default();
    check_policy_session(&mut c, &run.json, &messages, (&name, &message), (&ac_log, &proxy_log));
    c.finish(
        test,
        &[
            ("client JSON", run.json.to_string()),
            ("client stderr", run.stderr),
            ("proxy log", proxy_log),
            ("agentchattr's log", ac_log),
        ],
    );
}

// `policy_holds_against_agentchattr` for each SDK and transport.
cases! { policy_holds_against_agentchattr;
    policy_holds_against_agentchattr_for_python_sdk_1x_over_streamable_http => Sdk::Py1, Transport::StreamableHttp;
    policy_holds_against_agentchattr_for_python_sdk_2x_over_streamable_http => Sdk::Py2, Transport::StreamableHttp;
    policy_holds_against_agentchattr_for_typescript_sdk_over_streamable_http => Sdk::Ts, Transport::StreamableHttp;
    // Over legacy SSE every answer, the proxy's own included, must come as a `message` event on the session's
    // GET /sse stream (the POST getting 202): a refused POST leaves the Python SDK's call unanswered (its
    // timeout, 408) and fails the TypeScript SDK's without a JSON-RPC code.
    policy_holds_against_agentchattr_for_python_sdk_1x_over_legacy_sse => Sdk::Py1, Transport::LegacySse;
    policy_holds_against_agentchattr_for_typescript_sdk_over_legacy_sse => Sdk::Ts, Transport::LegacySse;
}

/// How a stand-in frames its JSON answers.
#[derive(Clone, Copy, Debug)]
enum Frame {
    Length,
    Chunked,
    CloseDelimited,
}

/// A stand-in that answers `tools/list` with `answer`, labelled with
/// `content_type` (or none) and framed as `frame`; anything else with an
/// echo of its params.
fn list_server(answer: &'static str, content_type: Option<&'static str>, frame: Frame) -> StubUpstream {
    StubUpstream::start(move |req: &Req, s: &mut std::net::TcpStream| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let body = match v["method"].as_str() {
            Some("tools/list") => answer.replace("\"ID\"", &v["id"].to_string()),
            _ => json!({"jsonrpc":"2.0","id":v["id"],"result":{"echo":v["params"]}}).to_string(),
        };
        let ct = content_type.map(|t| format!("Content-Type: {t}\r\n")).unwrap_or_default();
        let bytes = match frame {
            Frame::Length => format!("HTTP/1.1 200 OK\r\n{ct}Content-Length: {}\r\n\r\n{body}", body.len()),
            Frame::Chunked => {
                // Chunks of 7 bytes: every field is cut somewhere.
                let mut out = format!("HTTP/1.1 200 OK\r\n{ct}Transfer-Encoding: chunked\r\n\r\n");
                for piece in body.as_bytes().chunks(7) {
                    out.push_str(&format!("{:x}\r\n{}\r\n", piece.len(), String::from_utf8_lossy(piece)));
                }
                out + "0\r\n\r\n"
            }
            Frame::CloseDelimited => format!("HTTP/1.1 200 OK\r\n{ct}Connection: close\r\n\r\n{body}"),
        };
        let ok = std::io::Write::write_all(s, bytes.as_bytes()).is_ok();
        match frame {
            Frame::CloseDelimited => Next::Close,
            _ if ok => Next::KeepAlive,
            _ => Next::Close,
        }
    })
}

const LIST: &str = r#"{"jsonrpc":"2.0","id":"ID","result":{"tools":[{"name":"chat_send","inputSchema":{"type":"object","properties":{"sender":{"type":"string"},"message":{"type":"string"}},"required":["sender","message"]}},{"name":"secret_tool","inputSchema":{"type":"object","properties":{}}},{"name":"new_tool","inputSchema":{"type":"object","properties":{"sender":{"type":"string"},"x":{"type":"number"}}}}]}}"#;

fn post(p: &ProxyProcess, body: &Value) -> (u16, Value) {
    let mut c = crate::support::exchange::client(p);
    let fields = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    c.send(&request(
        "POST",
        "/mcp",
        &crate::support::exchange::host(p),
        &fields,
        body.to_string().as_bytes(),
    ));
    let resp = c.read_response("POST");
    (resp.status, serde_json::from_slice(&resp.body).unwrap_or(Value::Null))
}

/// The listed tools and whether any schema still shows `sender`.
fn listed(v: &Value) -> (Vec<String>, bool) {
    let tools = v["result"]["tools"].as_array().cloned().unwrap_or_default();
    let names = tools.iter().map(|t| t["name"].as_str().unwrap_or("").to_string()).collect();
    let sender = tools.iter().any(|t| t["inputSchema"]["properties"].get("sender").is_some());
    (names, sender)
}

#[test]
fn a_json_list_is_filtered_learned_from_and_a_list_that_is_not_json_is_refused() {
    // Whatever the framing, and whatever the label: none, the right one, a
    // wrong one (a list is never let through for want of a label).
    let labels = [Some("application/json"), None, Some("text/plain")];
    for frame in [Frame::Length, Frame::Chunked, Frame::CloseDelimited] {
        for label in labels {
            let up = list_server(LIST, label, frame);
            let p = ProxyProcess::builder(up.url())
                .agent("agent-a")
                .token("tok-POLICY-1")
                .arg("--deny-tool", "secret_*")
                .start();
            let (status, v) = post(&p, &json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}));
            assert_eq!(status, 200, "{frame:?} {label:?}");
            assert_eq!(
                listed(&v),
                (vec!["chat_send".to_string(), "new_tool".to_string()], false),
                "{frame:?} {label:?}: {v}"
            );
            assert_eq!(
                v["result"]["tools"][0]["inputSchema"]["required"],
                json!(["message"]),
                "{frame:?} {label:?}"
            );
        }
    }
    // A JSON list labelled as an event stream (a lying label) holds no
    // event: the error with its id, not the list.
    let up = list_server(LIST, Some("text/event-stream"), Frame::Length);
    let p = ProxyProcess::builder(up.url())
        .agent("agent-a")
        .token("tok-POLICY-4")
        .arg("--deny-tool", "secret_*")
        .start();
    let mut c = crate::support::exchange::client(&p);
    let fields = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let body = json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}).to_string();
    c.send(&request("POST", "/mcp", &crate::support::exchange::host(&p), &fields, body.as_bytes()));
    let text = c.read_response("POST").text();
    assert!(text.contains("-32603") && text.contains("\"id\":4") && !text.contains("secret_tool"), "{text}");

    let up = list_server(LIST, Some("application/json"), Frame::Length);
    let p = ProxyProcess::builder(up.url())
        .agent("agent-a")
        .token("tok-POLICY-1")
        .arg("--deny-tool", "secret_*")
        .env("RUST_LOG", "info")
        .start();
    let (_, v) = post(&p, &json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}));
    assert_eq!(listed(&v).0, ["chat_send", "new_tool"], "{v}");
    // new_tool has a string `sender`: learned, so its calls are stamped now.
    let (_, v) = post(
        &p,
        &json!({"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"new_tool","arguments":{"sender":"mallory","x":1}}}),
    );
    assert_eq!(v["result"]["echo"]["arguments"]["sender"], "agent-a", "{v}");
    // A hidden tool's call never reaches the upstream.
    let before = up.request_count();
    let (status, v) = post(
        &p,
        &json!({"jsonrpc":"2.0","id":"s1","method":"tools/call","params":{"name":"secret_tool","arguments":{}}}),
    );
    assert_eq!(
        (status, v["id"].clone(), v["error"]["code"].clone()),
        (200, json!("s1"), json!(-32602)),
        "{v}"
    );
    assert_eq!(up.request_count(), before, "the hidden tool's call reached the upstream");
    // The escape-spelled name is the same tool.
    let (_, v) = post(
        &p,
        &json!({"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"secret\u{5f}tool","arguments":{}}}),
    );
    assert_eq!(v["error"]["code"], -32602);
    let log = p.stderr_once("stamping \"sender\" of tool \"new_tool\"");
    assert!(log.contains("stamping \"sender\" of tool \"new_tool\""), "{log}");

    let bad = list_server("this is not json", Some("application/json"), Frame::Length);
    let p = ProxyProcess::builder(bad.url())
        .agent("agent-a")
        .token("tok-POLICY-2")
        .arg("--deny-tool", "x")
        .start();
    let (status, v) = post(&p, &json!({"jsonrpc":"2.0","id":8,"method":"tools/list"}));
    assert_eq!((status, v["id"].clone(), v["error"]["code"].clone()), (200, json!(8), json!(-32603)), "{v}");
}

#[test]
fn with_no_policy_and_identity_params_shown_the_list_is_relayed_byte_for_byte() {
    let up = list_server(LIST, Some("application/json"), Frame::Length);
    let p = ProxyProcess::builder(up.url())
        .agent("agent-a")
        .token("tok-POLICY-3")
        .flag("--show-identity-params")
        .flag("--no-default-stamps")
        .start();
    let mut c = crate::support::exchange::client(&p);
    let fields = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let body = json!({"jsonrpc":"2.0","id":4,"method":"tools/list"}).to_string();
    c.send(&request("POST", "/mcp", &crate::support::exchange::host(&p), &fields, body.as_bytes()));
    let resp = c.read_response("POST");
    assert_eq!(resp.body, LIST.replace("\"ID\"", "4").as_bytes(), "{}", resp.raw_text());
    assert_eq!(resp.one("content-length"), LIST.replace("\"ID\"", "4").len().to_string());
}

/// How the batch stand-in answers the part of a batch that reaches it.
#[derive(Clone, Copy, Debug)]
enum BatchFrame {
    Json,
    /// JSON with no Content-Type: read as JSON all the same.
    JsonUnlabelled,
    JsonChunked,
    Events,
}

/// A stand-in answering a batch's requests with an echo of their ids, as
/// one JSON array or one event per answer; 202 when the batch holds no
/// request.
fn batch_server(frame: BatchFrame) -> StubUpstream {
    StubUpstream::start(move |req: &Req, s: &mut std::net::TcpStream| {
        let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
        let answers: Vec<Value> = v
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|m| m.get("id").is_some())
            .map(|m| json!({"jsonrpc":"2.0","id":m["id"],"result":{"echo":m["params"]}}))
            .collect();
        let bytes = if answers.is_empty() {
            "HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n".to_string()
        } else {
            match frame {
                BatchFrame::JsonUnlabelled => {
                    let body = Value::Array(answers).to_string();
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                }
                BatchFrame::Json => {
                    let body = Value::Array(answers).to_string();
                    format!("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                }
                BatchFrame::JsonChunked => {
                    let body = format!(" \n{}", Value::Array(answers));
                    let mut out = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".to_string();
                    for piece in body.as_bytes().chunks(1) {
                        out.push_str(&format!("{:x}\r\n{}\r\n", piece.len(), String::from_utf8_lossy(piece)));
                    }
                    out + "0\r\n\r\n"
                }
                BatchFrame::Events => {
                    let body: String =
                        answers.iter().map(|a| format!("event: message\r\ndata: {a}\r\n\r\n")).collect();
                    format!("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Length: {}\r\n\r\n{body}", body.len())
                }
            }
        };
        match std::io::Write::write_all(s, bytes.as_bytes()) {
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Close,
        }
    })
}

/// POSTs `body`: the status and the JSON-RPC messages of the answer (a
/// JSON array, or the `data` of each event).
fn post_batch(p: &ProxyProcess, body: &Value) -> (u16, Vec<Value>) {
    let mut c = crate::support::exchange::client(p);
    let fields = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    let host = crate::support::exchange::host(p);
    c.send(&request("POST", "/mcp", &host, &fields, body.to_string().as_bytes()));
    let resp = c.read_response("POST");
    let text = resp.text();
    let messages = match serde_json::from_str::<Value>(&text) {
        Ok(Value::Array(a)) => a,
        Ok(v) => vec![v],
        Err(_) => text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d:?} in {text:?}")))
            .collect(),
    };
    (resp.status, messages)
}

fn call(id: i64, tool: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"tools/call","params":{"name":tool,"arguments":{"message":"m"}}})
}

#[test]
fn a_batchs_hidden_calls_get_their_errors_in_place_and_the_rest_is_forwarded() {
    let note = json!({"jsonrpc":"2.0","method":"notifications/progress","params":{}});
    for frame in [BatchFrame::Json, BatchFrame::JsonUnlabelled, BatchFrame::JsonChunked, BatchFrame::Events] {
        let up = batch_server(frame);
        let p =
            ProxyProcess::builder(up.url()).agent("alice").token("t0k").arg("--deny-tool", "chat_r*").start();

        // Mixed: the hidden call is answered by the proxy, the rest by the upstream.
        let (status, got) = post_batch(&p, &json!([call(1, "chat_rules"), call(2, "chat_send"), note]));
        assert_eq!(status, 200, "{frame:?}: {got:?}\n{}", p.stderr_text());
        let by_id = |id: i64| got.iter().find(|m| m["id"] == id).cloned().unwrap_or(Value::Null);
        assert_eq!(got.len(), 2, "{frame:?}: one answer per request: {got:?}");
        assert_eq!(by_id(1)["error"]["code"], -32602, "{frame:?}: {got:?}");
        assert_eq!(by_id(2)["result"]["echo"]["arguments"]["sender"], "alice", "{frame:?}: stamped: {got:?}");
        let reached: Value = serde_json::from_slice(&up.requests().last().unwrap().body).unwrap();
        assert_eq!(
            reached,
            json!([{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"chat_send","arguments":{"message":"m","sender":"alice"}}}, note]),
            "{frame:?}"
        );

        // The rest holds no request: the upstream's 202 becomes the proxy's errors.
        let before = up.request_count();
        let (status, got) = post_batch(&p, &json!([call(3, "chat_rules"), note]));
        assert_eq!((status, got.len()), (200, 1), "{frame:?}: {got:?}");
        assert_eq!(
            (got[0]["id"].clone(), got[0]["error"]["code"].clone()),
            (json!(3), json!(-32602)),
            "{frame:?}"
        );
        assert_eq!(up.request_count(), before + 1, "{frame:?}: the notification went on");

        // Every element hidden: nothing reaches the upstream.
        let before = up.request_count();
        let (status, got) = post_batch(&p, &json!([call(4, "chat_rules"), call(5, "chat_read_all")]));
        assert_eq!(status, 200, "{frame:?}");
        let ids: Vec<&Value> = got.iter().map(|m| &m["id"]).collect();
        assert_eq!(ids, [&json!(4), &json!(5)], "{frame:?}: {got:?}");
        assert_eq!(up.request_count(), before, "{frame:?}: forwarded a batch of hidden calls");
        let log = p.stderr_once("in a batch, which the tool policy hides");
        assert!(log.contains("in a batch, which the tool policy hides"), "{log}");
    }
}
