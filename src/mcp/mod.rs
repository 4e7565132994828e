//! Pure MCP layer: JSON span scanning, identity stamping, SSE endpoint
//! rewriting, identity parsing. No I/O, no clock.

pub mod identity;
pub mod json;
pub mod sse;
pub mod stamp;
