//! One integration-test binary (one link, shared helpers), ripgrep style.
//! Every test drives the real proxy over loopback: the binary, or (demo.rs)
//! the library in-process.

mod body_rule;
mod cli;
// Real Python and Node clients against a real FastMCP server: venvs with the
// Unix layout (bin/python) under an flock; on Windows they would need a host
// interpreter the test does not install.
#[cfg(unix)]
mod clients;
mod core;
mod deadlines;
mod demo;
mod harness;
mod hostile;
mod identity;
#[cfg(unix)]
mod realenv;
mod restarts;
mod shim;
mod sse;
mod upstream;
mod util;
