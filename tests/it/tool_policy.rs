//! The tool policy in both directions against the real agentchattr: with
//! `--deny-tool chat_rules --deny-tool chat_decision`, the Python SDK lists
//! the other tools only, none with a `sender` property; `chat_send` without
//! `sender` is stored under the agent's name; a call of `chat_rules` gets
//! the proxy's error with its id and agentchattr never hears of it. A
//! stand-in server covers what agentchattr cannot be made to do (a list it
//! answers as JSON, one that is not JSON, a list the policy may not pass).

use std::process::Command;

use serde_json::{json, Value};

use crate::support::agentchattr::Agentchattr;
use crate::support::proxy_process::ProxyProcess;
use crate::support::realenv::{self, python_script};
use crate::support::wire::{request, Next, Req, StubUpstream};

/// Runs `policy_client.py` with agentchattr's venv (mcp 1.x); its JSON.
fn policy_client(url: &str, transport: &str, message: &str, denied: &str) -> Value {
    let mut cmd: Command =
        python_script(realenv::agentchattr_py(), "policy_client.py", &[url, transport, message, denied]);
    let out = cmd.output().expect("run policy_client.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().last().unwrap_or("");
    serde_json::from_str(last).unwrap_or_else(|e| {
        panic!(
            "policy_client.py {transport}: {e}\nstdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Registers an agent with agentchattr as its wrapper does: (name, token).
fn register(ac: &Agentchattr) -> (String, String) {
    let body = json!({"base": "claude", "label": null, "ready_gate": false}).to_string();
    let (status, v) =
        ac.api("POST", "/api/register", &[("Content-Type", "application/json")], body.as_bytes());
    assert_eq!(status, 200, "register: {v}");
    (v["name"].as_str().unwrap().to_string(), v["token"].as_str().unwrap().to_string())
}

#[test]
fn denied_tools_are_hidden_and_refused_and_sender_is_hidden_and_stamped_against_agentchattr() {
    let ac = Agentchattr::start();
    let (name, token) = register(&ac);
    let p = ProxyProcess::builder(format!("{}/mcp", ac.mcp_base()))
        .agent(&name)
        .token(&token)
        .arg("--deny-tool", "chat_rules")
        .arg("--deny-tool", "chat_decision")
        .env("RUST_LOG", "info")
        .start();
    let out = policy_client(&p.url("/mcp"), "http", "policy-http", "chat_rules");
    let tools: Vec<&str> = out["tools"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert!(tools.contains(&"chat_send") && tools.contains(&"chat_read"), "{out}");
    assert!(
        !tools.contains(&"chat_rules") && !tools.contains(&"chat_decision"),
        "denied tools listed: {out}"
    );
    assert_eq!(out["with_sender"], json!([]), "a sender parameter is still shown: {out}");
    assert!(!out["required_of_send"].to_string().contains("sender"), "{out}");
    assert_eq!(out["send"]["is_error"], false, "{out}");
    assert_eq!(out["denied"]["code"], -32602, "the denied call: {out}\n{}", p.stderr_text());
    let messages = ac.messages();
    let stored: Vec<&Value> = messages.iter().filter(|m| m["text"] == "policy-http").collect();
    assert_eq!(stored.len(), 1, "{messages:?}");
    assert_eq!(stored[0]["sender"], name.as_str(), "stored under the agent's name: {:?}", stored[0]);
    assert!(!ac.log_text().contains("chat_rules"), "agentchattr heard of the denied call: {}", ac.log_text());
    assert!(p.stderr_text().contains("which the tool policy hides"), "{}", p.stderr_text());
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
    assert!(p.stderr_text().contains("stamping \"sender\" of tool \"new_tool\""), "{}", p.stderr_text());

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
