//! Real Claude Code turns through the proxy: `claude -p` (@anthropic-ai/claude-code at 2.1.217, the version
//! of the original duplicate-`Mcp-Session-Id` report, in `tests/support/claude-code-2.1.217/`, and at the
//! current release when pinned, in `tests/support/claude-code/`) with the real agentchattr as its MCP server
//! behind the proxy (an `http` entry of `--mcp-config` naming the proxy's port, or a `stdio` one naming the
//! proxy's binary with `--stdio`), and a scripted stand-in for the model on the Messages API
//! (`ANTHROPIC_BASE_URL`). The model is offered agentchattr's tools, none with a `sender` parameter; its
//! `chat_send` claims another sender and is stored once under the agent's registered name; its `chat_read`
//! brings that message back to it under the agent's name.
//!
//! Claude Code reaches nothing but loopback: `CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC` turns off what phones
//! home (the update check, telemetry, error reports), HOME and TMPDIR are the test's, and every proxy
//! variable points at the trap ([`hosts::trap`]).

use std::path::Path;

use serde_json::{json, Value};

use crate::support::cases;
use crate::support::checks::Checks;
use crate::support::hosts::{
    self, Run, Served, Stage, StdioEnd, Turns, Via, CLAIMED, FINAL, PROMPT, SERVER, TURN_LIMIT,
};
use crate::support::realenv::{self, ClaudeCode};
use crate::support::wire::StubUpstream;

/// Where Claude Code asks its model (the Messages API under `ANTHROPIC_BASE_URL`).
const TURN_PATH: &str = "/v1/messages?beta=true";
/// The model's two tool calls.
const SEND_ID: &str = "toolu_chat_send";
const READ_ID: &str = "toolu_chat_read";

/// The name Claude Code gives agentchattr's `tool` (agentchattr being [`SERVER`] in `--mcp-config`).
fn offered_name(tool: &str) -> String {
    format!("mcp__{SERVER}__{tool}")
}

// ---------------------------------------------------------------------------------------------------------
// The stand-in model.

/// `POST` [`TURN_PATH`], answered with an event stream: with chat_send offered, a turn with no tool
/// result yet calls it (posting `message` as [`CLAIMED`]); the turn carrying its result calls `chat_read` on
/// #general; the turn carrying that result ends with [`FINAL`]. Anything else is a 404.
fn model(message: String) -> StubUpstream {
    hosts::stand_in(TURN_PATH, move |body| {
        let send = offered_name("chat_send");
        let offered = body["tools"].as_array().into_iter().flatten().any(|t| t["name"] == send);
        let blocks = match (tool_result(body, SEND_ID), tool_result(body, READ_ID)) {
            (_, Some(_)) => vec![text(FINAL)],
            (Some(_), None) => {
                vec![tool_use(READ_ID, &offered_name("chat_read"), json!({"channel": "general"}))]
            }
            (None, None) if offered => {
                let input = json!({"sender": CLAIMED, "message": message, "channel": "general"});
                vec![tool_use(SEND_ID, &send, input)]
            }
            (None, None) => vec![text("chat_send was not offered")],
        };
        events(&body["model"], &blocks)
    })
}

/// The content blocks of one assistant message as a Messages API event stream, as the real API sends it:
/// `message_start`; per block `content_block_start`, one delta (a tool's input as `input_json_delta`),
/// `content_block_stop`; `message_delta` with the stop reason (`tool_use` when the last block calls a tool);
/// `message_stop`.
fn events(model: &Value, blocks: &[Value]) -> String {
    let usage = json!({"input_tokens": 1, "output_tokens": 1});
    let mut out = vec![json!({"type": "message_start", "message": {"id": "msg_stand_in", "type": "message",
        "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
        "usage": usage}})];
    for (index, block) in blocks.iter().enumerate() {
        let (start, delta) = match block["type"].as_str() {
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
            ),
            _ => (json!({"type": "text", "text": ""}), json!({"type": "text_delta", "text": block["text"]})),
        };
        out.push(json!({"type": "content_block_start", "index": index, "content_block": start}));
        out.push(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        out.push(json!({"type": "content_block_stop", "index": index}));
    }
    let calls = blocks.last().is_some_and(|b| b["type"] == "tool_use");
    let stop = if calls { "tool_use" } else { "end_turn" };
    out.push(json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": 1}}));
    out.push(json!({"type": "message_stop"}));
    out.iter().map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or(""))).collect()
}

fn tool_use(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

fn text(text: &str) -> Value {
    json!({"type": "text", "text": text})
}

/// The text of the `tool_result` for `id` in a request's messages (its content a string, or text blocks).
fn tool_result(body: &Value, id: &str) -> Option<String> {
    let block = body["messages"]
        .as_array()?
        .iter()
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .find(|b| b["type"] == "tool_result" && b["tool_use_id"] == id)?;
    Some(hosts::text_of(&block["content"]))
}

/// agentchattr's tools among a request's `tools`, as (agentchattr's name, input schema).
fn offered(body: &Value) -> Vec<(String, Value)> {
    let prefix = offered_name("");
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            Some((t["name"].as_str()?.strip_prefix(&prefix)?.to_string(), t["input_schema"].clone()))
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------------------
// Claude Code.

/// `claude -p` [`PROMPT`] in print mode with JSON output, its MCP servers only those of `mcp_config`,
/// agentchattr's two tools the model calls allowed without a prompt, the stand-in as its API; bounded by
/// [`TURN_LIMIT`].
fn claude(which: ClaudeCode, stage: &Stage, model: &StubUpstream, mcp_config: &Path) -> Run {
    let allowed = format!("{},{}", offered_name("chat_send"), offered_name("chat_read"));
    let mut cmd = stage.command("node");
    cmd.arg(realenv::claude_code(which))
        .args(["-p", PROMPT, "--output-format", "json", "--strict-mcp-config", "--allowedTools", &allowed])
        .arg("--mcp-config")
        .arg(mcp_config)
        .env("ANTHROPIC_BASE_URL", format!("http://{}", model.authority()))
        // A dummy key: the stand-in checks nothing.
        .env("ANTHROPIC_API_KEY", "dummy-key")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        // From 2.1.3xx MCP tools are otherwise offered through a search tool, not declared to the model.
        .env("ENABLE_TOOL_SEARCH", "false");
    stage.run("claude -p", cmd, TURN_LIMIT)
}

/// The current Claude Code first sends `server/discover` (MCP 2026-07-28), which agentchattr answers with
/// HTTP 400 and the id `"server-error"`, then falls back to `initialize`; 2.1.217 starts with `initialize`.
/// Checked in the proxy's audit log, with the fallback's delay: a stdio host matches answers by id only, so
/// unless the proxy gives the error the request's id, Claude Code waits for its own timeout (about 3 s)
/// first.
fn check_discover_fallback(c: &mut Checks, stage: &Stage, which: ClaudeCode) {
    let records = stage.audit_records();
    let at =
        |method: &str| records.iter().find(|r| r["mcp.method.name"] == method).and_then(|r| millis(&r["ts"]));
    let (discover, initialize) = (at("server/discover"), at("initialize"));
    c.check(
        discover.is_some() == (which == ClaudeCode::Current),
        format!(
            "{which:?} sent server/discover: {}, want {}",
            discover.is_some(),
            which == ClaudeCode::Current
        ),
    );
    if let (Some(discover), Some(initialize)) = (discover, initialize) {
        let gap = (initialize - discover).rem_euclid(86_400_000);
        c.check(
            gap < 2_000,
            format!("initialize came {gap} ms after server/discover's answer, want under 2 s"),
        );
    }
}

/// An audit record's `ts` (`YYYY-MM-DDTHH:MM:SS.mmmZ`) as milliseconds into its day.
fn millis(ts: &Value) -> Option<i64> {
    let time = ts.as_str()?.split_once('T')?.1.strip_suffix('Z')?;
    let (hms, ms) = time.split_once('.')?;
    let mut parts = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (h, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    Some(((h * 60 + m) * 60 + s) * 1000 + ms.parse::<i64>().ok()?)
}

fn claude_turn(test: &str, which: ClaudeCode, via: Via) {
    realenv::claude_code(which);
    let stage = Stage::new(test, "claude");
    let mut served = stage.serve(via, stage.proxy());
    let message = format!("{test}: posted claiming to be {CLAIMED}");
    let model = model(message.clone());
    let entry = match &served {
        Served::Http { url, .. } => json!({"type": "http", "url": url}),
        Served::Stdio { command, args } => json!({"type": "stdio", "command": command, "args": args}),
    };
    let mcp_config = stage.scratch.join("mcp.json");
    std::fs::write(&mcp_config, json!({"mcpServers": {SERVER: entry}}).to_string()).expect("write mcp.json");

    let run = claude(which, &stage, &model, &mcp_config);
    served.stop();

    let mut c = Checks::default();
    let turns = Turns::of(&mut c, &model, TURN_PATH, |body, tool| {
        tool_result(body, if tool == "chat_send" { SEND_ID } else { READ_ID })
    });
    c.check(turns.bodies.iter().all(|t| t["stream"] == true), "a model request without \"stream\": true");
    hosts::check_offered(&mut c, "Claude Code", &offered(turns.get(0)), &[]);
    stage.check_landing(&mut c, &message, &turns);

    // What Claude Code reported.
    let report: Value = serde_json::from_str(run.stdout.trim()).unwrap_or(Value::Null);
    c.eq(
        "Claude Code's report",
        &json!([report["type"], report["subtype"], report["is_error"], report["result"]]),
        &json!(["result", "success", false, FINAL]),
    );
    check_discover_fallback(&mut c, &stage, which);
    stage.check_ending(&mut c, "claude -p", via, StdioEnd::Signal, Some(CLAIMED), &run);
    stage.finish(c, test, "claude -p", &run, &served, &turns);
}

cases! { claude_turn;
    claude_code_2_1_217_over_http_posts_as_the_agent_and_reads_it_back => ClaudeCode::V2_1_217, Via::Http;
    claude_code_current_over_http_posts_as_the_agent_and_reads_it_back => ClaudeCode::Current, Via::Http;
    claude_code_2_1_217_over_stdio_posts_as_the_agent_and_reads_it_back => ClaudeCode::V2_1_217, Via::Stdio;
    claude_code_current_over_stdio_posts_as_the_agent_and_reads_it_back => ClaudeCode::Current, Via::Stdio;
}
