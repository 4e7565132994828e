//! Defends identity parsing: no panic on any file or control line, and an accepted identity round-trips through a re-serialised object to the same agent and token.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::identity::{self, parse};
use mcp_identity_proxy::mcp::json::write_json_string;

fuzz_target!(|data: &[u8]| {
    let Ok(id) = parse(data) else {
        return;
    };
    assert!(identity::validate_agent(&id.agent).is_ok());
    assert!(identity::validate_token(&id.token).is_ok());
    let debug = format!("{id:?}");
    let redacted = format!(
        "Identity {{ agent: {:?}, token: \"<redacted>\" }}",
        id.agent
    );
    assert_eq!(debug, redacted, "Debug must not show the token");
    let mut text = b"{\"token\":".to_vec();
    write_json_string(&id.token, &mut text);
    text.extend_from_slice(b",\"agent\":");
    write_json_string(&id.agent, &mut text);
    text.extend_from_slice(b"}\n");
    assert_eq!(parse(&text).expect("re-serialised identity parses"), id);
});
