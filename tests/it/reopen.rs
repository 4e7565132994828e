//! Transparent re-initialisation: the upstream (FastMCP 1.x, agentchattr's server) restarted on the same
//! port under live MCP sessions of real clients, through the proxy.
//!
//! A restarted FastMCP has forgotten every session and answers 404 to the old id. The proxy replays the
//! session's recorded `initialize` (with the identity current at replay time) and `notifications/initialized`,
//! maps the client's id C to the new upstream id U' (C→U' on requests, U'→C on responses) and retries the
//! request once; concurrent requests share one replay. The client never re-initialises and never sees U'. A
//! session the client deleted is forgotten: the server's 404 is relayed, nothing replayed. While the upstream
//! is down, a request in a recorded session waits `--restart-grace`, then gets 200 with a JSON-RPC error
//! carrying its id.
//!
//! How it is observed:
//! - Clients: `tests/support/restart_client.py` (Python SDK 1.x and 2.x, whichever the venv has) and
//!   `tests/support/ts_restart_client.cjs` (TypeScript SDK) run one session step by step. At `PAUSE <name>`
//!   the test acts: a restart is [`FastMcp::standby`] (a successor loaded in advance) then
//!   [`FastMcp::replace`] (SIGKILL, the successor binds the same port within milliseconds). They report every
//!   HTTP exchange (the Mcp-Session-Id sent and read, the JSON-RPC method and id, the body of a JSON answer)
//!   and each step's outcome with the client's own view of its session id.
//! - Server: `fastmcp_server.py --record` appends one JSON line per request when its response starts, tagged
//!   with the process's generation (1 before the restart, 2 after): method, status, Mcp-Session-Id sent and
//!   returned, credentials and the JSON-RPC body. Each client sends one `initialize`, before the restart, so a
//!   generation-2 `initialize` is a replay; the id it returned is U'; U' on a later GET, call or DELETE is the
//!   proxy's mapping at work.

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::cases;
use crate::support::checks::{http, step, Checks};
use crate::support::exchange::{client, host};
use crate::support::proxy_process::{scratch_dir, ProxyProcess};
use crate::support::realenv::{self, FastMcp, ScriptRun};
use crate::support::wire::{request, Resp};

/// The agent name the proxy stamps.
const AGENT: &str = "claude-prime";
/// The upstream's bearer token.
const TOKEN: &str = "5f0c9e2b7a4d41c8b3e6a9d2c7f1e084";
/// The identity after a live change (`--identity-file` rewritten).
const AGENT_2: &str = "claude-prime-2";
const TOKEN_2: &str = "9a1d3c5e7f2b4d6a8c0e1f3a5b7d9c2e";
/// Bound on one client run, pauses included (the scripts bound themselves at 40 s).
const SCRIPT_LIMIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------------------
// Clients, proxy, checks.

#[derive(Clone, Copy, Debug)]
enum Sdk {
    /// Python SDK 1.x: `streamable_http_client` + `ClientSession`.
    Py1,
    /// Python SDK 2.x: `mcp.Client`, mode "auto", which falls back to a session against FastMCP 1.x.
    Py2,
    /// TypeScript SDK: `StreamableHTTPClientTransport` on Node's fetch.
    Ts,
}

impl Sdk {
    /// The client script running `steps` against `url`, with spoofed credentials and identity.
    fn command(self, url: &str, steps: &str) -> Command {
        let args = [url, "--steps", steps, "--authorization", "Bearer spoof", "--sender", "mallory"];
        match self {
            Sdk::Py1 => realenv::python_script(realenv::py1(), "restart_client.py", &args),
            Sdk::Py2 => realenv::python_script(realenv::py2(), "restart_client.py", &args),
            Sdk::Ts => realenv::node_script("ts_restart_client.cjs", &args),
        }
    }
}

/// Run `steps` with `sdk` against `url`; `at_pause(name)` runs at each `pause:NAME` step.
#[track_caller]
fn run_client(sdk: Sdk, url: &str, steps: &str, at_pause: impl FnMut(&str)) -> ScriptRun {
    realenv::run_paused(&format!("{sdk:?} client"), sdk.command(url, steps), SCRIPT_LIMIT, at_pause)
}

/// What this suite adds to the shared `Checks`.
impl Checks {
    /// The client script itself failed (an exception outside any recorded step).
    fn client_ran(&mut self, out: &Value) {
        if let Some(err) = out["error"].as_str() {
            let lines: Vec<&str> = err.trim_end().lines().collect();
            let first = lines.first().copied().unwrap_or("");
            let last = lines.last().copied().unwrap_or("");
            self.failures.push(format!("the client failed: {first} ... {last}"));
        }
    }

    /// A `chat_send` step record: a result, no error; returns the server's view of the call (its result).
    fn call_ok<'a>(&mut self, what: &str, rec: &'a Value) -> &'a Value {
        if rec.is_null() {
            self.failures.push(format!("{what}: never made"));
        } else if !rec["error"].is_null() {
            self.failures.push(format!("{what}: failed with {}", rec["error"]));
        } else if rec["is_error"] != json!(false) || !rec["result"].is_object() {
            self.failures.push(format!("{what}: tool error {}", rec["result"]));
        }
        &rec["result"]
    }
}

/// `Checks::finish`, after the test's wall time (the suite's figures).
#[track_caller]
fn finish(c: Checks, test: &str, started: Instant, evidence: &[(&str, String)]) {
    eprintln!("{test}: {:.2}s wall", started.elapsed().as_secs_f64());
    c.finish(test, evidence);
}

fn evidence(run: &ScriptRun, proxy: &ProxyProcess, up: &FastMcp) -> Vec<(&'static str, String)> {
    let records: Vec<String> = up.records().iter().map(Value::to_string).collect();
    vec![
        ("client JSON", serde_json::to_string_pretty(&run.json).unwrap_or_default()),
        ("client stderr", run.stderr.clone()),
        ("proxy stderr", proxy.stderr_text()),
        ("upstream stderr (every generation)", up.stderr_text()),
        ("server records (every generation)", records.join("\n")),
    ]
}

// ---------------------------------------------------------------------------------------------------------
// The server's records.

/// The records of one process generation on the port.
fn generation(records: &[Value], g: u64) -> Vec<&Value> {
    records.iter().filter(|r| r["generation"] == g).collect()
}

fn rpc_method(r: &Value) -> &str {
    r["rpc"]["method"].as_str().unwrap_or("")
}

fn initializes<'a>(records: &[&'a Value]) -> Vec<&'a Value> {
    records.iter().copied().filter(|r| r["method"] == "POST" && rpc_method(r) == "initialize").collect()
}

/// The records that carried exactly the session id `id`.
fn in_session<'a>(records: &[&'a Value], id: &str) -> Vec<&'a Value> {
    records.iter().copied().filter(|r| r["session_sent"] == json!([id])).collect()
}

/// The chat_send calls with `message`.
fn chat_sends<'a>(records: &[&'a Value], message: &str) -> Vec<&'a Value> {
    records
        .iter()
        .copied()
        .filter(|r| {
            rpc_method(r) == "tools/call"
                && r["rpc"]["params"]["name"] == "chat_send"
                && r["rpc"]["params"]["arguments"]["message"] == message
        })
        .collect()
}

fn brief(records: &[&Value]) -> String {
    let lines: Vec<String> = records
        .iter()
        .map(|r| format!("{} {} {} {}", r["method"], rpc_method(r), r["session_sent"], r["status"]))
        .collect();
    format!("[{}]", lines.join("; "))
}

/// The new upstream session: the one session id returned to generation 2's single `initialize` (checked).
fn new_upstream_session(c: &mut Checks, gen2: &[&Value]) -> String {
    let inits = initializes(gen2);
    c.check(
        inits.len() == 1,
        format!(
            "the restarted server got {} initialize requests, want exactly 1 (the proxy's replay): {}",
            inits.len(),
            brief(gen2)
        ),
    );
    let id = inits.first().and_then(|r| r["session_returned"][0].as_str()).unwrap_or("").to_string();
    c.check(inits.is_empty() || !id.is_empty(), "the replayed initialize created no session");
    id
}

// ---------------------------------------------------------------------------------------------------------
// 1. Each SDK's session survives a restart: the call after it succeeds without a second initialize, the
//    session id is unchanged in the client's eyes, the GET stream carries notifications again, and the
//    closing DELETE reaches the new upstream session.

fn session_survives_an_upstream_restart(test: &str, sdk: Sdk) {
    let started = Instant::now();
    let mut up = FastMcp::start_recording(realenv::py1(), TOKEN);
    let proxy = ProxyProcess::builder(up.url("/mcp")).agent(AGENT).token(TOKEN).start();
    let mut standby = Some(up.standby());
    let run = run_client(
        sdk,
        &proxy.url("/mcp"),
        "call:before,notify:before,pause:restart,call:after,notify:after",
        |_| up.replace(standby.take().expect("one restart")),
    );
    let out = &run.json;
    let records = up.records();
    let mut c = Checks::default();
    c.client_ran(out);

    // The client's view: both calls answered, notifications before and after, one session id throughout.
    c.call_ok("chat_send before the restart", step(out, "call", "before"));
    let after = c.call_ok("chat_send after the restart", step(out, "call", "after"));
    c.eq("chat_send after the restart: sender stamped", &after["sender"], &json!(AGENT));
    c.eq(
        "standalone notification on the GET stream before the restart",
        &step(out, "notify", "before")["arrived"],
        &json!(true),
    );
    let notify_after = step(out, "notify", "after");
    // The proxy held the client's GET stream through the restart and reattached it on the new session:
    // the client never saw it end, so it opened no other.
    c.eq(
        "no GET stream reopened by the client after the restart (held)",
        &notify_after["get_open"],
        &json!(false),
    );
    c.eq(
        "standalone notification on the GET stream after the restart",
        &notify_after["arrived"],
        &json!(true),
    );
    let client_id = out["session_id_at_start"].as_str().unwrap_or("").to_string();
    c.check(!client_id.is_empty(), "the client has no session id after connecting");
    for s in out["steps"].as_array().into_iter().flatten() {
        if let Some(id) = s.get("session_id") {
            c.eq(&format!("client's session id at step {}:{}", s["step"], s["label"]), id, &json!(client_id));
        }
    }
    c.eq("client's session id at the end", &out["session_id_at_end"], &json!(client_id));

    // The client's wire: one initialize (its own, before the restart), C on everything after it, never a
    // 404, never another id read; the closing DELETE answered 200.
    let http = http(out);
    let inits: Vec<&Value> = http.iter().filter(|h| h["rpc_method"] == "initialize").collect();
    c.check(inits.len() == 1, format!("the client sent {} initialize requests, want 1", inits.len()));
    let mut lost = Vec::new();
    for (i, h) in http.iter().enumerate() {
        let what = format!("client http[{i}] {} {} {}", h["method"], h["rpc_method"], h["status"]);
        let probe_or_init = h["rpc_method"] == "initialize" || h["rpc_method"] == "server/discover";
        if !probe_or_init {
            c.eq(&format!("{what}: Mcp-Session-Id sent"), &h["sent_session_id"], &json!(client_id));
            if !h["session_get"].is_null() {
                c.eq(&format!("{what}: Mcp-Session-Id read"), &h["session_get"], &json!(client_id));
            }
        }
        if h["status"] == 404 {
            lost.push(format!("{} {} {}", h["method"], h["rpc_method"], h["body"]));
        }
    }
    c.check(lost.is_empty(), format!("the client was told its session is gone (404): {}", lost.join("; ")));
    let last = http.last().cloned().unwrap_or(Value::Null);
    c.eq(
        "the client's last exchange (closing DELETE)",
        &json!([last["method"], last["status"], last["sent_session_id"]]),
        &json!(["DELETE", 200, client_id]),
    );

    // The server's view.
    let gen1 = generation(&records, 1);
    let gen2 = generation(&records, 2);
    let first_inits = initializes(&gen1);
    c.check(first_inits.len() == 1, format!("generation 1 initialize requests: {}", brief(&first_inits)));
    c.eq(
        "session created by the client's initialize",
        &first_inits.first().map_or(Value::Null, |r| r["session_returned"].clone()),
        &json!([client_id]),
    );
    let new_id = new_upstream_session(&mut c, &gen2);
    c.check(new_id != client_id, "the restarted server returned the old session id (not a fresh process?)");
    if let (Some(orig), Some(replay)) = (first_inits.first(), initializes(&gen2).first()) {
        c.eq(
            "replayed initialize params (the client's own)",
            &replay["rpc"]["params"],
            &orig["rpc"]["params"],
        );
        c.eq(
            "replayed initialize Authorization",
            &replay["authorization"],
            &json!([format!("Bearer {TOKEN}")]),
        );
    }
    let on_new = in_session(&gen2, &new_id);
    let initialized: Vec<&Value> =
        on_new.iter().copied().filter(|r| rpc_method(r) == "notifications/initialized").collect();
    c.check(
        initialized.len() == 1 && initialized[0]["status"] == 202,
        format!("notifications/initialized replayed on the new session: {}", brief(&initialized)),
    );
    let retried: Vec<&Value> =
        chat_sends(&on_new, "after").into_iter().filter(|r| r["status"] == 200).collect();
    c.check(retried.len() == 1, format!("chat_send \"after\" on the new session (200): {}", brief(&retried)));
    if after.is_object() {
        c.eq(
            "the call after the restart reached the new session",
            &after["mcp_session_id"],
            &json!([new_id]),
        );
    }
    c.check(
        on_new.iter().any(|r| r["method"] == "GET" && r["status"] == 200),
        format!("no GET stream opened on the new session: {}", brief(&gen2)),
    );
    let deletes: Vec<&Value> = on_new.iter().copied().filter(|r| r["method"] == "DELETE").collect();
    c.check(
        deletes.len() == 1 && deletes[0]["status"] == 200,
        format!(
            "the closing DELETE on the new session: {} (generation 2: {})",
            brief(&deletes),
            brief(&gen2)
        ),
    );
    for r in in_session(&gen2, &client_id) {
        c.check(r["status"] == 404, format!("the restarted server accepted the old id: {}", brief(&[r])));
    }
    finish(c, test, started, &evidence(&run, &proxy, &up));
}

// Scenario 1 for each SDK.
cases! { session_survives_an_upstream_restart;
    python_sdk_1x_session_survives_an_upstream_restart => Sdk::Py1;
    python_sdk_2x_session_survives_an_upstream_restart => Sdk::Py2;
    typescript_sdk_session_survives_an_upstream_restart => Sdk::Ts;
}

// ---------------------------------------------------------------------------------------------------------
// 2. Concurrent requests hitting the 404 share one replay.

#[test]
fn four_concurrent_calls_after_a_restart_share_one_reinitialisation() {
    const TEST: &str = "four_concurrent_calls_after_a_restart_share_one_reinitialisation";
    let started = Instant::now();
    let mut up = FastMcp::start_recording(realenv::py1(), TOKEN);
    let proxy = ProxyProcess::builder(up.url("/mcp")).agent(AGENT).token(TOKEN).start();
    let mut standby = Some(up.standby());
    // The TypeScript SDK (Claude Code's) sends the four at once, each on its own connection; its GET stream
    // reconnects only a second after the restart, so the four are the first to meet the 404.
    let run = run_client(Sdk::Ts, &proxy.url("/mcp"), "call:before,pause:restart,calls:after:4", |_| {
        up.replace(standby.take().expect("one restart"))
    });
    let out = &run.json;
    let records = up.records();
    let mut c = Checks::default();
    c.client_ran(out);
    c.call_ok("chat_send before the restart", step(out, "call", "before"));
    let client_id = out["session_id_at_start"].clone();
    let calls = step(out, "calls", "after")["calls"].as_array().cloned().unwrap_or_default();
    c.check(calls.len() == 4, format!("{} concurrent calls recorded, want 4", calls.len()));
    for (i, call) in calls.iter().enumerate() {
        let result = c.call_ok(&format!("concurrent call {i}"), call);
        c.eq(&format!("concurrent call {i}: sender"), &result["sender"], &json!(AGENT));
        c.eq(&format!("concurrent call {i}: client's session id"), &call["session_id"], &client_id);
    }
    let starts: Vec<f64> = calls.iter().filter_map(|c| c["started"].as_f64()).collect();
    let spread =
        starts.iter().copied().fold(f64::MIN, f64::max) - starts.iter().copied().fold(f64::MAX, f64::min);
    c.check(spread < 0.5, format!("the four calls were not concurrent: started over {spread:.3} s"));

    let gen2 = generation(&records, 2);
    let new_id = new_upstream_session(&mut c, &gen2);
    let on_new = in_session(&gen2, &new_id);
    for i in 0..4 {
        let message = format!("after-{i}");
        let served: Vec<&Value> =
            chat_sends(&on_new, &message).into_iter().filter(|r| r["status"] == 200).collect();
        c.check(
            served.len() == 1,
            format!("chat_send {message:?} served on the new session {} times, want once", served.len()),
        );
    }
    finish(c, TEST, started, &evidence(&run, &proxy, &up));
}

// ---------------------------------------------------------------------------------------------------------
// 3. A live identity change before the restart is the identity of the replay and of the retried call.

#[test]
fn identity_changed_before_the_restart_is_the_identity_of_the_replay_and_the_retried_call() {
    const TEST: &str =
        "identity_changed_before_the_restart_is_the_identity_of_the_replay_and_the_retried_call";
    let started = Instant::now();
    let mut up = FastMcp::start_recording(realenv::py1(), TOKEN);
    let identity = scratch_dir("reopen-identity").join("identity.json");
    std::fs::write(&identity, json!({"agent": AGENT, "token": TOKEN}).to_string()).unwrap();
    let proxy = ProxyProcess::builder(up.url("/mcp")).arg("--identity-file", &identity).start();
    // The restarted server knows only the new token, as a re-registered agent's server would: a replay with
    // the old one would be refused (401).
    let mut standby = Some(up.standby_with_token(TOKEN_2));
    let mut switched = false;
    let run = run_client(Sdk::Py1, &proxy.url("/mcp"), "call:before,pause:restart,call:after", |_| {
        let tmp = identity.with_extension("tmp");
        std::fs::write(&tmp, json!({"agent": AGENT_2, "token": TOKEN_2}).to_string()).unwrap();
        std::fs::rename(&tmp, &identity).unwrap();
        let t0 = Instant::now();
        while !switched && t0.elapsed() < Duration::from_secs(5) {
            switched = proxy.stderr_text().contains("identity updated");
            std::thread::sleep(Duration::from_millis(10));
        }
        up.replace(standby.take().expect("one restart"));
    });
    let out = &run.json;
    let records = up.records();
    let mut c = Checks::default();
    c.check(switched, "the proxy did not log `identity updated` within 5 s of the identity file's rename");
    c.client_ran(out);
    let before = c.call_ok("chat_send before the change and restart", step(out, "call", "before"));
    c.eq("chat_send before: sender", &before["sender"], &json!(AGENT));
    let after = c.call_ok("chat_send after the change and restart", step(out, "call", "after"));
    c.eq("chat_send after: sender", &after["sender"], &json!(AGENT_2));
    c.eq("chat_send after: Authorization", &after["authorization"], &json!([format!("Bearer {TOKEN_2}")]));
    c.eq("chat_send after: X-Agent-Token", &after["x_agent_token"], &json!([TOKEN_2]));
    c.eq("client's session id after", &step(out, "call", "after")["session_id"], &out["session_id_at_start"]);

    let gen2 = generation(&records, 2);
    let new_id = new_upstream_session(&mut c, &gen2);
    if let Some(replay) = initializes(&gen2).first() {
        c.eq(
            "replayed initialize: Authorization",
            &replay["authorization"],
            &json!([format!("Bearer {TOKEN_2}")]),
        );
        c.eq("replayed initialize: X-Agent-Token", &replay["x_agent_token"], &json!([TOKEN_2]));
    }
    let retried: Vec<&Value> =
        chat_sends(&in_session(&gen2, &new_id), "after").into_iter().filter(|r| r["status"] == 200).collect();
    c.check(retried.len() == 1, format!("the retried chat_send on the new session: {}", brief(&retried)));
    if let Some(r) = retried.first() {
        c.eq(
            "retried chat_send: stamped sender",
            &r["rpc"]["params"]["arguments"]["sender"],
            &json!(AGENT_2),
        );
        c.eq("retried chat_send: Authorization", &r["authorization"], &json!([format!("Bearer {TOKEN_2}")]));
    }
    let refused: Vec<&Value> = gen2.iter().copied().filter(|r| r["status"] == 401).collect();
    c.check(refused.is_empty(), format!("requests with the old token after the change: {}", brief(&refused)));
    finish(c, TEST, started, &evidence(&run, &proxy, &up));
}

// ---------------------------------------------------------------------------------------------------------
// 4. A session the client deleted is forgotten: the server's 404, nothing replayed.

/// A tools/call with JSON-RPC id `id` in session `session`, on a new connection to the proxy.
fn raw_call(p: &ProxyProcess, session: &str, id: u64) -> Resp {
    let body = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                      "params": {"name": "chat_send", "arguments": {"message": "after delete"}}})
    .to_string();
    let fields = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
        ("Mcp-Session-Id", session),
        ("MCP-Protocol-Version", "2025-11-25"),
    ];
    let mut c = client(p);
    c.send(&request("POST", "/mcp", &host(p), &fields, body.as_bytes()));
    c.read_response("POST")
}

#[test]
fn a_deleted_session_gets_the_servers_404_and_nothing_is_replayed() {
    const TEST: &str = "a_deleted_session_gets_the_servers_404_and_nothing_is_replayed";
    let started = Instant::now();
    let mut up = FastMcp::start_recording(realenv::py1(), TOKEN);
    let proxy = ProxyProcess::builder(up.url("/mcp")).agent(AGENT).token(TOKEN).start();
    // The client's session ends with its DELETE (the Python SDK sends it on exit).
    let run = run_client(Sdk::Py1, &proxy.url("/mcp"), "call:before", |_| {});
    let out = &run.json;
    let id = out["session_id_at_start"].as_str().unwrap_or("").to_string();
    let same_server = raw_call(&proxy, &id, 41);
    up.restart();
    let restarted = raw_call(&proxy, &id, 42);
    let records = up.records();

    let mut c = Checks::default();
    c.client_ran(out);
    c.call_ok("chat_send before the DELETE", step(out, "call", "before"));
    let last = http(out).last().cloned().unwrap_or(Value::Null);
    c.eq("the client's closing DELETE", &json!([last["method"], last["status"]]), &json!(["DELETE", 200]));
    for (what, resp) in [("same server", &same_server), ("restarted server", &restarted)] {
        c.check(
            resp.status == 404 && String::from_utf8_lossy(&resp.body).contains("Session not found"),
            format!(
                "a call in the deleted session ({what}): want FastMCP's 404, got {} {:?}",
                resp.status,
                String::from_utf8_lossy(&resp.body[..resp.body.len().min(300)])
            ),
        );
    }
    let gen1 = generation(&records, 1);
    let gen2 = generation(&records, 2);
    c.check(
        initializes(&gen1).len() == 1,
        format!("generation 1 initializes: {}", brief(&initializes(&gen1))),
    );
    c.check(initializes(&gen2).is_empty(), format!("replayed for a deleted session: {}", brief(&gen2)));
    for (g, records, rpc_id) in [(1, &gen1, 41), (2, &gen2, 42)] {
        let seen: Vec<&Value> =
            in_session(records, &id).into_iter().filter(|r| r["rpc"]["id"] == rpc_id).collect();
        c.check(
            seen.len() == 1 && seen[0]["status"] == 404,
            format!("generation {g}: the call with id {rpc_id} answered 404 by the server: {}", brief(&seen)),
        );
    }
    c.check(gen2.len() == 1, format!("generation 2 was sent more than the one call: {}", brief(&gen2)));
    finish(c, TEST, started, &evidence(&run, &proxy, &up));
}

// ---------------------------------------------------------------------------------------------------------
// 5. While the upstream is down: 200 with a JSON-RPC error carrying the request's id within the grace plus
//    1 s; once it is back, the next call in the same session works.

#[test]
fn a_call_while_the_upstream_is_down_gets_its_error_within_the_grace_and_the_next_call_works() {
    const TEST: &str =
        "a_call_while_the_upstream_is_down_gets_its_error_within_the_grace_and_the_next_call_works";
    /// `--restart-grace 2`: the answer is due within 3 s; 1 s more for a loaded machine.
    const GRACE_MS: f64 = 2000.0;
    const DUE_MS: f64 = GRACE_MS + 1000.0;
    const SLACK_MS: f64 = 1000.0;
    /// The proxy retries the connect every 200 ms and answers after the last retry that fits in the grace,
    /// so up to 200 ms early (1813 ms seen for 2 s): this bound only shows the request was held, not failed.
    const HELD_MS: f64 = GRACE_MS - 500.0;
    let started = Instant::now();
    let mut up = FastMcp::start_recording(realenv::py1(), TOKEN);
    let proxy =
        ProxyProcess::builder(up.url("/mcp")).agent(AGENT).token(TOKEN).arg("--restart-grace", "2").start();
    let mut standby = Some(up.standby());
    let run = run_client(
        Sdk::Py1,
        &proxy.url("/mcp"),
        "call:before,pause:down,call:down,pause:up,call:after",
        |name| match name {
            "down" => up.kill(),
            _ => up.replace(standby.take().expect("one restart")),
        },
    );
    let out = &run.json;
    let records = up.records();
    let mut c = Checks::default();
    c.client_ran(out);
    c.call_ok("chat_send before", step(out, "call", "before"));

    let down = step(out, "call", "down");
    c.eq("the call while down: error code", &down["error"]["code"], &json!(-32000));
    c.check(
        down["error"]["message"].as_str().is_some_and(|m| m.contains("upstream unavailable")),
        format!("the call while down: error {}", down["error"]),
    );
    let took = down["elapsed_ms"].as_f64().unwrap_or(f64::INFINITY);
    c.check(
        (HELD_MS..=DUE_MS + SLACK_MS).contains(&took),
        format!(
            "the call while down was answered after {took:.0} ms, want it held for about the grace \
             ({HELD_MS} ms at least) and answered within {DUE_MS} ms (+{SLACK_MS} ms slack)"
        ),
    );
    // The answer on the wire: 200, a JSON-RPC error with the request's id.
    let http = http(out);
    let answer = http
        .iter()
        .find(|h| h["body"]["error"]["message"].as_str().is_some_and(|m| m.contains("upstream unavailable")));
    match answer {
        Some(h) => {
            c.eq("the outage answer's status", &h["status"], &json!(200));
            c.check(h["rpc_id"].is_number(), format!("the outage answer's request had no id: {h}"));
            c.eq("the outage answer's id (the request's)", &h["body"]["id"], &h["rpc_id"]);
        }
        None => c.check(false, "no JSON answer carrying `upstream unavailable` in the client's HTTP log"),
    }

    let after = c.call_ok("chat_send once the upstream is back", step(out, "call", "after"));
    c.eq("chat_send once back: sender", &after["sender"], &json!(AGENT));
    c.eq(
        "client's session id once back",
        &step(out, "call", "after")["session_id"],
        &out["session_id_at_start"],
    );
    let gen2 = generation(&records, 2);
    let new_id = new_upstream_session(&mut c, &gen2);
    let served: Vec<&Value> =
        chat_sends(&in_session(&gen2, &new_id), "after").into_iter().filter(|r| r["status"] == 200).collect();
    c.check(served.len() == 1, format!("chat_send \"after\" on the new session: {}", brief(&served)));
    finish(c, TEST, started, &evidence(&run, &proxy, &up));
}
