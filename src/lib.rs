//! mcp-identity-proxy: a single-threaded HTTP/1.1 proxy that sits between one
//! MCP agent and a shared MCP server.
//!
//! ```text
//!  main -> event_loop -> conn -> io, buf, http, mcp -> limits
//!
//!  client ──► listener ──► Conn { client socket, client_buf }
//!                            │ ReadHead: http::head parses in place
//!                            │ ReadBody: whole JSON POST body (bounded), mcp::stamp splices identity
//!                            │ Connect / SendRequest: head written from a HeaderList (one line per name)
//!                            │ ReadResponseHead / Relay: body streamed through upstream_buf
//!                            ▼
//!                          upstream socket (keep-alive pool in event_loop)
//! ```
//!
//! `http` and `mcp` are pure (bytes in, values or offsets out) and never name
//! mio, std::net or the clock; `event_loop` alone owns the `mio::Poll`.
//! `credentials` (a token program's command line and output, renewal) is pure too.
//! `probe` (`--probe URL`) is a mode of its own: one blocking std::net GET,
//! no event loop.

#![deny(unsafe_code)]

pub(crate) mod buf;
pub mod config;
pub mod conn;
pub mod credentials;
pub mod event_loop;
pub mod http;
pub(crate) mod io;
pub(crate) mod limits;
pub mod mcp;
#[cfg(feature = "tls")]
pub mod oauth;
pub mod obs;
pub mod probe;
pub mod route;
pub mod stdio;
#[cfg(test)]
mod test_rng;
#[cfg(feature = "tls")]
pub mod tls;
pub mod transport;
pub mod url;
// The OS layer: the one place allowed `unsafe`.
#[allow(unsafe_code)]
mod sys;
