//! The rules of `rewrite_list` on a serde_json tree: the naive twin that
//! `list.rs`'s tests and the `tools_list` fuzz target hold the rewriter to.
//! Test and fuzz builds only (the fuzz target includes this file; its
//! parent names `Learned`, `ListOptions`, `Policy`, `StampMap` and
//! `MAX_LEARNED_NAME`).

use super::{Learned, ListOptions, Policy, StampMap, MAX_LEARNED_NAME};
use serde_json::Value as J;

/// The rules on a serde_json tree: the tools the policy hides go, then each
/// kept stamped tool (map, or learned from this list) loses its parameter
/// from `inputSchema.properties` and `inputSchema.required` (dropped when
/// left empty); `cacheScope` becomes "private" when anything went.
pub fn expected(input: &J, p: &Policy, map: &StampMap, options: ListOptions) -> (J, Vec<Learned>) {
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
