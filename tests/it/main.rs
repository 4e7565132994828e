//! One integration-test binary (one link, shared helpers), ripgrep style.
//! Every test drives the real proxy over loopback: the binary, or (demo.rs)
//! the library in-process.

mod body_rule;
mod cli;
mod clients;

mod deadlines;
mod demo;
mod framing;
mod hostile;
mod identity;
mod shim;
mod sse;
mod support;
