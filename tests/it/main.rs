//! One integration-test binary (one link, shared helpers), ripgrep style.
//! Every test drives the real `mcp-identity-proxy` binary over loopback.

mod cli;
mod clients;
mod core;
mod hostile;
mod identity;
mod realenv;
mod sse;
mod upstream;
mod util;
