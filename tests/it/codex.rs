//! Real Codex CLI turns through the proxy: `codex exec` (@openai/codex, pinned in `tests/support/codex/`)
//! with the real agentchattr behind `--deny-tool chat_rules --deny-tool chat_decision` as its MCP server (the
//! proxy's URL, over HTTP or HTTPS upstream, or the proxy's binary with `--stdio` as Codex's `command`), and
//! a scripted stand-in for the model on the Responses API. Codex offers its model what the proxy let through:
//! agentchattr's tools less the denied ones, none with a `sender` parameter. The model's `chat_send` without
//! `sender` is stamped on its way (agentchattr's `chat_send` requires `sender`: unstamped, it fails
//! validation), or over stdio claims another sender, and is stored once under the agent's registered name;
//! its `chat_read` brings that message back to it under the agent's name.
//!
//! Codex reaches nothing but loopback: its config turns off what phones home (the plugin marketplace's git
//! and HTTPS syncs, analytics, the update check), and every proxy variable points at a trap that records and
//! refuses whatever would have left the machine; the test fails if the trap saw a connection.

use serde_json::{json, Value};

use crate::support::cases;
use crate::support::checks::Checks;
use crate::support::hosts::{
    self, sent_id, Run, Served, Stage, StdioEnd, Turns, Via, CLAIMED, FINAL, PROMPT, SERVER, TURN_LIMIT,
};
use crate::support::realenv;
use crate::support::wire::StubUpstream;

/// The tools the proxy hides.
const DENIED: [&str; 2] = ["chat_rules", "chat_decision"];
/// Where Codex asks its model (it appends `/responses` to the provider's base URL).
const TURN_PATH: &str = "/v1/responses";
/// The model's two tool calls.
const SEND_CALL: &str = "call_chat_send_1";
const READ_CALL: &str = "call_chat_read_1";
/// The provider's key variable (a dummy key: the stand-in checks nothing).
const KEY_VAR: &str = "CODEX_TURN_TEST_KEY";

/// How Codex reaches agentchattr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// The proxy on a loopback port, in front of agentchattr's `/mcp`; the model's `chat_send` names no
    /// sender.
    Http,
    /// The same with the proxy's upstream `https://`: agentchattr behind nginx terminating TLS.
    Https,
    /// The same through a forward proxy: Debian's squid named by `HTTPS_PROXY`, nginx as `mcp.proxied.test`.
    ForwardProxy,
    /// The proxy as Codex's stdio MCP server (`command` and `args`, with `--stdio`); the model's `chat_send`
    /// claims another sender.
    Stdio,
}

impl Route {
    fn via(self) -> Via {
        match self {
            Route::Http | Route::Https | Route::ForwardProxy => Via::Http,
            Route::Stdio => Via::Stdio,
        }
    }

    /// The sender the model's `chat_send` claims, if any.
    fn claims(self) -> Option<&'static str> {
        (self == Route::Stdio).then_some(CLAIMED)
    }
}

// ---------------------------------------------------------------------------------------------------------
// The stand-in model.

/// `POST` [`TURN_PATH`], answered with an event stream: with chat_send offered, a turn with no tool output
/// yet calls it with `arguments`; the turn carrying its output calls `chat_read` on #general; the turn
/// carrying that output ends with [`FINAL`]. Anything else is a 404.
fn model(arguments: Value) -> StubUpstream {
    hosts::stand_in(TURN_PATH, move |body| {
        let namespace = namespace_of(&body["tools"], "chat_send");
        let read = json!({"channel": "general"});
        let (id, item) = match (call_output(body, SEND_CALL), call_output(body, READ_CALL), namespace) {
            (_, Some(_), _) => ("resp_final", message(FINAL)),
            (Some(_), None, Some(ns)) => ("resp_read", function_call(&ns, READ_CALL, "chat_read", &read)),
            (None, None, Some(ns)) => ("resp_send", function_call(&ns, SEND_CALL, "chat_send", &arguments)),
            (_, None, None) => ("resp_none", message("chat_send was not offered")),
        };
        events(id, item)
    })
}

/// One output item as a Responses API event stream: the response created, the item done, the response
/// completed. Codex 0.171 acts on the item at `response.output_item.done` and needs `response.completed`
/// (without it the turn fails: "stream closed before response.completed"); `response.created` it can do
/// without, but the real API sends it first.
fn events(id: &str, item: Value) -> String {
    let usage = json!({"input_tokens": 1, "input_tokens_details": null, "output_tokens": 1,
                       "output_tokens_details": null, "total_tokens": 2});
    [
        json!({"type": "response.created", "response": {"id": id}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": {"id": id, "usage": usage}}),
    ]
    .iter()
    .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or("")))
    .collect()
}

/// A call of `name` in `namespace` with `arguments`.
fn function_call(namespace: &str, call_id: &str, name: &str, arguments: &Value) -> Value {
    json!({"type": "function_call", "call_id": call_id, "name": name, "namespace": namespace,
           "arguments": arguments.to_string()})
}

fn message(text: &str) -> Value {
    json!({"type": "message", "role": "assistant", "id": "msg_1",
           "content": [{"type": "output_text", "text": text}]})
}

/// Every function a Responses `tools` array offers, as (namespace, function): Codex 0.171 puts an MCP
/// server's tools in one `{"type": "namespace", "name": "mcp__<server>", "tools": [...]}` entry; its own
/// tools are top-level functions (namespace "").
fn offered(tools: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    for tool in tools.as_array().into_iter().flatten() {
        match tool["type"].as_str() {
            Some("namespace") => {
                let ns = tool["name"].as_str().unwrap_or("").to_string();
                out.extend(tool["tools"].as_array().into_iter().flatten().map(|t| (ns.clone(), t)));
            }
            _ => out.push((String::new(), tool)),
        }
    }
    out
}

/// The namespace of the function called `name`, when one namespace offers it.
fn namespace_of(tools: &Value, name: &str) -> Option<String> {
    offered(tools).into_iter().find(|(ns, t)| !ns.is_empty() && t["name"] == name).map(|(ns, _)| ns)
}

/// The text of the output of `call_id` in a request's input (a string, or a list of text parts).
fn call_output(body: &Value, call_id: &str) -> Option<String> {
    let item = body["input"]
        .as_array()?
        .iter()
        .find(|i| i["type"] == "function_call_output" && i["call_id"] == call_id)?;
    Some(hosts::text_of(&item["output"]))
}

// ---------------------------------------------------------------------------------------------------------
// Codex.

/// `$CODEX_HOME/config.toml`: the stand-in as the model provider, agentchattr through the proxy as the MCP
/// server, no prompts, nothing that phones home.
fn config(model: &StubUpstream, server: &str) -> String {
    format!(
        r#"model = "stand-in"
model_provider = "stand-in"
# MCP calls run without asking (with default_tools_approval_mode below); shell commands never leave read-only.
approval_policy = "never"
sandbox_mode = "read-only"
check_for_update_on_startup = false

[analytics]
enabled = false

[features]
# On by default: `git ls-remote https://github.com/openai/plugins.git` and requests to api.github.com and
# chatgpt.com at every start.
plugins = false
# Runs `bash -lc` with the user's startup files to snapshot the shell.
shell_snapshot = false

[model_providers.stand-in]
name = "stand-in"
base_url = "http://127.0.0.1:{port}/v1"
env_key = "{KEY_VAR}"
wire_api = "responses"
# A stand-in that answers wrong should fail the turn at once, not after retries with back-off.
request_max_retries = 0
stream_max_retries = 0

[mcp_servers.{SERVER}]
{server}
# Under approval_policy "never" an MCP call is refused ("MCP tool call requires approval, but approval policy
# is never") unless its server's tools are approved here.
default_tools_approval_mode = "approve"
"#,
        port = model.port
    )
}

/// `codex exec --json` [`PROMPT`] in the stage's working directory, its HOME as `CODEX_HOME` too (see
/// [`Stage::command`]), bounded by [`TURN_LIMIT`].
fn codex_exec(stage: &Stage) -> Run {
    let (home, work) = (&stage.home, &stage.work);
    let mut cmd = stage.command("node");
    cmd.arg(realenv::codex())
        .args([
            "exec",
            "--json",
            "--ephemeral",
            "--strict-config",
            "--skip-git-repo-check",
            "--color",
            "never",
        ])
        .arg("-C")
        .arg(work)
        .arg(PROMPT)
        .env("CODEX_HOME", home)
        .env(KEY_VAR, "dummy-key");
    stage.run("node codex.js exec", cmd, TURN_LIMIT)
}

/// The `mcp_tool_call` items Codex reported complete on its `--json` stdout.
fn tool_calls(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["type"] == "item.completed" && e["item"]["type"] == "mcp_tool_call")
        .map(|e| e["item"].clone())
        .collect()
}

fn codex_turn(test: &str, route: Route) {
    realenv::codex();
    let stage = Stage::new(test, "codex");
    let nginx = match route {
        Route::Https => Some(crate::tls::Nginx::start(&[stage.ac.http])),
        Route::ForwardProxy => Some(crate::tls::Nginx::start_as(
            "proxied",
            crate::forward_proxy::AGENTCHATTR_HOST,
            &[stage.ac.http],
        )),
        Route::Http | Route::Stdio => None,
    };
    let squid = (route == Route::ForwardProxy).then(crate::forward_proxy::Squid::start);
    let tls_host = if squid.is_some() { crate::forward_proxy::PROXIED_HOST } else { "localhost" };
    let upstream_names: Vec<&str> = stage.tools.iter().filter_map(|t| t["name"].as_str()).collect();
    // The premise, beyond the stage's: agentchattr lists the denied tools.
    for denied in DENIED {
        assert!(upstream_names.contains(&denied), "agentchattr lists no {denied}: {upstream_names:?}");
    }
    let message = match route.claims() {
        Some(claimed) => format!("{test}: posted claiming to be {claimed}"),
        None => format!("{test}: posted without a sender"),
    };
    let mut arguments = json!({"message": message, "channel": "general"});
    if let Some(claimed) = route.claims() {
        arguments["sender"] = json!(claimed);
    }

    let (url, ca) = match &nginx {
        Some(n) => (
            format!("https://{tls_host}:{}/mcp", n.ports[0]),
            vec!["--ca-file".to_string(), crate::tls::cert("root.pem")],
        ),
        None => (format!("{}/mcp", stage.ac.mcp_base()), Vec::new()),
    };
    let mut proxy = stage.proxy_to(url).arg("--deny-tool", DENIED[0]).arg("--deny-tool", DENIED[1]).args(ca);
    if let Some(squid) = &squid {
        proxy = proxy.envs(&crate::forward_proxy::through(squid).each_ref().map(|(k, v)| (*k, v.as_str())));
    }
    let mut served = stage.serve(route.via(), proxy);
    let model = model(arguments.clone());
    let server = match &served {
        Served::Http { url, .. } => format!("url = {}", json!(url)),
        Served::Stdio { command, args } => format!("command = {}\nargs = {}", json!(command), json!(args)),
    };
    std::fs::write(stage.home.join("config.toml"), config(&model, &server)).expect("write config.toml");

    let run = codex_exec(&stage);
    served.stop();

    let mut c = Checks::default();
    let turns = Turns::of(&mut c, &model, TURN_PATH, |body, tool| {
        call_output(body, if tool == "chat_send" { SEND_CALL } else { READ_CALL })
    });
    c.check(turns.bodies.iter().all(|t| t["stream"] == true), "a model request without \"stream\": true");

    // What Codex offered its model on the first turn: agentchattr's tools in its namespace, the denied ones
    // nowhere.
    let tools = offered(&turns.get(0)["tools"]);
    let namespace = format!("mcp__{SERVER}");
    let ours: Vec<(String, Value)> = tools
        .iter()
        .filter(|(ns, _)| *ns == namespace)
        .map(|(_, t)| (t["name"].as_str().unwrap_or("?").to_string(), t["parameters"].clone()))
        .collect();
    hosts::check_offered(&mut c, "Codex", &ours, &DENIED);
    let anywhere: Vec<&str> = tools.iter().filter_map(|(_, t)| t["name"].as_str()).collect();
    for denied in DENIED {
        c.check(!anywhere.contains(&denied), format!("{denied} offered to the model: {anywhere:?}"));
    }

    // The calls' outputs as the model saw them, and in agentchattr.
    let id = stage.check_landing(&mut c, &message, &turns);

    // The calls as Codex reported them.
    let calls = tool_calls(&run.stdout);
    let reported: Vec<Value> =
        calls.iter().map(|call| json!([call["server"], call["tool"], call["status"]])).collect();
    c.eq(
        "the calls Codex reported (server, tool, status)",
        &json!(reported),
        &json!([[SERVER, "chat_send", "completed"], [SERVER, "chat_read", "completed"]]),
    );
    if let Some(call) = calls.first() {
        c.eq("the reported chat_send's arguments", &call["arguments"], &arguments);
        c.check(
            sent_id(&call["result"].to_string()) == id,
            format!("the reported result {} is not the model's {:?}", call["result"], turns.send_output),
        );
    }
    c.check(calls.iter().all(|call| call["error"].is_null()), format!("a reported call failed: {calls:?}"));
    c.check(run.stdout.contains(FINAL), format!("Codex did not end with the model's {FINAL:?}"));
    if matches!(route, Route::Https | Route::ForwardProxy) {
        c.check(!served.log().contains("TLS with upstream"), "a TLS failure was logged");
    }
    if let Some(squid) = &squid {
        c.check(served.log().contains("through the forward proxy"), "the route line names no forward proxy");
        let access = squid.access_log_once("CONNECT mcp.proxied.test:");
        c.check(access.contains("CONNECT mcp.proxied.test:"), format!("no CONNECT in squid's log: {access}"));
        c.check(!access.contains(stage.token.as_str()), "the agent's token is in squid's access log");
    }
    stage.check_ending(&mut c, "codex exec", route.via(), StdioEnd::SignalThenKill, route.claims(), &run);
    stage.finish(c, test, "codex exec", &run, &served, &turns);
}

cases! { codex_turn;
    a_codex_turn_offers_only_allowed_tools_without_sender_and_its_call_lands_stamped => Route::Http;
    a_codex_turn_over_https_through_nginx_lands_stamped => Route::Https;
    a_codex_turn_through_a_forward_proxy_lands_stamped => Route::ForwardProxy;
    codex_over_stdio_posts_as_the_agent_and_reads_it_back => Route::Stdio;
}
