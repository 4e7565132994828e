//! Defends the proxy's one promise over the whole request path: whatever the head (method, path, Content-Type, framing) and body, every request that would go upstream carries exactly the agent's credentials, every tools/call of a mapped tool in its body carries exactly the agent's name, and nothing else in the body changed (serde_json and httparse are the independent readers).
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::conn::editor::{forward_whole, Credentials, Forwarded, Route};
use mcp_identity_proxy::mcp::stamp::StampMap;

#[path = "../../src/conn/upstream_invariant.rs"]
mod upstream_invariant;

fn param_for(tool: &str) -> Option<&'static str> {
    match tool {
        "chat_join" => Some("name"),
        "chat_send" | "chat_read" | "chat_resync" | "chat_decision" | "chat_set_hat" | "chat_claim"
        | "chat_rules" | "chat_summary" | "chat_propose_job" => Some("sender"),
        _ => None,
    }
}

fuzz_target!(|data: &[u8]| {
    // First byte: agent length; then the agent (lossy UTF-8, control
    // characters dropped as the proxy's validation would), then the request.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 16).min(rest.len());
    let (agent, raw) = rest.split_at(n);
    let agent: String = String::from_utf8_lossy(agent).chars().filter(|c| !c.is_control()).collect();
    if agent.is_empty() {
        return;
    }
    let stamps = StampMap::agentchattr();
    let who = Credentials { agent: &agent, bearer: b"Bearer tok-fuzz", token: b"tok-fuzz", dpop: None };
    let route = Route { authority: b"127.0.0.1:8200", stamps: &stamps };
    if let Forwarded::Upstream { bytes, body } = forward_whole(raw, &who, &route) {
        let want = upstream_invariant::Expect {
            agent: &agent,
            bearer: "Bearer tok-fuzz",
            token: "tok-fuzz",
            param_for: &param_for,
        };
        upstream_invariant::check(&body, &bytes, &want);
    }
});
