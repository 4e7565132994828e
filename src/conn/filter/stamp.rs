//! Identity stamping, at the request: once the body is whole, the agent's
//! name goes into its `tools/call` arguments and the agent's credentials
//! into the head, with the identity in force now (`editor::plan_request`,
//! over `mcp::stamp`'s scan). Its per-exchange state is `Exchange::plan`,
//! the splices the relay sends between the body's pieces; a reopen's replay
//! and a batch's rest are planned again here.

use crate::conn::exchange::Exchange;
use crate::conn::{editor, Ctx};
use crate::http::framing::Framing;
use crate::mcp::stamp::StampError;

impl Exchange {
    /// Scans and stamps the body with the identity in force now and writes
    /// the upstream head (`editor::plan_request`).
    pub(in crate::conn) fn plan_upstream(&mut self, ctx: &Ctx) -> Result<(), StampError> {
        let ex = self;
        let req = editor::Outgoing {
            method: &ex.req.method,
            target: &ex.req.target,
            // The client delimited a body (Content-Length or chunked).
            framed: ex.req.framing != Framing::None,
        };
        let (who, route) = (ctx.credentials(), ctx.route());
        ex.recovery.token_generation = ctx.token_generation;
        editor::plan_request(
            &req,
            &mut ex.req.headers,
            &ex.body,
            &who,
            &route,
            &mut ex.head_out,
            &mut ex.plan,
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::conn::filter::Fixture;
    use crate::mcp::stamp::StampError;

    /// The body as it goes upstream, and the head.
    fn planned(f: &Fixture, body: &[u8]) -> Result<(String, String), StampError> {
        let mut ex = Fixture::post("/mcp", body);
        ex.plan_upstream(&f.ctx())?;
        let sent: Vec<u8> = ex.plan.parts(&ex.body).flatten().copied().collect();
        Ok((String::from_utf8(sent).unwrap(), String::from_utf8(ex.head_out.clone()).unwrap()))
    }

    #[test]
    fn a_call_goes_upstream_under_the_agents_name_and_credentials_whoever_it_claims_to_be() {
        let f = Fixture::new(&[]);
        for claimed in [r#","sender":"mallory""#, "", r#","sender":"claude""#, r#","sender":null"#] {
            let body = format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"chat_send","arguments":{{"message":"hi"{claimed}}}}}}}"#
            );
            let (sent, head) = planned(&f, body.as_bytes()).unwrap();
            let v: serde_json::Value = serde_json::from_str(&sent).unwrap();
            assert_eq!(v["params"]["arguments"]["sender"], "claude", "{sent}");
            assert_eq!(v["params"]["arguments"]["message"], "hi", "{sent}");
            assert!(!sent.contains("mallory"), "{sent}");
            let head = head.to_ascii_lowercase();
            assert_eq!(head.matches("authorization: bearer tok-secret\r\n").count(), 1, "{head}");
            assert_eq!(head.matches("x-agent-token: tok-secret\r\n").count(), 1, "{head}");
            assert!(head.starts_with("post /mcp http/1.1\r\n"), "{head}");
            assert!(head.contains(&format!("content-length: {}\r\n", sent.len())), "{head}");
        }
        // A tool outside the map passes byte for byte.
        let other = br#"{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"x","arguments":{"sender":"m"}}}"#;
        assert_eq!(planned(&f, other).unwrap().0.as_bytes(), &other[..]);
    }

    #[test]
    fn a_body_the_stamp_cannot_read_for_sure_is_refused() {
        let f = Fixture::new(&[]);
        for body in [
            &br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_send","arguments":{"sender":"a","sender":"b"}}}"#[..],
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","method":"ping","params":{"name":"chat_send"}}"#,
            br#"{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"chat_send","arguments":[1]}}"#,
        ] {
            assert!(planned(&f, body).is_err(), "{}", String::from_utf8_lossy(body));
        }
    }

    /// The proxy's own answers read the request's ids from the plan: a
    /// plan is the body's own, never the last exchange's on the connection
    /// (a body not scanned yet, or refused, is parsed instead).
    #[test]
    fn the_ids_the_proxy_answers_are_this_bodys() {
        use crate::mcp::rpc;
        let f = Fixture::new(&[]);
        let first =
            br#"[{"jsonrpc":"2.0","id":1,"method":"ping"},{"jsonrpc":"2.0","id":"two","method":"ping"}]"#;
        let refused = br#"[{"jsonrpc":"2.0","id":7,"method":"tools/call","method":"x","params":{}}]"#;
        let next = br#"{"jsonrpc":"2.0","id":"third","method":"ping"}"#;
        let mut ex = Fixture::post("/mcp", first);
        ex.plan_upstream(&f.ctx()).unwrap();
        assert_eq!(ex.request_body(), rpc::parse(first).ok());
        // The next exchange on the connection: its body read, not planned yet.
        ex.begin(std::time::Instant::now());
        ex.body = next.to_vec();
        assert_eq!(ex.request_body(), rpc::parse(next).ok());
        ex.plan_upstream(&f.ctx()).unwrap();
        assert_eq!(ex.request_body(), rpc::parse(next).ok());
        // A body the scan refuses leaves no plan behind.
        ex.begin(std::time::Instant::now());
        ex.body = refused.to_vec();
        assert!(ex.plan_upstream(&f.ctx()).is_err());
        assert_eq!(ex.request_body(), rpc::parse(refused).ok());
    }
}
