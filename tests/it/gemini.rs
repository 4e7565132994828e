//! A real Gemini CLI turn through the proxy: `gemini -p` (@google/gemini-cli, pinned in
//! `tests/support/gemini-cli/`) with the real agentchattr as its MCP server behind the proxy (`mcpServers` in
//! `~/.gemini/settings.json`: an `httpUrl` naming the proxy's port, or a `command` naming the proxy's binary
//! with `--stdio`), and a scripted stand-in for the model on the Gemini API (`GOOGLE_GEMINI_BASE_URL`,
//! `streamGenerateContent` as an event stream). The model is offered agentchattr's tools, none with a
//! `sender` parameter; its `chat_send` claims another sender and is stored once under the agent's registered
//! name; its `chat_read` brings that message back to it under the agent's name.
//!
//! The settings live in the test's HOME (Gemini CLI ignores a system settings file under a world-writable
//! directory such as /tmp); they turn off what phones home (usage statistics, telemetry, the update check),
//! and every proxy variable points at the trap ([`hosts::trap`]). The model is named on the command line:
//! left to itself, Gemini CLI first asks a classifier model which one to use.

use serde_json::{json, Value};

use crate::support::cases;
use crate::support::checks::Checks;
use crate::support::hosts::{
    self, Run, Served, Stage, StdioEnd, Turns, Via, CLAIMED, FINAL, PROMPT, SERVER, TURN_LIMIT,
};
use crate::support::realenv;
use crate::support::wire::StubUpstream;

/// The model Gemini CLI is told to use, and so the path it streams from.
const MODEL: &str = "gemini-2.5-flash";
const TURN_PATH: &str = "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse";

/// The name Gemini CLI gives agentchattr's `tool` (agentchattr being [`SERVER`] under `mcpServers`).
fn offered_name(tool: &str) -> String {
    format!("mcp_{SERVER}_{tool}")
}

// ---------------------------------------------------------------------------------------------------------
// The stand-in model.

/// `POST` [`TURN_PATH`], answered with an event stream of one chunk: with chat_send offered, a turn with no
/// function response yet calls it (posting `message` as [`CLAIMED`]); the turn carrying its response calls
/// `chat_read` on #general; the turn carrying that response ends with [`FINAL`]. Anything else is a 404.
fn model(message: String) -> StubUpstream {
    hosts::stand_in(TURN_PATH, move |body| {
        let send = offered_name("chat_send");
        let offered = declarations(body).iter().any(|d| d["name"] == send);
        let part = match (function_response(body, "chat_send"), function_response(body, "chat_read")) {
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
        format!("data: {chunk}\r\n\r\n")
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

/// `gemini -p` [`PROMPT`] `-m` [`MODEL`] with JSON output, the stand-in as its API; bounded by
/// [`TURN_LIMIT`].
fn gemini(stage: &Stage, model: &StubUpstream) -> Run {
    let mut cmd = stage.command("node");
    cmd.arg(realenv::gemini_cli())
        .args(["-p", PROMPT, "-m", MODEL, "--output-format", "json"])
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

    let run = gemini(&stage, &model);
    served.stop();

    let mut c = Checks::default();
    let turns = Turns::of(&mut c, &model, TURN_PATH, function_response);
    hosts::check_offered(&mut c, "Gemini CLI", &offered(turns.get(0)), &[]);
    stage.check_landing(&mut c, &message, &turns);

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
    stage.check_ending(&mut c, "gemini -p", via, StdioEnd::Signal, Some(CLAIMED), &run);
    stage.finish(c, test, "gemini -p", &run, &served, &turns);
}

cases! { gemini_turn;
    gemini_cli_over_http_posts_as_the_agent_and_reads_it_back => Via::Http;
    gemini_cli_over_stdio_posts_as_the_agent_and_reads_it_back => Via::Stdio;
}
