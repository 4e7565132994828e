//! Real MCP SDK clients through the real binary against a real MCP server.
//!
//! Upstream: `tests/support/fastmcp_server.py` (FastMCP from the Python SDK 1.x, or MCPServer from 2.x),
//! requiring `Authorization: Bearer TOKEN`, DNS-rebinding protection on. Clients: the Python SDK 1.x and 2.x,
//! the TypeScript SDK on Node's fetch (scripts in `tests/support/`) and rmcp (`tests/rmcp_client/`), each
//! printing its observations as JSON on stdout.
//! Each client sends spoofed credentials (`Authorization: Bearer spoof`, `X-Agent-Token: spoof`) and a
//! spoofed identity (`sender: "mallory"`); through the proxy the server must see exactly one
//! `Bearer TOKEN`, one `X-Agent-Token: TOKEN` and the agent's name.
//!
//! The `*_direct_*` tests run the same scripts against the server without the proxy (with the real token):
//! when a `*_through_proxy` test fails and its direct twin passes, the proxy is at fault.
//!
//! The pinned SDKs are installed (and the rmcp client built) on first use by `realenv` (under
//! `target/realenv/`); these tests never skip.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cases;
use crate::support::checks::Checks;
use crate::support::proxy_process::ProxyProcess;
use crate::support::realenv::{self, FastMcp, ScriptRun};

/// The agent name the proxy stamps.
const AGENT: &str = "claude-prime";
/// The upstream's bearer token (shaped like agentchattr's `secrets.token_hex(16)`).
const TOKEN: &str = "5f0c9e2b7a4d41c8b3e6a9d2c7f1e084";
/// What a client sends as its own identity; must never reach the server through the proxy.
const SPOOF_SENDER: &str = "mallory";
/// A streamed notification reaches the client within this many ms of being sent: less than the 600 ms the
/// server waits before sending the next one (`slow_progress` in tests/support/fastmcp_server.py), so each one is
/// shown to arrive before its successor exists, i.e. streamed, not held until the answer. A gross bound that a
/// loaded 2-core machine still meets (a 50 ms bound failed there at 55-130 ms).
const MAX_NOTIFICATION_LATENCY_MS: f64 = 500.0;
/// Bound on one client script run.
const SCRIPT_LIMIT: Duration = Duration::from_secs(90);

fn pretty(v: &Value) -> String {
    serde_json::to_string_pretty(v).unwrap_or_default()
}

fn timed(name: &str, started: Instant) {
    eprintln!("{name}: {:.2}s wall", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------------------------
// Expectations shared by the script clients (py1, py2, ts).

/// What the server must have seen, and how the session must look.
#[derive(Clone)]
struct Expect {
    /// The identity the server saw in `sender` / `name`.
    sender: String,
    /// The single Authorization value the server saw.
    authorization: String,
    /// The single X-Agent-Token value the server saw.
    x_agent_token: String,
    /// The single Host value the server saw.
    host: String,
    /// No Mcp-Session-Id anywhere (2026-07-28 stateless, or legacy SSE).
    sessionless: bool,
    /// Protocol 2026-07-28 negotiated and sent on every request.
    modern: bool,
    /// The client sends a closing DELETE (py: on exit; ts: terminateSession()).
    delete: bool,
    /// What the client sent in chat_send's `message`.
    message: &'static str,
    /// The `sender` the server saw in slow_progress, a tool outside the stamp map whose schema has a string
    /// `sender`: the client's own directly, the agent's once the proxy learned it from the tools/list answer
    /// (streamable HTTP; a legacy SSE list travels on the GET stream, which the proxy does not filter yet).
    learned: String,
}

impl Expect {
    fn direct(up: &FastMcp, message: &'static str) -> Expect {
        Expect {
            sender: SPOOF_SENDER.into(),
            authorization: format!("Bearer {TOKEN}"),
            x_agent_token: TOKEN.into(),
            host: format!("127.0.0.1:{}", up.port),
            sessionless: false,
            modern: false,
            delete: true,
            message,
            learned: SPOOF_SENDER.into(),
        }
    }

    fn proxied(up: &FastMcp, message: &'static str) -> Expect {
        Expect { sender: AGENT.into(), learned: AGENT.into(), ..Expect::direct(up, message) }
    }
}

/// Client arguments: the real credentials (direct) or spoofed ones (through the proxy).
fn direct_args(url: &str) -> Vec<String> {
    vec![
        url.into(),
        "--authorization".into(),
        format!("Bearer {TOKEN}"),
        "--x-agent-token".into(),
        TOKEN.into(),
        "--sender".into(),
        SPOOF_SENDER.into(),
    ]
}

fn spoofed_args(url: &str) -> Vec<String> {
    vec![
        url.into(),
        "--authorization".into(),
        "Bearer spoof".into(),
        "--x-agent-token".into(),
        "spoof".into(),
        "--sender".into(),
        SPOOF_SENDER.into(),
    ]
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// The checks every script client's JSON must pass: tools, stamped identity, replaced credentials, one
/// session id everywhere, streamed notifications, closing DELETE.
fn check_lifecycle(c: &mut Checks, out: &Value, exp: &Expect) {
    if let Some(err) = out["error"].as_str() {
        // The client failed: its error is the finding (a JS stack leads with it, a Python trace ends with it);
        // the rest would be noise. The whole text is in the evidence.
        let lines: Vec<&str> = err.trim_end().lines().collect();
        let first = lines.first().copied().unwrap_or("");
        let last = lines.last().copied().unwrap_or("");
        c.check(false, format!("the client failed: {first} ... {last}"));
        return;
    }
    c.eq("closed", &out["closed"], &json!(true));
    let tools: Vec<&str> =
        out["tools"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    for t in ["chat_send", "chat_read", "chat_join", "chat_who", "slow_progress"] {
        c.check(tools.contains(&t), format!("tools/list lacks {t}: {tools:?}"));
    }

    let session = out["session_id"].clone();
    if exp.modern {
        c.eq("protocol_version", &out["protocol_version"], &json!("2026-07-28"));
    }
    if !exp.sessionless {
        c.check(session.as_str().is_some_and(|s| !s.is_empty()), format!("no session id: {session}"));
        c.check(
            session.as_str().is_some_and(|s| s.bytes().all(|b| (0x21..=0x7e).contains(&b))),
            format!("session id {session} is not visible ASCII (joined duplicate?)"),
        );
    }

    let calls = &out["calls"];
    let identity = [("chat_send", "sender"), ("chat_read", "sender"), ("chat_join", "name")];
    for (tool, key) in identity {
        c.eq(&format!("{tool}.{key} seen by the server"), &calls[tool][key], &json!(exp.sender));
    }
    // slow_progress is outside the default stamp map (agentchattr's tools only), but its schema has a string
    // `sender` (the default --identity-param) and the client listed the tools first: a learned stamp.
    c.eq(
        "slow_progress.sender (learned from tools/list) seen by the server",
        &calls["slow_progress"]["sender"],
        &json!(exp.learned),
    );
    c.check(
        calls["chat_who"].get("sender").is_none() && calls["chat_who"].get("name").is_none(),
        format!("chat_who must not be stamped: {}", calls["chat_who"]),
    );
    c.eq("chat_send.message", &calls["chat_send"]["message"], &json!(exp.message));
    c.eq("chat_send.channel", &calls["chat_send"]["channel"], &json!("general"));
    for tool in ["chat_send", "chat_read", "chat_join", "chat_who", "slow_progress"] {
        let call = &calls[tool];
        c.eq(
            &format!("{tool}: Authorization lines seen"),
            &call["authorization"],
            &json!([exp.authorization]),
        );
        c.eq(
            &format!("{tool}: X-Agent-Token lines seen"),
            &call["x_agent_token"],
            &json!([exp.x_agent_token]),
        );
        c.eq(&format!("{tool}: Host lines seen"), &call["host"], &json!([exp.host]));
        if exp.sessionless {
            c.eq(&format!("{tool}: Mcp-Session-Id lines seen"), &call["mcp_session_id"], &json!([]));
            if exp.modern {
                c.eq(
                    &format!("{tool}: MCP-Protocol-Version seen"),
                    &call["mcp_protocol_version"],
                    &json!(["2026-07-28"]),
                );
            }
        } else {
            c.eq(&format!("{tool}: Mcp-Session-Id lines seen"), &call["mcp_session_id"], &json!([session]));
            c.check(
                call["mcp_protocol_version"].as_array().is_some_and(|a| a.len() == 1),
                format!(
                    "{tool}: MCP-Protocol-Version seen {} (want exactly one)",
                    call["mcp_protocol_version"]
                ),
            );
        }
    }

    for (kind, want) in [("progress", 3), ("logs", 3)] {
        let items = out[kind].as_array().cloned().unwrap_or_default();
        c.check(items.len() == want, format!("{kind}: {} notifications, want {want}", items.len()));
        for (i, item) in items.iter().enumerate() {
            let lat = item["latency_ms"].as_f64().unwrap_or(f64::INFINITY);
            c.check(
                lat < MAX_NOTIFICATION_LATENCY_MS,
                format!("{kind}[{i}] arrived {lat:.1} ms after it was sent (limit {MAX_NOTIFICATION_LATENCY_MS} ms)"),
            );
        }
    }

    let http = out["http"].as_array().cloned().unwrap_or_default();
    c.check(!http.is_empty(), "no HTTP exchanges recorded");
    for (i, h) in http.iter().enumerate() {
        let what = format!("http[{i}] {} {}", h["method"], h["status"]);
        if let Some(ids) = h.get("session_ids") {
            if exp.sessionless {
                c.eq(&format!("{what}: Mcp-Session-Id lines"), ids, &json!([]));
            } else {
                c.check(
                    ids.as_array().is_some_and(|a| a.len() <= 1),
                    format!("{what}: Mcp-Session-Id lines {ids}"),
                );
            }
        }
        // What the client's HTTP stack reads (joined on duplicates): FastMCP puts the session id on every
        // response of the session, so each must read exactly it. The 2.x client's discover probe is outside.
        let got = &h["session_get"];
        let discover = h["sent_mcp_method"] == "server/discover";
        if exp.sessionless {
            c.eq(&format!("{what}: Mcp-Session-Id read"), got, &Value::Null);
        } else if !discover {
            c.eq(&format!("{what}: Mcp-Session-Id read"), got, &session);
        }
        let status = h["status"].as_u64().unwrap_or(0);
        c.check((200..300).contains(&status) || discover, format!("{what}: non-2xx status"));
    }
    if exp.delete {
        let last = http.last().cloned().unwrap_or(Value::Null);
        c.eq("last exchange method", &last["method"], &json!("DELETE"));
        c.eq("closing DELETE status", &last["status"], &json!(200));
    } else {
        c.check(!http.iter().any(|h| h["method"] == "DELETE"), "a sessionless client sent DELETE");
    }
}

fn evidence(run: &ScriptRun, proxy: Option<&ProxyProcess>, up: &FastMcp) -> Vec<(&'static str, String)> {
    let mut ev = vec![("client JSON", pretty(&run.json)), ("client stderr", run.stderr.clone())];
    if let Some(p) = proxy {
        ev.push(("proxy stderr", p.stderr_text()));
    }
    ev.push(("upstream stderr", up.stderr_text()));
    ev
}

// ---------------------------------------------------------------------------------------------------------
// Twins: one client scenario run direct to the server (real credentials) and through the proxy (spoofed
// credentials). When the proxied twin fails and the direct one passes, the proxy is at fault.

/// The MCP transport a twin's server runs and its client speaks.
#[derive(Clone, Copy)]
enum Transport {
    /// Streamable HTTP at `/mcp`.
    StreamableHttp,
    /// The legacy HTTP+SSE transport at `/sse` (the client gets `--transport sse`).
    LegacySse,
}

/// One client scenario: which server, which client, and the checks its JSON must pass given the expectation
/// for the route taken (`Expect::direct` or `Expect::proxied`).
struct Scenario {
    server: fn() -> &'static Path,
    transport: Transport,
    run: fn(&[String]) -> ScriptRun,
    message: &'static str,
    check: fn(&mut Checks, &Value, &Expect, &FastMcp),
}

/// Which way a twin's client reaches the server.
#[derive(Clone, Copy)]
enum Route {
    /// Straight to the server, with the real token.
    Direct,
    /// Through the proxy, with spoofed credentials and identity.
    Proxied,
}

/// Run `scenario` by `route`, and check it.
#[track_caller]
fn run_twin(test: &str, scenario: Scenario, route: Route) {
    let started = Instant::now();
    let (server_transport, path) = match scenario.transport {
        Transport::StreamableHttp => ("streamable-http", "/mcp"),
        Transport::LegacySse => ("sse", "/sse"),
    };
    let client_args = |args: Vec<String>| match scenario.transport {
        Transport::StreamableHttp => args,
        Transport::LegacySse => legacy_args(args),
    };
    let up = FastMcp::start((scenario.server)(), server_transport, TOKEN);
    let (proxy, run, exp) = match route {
        Route::Proxied => {
            let proxy = ProxyProcess::builder(up.url(path)).agent(AGENT).token(TOKEN).start();
            let run = (scenario.run)(&client_args(spoofed_args(&proxy.url(path))));
            (Some(proxy), run, Expect::proxied(&up, scenario.message))
        }
        Route::Direct => {
            let run = (scenario.run)(&client_args(direct_args(&up.url(path))));
            (None, run, Expect::direct(&up, scenario.message))
        }
    };
    let mut c = Checks::default();
    (scenario.check)(&mut c, &run.json, &exp, &up);
    c.finish(test, &evidence(&run, proxy.as_ref(), &up));
    timed(test, started);
}

// ---------------------------------------------------------------------------------------------------------
// Python SDK 1.x: streamable_http_client + ClientSession against FastMCP 1.x.

fn run_py1(url_args: &[String]) -> ScriptRun {
    let cmd = realenv::python_script(realenv::py1(), "py1_client.py", &strs(url_args));
    realenv::run_json("py1_client.py", cmd, SCRIPT_LIMIT)
}

/// The Python SDK 1.x client over streamable HTTP against FastMCP 1.x.
fn py1_streamable() -> Scenario {
    Scenario {
        server: realenv::py1,
        transport: Transport::StreamableHttp,
        run: run_py1,
        message: "hello from py1",
        check: |c, out, exp, _| check_lifecycle(c, out, exp),
    }
}

cases! { run_twin;
    python_sdk_1x_client_direct_to_fastmcp => py1_streamable(), Route::Direct;
    python_sdk_1x_client_through_proxy => py1_streamable(), Route::Proxied;
}

// ---------------------------------------------------------------------------------------------------------
// Python SDK 2.x: the default `mcp.Client` (mode "auto").

fn run_py2(url_args: &[String]) -> ScriptRun {
    let cmd = realenv::python_script(realenv::py2(), "py2_client.py", &strs(url_args));
    realenv::run_json("py2_client.py", cmd, SCRIPT_LIMIT)
}

/// Extra checks for a 2026-07-28 stateless exchange: the discover probe succeeded, every POST carried
/// `Mcp-Method`, no request carried a session id.
fn check_stateless(c: &mut Checks, out: &Value) {
    let http = out["http"].as_array().cloned().unwrap_or_default();
    let first = http.first().cloned().unwrap_or(Value::Null);
    c.eq("first request Mcp-Method", &first["sent_mcp_method"], &json!("server/discover"));
    c.eq("server/discover status", &first["status"], &json!(200));
    for (i, h) in http.iter().enumerate() {
        c.check(h["method"] == "POST", format!("http[{i}]: stateless client sent {}", h["method"]));
        c.check(h["sent_mcp_method"].is_string(), format!("http[{i}]: no Mcp-Method header sent"));
        c.eq(&format!("http[{i}] sent Mcp-Session-Id"), &h["sent_session_id"], &Value::Null);
        c.eq(
            &format!("http[{i}] sent MCP-Protocol-Version"),
            &h["sent_protocol_version"],
            &json!("2026-07-28"),
        );
    }
}

/// The Python SDK 2.x client against MCPServer 2.x, stateless (2026-07-28).
fn py2_stateless() -> Scenario {
    Scenario {
        server: realenv::py2,
        transport: Transport::StreamableHttp,
        run: run_py2,
        message: "hello from py2",
        check: |c, out, exp, _| {
            let exp = Expect { sessionless: true, modern: true, delete: false, ..exp.clone() };
            check_lifecycle(c, out, &exp);
            check_stateless(c, out);
        },
    }
}

cases! { run_twin;
    python_sdk_2x_client_direct_to_mcpserver_stateless => py2_stateless(), Route::Direct;
    python_sdk_2x_client_stateless_through_proxy => py2_stateless(), Route::Proxied;
}

/// The 2.x client against agentchattr's actual server (FastMCP 1.x): the `server/discover` probe is
/// answered 400 (with a fresh, unused session id) and the client falls back to the initialize handshake.
#[test]
fn python_sdk_2x_client_falls_back_to_initialize_on_fastmcp_1x_through_proxy() {
    let started = Instant::now();
    let up = FastMcp::start(realenv::py1(), "streamable-http", TOKEN);
    let proxy = ProxyProcess::builder(up.url("/mcp")).agent(AGENT).token(TOKEN).start();
    let run = run_py2(&spoofed_args(&proxy.url("/mcp")));
    let mut c = Checks::default();
    let out = &run.json;
    let http = out["http"].as_array().cloned().unwrap_or_default();
    c.eq(
        "probe Mcp-Method",
        &http.first().map_or(Value::Null, |h| h["sent_mcp_method"].clone()),
        &json!("server/discover"),
    );
    c.eq("probe status", &http.first().map_or(Value::Null, |h| h["status"].clone()), &json!(400));
    c.eq("protocol_version", &out["protocol_version"], &json!("2025-11-25"));
    // The session is the one from the initialize response (the second exchange), used from then on.
    let session = http.get(1).map_or(Value::Null, |h| h["session_get"].clone());
    let mut with_session = out.clone();
    with_session["session_id"] = session;
    check_lifecycle(&mut c, &with_session, &Expect::proxied(&up, "hello from py2"));
    c.finish(
        "python_sdk_2x_client_falls_back_to_initialize_on_fastmcp_1x_through_proxy",
        &evidence(&run, Some(&proxy), &up),
    );
    timed("python_sdk_2x_client_falls_back_to_initialize_on_fastmcp_1x_through_proxy", started);
}

// ---------------------------------------------------------------------------------------------------------
// TypeScript SDK: StreamableHTTPClientTransport on Node's fetch.

fn run_ts(url_args: &[String]) -> ScriptRun {
    let cmd = realenv::node_script("ts_client.cjs", &strs(url_args));
    realenv::run_json("ts_client.cjs", cmd, SCRIPT_LIMIT)
}

/// TS-only checks: terminateSession() cleared the id, and the standalone GET stream carried the server's
/// out-of-request notifications (tapped on the wire, and delivered to the client's handlers).
fn check_ts_extras(c: &mut Checks, out: &Value) {
    c.eq("session id after terminateSession()", &out["session_id_after_terminate"], &Value::Null);
    c.eq("transport errors", &out["transport_errors"], &json!([]));
    c.eq("GET stream opened", &out["get_stream_open"], &json!(true));
    let on_get: Vec<&str> = out["get_stream_events"]
        .as_array()
        .map(|a| a.iter().filter_map(|e| e["method"].as_str()).collect())
        .unwrap_or_default();
    c.check(
        on_get.contains(&"notifications/tools/list_changed") && on_get.contains(&"notifications/message"),
        format!("GET stream carried {on_get:?}, want tools/list_changed and message"),
    );
    c.check(
        out["tool_list_changed"].as_array().is_some_and(|a| a.len() == 1),
        format!("tools/list_changed handler calls: {}", out["tool_list_changed"]),
    );
    let standalone = out["standalone_logs"].as_array().cloned().unwrap_or_default();
    c.check(standalone.len() == 1, format!("standalone log messages: {standalone:?}"));
    for s in &standalone {
        let lat = s["latency_ms"].as_f64().unwrap_or(f64::INFINITY);
        c.check(lat < MAX_NOTIFICATION_LATENCY_MS, format!("standalone log arrived after {lat:.1} ms"));
    }
    c.eq(
        "notify_standalone Authorization seen",
        &out["calls"]["notify_standalone"]["authorization"],
        &out["calls"]["chat_send"]["authorization"],
    );
}

/// The TypeScript SDK client over streamable HTTP against FastMCP 1.x.
fn ts_streamable() -> Scenario {
    Scenario {
        server: realenv::py1,
        transport: Transport::StreamableHttp,
        run: run_ts,
        message: "hello from ts",
        check: |c, out, exp, _| {
            check_lifecycle(c, out, exp);
            check_ts_extras(c, out);
        },
    }
}

cases! { run_twin;
    typescript_sdk_client_direct_to_fastmcp => ts_streamable(), Route::Direct;
    typescript_sdk_client_through_proxy => ts_streamable(), Route::Proxied;
}

// ---------------------------------------------------------------------------------------------------------
// rmcp (the Rust SDK Codex uses), with its default reqwest client (one connection per request): the program in
// `tests/rmcp_client/`, built on first use by `realenv`, JSON on stdout like the scripts.

fn run_rmcp(url_args: &[String]) -> ScriptRun {
    realenv::run_json("rmcp-test-client", realenv::rmcp_client_command(&strs(url_args)), SCRIPT_LIMIT)
}

/// The four calls the client makes, in order.
const RMCP_CALLS: [&str; 4] = ["chat_send", "chat_join", "chat_read", "chat_who"];

fn check_rmcp(c: &mut Checks, out: &Value, sender: &str, up: &FastMcp) {
    if let Some(err) = out["error"].as_str() {
        c.check(false, format!("the client failed: {err}"));
        return;
    }
    c.eq("closed", &out["closed"], &json!(true));
    c.eq("server name", &out["server"], &json!("agentchattr-test"));
    c.check(out["protocol_version"].as_str().is_some_and(|p| !p.is_empty()), "no protocol version");
    let tools: Vec<&str> =
        out["tools"].as_array().map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    for t in ["chat_send", "chat_read", "chat_join", "chat_who", "slow_progress"] {
        c.check(tools.contains(&t), format!("tools/list lacks {t}: {tools:?}"));
    }
    let calls = &out["calls"];
    let made: Vec<&str> =
        calls.as_object().map(|m| m.keys().map(String::as_str).collect()).unwrap_or_default();
    c.check(
        made.len() == RMCP_CALLS.len() && RMCP_CALLS.iter().all(|t| made.contains(t)),
        format!("calls made: {made:?}, want {RMCP_CALLS:?}"),
    );
    for (tool, key) in [("chat_send", "sender"), ("chat_read", "sender"), ("chat_join", "name")] {
        c.eq(&format!("{tool}.{key} seen by the server"), &calls[tool][key], &json!(sender));
    }
    c.check(calls["chat_who"].get("sender").is_none(), "chat_who must not be stamped");
    c.eq("chat_send.message", &calls["chat_send"]["message"], &json!("hello from rmcp"));
    let session = calls["chat_send"]["mcp_session_id"].clone();
    c.check(session.as_array().is_some_and(|a| a.len() == 1), format!("Mcp-Session-Id lines seen {session}"));
    for tool in RMCP_CALLS {
        let call = &calls[tool];
        c.eq(
            &format!("{tool}: Authorization lines seen"),
            &call["authorization"],
            &json!([format!("Bearer {TOKEN}")]),
        );
        c.eq(&format!("{tool}: X-Agent-Token lines seen"), &call["x_agent_token"], &json!([TOKEN]));
        c.eq(&format!("{tool}: Host lines seen"), &call["host"], &json!([format!("127.0.0.1:{}", up.port)]));
        c.eq(&format!("{tool}: Mcp-Session-Id lines seen"), &call["mcp_session_id"], &session);
    }
}

/// The rmcp client over streamable HTTP against FastMCP 1.x.
fn rmcp_streamable() -> Scenario {
    Scenario {
        server: realenv::py1,
        transport: Transport::StreamableHttp,
        run: run_rmcp,
        message: "hello from rmcp",
        check: |c, out, exp, up| check_rmcp(c, out, &exp.sender, up),
    }
}

cases! { run_twin;
    rmcp_client_direct_to_fastmcp => rmcp_streamable(), Route::Direct;
    rmcp_client_through_proxy => rmcp_streamable(), Route::Proxied;
}

// ---------------------------------------------------------------------------------------------------------
// The original defect (bcurts/agentchattr#80): a repeated session header that Node fetch and httpx join
// into "abc, abc".

/// A std::net upstream that answers every request with an initialize result and the session id on two
/// field lines in different case (`MCP-SESSION-ID: abc`, `mcp-session-id: abc`). Keeps connections alive.
/// Records each raw request head.
struct DupSessionStub {
    port: u16,
    requests: Arc<Mutex<Vec<String>>>,
}

const DUP_SESSION_BODY: &str = r#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}},"serverInfo":{"name":"dup-stub","version":"0"}}}"#;

impl DupSessionStub {
    fn start() -> DupSessionStub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind stub");
        let port = listener.local_addr().unwrap().port();
        let requests = Arc::new(Mutex::new(Vec::new()));
        let log = requests.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { break };
                let log = log.clone();
                std::thread::spawn(move || Self::serve(stream, log));
            }
        });
        DupSessionStub { port, requests }
    }

    fn serve(mut s: TcpStream, log: Arc<Mutex<Vec<String>>>) {
        let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
        let mut buf = Vec::new();
        loop {
            // Read one request head.
            let head_end = loop {
                if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                    break i + 4;
                }
                let mut chunk = [0u8; 4096];
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            };
            let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
            let len = head
                .lines()
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
                .and_then(|(_, v)| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while buf.len() < head_end + len {
                let mut chunk = [0u8; 4096];
                match s.read(&mut chunk) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => buf.extend_from_slice(&chunk[..n]),
                }
            }
            buf.drain(..head_end + len);
            log.lock().unwrap().push(head);
            let resp = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMCP-SESSION-ID: abc\r\n\
                 mcp-session-id: abc\r\nContent-Length: {}\r\n\r\n{DUP_SESSION_BODY}",
                DUP_SESSION_BODY.len()
            );
            if s.write_all(resp.as_bytes()).is_err() {
                return;
            }
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

/// Send an initialize on a raw socket; return the response head.
fn raw_initialize(port: u16) -> Result<String, String> {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    let mut s = TcpStream::connect(("127.0.0.1", port)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let req = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        match s.read(&mut chunk) {
            Ok(0) => {
                return Err(format!("EOF before the end of the head: {:?}", String::from_utf8_lossy(&buf)))
            }
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => return Err(format!("{e} after {:?}", String::from_utf8_lossy(&buf))),
        }
    }
    let end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

fn session_lines(head: &str) -> Vec<String> {
    head.lines()
        .filter(|l| l.split_once(':').is_some_and(|(k, _)| k.eq_ignore_ascii_case("mcp-session-id")))
        .map(str::to_string)
        .collect()
}

#[test]
fn session_header_not_duplicated_for_node_fetch_and_httpx() {
    let started = Instant::now();
    let stub = DupSessionStub::start();
    let mut c = Checks::default();
    let mut ev: Vec<(&str, String)> = Vec::new();

    // The stub reproduces the symptom: directly, both stacks read the joined value.
    let node_direct = realenv::run_json(
        "read_session_header.cjs (direct)",
        realenv::plain_node_script("read_session_header.cjs", &[&stub.url()]),
        SCRIPT_LIMIT,
    );
    let httpx_direct = realenv::run_json(
        "read_session_header.py (direct)",
        realenv::python_script(realenv::py1(), "read_session_header.py", &[&stub.url()]),
        SCRIPT_LIMIT,
    );
    c.eq("node fetch reads (direct, stub sends two lines)", &node_direct.json["get"], &json!("abc, abc"));
    c.eq("httpx reads (direct, stub sends two lines)", &httpx_direct.json["get"], &json!("abc, abc"));

    let proxy = ProxyProcess::builder(stub.url()).agent(AGENT).token(TOKEN).start();

    // The raw wire through the proxy: exactly one session line, value byte-exact.
    match raw_initialize(proxy.port) {
        Ok(head) => {
            let lines = session_lines(&head);
            c.check(lines.len() == 1, format!("Mcp-Session-Id lines on the wire: {lines:?}"));
            c.check(
                lines.iter().all(|l| l.split_once(':').map(|(_, v)| v.trim()) == Some("abc")),
                format!("Mcp-Session-Id value on the wire: {lines:?}"),
            );
            ev.push(("raw response head through the proxy", head));
        }
        Err(e) => c.check(false, format!("raw initialize through the proxy: {e}")),
    }

    let node = realenv::run_json(
        "read_session_header.cjs (proxy)",
        realenv::plain_node_script("read_session_header.cjs", &[&proxy.url("/mcp")]),
        SCRIPT_LIMIT,
    );
    let httpx = realenv::run_json(
        "read_session_header.py (proxy)",
        realenv::python_script(realenv::py1(), "read_session_header.py", &[&proxy.url("/mcp")]),
        SCRIPT_LIMIT,
    );
    c.eq("node fetch status", &node.json["status"], &json!(200));
    c.eq("node fetch reads Mcp-Session-Id", &node.json["get"], &json!("abc"));
    c.eq("httpx status", &httpx.json["status"], &json!(200));
    c.eq("httpx reads Mcp-Session-Id", &httpx.json["get"], &json!("abc"));
    c.eq("httpx field lines", &httpx.json["get_list"], &json!(["abc"]));

    ev.push(("node (proxy)", node.stdout.clone()));
    ev.push(("httpx (proxy)", httpx.stdout.clone()));
    ev.push(("requests the stub received", stub.requests.lock().unwrap().join("\n")));
    ev.push(("proxy stderr", proxy.stderr_text()));
    c.finish("session_header_not_duplicated_for_node_fetch_and_httpx", &ev);
    timed("session_header_not_duplicated_for_node_fetch_and_httpx", started);
}

// ---------------------------------------------------------------------------------------------------------
// Legacy HTTP+SSE (MCP 2024-11-05, Transports, HTTP with SSE): `GET /sse` + `POST /messages/?session_id=...`, FastMCP run with
// transport "sse". The proxy is path-transparent: its `--upstream` is the `/sse` URL.

fn legacy_args(base: Vec<String>) -> Vec<String> {
    let mut v = base;
    v.push("--transport".into());
    v.push("sse".into());
    v
}

/// The legacy transport's shape; a proxied list is learned from there too (the
/// legacy stream carries the answer to the POST's tools/list).
fn legacy_expect(exp: Expect) -> Expect {
    Expect { sessionless: true, modern: false, delete: false, ..exp }
}

/// The legacy shape: one `GET /sse` (200), then every message a `POST /messages/?session_id=...` (202).
fn check_legacy_sse(c: &mut Checks, out: &Value) {
    let http = out["http"].as_array().cloned().unwrap_or_default();
    let first = http.first().cloned().unwrap_or(Value::Null);
    c.eq(
        "first exchange",
        &json!([first["method"], first["path"], first["status"]]),
        &json!(["GET", "/sse", 200]),
    );
    for (i, h) in http.iter().enumerate().skip(1) {
        let path = h["path"].as_str().unwrap_or("");
        c.check(
            h["method"] == "POST" && path.starts_with("/messages/?session_id=") && h["status"] == 202,
            format!(
                "http[{i}]: {} {path} {} (want POST /messages/?session_id=... 202)",
                h["method"], h["status"]
            ),
        );
    }
}

/// The Python SDK 1.x client over legacy HTTP+SSE against FastMCP 1.x.
fn py1_legacy_sse() -> Scenario {
    Scenario {
        server: realenv::py1,
        transport: Transport::LegacySse,
        run: run_py1,
        message: "hello from py1",
        check: |c, out, exp, _| {
            check_lifecycle(c, out, &legacy_expect(exp.clone()));
            check_legacy_sse(c, out);
        },
    }
}

cases! { run_twin;
    python_sdk_sse_client_direct_to_fastmcp => py1_legacy_sse(), Route::Direct;
    python_sdk_sse_client_through_proxy => py1_legacy_sse(), Route::Proxied;
}

/// The TypeScript SDK client over legacy HTTP+SSE against FastMCP 1.x.
fn ts_legacy_sse() -> Scenario {
    Scenario {
        server: realenv::py1,
        transport: Transport::LegacySse,
        run: run_ts,
        message: "hello from ts",
        check: |c, out, exp, _| {
            check_lifecycle(c, out, &legacy_expect(exp.clone()));
            check_legacy_sse(c, out);
            check_ts_extras(c, out);
        },
    }
}

cases! { run_twin;
    typescript_sdk_sse_client_direct_to_fastmcp => ts_legacy_sse(), Route::Direct;
    typescript_sdk_sse_client_through_proxy => ts_legacy_sse(), Route::Proxied;
}

/// An upstream whose `endpoint` event is absolute (`http://127.0.0.1:<upstream port>/messages/?...`). Both SDK
/// clients reject an endpoint on another origin than the SSE URL, so through the proxy this passes only if the
/// proxy rewrites it to its own origin. Directly, the same upstream works (baseline).
#[test]
fn sse_absolute_endpoint_rewritten_for_python_and_typescript_clients() {
    let started = Instant::now();
    let up = FastMcp::start_with(realenv::py1(), &["--transport", "sse", "--absolute-endpoint"], TOKEN);
    let mut c = Checks::default();
    let mut ev: Vec<(&str, String)> = Vec::new();

    let py_direct = run_py1(&legacy_args(direct_args(&up.url("/sse"))));
    let ts_direct = run_ts(&legacy_args(direct_args(&up.url("/sse"))));
    c.eq("python, direct: error", &py_direct.json["error"], &Value::Null);
    c.eq("typescript, direct: error", &ts_direct.json["error"], &Value::Null);

    let proxy = ProxyProcess::builder(up.url("/sse")).agent(AGENT).token(TOKEN).start();
    // A rejected endpoint hangs the Python SSE client (it never sends a request): bound it at 10 s.
    let bounded = |url: &str| {
        let mut v = legacy_args(spoofed_args(url));
        v.extend(["--timeout".to_string(), "10".to_string()]);
        v
    };
    let py = run_py1(&bounded(&proxy.url("/sse")));
    let ts = run_ts(&bounded(&proxy.url("/sse")));
    for (name, run, message) in [("python", &py, "hello from py1"), ("typescript", &ts, "hello from ts")] {
        let mut sub = Checks::default();
        check_lifecycle(&mut sub, &run.json, &legacy_expect(Expect::proxied(&up, message)));
        check_legacy_sse(&mut sub, &run.json);
        c.failures.extend(sub.failures.into_iter().map(|f| format!("{name}, through the proxy: {f}")));
        ev.push((if name == "python" { "python JSON" } else { "typescript JSON" }, pretty(&run.json)));
    }
    ev.push(("proxy stderr", proxy.stderr_text()));
    ev.push(("upstream stderr", up.stderr_text()));
    c.finish("sse_absolute_endpoint_rewritten_for_python_and_typescript_clients", &ev);
    timed("sse_absolute_endpoint_rewritten_for_python_and_typescript_clients", started);
}

// ---------------------------------------------------------------------------------------------------------
// Live identity: the wrapper re-registers mid-session and rewrites `--identity-file` (rename + new token).

/// The new identity after the switch.
const AGENT_2: &str = "claude-prime-2";
const TOKEN_2: &str = "9a1d3c5e7f2b4d6a8c0e1f3a5b7d9c2e";

#[test]
fn identity_file_change_mid_session_seen_by_next_tool_call() {
    let started = Instant::now();
    // The upstream accepts both tokens (as agentchattr accepts any registered instance's token).
    let up = FastMcp::start(realenv::py1(), "streamable-http", &format!("{TOKEN},{TOKEN_2}"));
    let dir = crate::support::proxy_process::scratch_dir("identity-switch");
    let identity = dir.join("identity.json");
    std::fs::write(&identity, json!({"agent": AGENT, "token": TOKEN}).to_string()).unwrap();
    let proxy = ProxyProcess::builder(up.url("/mcp")).arg("--identity-file", &identity).start();
    let mut args = spoofed_args(&proxy.url("/mcp"));
    args.extend([
        "--switch-identity".to_string(),
        identity.to_str().unwrap().to_string(),
        json!({"agent": AGENT_2, "token": TOKEN_2}).to_string(),
        // The proxy notices an identity-file change within a second.
        "--switch-wait".to_string(),
        "1.0".to_string(),
    ]);
    let run = run_py1(&args);
    let out = &run.json;
    let mut c = Checks::default();
    c.eq("error", &out["error"], &Value::Null);
    c.eq("closed", &out["closed"], &json!(true));
    let calls = &out["calls"];
    let session = calls["chat_send"]["mcp_session_id"].clone();
    c.check(
        session.as_array().is_some_and(|a| a.len() == 1),
        format!("session before the switch: {session}"),
    );
    let before = [("chat_send", "sender")];
    let after = [("chat_send_after_switch", "sender"), ("chat_join", "name"), ("chat_read", "sender")];
    for (tool, key, agent, token) in before
        .iter()
        .map(|(t, k)| (*t, *k, AGENT, TOKEN))
        .chain(after.iter().map(|(t, k)| (*t, *k, AGENT_2, TOKEN_2)))
    {
        let call = &calls[tool];
        c.eq(&format!("{tool}.{key}"), &call[key], &json!(agent));
        c.eq(
            &format!("{tool}: Authorization lines seen"),
            &call["authorization"],
            &json!([format!("Bearer {token}")]),
        );
        c.eq(&format!("{tool}: X-Agent-Token lines seen"), &call["x_agent_token"], &json!([token]));
        c.eq(&format!("{tool}: Mcp-Session-Id (same session)"), &call["mcp_session_id"], &session);
    }
    let http = out["http"].as_array().cloned().unwrap_or_default();
    let last = http.last().cloned().unwrap_or(Value::Null);
    c.eq("closing DELETE", &json!([last["method"], last["status"]]), &json!(["DELETE", 200]));
    c.finish("identity_file_change_mid_session_seen_by_next_tool_call", &evidence(&run, Some(&proxy), &up));
    timed("identity_file_change_mid_session_seen_by_next_tool_call", started);
}
