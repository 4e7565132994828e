//! The credential source's asks in an upstream answer's head, for the
//! 401 road (`reopen`): a `DPoP-Nonce` for the next proofs (RFC 9449
//! §8.2, any answer may carry one), a 401 that wants it, a 403 that wants
//! more scope (RFC 6750 §3.1). DPoP and step-ups belong to an OAuth
//! source, so TLS builds only: the minimal build has no challenge parser.

use crate::conn::Ctx;
use crate::http::head::ResponseHead;
use crate::http::headers::name;

/// Hands an answer's `DPoP-Nonce` to the loop (`Ctx::dpop_nonce`) while
/// DPoP is in force; whether there was one.
pub(in crate::conn) fn note_nonce(resp: &ResponseHead, ctx: &Ctx) -> bool {
    let nonce = match ctx.dpop {
        Some(_) if cfg!(feature = "tls") => resp.headers.get_name(name::DPOP_NONCE),
        _ => None,
    };
    if let Some(n) = nonce {
        *ctx.dpop_nonce.borrow_mut() = Some(n.to_vec());
    }
    nonce.is_some()
}

/// The scope a 403's `Bearer` or `DPoP` challenge with `error=
/// "insufficient_scope"` asks for (RFC 6750 §3.1). Only an OAuth source
/// (TLS builds) asks for more scope: the minimal build has no challenge
/// parser.
#[cfg(feature = "tls")]
pub(in crate::conn) fn insufficient_scope(resp: &ResponseHead) -> Option<String> {
    let value = resp.headers.get(b"www-authenticate")?;
    let all = crate::credentials::challenge::parse(value).ok()?;
    let c = all
        .iter()
        .find(|c| (c.is("Bearer") || c.is("DPoP")) && c.param("error") == Some("insufficient_scope"))?;
    c.param("scope").map(str::to_string).filter(|s| !s.trim().is_empty())
}

#[cfg(not(feature = "tls"))]
pub(in crate::conn) fn insufficient_scope(_: &ResponseHead) -> Option<String> {
    None
}

/// A 401 whose DPoP challenge says `use_dpop_nonce` (DPoP: TLS builds).
#[cfg(not(feature = "tls"))]
pub(in crate::conn) fn wants_dpop_nonce(_: &ResponseHead) -> bool {
    false
}

/// A 401 whose DPoP challenge says `use_dpop_nonce`.
#[cfg(feature = "tls")]
pub(in crate::conn) fn wants_dpop_nonce(resp: &ResponseHead) -> bool {
    let Some(value) = resp.headers.get(b"www-authenticate") else { return false };
    crate::credentials::challenge::parse(value)
        .is_ok_and(|all| all.iter().any(|c| c.is("DPoP") && c.param("error") == Some("use_dpop_nonce")))
}
