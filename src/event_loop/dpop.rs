//! `--dpop`: the proofs of a DPoP-bound token (RFC 9449), made on the loop
//! for each request to the upstream (`editor::Proof`): `htm` the request's
//! method, `htu` the upstream's origin and the request's path (no query),
//! `ath` the token's hash, a fresh `jti`, and the upstream's latest
//! `DPoP-Nonce` (§8, §9). An ES256 signature costs tens of microseconds, once
//! per request; nothing here blocks.

use crate::conn::editor::Proof;
use crate::credentials::jws::{self, SigningKey};
use log::warn;
use std::sync::Arc;

/// The key, the token it is bound to, the nonce in force.
pub struct Signer {
    key: Arc<SigningKey>,
    /// `scheme://authority` of the upstream (the `htu`'s origin).
    origin: String,
    /// The DPoP-bound token in force; `None` while the token is a plain
    /// bearer one (an authorization server that did not bind it).
    token: Option<String>,
    nonce: Option<String>,
}

impl Signer {
    pub fn new(key: Arc<SigningKey>, origin: String) -> Signer {
        Signer { key, origin, token: None, nonce: None }
    }

    /// The token in force: proofs when it is DPoP-bound, none otherwise.
    pub fn set_token(&mut self, token: Option<&str>) {
        self.token = token.map(str::to_string);
    }

    /// The upstream's new nonce; `true` when it differs from the one in
    /// force. Only a visible-ASCII value is taken (it goes in a JWT claim).
    pub fn set_nonce(&mut self, nonce: &[u8]) -> bool {
        let Ok(text) = std::str::from_utf8(nonce) else { return false };
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_graphic()) || text.len() > 512 {
            return false;
        }
        if self.nonce.as_deref() == Some(text) {
            return false;
        }
        self.nonce = Some(text.to_string());
        true
    }

    /// Whether requests need proofs now.
    pub fn active(&self) -> bool {
        self.token.is_some()
    }
}

impl Proof for Signer {
    fn proof(&self, method: &[u8], target: &[u8]) -> Option<String> {
        let token = self.token.as_deref()?;
        let method = std::str::from_utf8(method).ok()?;
        let target = std::str::from_utf8(target).ok()?;
        let path = target.split(['?', '#']).next().unwrap_or("/");
        let htu = format!("{}{path}", self.origin);
        let now = super::credential::unix_now();
        let made = jws::random_id().and_then(|jti| {
            jws::dpop_proof(&self.key, method, &htu, now, &jti, Some(token), self.nonce.as_deref())
        });
        match made {
            Ok(proof) => Some(proof),
            Err(e) => {
                warn!("dpop: no proof for {method} {path}: {e}");
                None
            }
        }
    }
}
