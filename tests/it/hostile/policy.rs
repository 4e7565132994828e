//! The tool policy against a hostile upstream and odd clients. A denied
//! tool never leaks through the list filter, whatever the upstream spells
//! the answer's id as: `"515"`, `515.0`, an escaped string, or an id that
//! is nobody's, in a JSON body, a JSON array, an event or an event holding
//! an array. The Python SDK and the TypeScript SDK take each of those as
//! the answer to request 515, so each must reach them filtered. A hidden
//! tool's call sent as a notification gets 202 and no body, and is not
//! forwarded.

use serde_json::Value;

use super::AGENT;
use crate::support::exchange::ok_upstream;
use crate::support::exchange::{client, host, json_post};
use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{request, Next, Req, StubUpstream};

const LIST: &str = r#"{"jsonrpc":"2.0","id":ID,"result":{"tools":[{"name":"chat_send","inputSchema":{"type":"object","properties":{"sender":{"type":"string"},"message":{"type":"string"}}}},{"name":"chat_rules","inputSchema":{"type":"object"}}]}}"#;

/// A stand-in answering every POST with `LIST` under `id`, framed as
/// `frame` (0: JSON, 1: JSON array, 2: an event, 3: an event holding an
/// array).
fn lister(id: &'static str, frame: u8) -> StubUpstream {
    StubUpstream::start(move |_req: &Req, s: &mut std::net::TcpStream| {
        let list = LIST.replace("ID", id);
        let (ctype, body) = match frame {
            0 => ("application/json", list),
            1 => ("application/json", format!("[{list}]")),
            2 => ("text/event-stream", format!("event: message\r\ndata: {list}\r\n\r\n")),
            _ => ("text/event-stream", format!("event: message\ndata: [{list}]\n\n")),
        };
        let bytes = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        match std::io::Write::write_all(s, bytes.as_bytes()) {
            Ok(()) => Next::KeepAlive,
            Err(_) => Next::Close,
        }
    })
}

/// The messages of an answer, as a client reads them.
fn messages(text: &str) -> Vec<Value> {
    let bodies: Vec<String> = if text.trim_start().starts_with(['{', '[']) {
        vec![text.to_string()]
    } else {
        text.lines().filter_map(|l| l.strip_prefix("data: ")).map(str::to_string).collect()
    };
    let mut all = Vec::new();
    for b in bodies {
        match serde_json::from_str::<Value>(&b) {
            Ok(Value::Array(items)) => all.extend(items),
            Ok(v) => all.push(v),
            Err(e) => panic!("{e}: {b:?} in {text:?}"),
        }
    }
    all
}

#[test]
fn a_denied_tool_never_leaks_through_the_list_filter_whatever_the_answers_id_spelling() {
    let request = br#"{"jsonrpc":"2.0","id":515,"method":"tools/list"}"#;
    let batch = br#"[{"jsonrpc":"2.0","id":515,"method":"tools/list"}]"#;
    for id in [r#""515""#, "515.0", r#""\u0035\u0031\u0035""#, r#""nobody""#, "515"] {
        for frame in 0..4u8 {
            let up = lister(id, frame);
            let p = ProxyProcess::builder(up.url())
                .agent(AGENT)
                .token("t0k")
                .arg("--deny-tool", "chat_rules")
                .start();
            for body in [&request[..], &batch[..]] {
                let mut c = client(&p);
                c.send(&json_post(&host(&p), &[], body));
                let resp = c.read_response("POST");
                let text = resp.text();
                let what = format!("id {id} frame {frame} request {}: {text}", String::from_utf8_lossy(body));
                assert_eq!(resp.status, 200, "{what}");
                assert!(!text.contains("chat_rules"), "the denied tool leaked: {what}");
                assert!(!text.contains(r#""sender""#), "the identity parameter leaked: {what}");
                let lists: Vec<Value> =
                    messages(&text).into_iter().filter(|m| m["result"]["tools"].is_array()).collect();
                assert_eq!(lists.len(), 1, "{what}");
                assert_eq!(lists[0]["result"]["tools"][0]["name"], "chat_send", "{what}");
            }
        }
    }
}

#[test]
fn a_hidden_tools_call_sent_as_a_notification_gets_202_and_no_body_and_is_not_forwarded() {
    let up = ok_upstream();
    let p =
        ProxyProcess::builder(up.url()).agent(AGENT).token("t0k").arg("--deny-tool", "chat_rules").start();
    let note = r#"{"jsonrpc":"2.0","method":"tools/call","params":{"name":"chat_rules","arguments":{}}}"#;
    let bodies = [note.to_string(), format!("[{note}]"), format!("[{note},{note}]")];
    let fields = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream")];
    for path in ["/mcp", "/messages/?session_id=0123abcd"] {
        for body in &bodies {
            let mut c = client(&p);
            c.send(&request("POST", path, &host(&p), &fields, body.as_bytes()));
            let resp = c.read_response("POST");
            assert_eq!((resp.status, resp.text()), (202, String::new()), "{path} {body}");
        }
    }
    assert_eq!(up.request_count(), 0, "a hidden call was forwarded");
    // A request beside it is still answered with its id, and the
    // upstream is still served.
    let call =
        r#"{"jsonrpc":"2.0","id":"c1","method":"tools/call","params":{"name":"chat_rules","arguments":{}}}"#;
    let mut c = client(&p);
    c.send(&json_post(&host(&p), &[], format!("[{note},{call}]").as_bytes()));
    let resp = c.read_response("POST");
    let got: Value = serde_json::from_str(&resp.text()).unwrap_or(Value::Null);
    assert_eq!((resp.status, got[0]["id"].clone()), (200, Value::from("c1")), "{}", resp.text());
    assert_eq!(up.request_count(), 0, "a hidden call was forwarded");
    crate::support::exchange::assert_healthy(&p, &up);
}
