//! Test-only helpers shared by every suite.

/// `Agentchattr` (the real server, unpacked from the snapshot) and `Wrapper` (its wrapper.py with the drop-in).
#[cfg(unix)]
pub mod agentchattr;
/// `Checks`: failed expectations collected, then one panic with the evidence (the real-client suites).
#[cfg(unix)]
pub mod checks;
/// One exchange on a new connection, the usual POST, the healthy-request and error-shape checks.
pub mod exchange;
/// Real agent CLIs making one turn: their environment and process group, the network trap, the landing checks.
#[cfg(unix)]
pub mod hosts;
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
/// `StdioProxy`: the binary with `--stdio`, its stdin written and its stdout read line by line and checked.
pub mod stdio_proxy;
/// Both ends of the raw HTTP/1.1 wire: `StubUpstream`, `RawClient` and their strict head parser.
pub mod wire;

/// `cases! { scenario; name => args; ... }`: one `#[test] fn name()` per line, each running
/// `scenario(stringify!(name), args)`, so a scenario written once runs for each SDK, transport or
/// route under a test name of its own (the name is also the scenario's label in its evidence).
///
/// ```ignore
/// cases! { session_survives_an_upstream_restart;
///     python_sdk_1x_session_survives_an_upstream_restart => Sdk::Py1;
///     typescript_sdk_session_survives_an_upstream_restart => Sdk::Ts;
/// }
/// ```
// Its users are the real-client suites, all Unix-only today.
#[cfg_attr(not(unix), allow(unused_macros))]
macro_rules! cases {
    ($scenario:path; $($name:ident => $($arg:expr),+;)+) => {$(
        #[test]
        fn $name() {
            $scenario(stringify!($name), $($arg),+);
        }
    )+};
}
#[cfg_attr(not(unix), allow(unused_imports))]
pub(crate) use cases;
