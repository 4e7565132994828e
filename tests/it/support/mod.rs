//! Test-only helpers shared by every suite.

/// `Agentchattr` (the real server, unpacked from the snapshot) and `Wrapper` (its wrapper.py with the drop-in).
#[cfg(unix)]
pub mod agentchattr;
/// `Checks`: failed expectations collected, then one panic with the evidence (the real-client suites).
#[cfg(unix)]
pub mod checks;
/// One exchange on a new connection, the usual POST, the healthy-request and error-shape checks.
pub mod exchange;
/// `/proc` readers: CPU time, RSS and open descriptors of a process. Linux only.
#[cfg(target_os = "linux")]
pub mod procfs;
/// `ProxyProcess`: the proxy binary as a child process; scratch files.
pub mod proxy_process;
/// `FastMcp` and the real MCP clients, installed on first use.
#[cfg(unix)]
pub mod realenv;
/// `RestartingUpstream`: an upstream that dies (listener closed, connections cut) and comes back on its port.
pub mod restarting;
/// The proxy in front of a `StubUpstream` with one token and agent, as the behaviour suites start it.
pub mod setup;
/// Both ends of the raw HTTP/1.1 wire: `StubUpstream`, `RawClient` and their strict head parser.
pub mod wire;
