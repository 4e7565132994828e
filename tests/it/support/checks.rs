//! Checks for the real-client suites: every failed expectation is collected,
//! then one panic reports all of them with the evidence (client output,
//! proxy and server logs), so one run shows everything that went wrong.

use serde_json::Value;

#[derive(Default)]
pub struct Checks {
    pub failures: Vec<String>,
}

impl Checks {
    pub fn check(&mut self, ok: bool, msg: impl Into<String>) {
        if !ok {
            self.failures.push(msg.into());
        }
    }

    pub fn eq(&mut self, what: &str, actual: &Value, expected: &Value) {
        if actual != expected {
            self.failures.push(format!("{what}: got {actual}, want {expected}"));
        }
    }

    #[track_caller]
    pub fn finish(self, test: &str, evidence: &[(&str, String)]) {
        if self.failures.is_empty() {
            return;
        }
        let mut msg = format!("{test}: {} failed expectation(s):\n", self.failures.len());
        for f in &self.failures {
            msg.push_str(&format!("  - {f}\n"));
        }
        for (name, text) in evidence {
            msg.push_str(&format!("--- {name} ---\n{}\n", tail(text, 12_000)));
        }
        panic!("{msg}");
    }
}

fn tail(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// A step-driven client script's record of its step `kind:label` (Null if it never got there).
pub fn step<'a>(out: &'a Value, kind: &str, label: &str) -> &'a Value {
    out["steps"]
        .as_array()
        .and_then(|steps| steps.iter().find(|s| s["step"] == kind && s["label"] == label))
        .unwrap_or(&Value::Null)
}

/// A client script's record of every HTTP exchange.
pub fn http(out: &Value) -> Vec<Value> {
    out["http"].as_array().cloned().unwrap_or_default()
}
