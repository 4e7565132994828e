//! Pure MCP layer: JSON span scanning, identity stamping, SSE endpoint
//! rewriting, identity parsing, JSON-RPC message reading and error bodies,
//! the `initialize` answer (whole, and as it streams past: `version_scan`),
//! the session table. No I/O, no clock.

pub mod identity;
pub mod initialize;
pub mod json;
pub mod legacy;
pub mod lex;
pub mod rpc;
pub mod session;
pub mod sse;
pub mod stamp;
pub mod tools;
pub mod version_scan;
