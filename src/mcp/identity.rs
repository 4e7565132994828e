//! The agent's identity (name + bearer token) and its parsing from the
//! identity file or a `--control-stdin` line: `{"agent": "...", "token":
//! "..."}`. Pure: no I/O. The token is never printed, not even by `Debug`
//! or in an error.

use std::fmt;

use crate::mcp::json::{self, Kind, ScanError, Value};

pub use crate::limits::{MAX_AGENT_LEN, MAX_TOKEN_LEN};

#[derive(Clone, PartialEq, Eq)]
pub struct Identity {
    pub agent: String,
    pub token: String,
}

impl fmt::Debug for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Identity").field("agent", &self.agent).field("token", &"<redacted>").finish()
    }
}

/// Which field of the identity object an error is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Agent,
    Token,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::Agent => "agent",
            Field::Token => "token",
        }
    }
}

/// Why an identity is refused. Carries no value of the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdentityError {
    /// Not JSON; `offset` is where the scanner stopped.
    Json {
        offset: usize,
    },
    NotObject,
    Missing(Field),
    Duplicate(Field),
    NotString(Field),
    /// A string with a lone surrogate escape: no valid text.
    BadString(Field),
    Empty(Field),
    TooLong(Field),
    /// A control character in the agent name.
    AgentControl,
    /// A token byte outside visible ASCII (0x21..=0x7E).
    TokenChar,
}

impl From<ScanError> for IdentityError {
    fn from(e: ScanError) -> Self {
        let (ScanError::Syntax { offset }
        | ScanError::InvalidUtf8 { offset }
        | ScanError::TooDeep { offset }) = e;
        IdentityError::Json { offset }
    }
}

impl fmt::Display for IdentityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdentityError::Json { offset } => {
                write!(f, "identity is not valid JSON (byte {offset})")
            }
            IdentityError::NotObject => f.write_str("identity is not a JSON object"),
            IdentityError::Missing(k) => write!(f, "identity has no \"{}\"", k.name()),
            IdentityError::Duplicate(k) => write!(f, "identity has \"{}\" twice", k.name()),
            IdentityError::NotString(k) => {
                write!(f, "identity \"{}\" is not a string", k.name())
            }
            IdentityError::BadString(k) => {
                write!(f, "identity \"{}\" holds a lone surrogate", k.name())
            }
            IdentityError::Empty(k) => write!(f, "identity \"{}\" is empty", k.name()),
            IdentityError::TooLong(Field::Agent) => {
                write!(f, "identity \"agent\" is longer than {MAX_AGENT_LEN} bytes")
            }
            IdentityError::TooLong(Field::Token) => {
                write!(f, "identity \"token\" is longer than {MAX_TOKEN_LEN} bytes")
            }
            IdentityError::AgentControl => f.write_str("identity \"agent\" holds a control character"),
            IdentityError::TokenChar => f.write_str("identity \"token\" holds a byte outside visible ASCII"),
        }
    }
}

/// Parses one identity object: both fields required strings, duplicates
/// refused, unknown keys ignored, whitespace (a trailing newline) allowed.
pub fn parse(bytes: &[u8]) -> Result<Identity, IdentityError> {
    let top = json::parse_value(bytes)?;
    let Kind::Object { .. } = top.kind else {
        return Err(IdentityError::NotObject);
    };
    let mut agent = None;
    let mut token = None;
    json::for_each_member(bytes, &top, |key, value| {
        let (slot, field) = if key.is(bytes, "agent") {
            (&mut agent, Field::Agent)
        } else if key.is(bytes, "token") {
            (&mut token, Field::Token)
        } else {
            return Ok(());
        };
        if slot.is_some() {
            return Err(IdentityError::Duplicate(field));
        }
        *slot = Some(value);
        Ok(())
    })?;
    let agent = text(bytes, agent, Field::Agent)?;
    let token = text(bytes, token, Field::Token)?;
    validate_agent(&agent)?;
    validate_token(&token)?;
    Ok(Identity { agent, token })
}

fn text(bytes: &[u8], v: Option<Value>, field: Field) -> Result<String, IdentityError> {
    let v = v.ok_or(IdentityError::Missing(field))?;
    let Kind::String { .. } = v.kind else {
        return Err(IdentityError::NotString(field));
    };
    v.decode_str(bytes).ok_or(IdentityError::BadString(field))
}

/// An agent name: non-empty, at most `MAX_AGENT_LEN` bytes, no control
/// characters (it is logged and shown in chat).
pub fn validate_agent(agent: &str) -> Result<(), IdentityError> {
    if agent.is_empty() {
        return Err(IdentityError::Empty(Field::Agent));
    }
    if agent.len() > MAX_AGENT_LEN {
        return Err(IdentityError::TooLong(Field::Agent));
    }
    if agent.chars().any(char::is_control) {
        return Err(IdentityError::AgentControl);
    }
    Ok(())
}

/// A token: non-empty, at most `MAX_TOKEN_LEN` bytes, visible ASCII only,
/// since it is written into `Authorization` and `X-Agent-Token` verbatim.
pub fn validate_token(token: &str) -> Result<(), IdentityError> {
    if token.is_empty() {
        return Err(IdentityError::Empty(Field::Token));
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(IdentityError::TooLong(Field::Token));
    }
    if !token.bytes().all(|c| (0x21..=0x7e).contains(&c)) {
        return Err(IdentityError::TokenChar);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn parses_identity_objects() {
        let ok: &[(&str, &str, &str)] = &[
            (r#"{"agent":"claude","token":"t0k"}"#, "claude", "t0k"),
            ("  {\"token\": \"t\", \"agent\": \"codex-2\", \"extra\": [1, {}]}\n", "codex-2", "t"),
            (r#"{"\u0061gent":"\u00e9\ud83d\ude00","token":"a\/b"}"#, "é😀", "a/b"),
            (r#"{"agent":"a b","token":"x","agent_old":1}"#, "a b", "x"),
        ];
        for (input, agent, token) in ok {
            let id = parse(input.as_bytes()).unwrap();
            assert_eq!((id.agent.as_str(), id.token.as_str()), (*agent, *token));
        }
    }

    #[test]
    fn refuses_bad_identities() {
        use IdentityError as E;
        let bad: &[(&[u8], IdentityError)] = &[
            (b"", E::Json { offset: 0 }),
            (b"{\"agent\":\"a\",\"token\":\"t\"} x", E::Json { offset: 26 }),
            (b"{\"agent\":\"a\",\"token\":\"\xff\"}", E::Json { offset: 22 }),
            (b"[]", E::NotObject),
            (b"\"a\"", E::NotObject),
            (b"{\"agent\":\"a\"}", E::Missing(Field::Token)),
            (b"{\"token\":\"t\"}", E::Missing(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":\"t\",\"agent\":\"b\"}", E::Duplicate(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":\"t\",\"t\\u006fken\":\"u\"}", E::Duplicate(Field::Token)),
            (b"{\"agent\":1,\"token\":\"t\"}", E::NotString(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":null}", E::NotString(Field::Token)),
            (b"{\"agent\":\"\\ud800\",\"token\":\"t\"}", E::BadString(Field::Agent)),
            (b"{\"agent\":\"\",\"token\":\"t\"}", E::Empty(Field::Agent)),
            (b"{\"agent\":\"a\",\"token\":\"\"}", E::Empty(Field::Token)),
            (b"{\"agent\":\"a\\nb\",\"token\":\"t\"}", E::AgentControl),
            (b"{\"agent\":\"a\\u0085b\",\"token\":\"t\"}", E::AgentControl),
            (b"{\"agent\":\"a\",\"token\":\"t t\"}", E::TokenChar),
            (b"{\"agent\":\"a\",\"token\":\"t\\r\\nX-Evil: 1\"}", E::TokenChar),
            (b"{\"agent\":\"a\",\"token\":\"t\xc3\xa9\"}", E::TokenChar),
        ];
        for (input, want) in bad {
            assert_eq!(parse(input), Err(*want), "{:?}", String::from_utf8_lossy(input));
        }
        let long_agent = format!(r#"{{"agent":"{}","token":"t"}}"#, "a".repeat(MAX_AGENT_LEN + 1));
        assert_eq!(parse(long_agent.as_bytes()), Err(E::TooLong(Field::Agent)));
        let max_agent = format!(r#"{{"agent":"{}","token":"t"}}"#, "é".repeat(MAX_AGENT_LEN / 2));
        assert!(parse(max_agent.as_bytes()).is_ok());
        let long_token = format!(r#"{{"agent":"a","token":"{}"}}"#, "t".repeat(MAX_TOKEN_LEN + 1));
        assert_eq!(parse(long_token.as_bytes()), Err(E::TooLong(Field::Token)));
    }

    #[test]
    fn token_never_shows() {
        let id = parse(format!(r#"{{"agent":"claude","token":"{TOKEN}"}}"#).as_bytes()).unwrap();
        let debug = format!("{id:?}");
        assert!(debug.contains("claude") && !debug.contains(TOKEN), "{debug}");
        let inputs = [
            format!(r#"{{"agent":"claude","token":"{TOKEN} "}}"#),
            format!(r#"{{"agent":"","token":"{TOKEN}"}}"#),
            format!(r#"{{"agent":"a","token":"{TOKEN}","token":"{TOKEN}"}}"#),
            format!(r#"{{"agent":"a","token":"{TOKEN}"#),
            format!(r#"{{"agent":"a","token":["{TOKEN}"]}}"#),
        ];
        for input in inputs {
            let e = parse(input.as_bytes()).unwrap_err();
            for shown in [e.to_string(), format!("{e:?}")] {
                assert!(!shown.contains(TOKEN) && !shown.contains("0123"), "{shown}");
            }
        }
    }

    #[test]
    fn round_trips_through_a_serialised_object() {
        for (agent, token) in [("claude", TOKEN), ("q\"uote\\ é", "!~"), ("\u{7f}x", "a")] {
            let mut text = b"{\"agent\":".to_vec();
            json::write_json_string(agent, &mut text);
            text.extend_from_slice(b",\"token\":");
            json::write_json_string(token, &mut text);
            text.extend_from_slice(b"}\n");
            match parse(&text) {
                Ok(id) => assert_eq!((id.agent.as_str(), id.token.as_str()), (agent, token)),
                Err(e) => assert_eq!(validate_agent(agent), Err(e)),
            }
        }
    }
}
