//! The features an exchange calls at its fixed points, each a type in a
//! file of its own that owns its per-exchange state (one field of
//! `Exchange`) and returns what the core carries out:
//!
//! - `stamp`: identity stamping (`Exchange::plan`), at the request;
//! - `policy`: the tool policy (`PolicyState`): a hidden tool's call
//!   refused (`Refusal`), at the request; a `tools/list` answer filtered
//!   and a batch's answer completed, stages of the response's rewrite;
//! - `session`: session bookkeeping (`SessionState`): ids mapped at the
//!   request and the response head, a session recorded or forgotten, an
//!   `initialize` answer's version read as it is relayed;
//! - `audit`: the audit log's and the metrics' records (`AuditState`), at
//!   the request, the response body (the answer reader) and the end;
//! - `credential`: what an answer's head asks of the credential source (a
//!   DPoP nonce, more scope), read at the response head for the 401 road.
//!
//! ARCHITECTURE.md ("Filters at fixed points") has the table of which
//! feature sits at which point.

pub(super) mod audit;
pub(super) mod credential;
pub(super) mod policy;
pub(super) mod session;
mod stamp;

pub(super) use audit::AuditState;
pub(super) use policy::PolicyState;
pub(super) use session::SessionState;

/// What a filter's unit test hands it for a `Ctx`: the tables and the
/// configuration of a proxy for agent `claude` (token `tok-secret`) in
/// front of `http://127.0.0.1:9/mcp`, with `args` added; no socket.
#[cfg(test)]
pub(super) struct Fixture {
    pub(super) config: crate::config::Config,
    pub(super) policy: crate::mcp::tools::Policy,
    pub(super) sessions: std::cell::RefCell<crate::mcp::session::SessionTable>,
    pub(super) legacy: std::cell::RefCell<crate::mcp::legacy::Routes>,
    response_head: std::cell::RefCell<crate::http::head::ResponseHead>,
    learned: std::cell::RefCell<Vec<crate::mcp::tools::Learned>>,
    obs: std::cell::RefCell<crate::obs::Observer>,
    connect_failed: std::cell::Cell<bool>,
    unauthorized: std::cell::Cell<bool>,
    dpop_nonce: std::cell::RefCell<Option<Vec<u8>>>,
}

#[cfg(test)]
impl Fixture {
    pub(super) fn new(args: &[&str]) -> Fixture {
        let base = ["--upstream", "http://127.0.0.1:9/mcp", "--agent", "claude"];
        let argv = base.iter().chain(args).map(|a| a.to_string());
        let config = crate::config::parse(argv, Some("tok-secret".into())).expect("test flags parse");
        Fixture {
            policy: crate::mcp::tools::Policy::from_flags(&config.tools),
            config,
            sessions: Default::default(),
            legacy: Default::default(),
            response_head: Default::default(),
            learned: Default::default(),
            obs: Default::default(),
            connect_failed: Default::default(),
            unauthorized: Default::default(),
            dpop_nonce: Default::default(),
        }
    }

    pub(super) fn ctx(&self) -> super::Ctx<'_> {
        super::Ctx {
            config: &self.config,
            bearer: b"Bearer tok-secret",
            token: b"tok-secret",
            dpop: None,
            dpop_nonce: &self.dpop_nonce,
            step_up: None,
            agent: "claude",
            now: std::time::Instant::now(),
            listen_port: 8200,
            shutting_down: false,
            sessions: &self.sessions,
            response_head: &self.response_head,
            policy: &self.policy,
            stamps: &self.config.stamps,
            learned: &self.learned,
            observing: false,
            obs: &self.obs,
            legacy: &self.legacy,
            connect_failed: &self.connect_failed,
            unauthorized: &self.unauthorized,
            renewable: false,
            token_generation: 0,
            token_expired: false,
            record_time: std::cell::Cell::new(None),
        }
    }

    /// A POST exchange to `target` carrying `body`, whole.
    pub(super) fn post(target: &str, body: &[u8]) -> super::exchange::Exchange {
        let mut ex = super::exchange::Exchange::default();
        ex.req.method = smallvec::SmallVec::from_slice(b"POST");
        ex.req.target = smallvec::SmallVec::from_slice(target.as_bytes());
        ex.req.framing = crate::http::framing::Framing::Length(body.len() as u64);
        ex.body = body.to_vec();
        ex.body_read = true;
        ex
    }
}
