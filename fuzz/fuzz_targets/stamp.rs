//! Defends the stamper: no panic on any body or agent; a stamped body that serde_json could read still parses, and every stamped call carries exactly the agent; stamping is idempotent; bytes outside the splices are untouched.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::stamp::{plan, StampMap};
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    // First byte: agent length; then the agent (lossy UTF-8), then the body.
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = usize::from(n % 32).min(rest.len());
    let (agent, body) = rest.split_at(n);
    let agent = String::from_utf8_lossy(agent);
    let map = StampMap::agentchattr();
    let Ok(p) = plan(body, &agent, &map) else {
        return;
    };
    let out = p.apply(body);
    assert_eq!(out.len(), p.new_len(body.len()));

    // Splices are sorted, in range, and everything between them is kept.
    let mut at = 0;
    let mut o = 0;
    for s in p.splices() {
        assert!(at <= s.start && s.start <= s.end && s.end <= body.len());
        let keep = &body[at..s.start];
        assert_eq!(&out[o..o + keep.len()], keep);
        o += keep.len() + s.insert.len();
        at = s.end;
    }
    assert_eq!(&out[o..], &body[at..]);

    // Idempotent: stamping the stamped body changes nothing.
    let again = plan(&out, &agent, &map).expect("a stamped body stamps again");
    assert_eq!(again.apply(&out), out);
    assert_eq!(again.splices().len(), p.splices().len());

    // Where serde_json reads the input, it reads the output, and each
    // stamped call's identity is the agent.
    if serde_json::from_slice::<Value>(body).is_ok() {
        let v: Value = serde_json::from_slice(&out).expect("stamped body parses");
        let messages = match &v {
            Value::Array(items) => items.iter().collect(),
            other => vec![other],
        };
        let mut stamped = 0;
        for m in messages {
            if m.get("method").and_then(Value::as_str) != Some("tools/call") {
                continue;
            }
            let Some(tool) = m["params"].get("name").and_then(Value::as_str) else {
                continue;
            };
            let Some(key) = map.param_for(tool.as_bytes()) else {
                continue;
            };
            assert_eq!(m["params"]["arguments"][key].as_str(), Some(&*agent));
            stamped += 1;
        }
        assert_eq!(stamped, p.splices().len());
    }
});
