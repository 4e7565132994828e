//! The property of everything the proxy sends upstream, checked by the
//! generated unit test in `editor.rs` and by the `upstream_request` fuzz
//! target (which includes this file): serde_json and httparse are the
//! independent readers, so the check does not trust the proxy's own
//! scanner or writer. Test and fuzz builds only.

use serde_json::Value;

/// The identity the upstream must see, and the stamp map as a lookup.
pub struct Expect<'a> {
    pub agent: &'a str,
    pub bearer: &'a str,
    pub token: &'a str,
    pub param_for: &'a dyn Fn(&str) -> Option<&'static str>,
}

/// `client_body` is the body the client framed (de-chunked); `upstream` is
/// the whole request the proxy would write. Panics when the property fails:
/// - the head parses, names each field once, carries exactly the agent's
///   credentials, no Transfer-Encoding, and a Content-Length that frames
///   exactly the bytes after it;
/// - every message that serde_json reads as a `tools/call` of a mapped tool
///   carries exactly the agent's name in its identity argument;
/// - nothing else changed: the client's body with only those arguments set
///   to the agent reads the same (an empty body stays empty).
pub fn check(client_body: &[u8], upstream: &[u8], want: &Expect) {
    let mut fields = [httparse::EMPTY_HEADER; 128];
    let mut req = httparse::Request::new(&mut fields);
    let head_len = match req.parse(upstream) {
        Ok(httparse::Status::Complete(n)) => n,
        other => panic!("upstream head does not parse: {other:?}"),
    };
    let body = &upstream[head_len..];
    let mut names: Vec<String> = Vec::new();
    let mut length = None;
    for f in req.headers.iter() {
        let name = f.name.to_ascii_lowercase();
        assert!(!names.contains(&name), "field {name} written twice");
        match name.as_str() {
            "authorization" => assert_eq!(f.value, want.bearer.as_bytes(), "authorization"),
            "x-agent-token" => assert_eq!(f.value, want.token.as_bytes(), "x-agent-token"),
            "transfer-encoding" => panic!("transfer-encoding written upstream"),
            "content-length" => {
                length = std::str::from_utf8(f.value).ok().and_then(|v| v.parse::<usize>().ok())
            }
            _ => {}
        }
        names.push(name);
    }
    assert!(names.iter().any(|n| n == "authorization"), "no authorization upstream");
    assert!(names.iter().any(|n| n == "x-agent-token"), "no x-agent-token upstream");
    match length {
        Some(n) => assert_eq!(n, body.len(), "content-length does not frame the body"),
        None => assert!(body.is_empty(), "a body without content-length"),
    }
    if client_body.is_empty() {
        assert!(body.is_empty(), "an empty body grew");
        return;
    }
    let Ok(sent) = serde_json::from_slice::<Value>(body) else {
        // Not JSON to serde_json (e.g. NaN, which the upstream's Python may
        // read): the client's body must not have been JSON to it either.
        assert!(serde_json::from_slice::<Value>(client_body).is_err(), "stamping broke a JSON body");
        return;
    };
    for m in messages(&sent) {
        if let Some(key) = mapped(m, want) {
            let got = m["params"]["arguments"].get(key);
            assert_eq!(got.and_then(Value::as_str), Some(want.agent), "tools/call {key} not stamped");
        }
    }
    let mut expected: Value = match serde_json::from_slice(client_body) {
        Ok(v) => v,
        Err(e) => panic!("upstream body is JSON but the client's was not ({e})"),
    };
    let stamp = |m: &mut Value| {
        if let Some(key) = mapped(m, want) {
            let args = &mut m["params"]["arguments"];
            if !args.is_object() {
                *args = Value::Object(Default::default());
            }
            args[key] = Value::String(want.agent.to_string());
        }
    };
    match &mut expected {
        Value::Array(items) => items.iter_mut().for_each(stamp),
        other => stamp(other),
    }
    assert_eq!(sent, expected, "something besides the identity argument changed");
}

fn messages(v: &Value) -> Vec<&Value> {
    match v {
        Value::Array(items) => items.iter().collect(),
        other => vec![other],
    }
}

/// The identity key when `m` is a `tools/call` of a mapped tool.
fn mapped(m: &Value, want: &Expect) -> Option<&'static str> {
    if m.get("method").and_then(Value::as_str) != Some("tools/call") {
        return None;
    }
    let tool = m.get("params")?.get("name")?.as_str()?;
    (want.param_for)(tool)
}
