//! One integration-test binary (one link, shared helpers), ripgrep style.
//! Every test drives the real proxy over loopback: the binary, or (demo.rs)
//! the library in-process. One line per module on what belongs there:

/// The real agentchattr (run.py, driven as wrapper.py does, the drop-in as proxy): restarts, rename, SSE.
#[cfg(unix)]
mod agentchattr;
/// agentchattr's own `tests/test_mcp_proxy.py` (from ../shared/agentchattr/) against the drop-in
/// (python/), its `mcp_proxy.py` one import line. Unix only: the agentchattr venv (bin/python).
#[cfg(unix)]
mod agentchattr_own_tests;
/// The audit log and the metrics listener against the real agentchattr and the Python SDK 1.x: records,
/// counters, the impersonation warning. Unix only: the agentchattr and py1 venvs (bin/python).
#[cfg(unix)]
mod audit;
/// Every request body is scanned whatever its method, Content-Type or framing.
mod body_rule;
/// Real Claude Code turns (`claude -p` at 2.1.217 and the current release, a scripted Messages-API model)
/// through the proxy, over HTTP and as a stdio server, to the real agentchattr. Unix only: the agentchattr venv, and Claude Code in a process
/// group of its own.
#[cfg(unix)]
mod claude_code;
/// The command line: arguments, exit codes, the port line, signals, secrets.
mod cli;
/// Real MCP SDK clients (Python, TypeScript, rmcp) against a real FastMCP server. Unix only: the
/// venvs have the Unix layout (bin/python) under an flock; on Windows they would need a host
/// interpreter the test does not install.
#[cfg(unix)]
mod clients;
/// Real Codex CLI turns (`codex exec`, a scripted Responses-API model) through the tool policy, over HTTP (to
/// an http:// or https:// upstream) and as a stdio server, to the real agentchattr. Unix only: the agentchattr venv, and Codex in a process group of its own.
#[cfg(unix)]
mod codex;
/// The official MCP conformance suite (0.1.16, 0.2.0-alpha.12) direct and through the proxy, in server and client
/// mode, against the Python SDK's conformance server and client. Unix only: the py2 venv, process groups.
#[cfg(unix)]
mod conformance;
/// `--token-command`: the token a program prints, renewed before it expires, failures that keep the token in
/// force. Unix only: the programs are shell scripts.
#[cfg(unix)]
mod credentials;
/// Slow clients cut off by the request and keep-alive deadlines.
mod deadlines;
/// The quickstart demo's session, in-process through the library.
mod demo;
/// Forward proxies (HTTPS_PROXY, NO_PROXY): CONNECT tunnels, stand-in proxies that refuse, stall or close,
/// Debian's squid (agentchattr's sessions through it are in `agentchattr::forward_proxy`). Unix only: squid.
#[cfg(unix)]
mod forward_proxy;
/// Forwarding: credentials, Host, path and query, field merging, hop-by-hop, Location, statuses.
mod forwarding;
/// Framing: malformed requests, head limits, request and response bodies, byte-at-a-time input.
mod framing;
/// Real Gemini CLI turns (`gemini -p`, a scripted Gemini-API model) through the proxy, over HTTP and as a stdio
/// server, to the real agentchattr.
/// Unix only: the agentchattr venv, and Gemini CLI in a process group of its own.
#[cfg(unix)]
mod gemini;
/// The audit log's file (full disk, removed directory, SIGUSR1, rotation by size) and the metrics listener
/// (`/healthz` through the restart grace, `/metrics` as Prometheus text, what else it refuses).
mod health;
/// Adversarial clients and upstreams, DNS rebinding, limits and secrets; each case ends healthy.
mod hostile;
/// Identity stamping, fail-closed refusals and live identity changes.
mod identity;
/// The OAuth token sources (`--oauth-*`) against a stand-in MCP and authorization server: discovery, the
/// token request, the 401 replay, and an authorization server that fails at start.
#[cfg(feature = "tls")]
mod oauth;
/// Real clients through a FastMCP restart on the same port: the proxy re-initialises their sessions. Unix only.
#[cfg(unix)]
mod reopen;
/// The upstream restarting under a live MCP session: --restart-grace, answers the session survives.
mod restarts;
/// A session the upstream lost (404) re-initialised for the client on the wire, and when it is not.
mod session_recovery;
/// MCP sessions (one session header) and connection lifecycle, keep-alive, pipelining, reuse.
mod sessions;
/// The agentchattr drop-in: its wrapper script driving the binary.
mod shim;
/// A soak under faults: callers and GET streams through a minute of upstream restarts.
mod soak;
/// The legacy HTTP+SSE transport: `GET /sse` endpoint rewriting and `POST /messages/`.
mod sse;
/// `--stdio`: the host's JSON-RPC lines on stdin and stdout, to stand-ins and, with the real SDKs' stdio clients,
/// to the real agentchattr.
mod stdio;
/// A recorded session's GET stream held open through an upstream restart and reattached.
mod stream_hold;
/// Streamed responses: SSE latency, re-framing, disconnects, no head-of-line blocking.
mod streaming;
/// Shared helpers: the proxy process, stub upstream, raw client, real-client environment.
mod support;
/// https:// upstreams against stand-in TLS servers (Python's ssl, certificates by the openssl command):
/// streaming, keep-alive reuse, every TLS failure answered within its bound. Unix only (python3, bash).
#[cfg(unix)]
mod tls;
/// The tool policy (allow/deny, identity parameters hidden and learned), against the real agentchattr.
#[cfg(unix)]
mod tool_policy;
/// Failing upstreams: refused, silent, garbage, interim-only, truncated, idle past the timeout.
mod upstream_failures;
