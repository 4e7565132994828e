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

/// The rules on a serde_json tree: the tools the policy hides go, then each
/// kept stamped tool (map, or learned from this list) loses its parameter
/// from `inputSchema.properties` and `inputSchema.required` (dropped when
/// left empty); `cacheScope` becomes "private" when anything went.
fn expected(input: &J, p: &Policy, map: &StampMap, options: ListOptions) -> (J, Vec<Learned>) {
    let mut v = input.clone();
    let mut learned: Vec<Learned> = Vec::new();
    let Some(result) = v.get_mut("result") else {
        return (v, learned);
    };
    let tools = result["tools"].as_array().expect("accepted: tools is an array").clone();
    let name_of = |t: &J| t["name"].as_str().expect("accepted: names are strings").to_owned();
    for t in &tools {
        if options.learn_room == 0 {
            break;
        }
        let name = name_of(t);
        if name.len() > MAX_LEARNED_NAME
            || map.param_for(name.as_bytes()).is_some()
            || learned.iter().any(|l| l.tool == name)
        {
            continue;
        }
        let Some(props) = t.get("inputSchema").and_then(|s| s.get("properties")).and_then(J::as_object)
        else {
            continue;
        };
        let param = p.identity_params().iter().find(|param| {
            props.get(param.as_str()).is_some_and(|s| s.get("type").and_then(J::as_str) == Some("string"))
        });
        if let (Some(param), true) = (param, learned.len() < options.learn_room) {
            learned.push(Learned { tool: name, param: param.clone() });
        }
    }
    let mut removed = false;
    let mut kept = Vec::new();
    for mut t in tools {
        let name = name_of(&t);
        if !p.allows(&name) {
            removed = true;
            continue;
        }
        let param = map
            .param_for(name.as_bytes())
            .map(str::to_owned)
            .or_else(|| learned.iter().find(|l| l.tool == name).map(|l| l.param.clone()));
        if let (Some(param), false) = (param, p.show_identity_params()) {
            if let Some(schema) = t.get_mut("inputSchema").and_then(J::as_object_mut) {
                if let Some(props) = schema.get_mut("properties").and_then(J::as_object_mut) {
                    removed |= props.remove(&param).is_some();
                }
                if let Some(req) = schema.get_mut("required").and_then(J::as_array_mut) {
                    let before = req.len();
                    req.retain(|e| e.as_str() != Some(&param));
                    if req.len() != before {
                        removed = true;
                        if req.is_empty() {
                            schema.remove("required");
                        }
                    }
                }
            }
        }
        kept.push(t);
    }
    result["tools"] = J::Array(kept);
    if removed {
        let r = result.as_object_mut().expect("accepted: result is an object");
        if r.contains_key("cacheScope") || options.insert_cache_scope {
            r.insert("cacheScope".into(), J::from("private"));
        }
    }
    (v, learned)
}

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
    match &rewritten {
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
