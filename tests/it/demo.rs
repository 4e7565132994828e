//! The quickstart demo's session logic (`tests/examples/demo_session.rs`,
//! the same file `cargo run --example demo` runs), in-process: built-in MCP
//! server, the proxy through `Proxy::bind`, and the scripted client.

#[path = "../examples/demo_session.rs"]
mod session;

use serde_json::json;
use session::{Client, Demo, DemoServer, AGENT};

#[test]
fn demo_session_one_session_line_stamped_sender_injected_token() {
    let demo = Demo::start().expect("start the demo server and proxy");
    let token = demo.server.token.clone();
    let t = session::run_script(&demo).expect("scripted session through the proxy");

    let steps: Vec<(&str, u16)> = t.steps.iter().map(|s| (s.label.as_str(), s.status)).collect();
    assert_eq!(
        steps,
        [
            ("POST initialize", 200),
            ("POST notifications/initialized", 202),
            ("POST tools/list", 200),
            ("POST tools/call chat_send", 200),
            ("DELETE /mcp", 200),
        ]
    );
    // Exactly one session line per response (the server writes
    // `Mcp-Session-Id`; case-insensitively there is still one).
    for step in &t.steps {
        assert_eq!(step.session_lines, [format!("mcp-session-id: {}", t.session_id)], "{}", step.label);
    }
    assert_eq!(t.tools, ["chat_send", "chat_read", "chat_who"]);

    // The client claimed "mallory" with a forged token; the server saw the
    // agent's name and the agent's token.
    let seen = t.seen.clone().expect("the server recorded the tools/call");
    assert_eq!(seen.tool, "chat_send");
    assert_eq!(seen.sender.as_deref(), Some(AGENT));
    assert_eq!(seen.authorization, Some(format!("Bearer {token}")));
    assert_eq!(seen.x_agent_token.as_deref(), Some(token.as_str()));
    assert_eq!(t.call_result["sender"], AGENT);
    assert_eq!(t.call_result["token"], token.as_str());
    assert_eq!(session::problems(&t, &token), Vec::<String>::new());

    // DELETE ended the session: the server's 404 comes back through the proxy.
    let mut client = Client::connect(demo.proxy_addr).expect("connect to the proxy");
    let list = json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"});
    let r = client.request("POST", Some(&t.session_id), &[], Some(&list)).expect("post after delete");
    assert_eq!(r.status().expect("status").0, 404);
    assert_eq!(r.json().expect("json")["error"]["message"], "Session not found");

    // The in-process proxy stops on request, like on SIGTERM.
    drop(client);
    demo.stop.shutdown();
    let started = std::time::Instant::now();
    while !demo.proxy_thread.is_finished() {
        assert!(started.elapsed() < std::time::Duration::from_secs(7), "proxy did not stop");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(demo.proxy_thread.join().expect("proxy thread").is_ok());
}

#[test]
fn demo_server_requires_the_bearer_token() {
    let server = DemoServer::start("demo-test-token".into()).expect("start demo server");
    let init = json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": session::PROTOCOL_VERSION, "capabilities": {},
        "clientInfo": {"name": "t", "version": "1"}}});
    let mut client = Client::connect(server.addr).expect("connect to the server");
    let r = client.request("POST", None, &[], Some(&init)).expect("initialize without a token");
    assert_eq!(r.status().expect("status").0, 401);
    assert!(r.header("www-authenticate").is_some());
    let r = client
        .request("POST", None, &[("Authorization", "Bearer demo-test-token")], Some(&init))
        .expect("initialize with the token");
    assert_eq!(r.status().expect("status").0, 200);
    assert_eq!(r.header_lines("mcp-session-id").len(), 1);
}
