//! One integration-test binary (one link, shared helpers), ripgrep style.
//! Every test drives the real proxy over loopback: the binary, or (demo.rs)
//! the library in-process.

mod body_rule;
mod cli;
mod clients;
mod core;
mod deadlines;
mod demo;
mod harness;
mod hostile;
mod identity;
mod realenv;
mod restarts;
mod shim;
mod sse;
mod upstream;
mod util;
