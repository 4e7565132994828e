//! Thin entry point: argv/env -> Config, logger, bind, port line, run,
//! exit code (0 clean, 2 configuration, 3 bind); or `--probe URL`, its
//! exit code (0 a 200, 1 anything else, 2 a bad URL).

#![deny(unsafe_code)]

use mcp_identity_proxy::config::{self, ConfigError, Mode, TOKEN_ENV, USAGE, USAGE_OAUTH};
use mcp_identity_proxy::event_loop::{BindError, Proxy};
use mcp_identity_proxy::probe;
use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let env_token = std::env::var(TOKEN_ENV).ok();
    let config = match config::parse_mode(std::env::args().skip(1), env_token) {
        Ok(Mode::Proxy(c)) => *c,
        Ok(Mode::Probe(url)) => {
            return match probe::run(&url) {
                Ok(()) => ExitCode::SUCCESS,
                Err(why) => {
                    eprintln!("mcp-identity-proxy: probe {url}: {why}");
                    ExitCode::from(1)
                }
            };
        }
        Err(ConfigError::Help) => {
            print!("{USAGE}{USAGE_OAUTH}");
            return ExitCode::SUCCESS;
        }
        Err(ConfigError::Version) => {
            println!("mcp-identity-proxy {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mcp-identity-proxy: {e}");
            return ExitCode::from(2);
        }
    };
    env_logger::Builder::new()
        .parse_filters(&std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .target(env_logger::Target::Stderr)
        .init();
    let port = config.listen.port();
    let stdio = config.stdio;
    let proxy = match Proxy::bind(config) {
        Ok(p) => p,
        Err(BindError::Listen(e)) if e.kind() == std::io::ErrorKind::AddrInUse && port != 0 => {
            println!("  MCP proxy: port {port} in use (shared with another instance)");
            let _ = std::io::stdout().flush();
            return ExitCode::from(3);
        }
        Err(e @ BindError::Listen(_)) => {
            eprintln!("mcp-identity-proxy: {e}");
            return ExitCode::from(3);
        }
        Err(e @ BindError::Metrics(_)) => {
            eprintln!("mcp-identity-proxy: {e}");
            return ExitCode::from(3);
        }
        Err(e @ (BindError::ControlStdin(_) | BindError::AuditLog(_) | BindError::FirstToken(..))) => {
            eprintln!("mcp-identity-proxy: {e}");
            return ExitCode::from(2);
        }
        Err(e) => {
            eprintln!("mcp-identity-proxy: {e}");
            return ExitCode::from(1);
        }
    };
    if stdio {
        // stdout carries JSON-RPC only.
        if let Some(addr) = proxy.metrics_addr() {
            eprintln!("  metrics: port {}", addr.port());
        }
    } else {
        println!("  MCP proxy: port {}", proxy.local_addr().port());
        if let Some(addr) = proxy.metrics_addr() {
            println!("  metrics: port {}", addr.port());
        }
        let _ = std::io::stdout().flush();
    }
    match proxy.run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            log::error!("event loop failed: {e}");
            ExitCode::from(1)
        }
    }
}
