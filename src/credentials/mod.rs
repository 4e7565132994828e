//! Where the upstream tokens come from and when they are renewed: a
//! credential program's command line (`cmdline`), what it printed
//! (`output`) and the renewal schedule (`renew`). These parts are pure: no
//! process, no socket, no clock read (time comes in as unix seconds);
//! running the program is the caller's.

use std::fmt;

pub mod b64;
pub mod challenge;
pub mod cmdline;
pub mod form;
#[cfg(feature = "tls")]
pub mod jws;
pub mod metadata;
pub mod oauth;
pub mod output;
pub mod renew;

/// A token's text. `Debug` hides it and there is no `Display`, so it
/// reaches a log only through an explicit `expose()`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Secret {
        Secret(value)
    }

    /// The token itself, for the one place that writes it into a request.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

/// A token as a credential program gave it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub secret: Secret,
    /// Unix seconds; `None` when neither the output nor the token says.
    pub expires_at: Option<u64>,
    pub scheme: Scheme,
}

/// The `Authorization` scheme the token is sent with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// RFC 6750 §2.1.
    Bearer,
    /// A sender-constrained token (RFC 9449 §7.1).
    DPoP,
}

impl Scheme {
    /// From an OAuth `token_type`, which is case-insensitive (RFC 6749
    /// §5.1); `None` for a type this proxy cannot send.
    pub fn from_token_type(token_type: &str) -> Option<Scheme> {
        if token_type.eq_ignore_ascii_case("bearer") {
            Some(Scheme::Bearer)
        } else if token_type.eq_ignore_ascii_case("dpop") {
            Some(Scheme::DPoP)
        } else {
            None
        }
    }

    /// The auth-scheme as written before the token.
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Bearer => "Bearer",
            Scheme::DPoP => "DPoP",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_debug_hides_the_value() {
        let s = Secret::new("s3cr3t-value".to_string());
        assert_eq!(format!("{s:?}"), "Secret(..)");
        assert_eq!(s.expose(), "s3cr3t-value");
        let t = Token { secret: s.clone(), expires_at: Some(5), scheme: Scheme::Bearer };
        let shown = format!("{t:?} {t:#?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert_eq!(t.secret, s);
        assert_ne!(s, Secret::new("other".to_string()));
    }

    #[test]
    fn scheme_from_token_type() {
        let cases: &[(&str, Option<Scheme>)] = &[
            ("bearer", Some(Scheme::Bearer)),
            ("Bearer", Some(Scheme::Bearer)),
            ("BEARER", Some(Scheme::Bearer)),
            ("DPoP", Some(Scheme::DPoP)),
            ("dpop", Some(Scheme::DPoP)),
            ("", None),
            ("mac", None),
            ("bearer ", None),
            ("N_A", None),
        ];
        for (s, want) in cases {
            assert_eq!(Scheme::from_token_type(s), *want, "{s:?}");
        }
        assert_eq!(Scheme::Bearer.as_str(), "Bearer");
        assert_eq!(Scheme::DPoP.as_str(), "DPoP");
    }
}
