//! `cargo run --release --example demo`: the proxy doing its job, in one
//! process and one command. Starts a small MCP chat server that demands a
//! bearer token, puts mcp-identity-proxy in front of it, runs a scripted
//! client session through the proxy (a client that claims to be "mallory"
//! and forges a token), prints what went over the wire, then keeps serving
//! so a real client can attach. Ctrl-C stops the proxy and the demo exits 0.
//!
//! `RUST_LOG=info` shows the proxy's one line per exchange on stderr.

#[path = "demo_session.rs"]
mod demo_session;

use demo_session::{Demo, AGENT, MCP_PATH, PROTOCOL_VERSION};
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Ok(filter) = std::env::var("RUST_LOG") {
        env_logger::Builder::new().parse_filters(&filter).target(env_logger::Target::Stderr).init();
    }
    match run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("demo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> std::io::Result<ExitCode> {
    let demo = Demo::start()?;
    let token = demo.server.token.clone();
    println!("mcp-identity-proxy demo");
    println!("  MCP server (built in)  {}  needs Authorization: Bearer {token}", demo.server.url());
    println!("  proxy                  {}  agent \"{AGENT}\", holds that token", demo.proxy_url());
    println!();
    println!("Scripted client -> proxy -> server (the client itself holds no valid token):");
    let transcript = demo_session::run_script(&demo)?;
    print!("{}", demo_session::render(&transcript, &token));
    let problems = demo_session::problems(&transcript, &token);
    println!();
    if problems.is_empty() {
        println!("OK: one Mcp-Session-Id line per response, sender stamped \"{AGENT}\", token injected.");
    } else {
        for p in &problems {
            println!("FAILED: {p}");
        }
        return Ok(ExitCode::FAILURE);
    }

    let url = demo.proxy_url();
    let accept = "-H 'accept: application/json, text/event-stream' -H 'content-type: application/json'";
    println!();
    println!("The proxy keeps serving at {url}  (Ctrl-C to stop)");
    println!("Attach a real client:");
    println!("  claude mcp add --transport http demo {url}");
    println!("Or by hand with curl:");
    println!(
        "  SID=$(curl -sS -o /dev/null -D - {url} {accept} \\\n      -d '{{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{{\"protocolVersion\":\"{PROTOCOL_VERSION}\",\"capabilities\":{{}},\"clientInfo\":{{\"name\":\"curl\",\"version\":\"0\"}}}}}}' \\\n      | tr -d '\\r' | awk 'tolower($1)==\"mcp-session-id:\" {{print $2}}')"
    );
    println!(
        "  curl -sS {url} {accept} -H \"mcp-session-id: $SID\" \\\n      -d '{{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/call\",\"params\":{{\"name\":\"chat_send\",\"arguments\":{{\"sender\":\"mallory\",\"message\":\"hi\"}}}}}}'"
    );
    println!("  curl -sS -X DELETE -i {url} -H \"mcp-session-id: $SID\"");
    debug_assert!(url.ends_with(MCP_PATH));

    match demo.proxy_thread.join() {
        Ok(Ok(())) => {
            println!("\nproxy stopped; bye");
            Ok(ExitCode::SUCCESS)
        }
        Ok(Err(e)) => Err(e),
        Err(_) => Err(std::io::Error::other("the proxy thread panicked")),
    }
}
