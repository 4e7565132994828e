//! rmcp (the Rust MCP SDK Codex uses) as a real client, with its default reqwest client (one connection per
//! request), reporting as JSON on stdout like the Python and Node client scripts in `tests/support/`.
//!
//!   rmcp-test-client URL [--authorization "Bearer spoof"] [--x-agent-token spoof] [--sender mallory]
//!
//! Handshake (initialize + notifications/initialized), tools/list, tools/call of chat_send, chat_join,
//! chat_read and chat_who as `--sender`, then close. The credentials are the client's own: forged ones when it
//! talks to the proxy, the test upstream's when it talks to it directly. Prints one JSON object and exits 0
//! even when a step failed (`error` says which); bad arguments exit 2.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::{json, Map, Value};

/// Bound on the handshake (a client that gets no answer to `initialize` waits forever otherwise).
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(20);
/// Bound on closing the session.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

struct Args {
    url: String,
    /// The bearer token rmcp sends as `Authorization: Bearer <token>`.
    bearer: Option<String>,
    x_agent_token: Option<String>,
    sender: String,
}

fn parse_args(argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut url = None;
    let mut bearer = None;
    let mut x_agent_token = None;
    let mut sender = "mallory".to_string();
    let mut argv = argv;
    while let Some(a) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--authorization" => {
                let v = value()?;
                // rmcp writes the scheme itself; it can only send a bearer credential.
                let token =
                    v.strip_prefix("Bearer ").ok_or_else(|| format!("--authorization {v:?}: not Bearer"))?;
                bearer = Some(token.to_string());
            }
            "--x-agent-token" => x_agent_token = Some(value()?),
            "--sender" => sender = value()?,
            _ if url.is_none() && !a.starts_with("--") => url = Some(a),
            _ => return Err(format!("unexpected argument {a:?}")),
        }
    }
    let url =
        url.ok_or("usage: rmcp-test-client URL [--authorization V] [--x-agent-token V] [--sender NAME]")?;
    Ok(Args { url, bearer, x_agent_token, sender })
}

fn main() -> ExitCode {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("rmcp-test-client: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let mut out = json!({
        "sdk": "rmcp 3.11.0",
        "server": null,
        "protocol_version": null,
        "tools": [],
        "calls": {},
        "closed": false,
        "error": null,
    });
    if let Err(e) = run(&args, &mut out) {
        out["error"] = Value::String(e);
    }
    out["elapsed_ms"] = json!(started.elapsed().as_millis() as u64);
    println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    ExitCode::SUCCESS
}

/// The session, step by step; each observation goes into `out` as soon as it is made, so a failure leaves
/// what came before it in the report.
fn run(args: &Args, out: &mut Value) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let mut config = StreamableHttpClientTransportConfig::with_uri(args.url.clone());
        if let Some(bearer) = &args.bearer {
            config = config.auth_header(bearer.clone());
        }
        if let Some(token) = &args.x_agent_token {
            let mut headers = HashMap::new();
            headers.insert(
                http::HeaderName::from_static("x-agent-token"),
                http::HeaderValue::from_str(token).map_err(|e| e.to_string())?,
            );
            config = config.custom_headers(headers);
        }
        let transport = StreamableHttpClientTransport::from_config(config);
        let client = tokio::time::timeout(HANDSHAKE_LIMIT, ().serve(transport))
            .await
            .map_err(|_| "rmcp handshake timed out".to_string())?
            .map_err(|e| format!("rmcp handshake: {e:?}"))?;
        let info = client.peer_info().ok_or("rmcp: no server info after the handshake")?;
        out["server"] = json!(info.server_info.as_ref().map(|s| s.name.clone()));
        out["protocol_version"] = json!(info.protocol_version.to_string());

        let tools = client.list_all_tools().await.map_err(|e| format!("rmcp tools/list: {e:?}"))?;
        out["tools"] = tools.iter().map(|t| Value::String(t.name.to_string())).collect();

        let sender = args.sender.as_str();
        let plan = [
            ("chat_send", json!({"sender": sender, "message": "hello from rmcp"})),
            ("chat_join", json!({"name": sender})),
            ("chat_read", json!({"sender": sender})),
            ("chat_who", json!({})),
        ];
        for (name, arguments) in plan {
            let arguments: Map<String, Value> = arguments.as_object().cloned().unwrap_or_default();
            let result = client
                .call_tool(CallToolRequestParams::new(name).with_arguments(arguments))
                .await
                .map_err(|e| format!("rmcp tools/call {name}: {e:?}"))?;
            let text = result
                .content
                .first()
                .and_then(|c| c.as_text())
                .map(|t| t.text.clone())
                .ok_or_else(|| format!("rmcp tools/call {name}: no text content: {result:?}"))?;
            // The test server answers with what it saw (identity, credential lines) as JSON text.
            out["calls"][name] = serde_json::from_str(&text).unwrap_or(Value::String(text));
        }

        tokio::time::timeout(CLOSE_LIMIT, client.cancel())
            .await
            .map_err(|_| "rmcp close timed out".to_string())?
            .map_err(|e| format!("rmcp close: {e:?}"))?;
        out["closed"] = json!(true);
        Ok(())
    })
}
