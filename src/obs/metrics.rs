//! The counters and gauges behind `GET /metrics`, in the Prometheus text
//! exposition format 0.0.4. Every counter is moved by the same record the
//! audit log writes (`Metrics::count`), so the two always agree. Label
//! values the client chooses (method and tool names) are bounded: past
//! `MAX_LABELS` distinct values the rest count under `other`.

use super::audit::{Outcome, Record};

/// Distinct method or tool label values kept per metric.
pub const MAX_LABELS: usize = 64;

/// Why the upstream failed a request (`mcp_proxy_upstream_failures_total`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    ConnectRefused,
    ConnectTimeout,
    ResponseTimeout,
    BadAnswer,
    /// The TLS connection to the upstream failed.
    Tls,
    /// The forward proxy refused or failed the tunnel to the upstream.
    Proxy,
}

impl Failure {
    const ALL: [Failure; 6] = [
        Failure::ConnectRefused,
        Failure::ConnectTimeout,
        Failure::ResponseTimeout,
        Failure::BadAnswer,
        Failure::Tls,
        Failure::Proxy,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Failure::ConnectRefused => "connect_refused",
            Failure::ConnectTimeout => "connect_timeout",
            Failure::ResponseTimeout => "response_timeout",
            Failure::BadAnswer => "bad_answer",
            Failure::Tls => "tls",
            Failure::Proxy => "proxy",
        }
    }
}

/// The gauges, read from the loop when `/metrics` is asked for.
#[derive(Clone, Copy, Debug, Default)]
pub struct Gauges {
    pub sessions: usize,
    pub client_connections: usize,
    pub streams: usize,
}

/// Counts by a bounded label, then by outcome.
#[derive(Debug, Default)]
struct ByLabel {
    rows: Vec<(Box<str>, [u64; 5])>,
}

impl ByLabel {
    /// `label`: UTF-8 text as bytes (an audit `Text`'s).
    fn row(&mut self, label: &[u8]) -> &mut [u64; 5] {
        let at = match self.rows.iter().position(|(l, _)| l.as_bytes() == label) {
            Some(i) => i,
            None if self.rows.len() < MAX_LABELS || label == b"other" => {
                self.rows.push((String::from_utf8_lossy(label).into(), [0; 5]));
                self.rows.len() - 1
            }
            // Past the bound: the `other` row (made once).
            None => match self.rows.iter().position(|(l, _)| &**l == "other") {
                Some(i) => i,
                None => {
                    self.rows.push(("other".into(), [0; 5]));
                    self.rows.len() - 1
                }
            },
        };
        &mut self.rows[at].1
    }

    fn add(&mut self, label: &[u8], outcome: Outcome) {
        self.row(label)[outcome.index()] += 1;
    }
}

/// Every counter the proxy keeps.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: ByLabel,
    tool_calls: ByLabel,
    /// Per tool: only the first column is used.
    impersonations: ByLabel,
    refusals: Vec<(&'static str, u64)>,
    failures: [u64; 6],
    reinit: [u64; 2],
    /// Credential renewals, ok and failed; rendered once there was one.
    renewals: Option<[u64; 2]>,
    /// When the token in force expires (seconds since the epoch).
    credential_expiry: Option<u64>,
    bytes_in: u64,
    bytes_out: u64,
    dropped: u64,
}

impl Metrics {
    /// The counters `record` moves (the audit log writes the same record).
    pub fn count(&mut self, record: &Record) {
        match record {
            Record::Request(r) => {
                let outcome = r.outcome.unwrap_or(Outcome::Ok);
                self.requests.add(r.method.as_bytes(), outcome);
                if let Some(tool) = &r.tool {
                    self.tool_calls.add(tool.as_bytes(), outcome);
                    if r.claimed.is_some() {
                        self.impersonations.add(tool.as_bytes(), Outcome::Ok);
                    }
                }
                if let Some(why) = r.reason.filter(|_| r.by_proxy) {
                    match self.refusals.iter_mut().find(|(w, _)| *w == why) {
                        Some((_, n)) => *n += 1,
                        None => self.refusals.push((why, 1)),
                    }
                }
            }
            Record::SessionReinitialised { ok, .. } => self.reinit[usize::from(!ok)] += 1,
            Record::CredentialRenewed { expires_at, .. } => {
                self.renewals.get_or_insert([0; 2])[0] += 1;
                self.credential_expiry = *expires_at;
            }
            Record::CredentialFailed { .. } => self.renewals.get_or_insert([0; 2])[1] += 1,
            _ => {}
        }
    }

    pub fn upstream_failure(&mut self, kind: Failure) {
        let at = Failure::ALL.iter().position(|f| *f == kind).unwrap_or(0);
        self.failures[at] += 1;
    }

    /// Bytes read from clients (`in`) and written to them (`out`).
    pub fn bytes(&mut self, bytes_in: u64, bytes_out: u64) {
        self.bytes_in += bytes_in;
        self.bytes_out += bytes_out;
    }

    pub fn audit_dropped(&mut self, records: u64) {
        self.dropped += records;
    }

    /// The exposition: `# HELP` and `# TYPE` for each metric, then its
    /// samples.
    pub fn render(&self, g: Gauges, out: &mut String) {
        use std::fmt::Write;
        let head = |out: &mut String, name: &str, kind: &str, help: &str| {
            let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
        };
        head(
            out,
            "mcp_proxy_requests_total",
            "counter",
            "JSON-RPC requests relayed or answered, by method and outcome.",
        );
        by_label(out, "mcp_proxy_requests_total", "method", &self.requests, true);
        head(out, "mcp_proxy_tool_calls_total", "counter", "tools/call requests, by tool and outcome.");
        by_label(out, "mcp_proxy_tool_calls_total", "tool", &self.tool_calls, true);
        head(
            out,
            "mcp_proxy_impersonation_attempts_total",
            "counter",
            "tools/call requests whose identity argument named someone else, by tool.",
        );
        by_label(out, "mcp_proxy_impersonation_attempts_total", "tool", &self.impersonations, false);
        head(out, "mcp_proxy_refusals_total", "counter", "Requests the proxy answered itself, by reason.");
        for (why, n) in &self.refusals {
            let _ = writeln!(out, "mcp_proxy_refusals_total{{reason=\"{why}\"}} {n}");
        }
        head(out, "mcp_proxy_upstream_failures_total", "counter", "Requests the upstream failed, by kind.");
        for (kind, n) in Failure::ALL.iter().zip(self.failures) {
            let _ = writeln!(out, "mcp_proxy_upstream_failures_total{{kind=\"{}\"}} {n}", kind.as_str());
        }
        head(
            out,
            "mcp_proxy_session_reinitialisations_total",
            "counter",
            "Recorded sessions re-initialised after an upstream restart, by result.",
        );
        for (result, n) in ["ok", "failed"].iter().zip(self.reinit) {
            let _ = writeln!(out, "mcp_proxy_session_reinitialisations_total{{result=\"{result}\"}} {n}");
        }
        if let Some(renewals) = self.renewals {
            head(
                out,
                "mcp_proxy_credential_renewals_total",
                "counter",
                "Tokens obtained from the credential source (at start, before expiry, after a 401), by result.",
            );
            for (result, n) in ["ok", "failed"].iter().zip(renewals) {
                let _ = writeln!(out, "mcp_proxy_credential_renewals_total{{result=\"{result}\"}} {n}");
            }
        }
        if let Some(at) = self.credential_expiry {
            head(
                out,
                "mcp_proxy_credential_expiry_seconds",
                "gauge",
                "When the token in force expires, in seconds since the epoch.",
            );
            let _ = writeln!(out, "mcp_proxy_credential_expiry_seconds {at}");
        }
        head(out, "mcp_proxy_sessions", "gauge", "MCP sessions recorded for re-initialisation.");
        let _ = writeln!(out, "mcp_proxy_sessions {}", g.sessions);
        head(out, "mcp_proxy_client_connections", "gauge", "Open client connections.");
        let _ = writeln!(out, "mcp_proxy_client_connections {}", g.client_connections);
        head(out, "mcp_proxy_streams", "gauge", "Event streams being relayed.");
        let _ = writeln!(out, "mcp_proxy_streams {}", g.streams);
        head(
            out,
            "mcp_proxy_bytes_total",
            "counter",
            "Bytes read from clients (in) and written to them (out).",
        );
        let _ = writeln!(out, "mcp_proxy_bytes_total{{direction=\"in\"}} {}", self.bytes_in);
        let _ = writeln!(out, "mcp_proxy_bytes_total{{direction=\"out\"}} {}", self.bytes_out);
        head(
            out,
            "mcp_proxy_audit_records_dropped_total",
            "counter",
            "Audit records that could not be written.",
        );
        let _ = writeln!(out, "mcp_proxy_audit_records_dropped_total {}", self.dropped);
    }
}

fn by_label(out: &mut String, name: &str, label: &str, rows: &ByLabel, outcomes: bool) {
    use std::fmt::Write;
    for (value, counts) in &rows.rows {
        let value = escape(value);
        if !outcomes {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\"}} {}", counts[0]);
            continue;
        }
        for (o, n) in Outcome::ALL.iter().zip(counts).filter(|(_, n)| **n > 0) {
            let _ = writeln!(out, "{name}{{{label}=\"{value}\",outcome=\"{}\"}} {n}", o.as_str());
        }
    }
}

/// A label value as the text format writes it: `\`, `"` and line feed escaped.
fn escape(value: &str) -> String {
    let mut s = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::obs::audit::Request;

    fn call(tool: &str, outcome: Outcome, claimed: bool) -> Record {
        Record::Request(Request {
            method: "tools/call".into(),
            tool: Some(tool.into()),
            outcome: Some(outcome),
            claimed: claimed.then(|| "bob".into()),
            ..Request::default()
        })
    }

    #[test]
    fn counters_follow_the_records_and_labels_are_bounded_and_escaped() {
        let mut m = Metrics::default();
        m.count(&call("chat_send", Outcome::Ok, true));
        m.count(&call("chat_send", Outcome::ToolError, false));
        m.count(&call("we\"ird\\\n", Outcome::Ok, false));
        for i in 0..MAX_LABELS + 10 {
            m.count(&call(&format!("t{i}"), Outcome::Error, false));
        }
        m.count(&Record::Request(Request {
            method: "tools/call".into(),
            tool: Some("hidden".into()),
            outcome: Some(Outcome::Refused),
            by_proxy: true,
            reason: Some("hidden_tool"),
            ..Request::default()
        }));
        m.count(&Record::SessionReinitialised { session: b"s".as_slice().into(), ok: true });
        m.upstream_failure(Failure::ConnectTimeout);
        m.upstream_failure(Failure::Proxy);
        m.bytes(10, 20);
        let mut text = String::new();
        m.render(Gauges { sessions: 2, client_connections: 3, streams: 1 }, &mut text);
        for want in [
            "mcp_proxy_tool_calls_total{tool=\"chat_send\",outcome=\"ok\"} 1\n",
            "mcp_proxy_tool_calls_total{tool=\"chat_send\",outcome=\"tool_error\"} 1\n",
            "mcp_proxy_tool_calls_total{tool=\"we\\\"ird\\\\\\n\",outcome=\"ok\"} 1\n",
            "mcp_proxy_tool_calls_total{tool=\"other\",outcome=\"error\"} 12\n",
            "mcp_proxy_tool_calls_total{tool=\"other\",outcome=\"refused\"} 1\n",
            "mcp_proxy_requests_total{method=\"tools/call\",outcome=\"error\"} 74\n",
            "mcp_proxy_impersonation_attempts_total{tool=\"chat_send\"} 1\n",
            "mcp_proxy_refusals_total{reason=\"hidden_tool\"} 1\n",
            "mcp_proxy_upstream_failures_total{kind=\"connect_timeout\"} 1\n",
            "mcp_proxy_upstream_failures_total{kind=\"proxy\"} 1\n",
            "mcp_proxy_session_reinitialisations_total{result=\"ok\"} 1\n",
            "mcp_proxy_sessions 2\n",
            "mcp_proxy_streams 1\n",
            "mcp_proxy_bytes_total{direction=\"out\"} 20\n",
            "# TYPE mcp_proxy_audit_records_dropped_total counter\n",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        let tools = text.lines().filter(|l| l.starts_with("mcp_proxy_tool_calls_total{")).count();
        assert!(tools <= MAX_LABELS * 5 + 5, "{tools}");
        // Every sample line is `name{labels} value` or `name value`.
        for l in text.lines().filter(|l| !l.starts_with('#')) {
            let value = l.rsplit(' ').next().unwrap();
            assert!(value.parse::<u64>().is_ok(), "{l}");
        }
    }
}
