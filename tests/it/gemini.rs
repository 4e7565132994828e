//! A real Gemini CLI turn through the proxy: `gemini -p` (@google/gemini-cli, pinned in
//! `tests/support/gemini-cli/`) with the real agentchattr as its MCP server behind the proxy (`mcpServers` in
//! `~/.gemini/settings.json`: an `httpUrl` naming the proxy's port, or a `command` naming the proxy's binary
//! with `--stdio`), and a scripted stand-in for the model on the Gemini API
//! (`GOOGLE_GEMINI_BASE_URL`, `streamGenerateContent` as an event stream). The model is offered agentchattr's
//! tools, none with a `sender` parameter; its `chat_send` claims another sender and is stored once under the
//! agent's registered name; its `chat_read` brings that message back to it under the agent's name.
//!
//! The settings live in the test's HOME (Gemini CLI ignores a system settings file under a world-writable
//! directory such as /tmp); they turn off what phones home (usage statistics, telemetry, the update check),
//! and every proxy variable points at the trap ([`hosts::trap`]). The model is named on the command line: left
//! to itself, Gemini CLI first asks a classifier model which one to use.

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use serde_json::{json, Value};

use crate::support::cases;
use crate::support::checks::Checks;
use crate::support::hosts::{self, Run, Served, Stage, Via, CLAIMED};
use crate::support::realenv;
use crate::support::wire::{response, Next, Req, StubUpstream};

/// agentchattr's name under `mcpServers`: Gemini CLI offers its tools as `mcp_agentchattr_<tool>`.
const SERVER: &str = "agentchattr";
/// The model Gemini CLI is told to use, and so the path it streams from.
const MODEL: &str = "gemini-2.5-flash";
const TURN_PATH: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";
/// The model's last words.
const FINAL: &str = "Posted to #general and read it back.";
/// Bound on one `gemini -p` run (about 2 s on an idle machine).
const TURN_LIMIT: Duration = Duration::from_secs(90);

/// The name Gemini CLI gives agentchattr's `tool`.
fn offered_name(tool: &str) -> String {
    format!("mcp_{SERVER}_{tool}")
}

// ---------------------------------------------------------------------------------------------------------
// The stand-in model.

/// `POST` [`TURN_PATH`], answered with an event stream of one chunk: with chat_send offered, a turn with no
/// function response yet calls it (posting `message` as [`CLAIMED`]); the turn carrying its response calls
/// `chat_read` on #general; the turn carrying that response ends with [`FINAL`]. Anything else is a 404.
fn model(message: String) -> StubUpstream {
    StubUpstream::start(move |req: &Req, s: &mut TcpStream| {
        let bytes = if req.method == "POST" && req.target == TURN_PATH {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or(Value::Null);
            let send = offered_name("chat_send");
            let offered = declarations(&body).iter().any(|d| d["name"] == send);
            let part = match (function_response(&body, "chat_send"), function_response(&body, "chat_read")) {
                (_, Some(_)) => json!({"text": FINAL}),
                (Some(_), None) => {
                    json!({"functionCall": {"name": offered_name("chat_read"), "args": {"channel": "general"}}})
                }
                (None, None) if offered => json!({"functionCall": {"name": send,
                    "args": {"sender": CLAIMED, "message": message, "channel": "general"}}}),
                (None, None) => json!({"text": "chat_send was not offered"}),
            };
            let chunk = json!({
                "candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2},
                "modelVersion": MODEL,
            });
            response(
                "200 OK",
                &[("Content-Type", "text/event-stream")],
                format!("data: {chunk}\r\n\r\n").as_bytes(),
            )
        } else {
            response(
                "404 Not Found",
                &[("Content-Type", "text/plain")],
                b"the stand-in model has no such path",
            )
        };
        let _ = s.write_all(&bytes);
        Next::KeepAlive
    })
}

/// Every function declaration in a request's `tools`.
fn declarations(body: &Value) -> Vec<&Value> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["functionDeclarations"].as_array())
        .flatten()
        .collect()
}

/// The response to the call of agentchattr's `tool` in a request's contents, as text (Gemini CLI gives its
/// model `{"output": TEXT}`).
fn function_response(body: &Value, tool: &str) -> Option<String> {
    let name = offered_name(tool);
    let response = body["contents"]
        .as_array()?
        .iter()
        .filter_map(|c| c["parts"].as_array())
        .flatten()
        .find(|p| p["functionResponse"]["name"] == name.as_str())
        .map(|p| &p["functionResponse"]["response"])?;
    Some(match response["output"].as_str() {
        Some(s) => s.to_string(),
        None => response.to_string(),
    })
}

/// agentchattr's tools among a request's declarations, as (agentchattr's name, parameter schema).
fn offered(body: &Value) -> Vec<(String, Value)> {
    let prefix = offered_name("");
    declarations(body)
        .into_iter()
        .filter_map(|d| {
            let name = d["name"].as_str()?.strip_prefix(&prefix)?.to_string();
            let schema = if d["parametersJsonSchema"].is_null() {
                &d["parameters"]
            } else {
                &d["parametersJsonSchema"]
            };
            Some((name, schema.clone()))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// Gemini CLI.

/// `~/.gemini/settings.json`: the API key as the way in, agentchattr's entry `server` (trusted: its tools run
/// without a confirmation), nothing that phones home, no folder-trust check.
fn settings(server: Value) -> Value {
    json!({
        "general": {"enableAutoUpdate": false, "enableAutoUpdateNotification": false},
        "privacy": {"usageStatisticsEnabled": false},
        "telemetry": {"enabled": false},
        "security": {"auth": {"selectedType": "gemini-api-key"}, "folderTrust": {"enabled": false}},
        "mcpServers": {SERVER: server},
    })
}

/// `gemini -p PROMPT -m MODEL` with JSON output, the stand-in as its API; bounded by [`TURN_LIMIT`].
fn gemini(stage: &Stage, model: &StubUpstream, prompt: &str) -> Run {
    let mut cmd = stage.command("node");
    cmd.arg(realenv::gemini_cli())
        .args(["-p", prompt, "-m", MODEL, "--output-format", "json"])
        .env("GOOGLE_GEMINI_BASE_URL", format!("http://{}", model.authority()))
        // A dummy key: the stand-in checks nothing.
        .env("GEMINI_API_KEY", "dummy-key");
    stage.run("gemini -p", cmd, TURN_LIMIT)
}

fn gemini_turn(test: &str, via: Via) {
    realenv::gemini_cli();
    let stage = Stage::new(test, "gemini");
    let mut served = stage.serve(via, stage.proxy());
    let message = format!("{test}: posted claiming to be {CLAIMED}");
    let model = model(message.clone());
    let dir = stage.home.join(".gemini");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    let server = match &served {
        Served::Http { url, .. } => json!({"httpUrl": url, "trust": true}),
        Served::Stdio { command, args } => json!({"command": command, "args": args, "trust": true}),
    };
    std::fs::write(dir.join("settings.json"), settings(server).to_string()).expect("write settings.json");
    let setup = stage.started.elapsed();

    let run = gemini(&stage, &model, "Post a short hello to #general, then read #general.");
    served.stop();

    let mut c = Checks::default();
    c.check(run.status.success(), format!("gemini -p exited with {}", run.status));
    let reqs = model.requests();
    let turns: Vec<Value> = reqs
        .iter()
        .filter(|r| r.method == "POST" && r.target == TURN_PATH)
        .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
        .collect();
    let seen: Vec<String> = reqs.iter().map(|r| format!("{} {}", r.method, r.target)).collect();
    c.check(
        turns.len() == 3,
        format!(
            "the model was asked {} times, want 3 (chat_send, chat_read, the end): {seen:?}",
            turns.len()
        ),
    );
    c.check(turns.len() == reqs.len(), format!("the model got requests other than its turns: {seen:?}"));

    let first = turns.first().cloned().unwrap_or(Value::Null);
    hosts::check_offered(&mut c, "Gemini CLI", &offered(&first), &[]);
    let send_output = turns.get(1).and_then(|t| function_response(t, "chat_send"));
    let read_output = turns.get(2).and_then(|t| function_response(t, "chat_read"));
    let id = hosts::check_landing(
        &mut c,
        &stage.ac,
        &stage.agent,
        &message,
        send_output.as_deref(),
        read_output.as_deref(),
    );

    // What Gemini CLI reported: the model's last words, both calls made and none failed.
    let report: Value = serde_json::from_str(run.stdout.trim()).unwrap_or(Value::Null);
    c.eq("Gemini CLI's answer", &report["response"], &json!(FINAL));
    let tools = &report["stats"]["tools"];
    let calls = |tool: &str| {
        let t = &tools["byName"][offered_name(tool)];
        json!([t["count"], t["success"]])
    };
    c.eq("Gemini CLI's chat_send calls (count, success)", &calls("chat_send"), &json!([1, 1]));
    c.eq("Gemini CLI's chat_read calls (count, success)", &calls("chat_read"), &json!([1, 1]));
    c.eq("Gemini CLI's failed tool calls", &tools["totalFail"], &json!(0));
    stage.check_audit(&mut c, via, Some(CLAIMED));
    hosts::check_proxy_exit(&mut c, via, &run);
    hosts::check_trap(&mut c, "Gemini CLI", &stage.trap);

    let decls = serde_json::to_string_pretty(&declarations(&first)).unwrap_or_default();
    let evidence = [
        ("gemini stdout", run.stdout.clone()),
        ("gemini stderr", run.stderr.clone()),
        ("model requests", seen.join("\n")),
        ("functions declared on the first turn", decls),
        ("chat_send's response given to the model", format!("{send_output:?}")),
        ("chat_read's response given to the model", format!("{read_output:?}")),
        ("the proxy's log", served.log()),
        ("the proxy's audit log", stage.audit_text()),
        ("agentchattr's output", stage.ac.log_text()),
    ];
    c.finish(test, &evidence);
    eprintln!(
        "{test}: gemini -p {:.1} s (setup {:.1} s, whole test {:.1} s); agent {}, message id {id:?}",
        run.elapsed.as_secs_f64(),
        setup.as_secs_f64(),
        stage.started.elapsed().as_secs_f64(),
        stage.agent
    );
}

cases! { gemini_turn;
    gemini_cli_over_http_posts_as_the_agent_and_reads_it_back => Via::Http;
    gemini_cli_over_stdio_posts_as_the_agent_and_reads_it_back => Via::Stdio;
}
