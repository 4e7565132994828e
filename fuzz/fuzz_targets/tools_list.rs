//! Defends the tools/list rewriter and the relay's filter around it: no panic on any answer; the filter of a JSON body split anywhere sends the rewriter's output (or the error with the id when it cannot be rewritten and the policy hides something); the edits are sorted and in range and every byte between them is kept; rewriting the output again (with the learned stamps in the map) changes nothing; where serde_json reads the input it reads the output, which equals the input with exactly the policy's parts removed (a serde_json twin of the rules), holds no hidden tool and no stamped tool's identity property, and the learned stamps are the twin's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::mcp::initialize::Format;
use mcp_identity_proxy::mcp::json::parse_value;
use mcp_identity_proxy::mcp::stamp::{StampMap, MAX_LEARNED_NAME};
use mcp_identity_proxy::mcp::tools::{
    rewrite_list, Learned, ListError, ListFilter, ListOptions, Policy, ToolFlags,
};
use serde_json::Value as J;

fn policy(allow: Option<&[&str]>, deny: &[&str], show: bool, params: &[&str]) -> Policy {
    let strings = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    Policy::from_flags(&ToolFlags {
        allow: allow.map(strings),
        deny: strings(deny),
        show_identity_params: show,
        identity_params: strings(params),
    })
}

#[path = "../../src/mcp/tools/list_twin.rs"]
mod list_twin;
use list_twin::expected;

fuzz_target!(|data: &[u8]| {
    // First byte: policy, map, learn room and cache-scope insertion.
    let Some((&sel, message)) = data.split_first() else {
        return;
    };
    let policies = [
        policy(None, &["chat_rules", "chat_decision"], false, &["sender"]),
        policy(None, &[], false, &["sender", "agent"]),
        policy(None, &[], true, &["sender"]),
        policy(Some(&["chat_*", "?"]), &["chat_r??d"], false, &["sender"]),
    ];
    let p = &policies[usize::from(sel & 3)];
    let map = if sel & 4 == 0 { StampMap::agentchattr() } else { StampMap::empty() };
    let options = ListOptions { learn_room: usize::from(sel >> 3 & 3), insert_cache_scope: sel & 32 != 0 };

    let rewritten = rewrite_list(message, p, &map, options);

    // The relay's filter of a JSON body, split anywhere, sends what the
    // rewriter makes of it whole (or, when it cannot, the error with the
    // request's id: never the answer unfiltered while the policy hides).
    let enforce = !p.allows_all() || !p.show_identity_params();
    let cut = usize::from(sel >> 6) * message.len() / 3;
    let mut f = ListFilter::new(Format::Json, b"7", p, &map, options, enforce);
    let mut sent = Vec::new();
    f.feed(&message[..cut], &mut sent);
    f.feed(&message[cut..], &mut sent);
    f.finish(&mut sent);
    let outcome = f.take_outcome();
    // A batch (a JSON array) is filtered message by message, each response
    // in it as `rewrite_list` rewrites one (the unit tests hold each to it),
    // which `rewrite_list` itself refuses whole: here, whatever the filter
    // sends holds no tool the policy hides, in any response.
    let batch = message.iter().find(|b| !b" \t\r\n".contains(b)) == Some(&b'[');
    match &rewritten {
        _ if batch => {
            if let Ok(J::Array(items)) = serde_json::from_slice::<J>(&sent) {
                for m in items.iter().filter(|m| m.get("method").is_none()) {
                    let tools = m.get("result").and_then(|r| r.get("tools")).and_then(J::as_array);
                    for name in tools.into_iter().flatten().filter_map(|t| t.get("name").and_then(J::as_str))
                    {
                        assert!(!enforce || p.allows(name), "hidden tool {name:?} sent in a batch's answer");
                    }
                }
            }
        }
        Ok(edit) => assert_eq!(sent, edit.apply(message), "the filter sent other bytes than the rewriter's"),
        Err(_) if enforce => {
            assert!(outcome.refused, "an answer that cannot be rewritten was not refused");
            let v: J = serde_json::from_slice(&sent).expect("the refusal is JSON");
            assert_eq!(
                (v["id"].clone(), v["error"]["code"].clone()),
                (serde_json::json!(7), serde_json::json!(-32603))
            );
        }
        Err(_) => assert_eq!(sent, message, "nothing hidden: an answer that cannot be read passes"),
    }
    // The rewriter validates in its walk: it must agree with parse_value
    // (an answer both malformed and ambiguous may be refused as either).
    match (&rewritten, parse_value(message).is_ok()) {
        (Err(ListError::Parse { .. } | ListError::TooDeep { .. }), true) => {
            panic!("JSON refused as not JSON")
        }
        (Ok(_), false) => panic!("not JSON accepted"),
        _ => {}
    }
    let Ok(edit) = rewritten else {
        return;
    };
    let out = edit.apply(message);
    assert_eq!(out.len(), edit.new_len(message.len()));

    // Edits are sorted, in range, and everything between them is kept.
    let mut at = 0;
    let mut o = 0;
    for e in edit.edits() {
        assert!(at <= e.start && e.start <= e.end && e.end <= message.len());
        let keep = &message[at..e.start];
        assert_eq!(&out[o..o + keep.len()], keep);
        o += keep.len() + e.insert.len();
        at = e.end;
    }
    assert_eq!(&out[o..], &message[at..]);

    // Idempotent, with the learned stamps in the map.
    let mut learned_map = map.clone();
    for l in edit.learned() {
        assert!(learned_map.learn(&l.tool, &l.param), "{l:?} learned twice or over the map");
    }
    let again = rewrite_list(&out, p, &learned_map, ListOptions { learn_room: 0, ..options })
        .expect("a rewritten list rewrites again");
    assert!(again.is_unchanged(), "rewriting the output changed it");

    let Ok(input) = serde_json::from_slice::<J>(message) else {
        return;
    };
    let got: J = serde_json::from_slice(&out).expect("rewritten list parses");
    let (want, learned) = expected(&input, p, &map, options);
    assert_eq!(got, want, "output differs from the input minus the named parts");
    assert_eq!(edit.learned(), &learned[..]);
    // No hidden tool, no stamped identity property.
    let Some(tools) = got.get("result").map(|r| r["tools"].as_array().expect("tools")) else {
        return;
    };
    for t in tools {
        let name = t["name"].as_str().expect("name");
        assert!(p.allows(name), "hidden tool listed");
        let Some(param) = learned_map.param_for(name.as_bytes()) else {
            continue;
        };
        if p.show_identity_params() {
            continue;
        }
        let schema = &t["inputSchema"];
        assert!(
            schema["properties"].as_object().is_none_or(|o| !o.contains_key(param)),
            "identity property left"
        );
        let req = schema["required"].as_array();
        assert!(
            req.is_none_or(|r| !r.iter().any(|e| e.as_str() == Some(param))),
            "identity parameter required"
        );
    }
});
