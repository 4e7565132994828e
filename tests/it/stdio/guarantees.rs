//! Every guarantee of the HTTP front-end, over stdio: the agent's credentials
//! on every upstream request and no other, the agent's name stamped, a call
//! that cannot be stamped answered with its id and never forwarded, the tool
//! policy, and the audit log.

use std::time::Duration;

use serde_json::{json, Value};

use super::{calls_of, error_code, handshake, plain_upstream, start, tool_call, ANSWER};
use crate::support::proxy_process::{scratch_dir, token_file};
use crate::support::setup::{assert_credentials, AGENT, SESSION, TOOLS_LIST};

#[test]
fn every_upstream_request_carries_the_agents_credentials_and_never_the_client_secret() {
    let up = plain_upstream();
    let secret = "host-side-SECRET-5be1";
    let secret_file = token_file(secret);
    let mut p = start(&up.url(), &["--client-token-file", secret_file.to_str().unwrap()]);
    handshake(&mut p);
    p.call(&serde_json::from_slice(TOOLS_LIST).unwrap());
    p.call(&tool_call(json!(3), "chat_send", json!({"message": "hi"})));
    p.end_session(Duration::from_secs(5));
    let reqs = up.requests();
    // initialize, initialized, tools/list, tools/call; the GET stream; the DELETE.
    let mut methods: Vec<&str> = reqs.iter().map(|r| r.method.as_str()).collect();
    methods.sort_unstable();
    assert_eq!(methods, ["DELETE", "GET", "POST", "POST", "POST", "POST"], "{reqs:#?}");
    for r in &reqs {
        assert_credentials(r);
        assert!(!r.raw_text().contains(secret), "the client secret went upstream: {}", r.raw_text());
    }
}

#[test]
fn a_tools_call_claiming_another_sender_arrives_with_the_agents_name() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let answer =
        p.call(&tool_call(json!("s-1"), "chat_send", json!({"sender": "someone-else", "message": "hi"})));
    assert_eq!(answer["result"]["arguments"]["sender"], AGENT, "{answer}");
    let answer = p.call(&tool_call(json!(2), "chat_read", json!({})));
    assert_eq!(answer["result"]["arguments"]["sender"], AGENT, "a missing sender is added: {answer}");
    let sent = calls_of(&up, "chat_send");
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0]["params"]["arguments"], json!({"sender": AGENT, "message": "hi"}));
    assert_eq!(sent[0]["id"], "s-1");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_tools_call_that_cannot_be_stamped_is_answered_with_its_id_and_never_forwarded() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &[]);
    handshake(&mut p);
    let refused: [(&[u8], Value); 3] = [
        (
            br#"{"jsonrpc":"2.0","id":"dup","method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#,
            json!("dup"),
        ),
        (
            br#"{"jsonrpc":"2.0","id":41,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","\u0073ender":"b"}}}"#,
            json!(41),
        ),
        (
            br#"{"jsonrpc":"2.0","id":42,"method":"tools/call","params":{"name":"chat_send","arguments":"sender=x"}}"#,
            json!(42),
        ),
    ];
    for (line, id) in &refused {
        p.send(line);
        let answer = p.answer_to(id, ANSWER);
        assert_eq!(error_code(&answer, id), -32600, "{}: {answer}", String::from_utf8_lossy(line));
    }
    assert!(
        calls_of(&up, "chat_send").is_empty(),
        "a refused call reached the upstream: {:?}",
        super::posted(&up)
    );
    let answer = p.call(&tool_call(json!(43), "chat_send", json!({"sender": "x"})));
    assert_eq!(answer["result"]["arguments"]["sender"], AGENT, "the session goes on: {answer}");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn a_denied_tool_is_hidden_from_tools_list_and_its_call_answered_locally_with_its_id() {
    let up = plain_upstream();
    let mut p = start(&up.url(), &["--deny-tool", "secret_*"]);
    handshake(&mut p);
    let list = p.call(&serde_json::from_slice(TOOLS_LIST).unwrap());
    let names: Vec<&str> =
        list["result"]["tools"].as_array().into_iter().flatten().filter_map(|t| t["name"].as_str()).collect();
    assert_eq!(names, ["chat_send", "chat_read"], "{list}");
    let props = &list["result"]["tools"][0]["inputSchema"]["properties"];
    assert!(props.get("sender").is_none(), "the stamped parameter is hidden: {list}");
    let answer = p.call(&tool_call(json!("hidden-1"), "secret_tool", json!({})));
    assert_eq!(error_code(&answer, &json!("hidden-1")), -32602, "{answer}");
    assert!(calls_of(&up, "secret_tool").is_empty(), "the hidden call reached the upstream");
    let answer = p.call(&tool_call(json!(5), "chat_read", json!({})));
    assert_eq!(answer["result"]["method"], "tools/call", "{answer}");
    p.end_session(Duration::from_secs(5));
}

#[test]
fn the_audit_log_records_the_stdio_sessions_requests() {
    let up = plain_upstream();
    let log = scratch_dir("stdio-audit").join("audit.jsonl");
    let mut p = start(&up.url(), &["--audit-log", log.to_str().unwrap(), "--deny-tool", "secret_tool"]);
    handshake(&mut p);
    p.call(&tool_call(json!(2), "chat_send", json!({"sender": "someone-else", "message": "hi"})));
    p.call(&tool_call(json!("h"), "secret_tool", json!({})));
    p.end_session(Duration::from_secs(5));
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| panic!("read {}: {e}", log.display()));
    let records: Vec<Value> =
        text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect();
    let request = |id: Value| {
        records
            .iter()
            .find(|r| r["event"] == "request" && r["jsonrpc.request.id"] == id)
            .unwrap_or_else(|| panic!("no request record for id {id}:\n{text}"))
    };
    let init = request(json!(1));
    assert_eq!(init["mcp.method.name"], "initialize", "{init}");
    let send = request(json!(2));
    assert_eq!(send["agent"], AGENT, "{send}");
    assert_eq!(send["mcp.session.id"], SESSION, "{send}");
    assert_eq!(send["gen_ai.tool.name"], "chat_send", "{send}");
    assert_eq!(send["claimed"], "someone-else", "{send}");
    assert_eq!(send["answered_by"], "upstream", "{send}");
    assert_eq!(send["outcome"], "ok", "{send}");
    let hidden = request(json!("h"));
    assert_eq!(hidden["answered_by"], "proxy", "{hidden}");
    assert_eq!(hidden["outcome"], "refused", "{hidden}");
    for event in ["session.created", "session.deleted"] {
        let r = records.iter().find(|r| r["event"] == event);
        assert_eq!(r.map(|r| &r["mcp.session.id"]), Some(&json!(SESSION)), "{event}:\n{text}");
    }
}
