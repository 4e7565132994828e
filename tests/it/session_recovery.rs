//! The upstream loses an MCP session (a restart: 404 on its id) and the
//! proxy re-initialises it for the client, on the wire: the recorded
//! `initialize` replayed with the current identity, `notifications/initialized`
//! on the new id, the parked request sent again, the client's id kept in
//! both directions; and every way it must give up and relay the 404.

use std::collections::HashSet;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::exchange::{client, host};
use crate::support::proxy_process::ProxyProcess;
use crate::support::wire::{request, response, Next, Req, Resp, StubUpstream};

const VERSION: &str = "2025-06-18";

/// What the stub server does; changed by the test between calls.
struct State {
    sessions: HashSet<String>,
    created: usize,
    /// The protocol version `initialize` answers with.
    version: &'static str,
    /// Answer 404 to every request that names a session.
    lose_every_session: bool,
    /// How `initialize` is answered.
    init: Init,
}

/// The ways a server may answer `initialize`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Init {
    /// 200, one Mcp-Session-Id, the result as application/json.
    Json,
    /// 200, one Mcp-Session-Id, the result as one SSE event (FastMCP's default).
    EventStream,
    /// 500 with a JSON-RPC error.
    Refused,
    /// 200 and a result, but no Mcp-Session-Id.
    NoSessionId,
}

/// An MCP server that keeps sessions in memory like FastMCP: `restart`
/// forgets them all, and a request on an unknown id gets 404.
struct SessionServer {
    stub: StubUpstream,
    state: Arc<Mutex<State>>,
}

impl SessionServer {
    fn start() -> SessionServer {
        let state = Arc::new(Mutex::new(State {
            sessions: HashSet::new(),
            created: 0,
            version: VERSION,
            lose_every_session: false,
            init: Init::Json,
        }));
        let st = state.clone();
        let stub = StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
            let _ = std::io::Write::write_all(s, &answer(req, &mut st.lock().unwrap()));
            Next::KeepAlive
        });
        SessionServer { stub, state }
    }

    fn restart(&self) {
        self.state.lock().unwrap().sessions.clear();
    }

    /// Every request after `from` as (method, JSON-RPC method, session id, request).
    fn seen(&self, from: usize) -> Vec<(String, String, String, Req)> {
        self.stub.requests()[from..]
            .iter()
            .map(|r| {
                let v: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                let sid = r.head.all("mcp-session-id").first().map(|s| s.to_string()).unwrap_or_default();
                (r.method.clone(), v["method"].as_str().unwrap_or("").to_string(), sid, r.clone())
            })
            .collect()
    }

    fn initializes(&self) -> usize {
        self.seen(0).iter().filter(|(_, m, _, _)| m == "initialize").count()
    }
}

fn json_response(status: &str, extra: &[(&str, &str)], body: &Value) -> Vec<u8> {
    let mut fields = vec![("Content-Type", "application/json")];
    fields.extend_from_slice(extra);
    response(status, &fields, body.to_string().as_bytes())
}

fn answer(req: &Req, st: &mut State) -> Vec<u8> {
    let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
    let sid = req.head.all("mcp-session-id").first().map(|s| s.to_string());
    if req.method == "POST" && v["method"] == "initialize" && sid.is_none() {
        st.created += 1;
        let id = format!("upstream-{}", st.created);
        st.sessions.insert(id.clone());
        let result = json!({"jsonrpc":"2.0","id":v["id"],"result":{"protocolVersion":st.version,"capabilities":{},"serverInfo":{"name":"stub","version":"1"}}});
        return match st.init {
            Init::Json => json_response("200 OK", &[("Mcp-Session-Id", &id)], &result),
            Init::EventStream => {
                let event = format!("event: message\r\ndata: {result}\r\n\r\n");
                let fields = [("Content-Type", "text/event-stream"), ("Mcp-Session-Id", id.as_str())];
                response("200 OK", &fields, event.as_bytes())
            }
            Init::Refused => {
                let error =
                    json!({"jsonrpc":"2.0","id":v["id"],"error":{"code":-32603,"message":"not ready"}});
                json_response("500 Internal Server Error", &[], &error)
            }
            Init::NoSessionId => json_response("200 OK", &[], &result),
        };
    }
    let Some(sid) = sid.filter(|s| st.sessions.contains(s) && !st.lose_every_session) else {
        let body = json!({"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}});
        return json_response("404 Not Found", &[], &body);
    };
    match req.method.as_str() {
        "DELETE" => {
            st.sessions.remove(&sid);
            response("200 OK", &[("Mcp-Session-Id", &sid)], b"")
        }
        "GET" => {
            let event = format!(
                "event: message\ndata: {}\n\n",
                json!({"jsonrpc":"2.0","method":"ping-from","params":{"session":sid}})
            );
            response(
                "200 OK",
                &[("Content-Type", "text/event-stream"), ("Mcp-Session-Id", &sid)],
                event.as_bytes(),
            )
        }
        _ if v.get("id").is_none() => response("202 Accepted", &[("Mcp-Session-Id", &sid)], b""),
        _ => {
            let result = json!({"jsonrpc":"2.0","id":v["id"],"result":{"session":sid,"sender":v["params"]["arguments"]["sender"]}});
            json_response("200 OK", &[("Mcp-Session-Id", &sid)], &result)
        }
    }
}

fn post(p: &ProxyProcess, session: Option<&str>, body: &Value) -> Resp {
    let mut fields = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Protocol-Version", VERSION),
    ];
    if let Some(s) = session {
        fields.push(("Mcp-Session-Id", s));
    }
    let mut c = client(p);
    c.send(&request("POST", "/mcp", &host(p), &fields, body.to_string().as_bytes()));
    c.read_response("POST")
}

/// initialize, then notifications/initialized: the client's session id.
fn open_session(p: &ProxyProcess) -> String {
    let init = json!({"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":VERSION,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}});
    let resp = post(p, None, &init);
    assert_eq!(resp.status, 200, "{}", resp.raw_text());
    let sid = resp.one("mcp-session-id").to_string();
    let note = json!({"jsonrpc":"2.0","method":"notifications/initialized"});
    assert_eq!(post(p, Some(&sid), &note).status, 202);
    sid
}

fn call(n: u64) -> Value {
    json!({"jsonrpc":"2.0","id":n,"method":"tools/call","params":{"name":"chat_send","arguments":{"message":"hi","sender":"mallory"}}})
}

fn body(resp: &Resp) -> Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("{e}: {}", resp.raw_text()))
}

#[test]
fn a_lost_session_is_reinitialised_and_the_call_sent_again_under_the_clients_id() {
    let server = SessionServer::start();
    let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-1").start();
    let sid = open_session(&p);
    assert_eq!(body(&post(&p, Some(&sid), &call(1)))["result"]["session"], sid.as_str());

    server.restart();
    let before = server.stub.request_count();
    let resp = post(&p, Some(&sid), &call(2));
    assert_eq!(resp.status, 200, "{}", resp.raw_text());
    let v = body(&resp);
    assert_eq!(v["id"], 2);
    assert_eq!(v["result"]["sender"], "claude");
    let new_id = v["result"]["session"].as_str().unwrap().to_string();
    assert_ne!(new_id, sid, "the call went to the new upstream session");
    // The client never sees the upstream's new id.
    assert_eq!(resp.all("mcp-session-id"), [sid.as_str()]);

    let seen = server.seen(before);
    let summary: Vec<(&str, &str, &str)> =
        seen.iter().map(|(m, rpc, s, _)| (m.as_str(), rpc.as_str(), s.as_str())).collect();
    assert_eq!(
        summary,
        [
            ("POST", "tools/call", sid.as_str()),
            ("POST", "initialize", ""),
            ("POST", "notifications/initialized", new_id.as_str()),
            ("POST", "tools/call", new_id.as_str()),
        ]
    );
    let replayed = &seen[1].3;
    assert!(!replayed.head.has("mcp-protocol-version"), "{}", replayed.raw_text());
    assert_eq!(replayed.head.one("authorization"), "Bearer tok-RECOVER-1");
    assert_eq!(replayed.head.one("x-agent-token"), "tok-RECOVER-1");
    assert_eq!(seen[2].3.head.one("mcp-protocol-version"), VERSION);
    let retried: Value = serde_json::from_slice(&seen[3].3.body).unwrap();
    assert_eq!(retried["params"]["arguments"]["sender"], "claude");
    assert_eq!(retried["id"], 2);

    // Later calls go straight to the new session; DELETE ends it there.
    let before = server.stub.request_count();
    assert_eq!(body(&post(&p, Some(&sid), &call(3)))["result"]["session"], new_id.as_str());
    let mut c = client(&p);
    c.send(&request("DELETE", "/mcp", &host(&p), &[("Mcp-Session-Id", &sid)], b""));
    let deleted = c.read_response("DELETE");
    assert_eq!(deleted.status, 200);
    assert_eq!(deleted.all("mcp-session-id"), [sid.as_str()]);
    let seen = server.seen(before);
    assert_eq!(seen.len(), 2, "no 404, no replay: {:?}", seen.iter().map(|s| &s.1).collect::<Vec<_>>());
    assert_eq!((seen[1].0.as_str(), seen[1].2.as_str()), ("DELETE", new_id.as_str()));

    // A deleted session is never resurrected: the server's 404, nothing replayed.
    let inits = server.initializes();
    let resp = post(&p, Some(&sid), &call(4));
    assert_eq!(resp.status, 404);
    assert_eq!(body(&resp)["error"]["message"], "Session not found");
    assert_eq!(server.initializes(), inits);
}

#[test]
fn a_second_404_after_reinitialising_is_relayed_and_nothing_storms() {
    let server = SessionServer::start();
    let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-3").start();
    let sid = open_session(&p);
    server.restart();
    // initialize still works, but every session is lost at once.
    server.state.lock().unwrap().lose_every_session = true;
    let before = server.stub.request_count();
    let resp = post(&p, Some(&sid), &call(1));
    assert_eq!(resp.status, 404, "{}", resp.raw_text());
    let methods: Vec<String> = server.seen(before).into_iter().map(|s| s.1).collect();
    // The replayed notifications/initialized got 404 too: the replay failed.
    assert_eq!(methods, ["tools/call", "initialize", "notifications/initialized"]);
    for n in 2..5 {
        assert_eq!(post(&p, Some(&sid), &call(n)).status, 404);
    }
    assert_eq!(server.initializes(), 2, "one replay, then the session is forgotten");
}

#[test]
fn a_lost_get_stream_is_reopened_on_the_new_session_without_last_event_id() {
    let server = SessionServer::start();
    let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-4").start();
    let sid = open_session(&p);
    server.restart();
    let before = server.stub.request_count();
    let mut c = client(&p);
    let fields = [("Accept", "text/event-stream"), ("Mcp-Session-Id", sid.as_str()), ("Last-Event-ID", "41")];
    c.send(&request("GET", "/mcp", &host(&p), &fields, b""));
    let resp = c.read_response("GET");
    assert_eq!(resp.status, 200, "{}", resp.raw_text());
    assert_eq!(resp.all("mcp-session-id"), [sid.as_str()]);
    let seen = server.seen(before);
    let last = seen.last().unwrap();
    assert_eq!(last.0, "GET");
    assert_eq!(last.2, "upstream-2");
    assert!(!last.3.head.has("last-event-id"), "{}", last.3.raw_text());
    assert!(String::from_utf8_lossy(&resp.body).contains("upstream-2"));
    // The first GET still carried it, on the old id.
    assert_eq!(seen[0].3.head.one("last-event-id"), "41");
}

#[test]
fn concurrent_calls_on_a_lost_session_share_one_reinitialisation() {
    let server = SessionServer::start();
    let p = Arc::new(ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-5").start());
    let sid = open_session(&p);
    server.restart();
    let threads: Vec<_> = (0..4u64)
        .map(|n| {
            let (p, sid) = (p.clone(), sid.clone());
            std::thread::spawn(move || post(&p, Some(&sid), &call(10 + n)))
        })
        .collect();
    for (n, t) in threads.into_iter().enumerate() {
        let resp = t.join().unwrap();
        assert_eq!(resp.status, 200, "{}", resp.raw_text());
        assert_eq!(body(&resp)["id"], 10 + n as u64);
        assert_eq!(resp.all("mcp-session-id"), [sid.as_str()]);
    }
    assert_eq!(server.initializes(), 2, "one original initialize and one replay");
    let calls = server.seen(0).into_iter().filter(|s| s.1 == "tools/call" && s.2 == "upstream-2").count();
    assert_eq!(calls, 4, "each call reached the new session once");
    std::thread::sleep(Duration::from_millis(10));
}

#[test]
fn a_client_that_never_sent_initialized_gets_none_replayed() {
    let server = SessionServer::start();
    let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-6").start();
    let init = json!({"jsonrpc":"2.0","id":"i","method":"initialize","params":{"protocolVersion":VERSION,"capabilities":{},"clientInfo":{"name":"raw","version":"1"}}});
    let sid = post(&p, None, &init).one("mcp-session-id").to_string();
    server.restart();
    let before = server.stub.request_count();
    let resp = post(&p, Some(&sid), &call(1));
    assert_eq!(resp.status, 200, "{}", resp.raw_text());
    let methods: Vec<String> = server.seen(before).into_iter().map(|s| s.1).collect();
    assert_eq!(methods, ["tools/call", "initialize", "tools/call"]);
    // The replayed initialize is the client's, byte for byte.
    let replayed = &server.seen(before)[1].3;
    assert_eq!(replayed.body, init.to_string().as_bytes());
}

#[test]
fn every_way_a_replay_can_fail_relays_the_servers_404_and_forgets_the_session() {
    let cases: [(&str, Init, &'static str); 3] = [
        ("initialize refused", Init::Refused, VERSION),
        ("no session id in the answer", Init::NoSessionId, VERSION),
        ("another protocol version", Init::Json, "2024-11-05"),
    ];
    for (case, init, version) in cases {
        let server = SessionServer::start();
        let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-7").start();
        let sid = open_session(&p);
        server.restart();
        {
            let mut st = server.state.lock().unwrap();
            st.init = init;
            st.version = version;
        }
        let resp = post(&p, Some(&sid), &call(1));
        assert_eq!(resp.status, 404, "{case}: {}", resp.raw_text());
        assert_eq!(
            body(&resp),
            json!({"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}}),
            "{case}: the server's own 404, as it came"
        );
        assert_eq!(resp.all("mcp-session-id"), Vec::<&str>::new(), "{case}: no upstream id leaks");
        assert_eq!(server.initializes(), 2, "{case}: one replay");
        // Forgotten: the next 404 is relayed without another replay, even
        // once the server would answer a replay well.
        server.state.lock().unwrap().init = Init::Json;
        std::thread::sleep(Duration::from_millis(1100));
        assert_eq!(post(&p, Some(&sid), &call(2)).status, 404, "{case}");
        assert_eq!(server.initializes(), 2, "{case}: nothing replayed for a forgotten session");
    }
}

#[test]
fn an_initialize_answered_as_an_event_stream_is_recorded_and_replayed() {
    // FastMCP answers initialize with an SSE event: the version is read
    // from that form both when the session is recorded and on the replay.
    let server = SessionServer::start();
    server.state.lock().unwrap().init = Init::EventStream;
    let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-8").start();
    let sid = open_session(&p);
    server.restart();
    let resp = post(&p, Some(&sid), &call(1));
    assert_eq!(resp.status, 200, "{}", resp.raw_text());
    assert_eq!(body(&resp)["result"]["session"], "upstream-2");
    assert_eq!(resp.all("mcp-session-id"), [sid.as_str()]);
}

#[test]
fn a_404_that_is_no_lost_session_is_relayed_without_a_replay() {
    let server = SessionServer::start();
    let p = ProxyProcess::builder(server.stub.url()).agent("claude").token("tok-RECOVER-9").start();
    let sid = open_session(&p);
    server.restart();
    // An id the proxy never saw created.
    let resp = post(&p, Some("never-recorded"), &call(1));
    assert_eq!(resp.status, 404);
    assert_eq!(server.initializes(), 1);
    // A 404 to DELETE: the session ended, whatever the server answered.
    let mut c = client(&p);
    c.send(&request("DELETE", "/mcp", &host(&p), &[("Mcp-Session-Id", &sid)], b""));
    assert_eq!(c.read_response("DELETE").status, 404);
    assert_eq!(server.initializes(), 1, "a DELETE's 404 is not a lost session");
    // And the client's DELETE forgot it: no replay afterwards either.
    assert_eq!(post(&p, Some(&sid), &call(2)).status, 404);
    assert_eq!(server.initializes(), 1);
}

/// How a large `initialize` answer is framed and formed.
#[derive(Clone, Copy, Debug)]
enum BigInit {
    LengthJson,
    ChunkedSse,
    CloseDelimitedSse,
}

/// agentchattr's answer to `initialize` is 6 KB of instructions in one SSE
/// event in a chunked body; a larger one must be read just as well. A
/// server whose answers carry 1 MiB of instructions before the version, in
/// each framing and form: its sessions are recorded with their version and
/// survive a restart (the replay's answer is read, not held, whatever its
/// size).
#[test]
fn a_mebibyte_initialize_answer_in_every_framing_is_read_and_the_session_survives() {
    for mode in [BigInit::LengthJson, BigInit::ChunkedSse, BigInit::CloseDelimitedSse] {
        let sessions = Arc::new(Mutex::new((HashSet::<String>::new(), 0usize)));
        let st = sessions.clone();
        let stub = StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
            let v: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let sid = req.head.all("mcp-session-id").first().map(|s| s.to_string());
            let mut st = st.lock().unwrap();
            let write = |s: &mut TcpStream, bytes: &[u8]| std::io::Write::write_all(s, bytes).is_ok();
            if v["method"] == "initialize" && sid.is_none() {
                st.1 += 1;
                let id = format!("big-{}", st.1);
                st.0.insert(id.clone());
                let instructions = "i".repeat(1 << 20);
                let result = json!({"jsonrpc":"2.0","id":v["id"],"result":{"capabilities":{"tools":{}},"instructions":instructions,"serverInfo":{"name":"big","version":"1"},"protocolVersion":VERSION}});
                let event = format!(": a comment first\r\n\r\nevent: message\r\ndata: {result}\r\n\r\n");
                let ok = match mode {
                    BigInit::LengthJson => write(
                        s,
                        &response(
                            "200 OK",
                            &[("Content-Type", "application/json"), ("Mcp-Session-Id", &id)],
                            result.to_string().as_bytes(),
                        ),
                    ),
                    BigInit::ChunkedSse => {
                        let mut out = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {id}\r\nTransfer-Encoding: chunked\r\n\r\n"
                        )
                        .into_bytes();
                        // Odd chunk sizes: boundaries fall inside the field names too.
                        for piece in event.as_bytes().chunks(4093) {
                            out.extend_from_slice(format!("{:x}\r\n", piece.len()).as_bytes());
                            out.extend_from_slice(piece);
                            out.extend_from_slice(b"\r\n");
                        }
                        out.extend_from_slice(b"0\r\n\r\n");
                        write(s, &out)
                    }
                    BigInit::CloseDelimitedSse => {
                        let head = format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nMcp-Session-Id: {id}\r\nConnection: close\r\n\r\n"
                        );
                        let ok = write(s, head.as_bytes()) && write(s, event.as_bytes());
                        let _ = ok;
                        return Next::Close;
                    }
                };
                return if ok { Next::KeepAlive } else { Next::Close };
            }
            let Some(sid) = sid.filter(|s| st.0.contains(s)) else {
                let body = json!({"jsonrpc":"2.0","id":"server-error","error":{"code":-32600,"message":"Session not found"}});
                write(s, &json_response("404 Not Found", &[], &body));
                return Next::KeepAlive;
            };
            if v.get("id").is_none() {
                write(s, &response("202 Accepted", &[("Mcp-Session-Id", &sid)], b""));
            } else {
                let result = json!({"jsonrpc":"2.0","id":v["id"],"result":{"session":sid}});
                write(s, &json_response("200 OK", &[("Mcp-Session-Id", &sid)], &result));
            }
            Next::KeepAlive
        });
        let p = ProxyProcess::builder(stub.url())
            .agent("claude")
            .token("tok-BIG-1")
            .env("RUST_LOG", "info")
            .start();
        let sid = open_session(&p);
        sessions.lock().unwrap().0.clear(); // the restart: every session lost
        let resp = post(&p, Some(&sid), &call(9));
        assert_eq!(resp.status, 200, "{mode:?}: {}\n{}", resp.raw_text(), p.stderr_text());
        let v = body(&resp);
        assert_eq!(v["id"], 9, "{mode:?}");
        assert_eq!(v["result"]["session"], "big-2", "{mode:?}: the call reached the re-initialised session");
        assert_eq!(resp.all("mcp-session-id"), [sid.as_str()], "{mode:?}");
        // The log line may reach the pipe a moment after the answer.
        let t0 = std::time::Instant::now();
        while !p.stderr_text().contains("MCP session re-initialised") && t0.elapsed() < Duration::from_secs(3)
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        let log = p.stderr_text();
        assert!(log.contains("MCP session re-initialised"), "{mode:?}: {log}");
        assert!(!log.contains("no protocol version"), "{mode:?}: {log}");
    }
}
