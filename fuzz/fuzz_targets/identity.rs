//! Defends identity parsing: no panic on any file or control line, and an accepted identity round-trips through a re-serialised object to the same agent, token and tool lists; its Debug never shows the token.
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
    let mut redacted = format!("Identity {{ agent: {:?}, token: \"<redacted>\"", id.agent);
    if let Some(allow) = &id.allow_tools {
        redacted.push_str(&format!(", allow_tools: {allow:?}"));
    }
    if let Some(deny) = &id.deny_tools {
        redacted.push_str(&format!(", deny_tools: {deny:?}"));
    }
    redacted.push_str(" }");
    assert_eq!(debug, redacted, "Debug must not show the token");
    let mut text = b"{\"token\":".to_vec();
    write_json_string(&id.token, &mut text);
    text.extend_from_slice(b",\"agent\":");
    write_json_string(&id.agent, &mut text);
    for (key, list) in [("allow_tools", &id.allow_tools), ("deny_tools", &id.deny_tools)] {
        let Some(list) = list else {
            continue;
        };
        text.extend_from_slice(format!(",\"{key}\":[").as_bytes());
        for (i, glob) in list.iter().enumerate() {
            if i > 0 {
                text.push(b',');
            }
            write_json_string(glob, &mut text);
        }
        text.push(b']');
    }
    text.extend_from_slice(b"}\n");
    assert_eq!(parse(&text).expect("re-serialised identity parses"), id);
});
