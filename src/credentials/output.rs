//! What a credential program printed, read into a `Token`. Pure: the bytes
//! and the time they were read in, a token or an error out. Tried in order:
//!
//! 1. A Kubernetes `ExecCredential` (`kind` and an `apiVersion` under
//!    `client.authentication.k8s.io/`): `status.token`, and
//!    `status.expirationTimestamp` in RFC 3339.
//! 2. An OAuth token response (RFC 6749 §5.1): `access_token`, `expires_in`
//!    (seconds from now; a number, or the digits as a string as some
//!    servers send), `token_type` (`Bearer` or `DPoP`).
//! 3. One bare token line.
//!
//! Output that opens a JSON object is one of the first two or an error,
//! never a bare token. With no expiry given, a JWT's `exp` claim is used
//! (decoded, not verified: it only says when to renew). Every token must
//! fit in an `Authorization` field, so it is visible ASCII only. An error
//! names what was wrong and carries no byte of the output: `OutputError`
//! holds numbers and fixed field names, nothing else.

use std::fmt;

use super::{Scheme, Secret, Token};
use crate::credentials::b64;
use crate::http::framing::parse_digits;
use crate::mcp::json::{self, Kind, ScanError, Value};

/// Longest token accepted, in any of the forms. Large JWTs run to a few
/// KiB; past this the output is not a token, and it would crowd the
/// request head the proxy writes.
pub const MAX_TOKEN_LEN: usize = 16 * 1024;

/// The API group of a Kubernetes exec credential plugin's output
/// (`client.authentication.k8s.io/v1`, `/v1beta1`).
const EXEC_CREDENTIAL_API: &str = "client.authentication.k8s.io/";

/// Why the output is not a token. Copy and free of output bytes, so that
/// logging it can never log a secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputError {
    /// Nothing but whitespace.
    Empty,
    /// The output opens an object and is not JSON.
    Json(ScanError),
    /// A JSON object that is neither an ExecCredential nor a token response.
    UnknownObject,
    /// An OAuth error response (RFC 6749 §5.2).
    ErrorResponse,
    /// `kind` is `ExecCredential` and `apiVersion` is not a version of
    /// `client.authentication.k8s.io`.
    ApiVersion,
    /// A required member is absent.
    Missing { field: &'static str },
    /// A member holds the wrong type of JSON value.
    WrongType { field: &'static str },
    /// A string member with an unpaired surrogate escape (`\ud800`).
    NotText { field: &'static str },
    /// A member occurs twice: which one a reader takes is not ours to guess.
    Duplicate { field: &'static str },
    /// `expirationTimestamp` is not an RFC 3339 time at or after 1970.
    Timestamp,
    /// `expires_in` is not a non-negative integer.
    ExpiresIn,
    /// A `token_type` other than `Bearer` and `DPoP`.
    TokenType,
    /// Bare output of more than one line.
    Lines,
    /// The token is the empty string.
    EmptyToken,
    /// The token is longer than `MAX_TOKEN_LEN`.
    TooLong { len: usize },
    /// The token holds a byte that cannot be sent (a space, a control, a
    /// byte past ASCII) at this offset into the token.
    TokenByte { offset: usize },
}

impl fmt::Display for OutputError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OutputError::Empty => f.write_str("the credential program printed nothing"),
            OutputError::Json(e) => write!(f, "the credential output opens a JSON object but is not JSON: {e}"),
            OutputError::UnknownObject => f.write_str(
                "the credential output is a JSON object but neither an ExecCredential nor an OAuth token response",
            ),
            OutputError::ErrorResponse => f.write_str("the credential output is an OAuth error response"),
            OutputError::ApiVersion => {
                write!(f, "the ExecCredential's apiVersion is not under {EXEC_CREDENTIAL_API}")
            }
            OutputError::Missing { field } => write!(f, "the credential output has no `{field}`"),
            OutputError::WrongType { field } => {
                write!(f, "`{field}` in the credential output has the wrong JSON type")
            }
            OutputError::NotText { field } => {
                write!(f, "`{field}` in the credential output holds an unpaired surrogate escape")
            }
            OutputError::Duplicate { field } => write!(f, "`{field}` occurs twice in the credential output"),
            OutputError::Timestamp => f.write_str(
                "the ExecCredential's expirationTimestamp is not an RFC 3339 time at or after 1970",
            ),
            OutputError::ExpiresIn => f.write_str("`expires_in` is not a non-negative whole number of seconds"),
            OutputError::TokenType => f.write_str("`token_type` is neither Bearer nor DPoP"),
            OutputError::Lines => f.write_str("the credential output is more than one line"),
            OutputError::EmptyToken => f.write_str("the token is empty"),
            OutputError::TooLong { len } => {
                write!(f, "the token is {len} bytes long, over the limit of {MAX_TOKEN_LEN}")
            }
            OutputError::TokenByte { offset } => write!(
                f,
                "the token has a space, a control character or a non-ASCII byte at byte {offset} \
                 (only visible ASCII can be sent in an Authorization field)"
            ),
        }
    }
}

impl std::error::Error for OutputError {}

/// Reads a credential program's whole stdout, read at `now` (unix seconds).
pub fn parse(stdout: &[u8], now: u64) -> Result<Token, OutputError> {
    let text = stdout.trim_ascii();
    let mut token = match text.first() {
        None => return Err(OutputError::Empty),
        Some(b'{') => object(stdout, now)?,
        Some(_) => bare(text)?,
    };
    if token.expires_at.is_none() {
        token.expires_at = jwt_exp(token.secret.expose());
    }
    Ok(token)
}

/// An ExecCredential or a token response.
fn object(body: &[u8], now: u64) -> Result<Token, OutputError> {
    let top = json::parse_value(body).map_err(OutputError::Json)?;
    // Opens with `{` and is JSON, so an object; checked all the same.
    if !matches!(top.kind, Kind::Object { .. }) {
        return Err(OutputError::UnknownObject);
    }
    let kind = member(body, &top, "kind", "kind")?;
    if kind.is_some_and(|k| k.is_str(body, "ExecCredential")) {
        return exec_credential(body, &top);
    }
    if let Some(access_token) = member(body, &top, "access_token", "access_token")? {
        return token_response(body, &top, &access_token, now);
    }
    if member(body, &top, "error", "error")?.is_some() {
        return Err(OutputError::ErrorResponse);
    }
    Err(OutputError::UnknownObject)
}

/// The Kubernetes client authentication API's `ExecCredential`: `status`
/// holds `token` and, optionally, `expirationTimestamp`.
fn exec_credential(body: &[u8], top: &Value) -> Result<Token, OutputError> {
    let api = member(body, top, "apiVersion", "apiVersion")?;
    let api_ok = api
        .and_then(|v| v.decode_cow(body))
        .is_some_and(|v| v.len() > EXEC_CREDENTIAL_API.len() && v.starts_with(EXEC_CREDENTIAL_API));
    if !api_ok {
        return Err(OutputError::ApiVersion);
    }
    let status =
        member(body, top, "status", "status")?.ok_or(OutputError::Missing { field: "status.token" })?;
    if !matches!(status.kind, Kind::Object { .. }) {
        return Err(OutputError::WrongType { field: "status" });
    }
    let token = member(body, &status, "token", "status.token")?
        .ok_or(OutputError::Missing { field: "status.token" })?;
    let secret = secret(string(body, &token, "status.token")?)?;
    const EXPIRY: &str = "status.expirationTimestamp";
    let expires_at = match optional(member(body, &status, "expirationTimestamp", EXPIRY)?) {
        None => None,
        Some(v) => Some(rfc3339(string(body, &v, EXPIRY)?.as_bytes()).ok_or(OutputError::Timestamp)?),
    };
    Ok(Token { secret, expires_at, scheme: Scheme::Bearer })
}

/// RFC 6749 §5.1's successful response.
fn token_response(body: &[u8], top: &Value, access_token: &Value, now: u64) -> Result<Token, OutputError> {
    let secret = secret(string(body, access_token, "access_token")?)?;
    let expires_in = match optional(member(body, top, "expires_in", "expires_in")?) {
        None => None,
        Some(v) => Some(expires_in(body, &v).ok_or(OutputError::ExpiresIn)?),
    };
    let scheme = match optional(member(body, top, "token_type", "token_type")?) {
        None => Scheme::Bearer,
        Some(v) => Scheme::from_token_type(&string(body, &v, "token_type")?).ok_or(OutputError::TokenType)?,
    };
    // An `expires_in` past the end of time means no expiry worth a number.
    Ok(Token { secret, expires_at: expires_in.map(|s| now.saturating_add(s)), scheme })
}

/// A number of seconds: JSON digits, or a string of them (some servers
/// quote it). Digits only: no sign, fraction or exponent.
fn expires_in(body: &[u8], v: &Value) -> Option<u64> {
    match v.kind {
        Kind::Number => parse_digits(v.bytes(body)),
        Kind::String { .. } => parse_digits(v.decode_cow(body)?.as_bytes()),
        _ => None,
    }
}

/// The one bare line, already trimmed.
fn bare(text: &[u8]) -> Result<Token, OutputError> {
    if text.iter().any(|&b| b == b'\n' || b == b'\r') {
        return Err(OutputError::Lines);
    }
    check_token(text)?;
    // Visible ASCII, so one char per byte.
    let value: String = text.iter().copied().map(char::from).collect();
    Ok(Token { secret: Secret::new(value), expires_at: None, scheme: Scheme::Bearer })
}

/// A token from JSON, checked as a bare one is.
fn secret(value: String) -> Result<Secret, OutputError> {
    check_token(value.as_bytes())?;
    Ok(Secret::new(value))
}

/// What every token must be to go in `Authorization: <scheme> <token>`:
/// not empty, at most `MAX_TOKEN_LEN`, visible ASCII (RFC 9110 §5.5 allows
/// no CR, LF or NUL in a field value; spaces, other controls and bytes past
/// ASCII are refused too, since no token of RFC 6750 §2.1 holds them).
fn check_token(token: &[u8]) -> Result<(), OutputError> {
    if token.is_empty() {
        return Err(OutputError::EmptyToken);
    }
    if token.len() > MAX_TOKEN_LEN {
        return Err(OutputError::TooLong { len: token.len() });
    }
    match token.iter().position(|b| !(0x21..=0x7e).contains(b)) {
        Some(offset) => Err(OutputError::TokenByte { offset }),
        None => Ok(()),
    }
}

/// The value of `key` in `object`; twice is an error (`field` names it).
fn member(body: &[u8], object: &Value, key: &str, field: &'static str) -> Result<Option<Value>, OutputError> {
    let found = json::find_member(body, object, key).map_err(OutputError::Json)?;
    if found.duplicate {
        return Err(OutputError::Duplicate { field });
    }
    Ok(found.value)
}

/// An optional member: `null` is the same as absent.
fn optional(v: Option<Value>) -> Option<Value> {
    v.filter(|v| v.kind != Kind::Null)
}

/// A string member's decoded text.
fn string(body: &[u8], v: &Value, field: &'static str) -> Result<String, OutputError> {
    if !matches!(v.kind, Kind::String { .. }) {
        return Err(OutputError::WrongType { field });
    }
    v.decode_str(body).ok_or(OutputError::NotText { field })
}

/// The `exp` claim (RFC 7519 §4.1.4) of a token shaped like a JWS compact
/// serialization (RFC 7515 §7.1: three base64url parts, the last may be
/// empty), or `None`. A fractional NumericDate is cut to the second before.
fn jwt_exp(token: &str) -> Option<u64> {
    let mut parts = token.split('.');
    let (header, payload, signature) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || header.is_empty() || !b64::is_url(header) || !b64::is_url(signature) {
        return None;
    }
    let claims = b64::decode_url(payload.as_bytes())?;
    let top = json::parse_value(&claims).ok()?;
    if !matches!(top.kind, Kind::Object { .. }) {
        return None;
    }
    let exp = json::find_member(&claims, &top, "exp").ok()?;
    let exp = exp.value.filter(|v| !exp.duplicate && v.kind == Kind::Number)?;
    let digits = exp.bytes(&claims);
    let (whole, fraction) = match digits.iter().position(|&b| b == b'.') {
        Some(dot) => (digits.get(..dot)?, digits.get(dot + 1..)?),
        None => (digits, &b""[..]),
    };
    if !fraction.iter().all(u8::is_ascii_digit) {
        return None;
    }
    parse_digits(whole)
}

/// An RFC 3339 §5.6 `date-time` as unix seconds: `2026-12-07T03:04:05Z`,
/// with an optional fraction (cut off: an expiry read early is the safe
/// side) and `Z` or a `+hh:mm`/`-hh:mm` offset; `T` and `Z` in either
/// case. `None` for anything else, an impossible date, or before 1970.
fn rfc3339(s: &[u8]) -> Option<u64> {
    let num = |from: usize, to: usize| s.get(from..to).and_then(parse_digits);
    let at = |i: usize, allowed: &[u8]| s.get(i).is_some_and(|c| allowed.contains(c));
    if !(at(4, b"-") && at(7, b"-") && at(10, b"Tt") && at(13, b":") && at(16, b":")) {
        return None;
    }
    let (year, month, day) = (num(0, 4)?, num(5, 7)?, num(8, 10)?);
    let (hour, minute, second) = (num(11, 13)?, num(14, 16)?, num(17, 19)?);
    // §5.7: a leap second is second 60.
    if !(1..=12).contains(&month) || day < 1 || day > days_in_month(year, month) {
        return None;
    }
    if hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    let mut rest = s.get(19..)?;
    if let Some(fraction) = rest.strip_prefix(b".") {
        let digits = fraction.iter().take_while(|b| b.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        rest = fraction.get(digits..)?;
    }
    let offset: i64 = match rest {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let (h, m) = (parse_digits(&[*h1, *h2])?, parse_digits(&[*m1, *m2])?);
            if h > 23 || m > 59 {
                return None;
            }
            let sign = if *sign == b'-' { -1 } else { 1 };
            sign * i64::try_from(h * 3600 + m * 60).ok()?
        }
        _ => return None,
    };
    let signed = |n: u64| i64::try_from(n).ok();
    let days = days_from_civil(signed(year)?, signed(month)?, signed(day)?);
    let local = days * 86_400 + signed(hour * 3600 + minute * 60 + second)?;
    // Local time minus its offset is UTC.
    u64::try_from(local - offset).ok()
}

fn is_leap(year: u64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: u64, month: u64) -> u64 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's
/// `days_from_civil`): years counted from March, so a leap day ends its
/// year, in 400-year eras of 146,097 days. `month` 1..=12, `day` valid.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year.rem_euclid(400);
    // March is 0, February 11.
    let month_from_march = (month + 9) % 12;
    let day_of_year = (153 * month_from_march + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_796_600_000;

    /// Base64url without padding, the form JWTs use.
    fn b64(bytes: &[u8]) -> String {
        const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
        let mut out = String::new();
        for group in bytes.chunks(3) {
            let mut acc = 0u32;
            for (i, &b) in group.iter().enumerate() {
                acc |= u32::from(b) << (16 - 8 * i);
            }
            for i in 0..=group.len() {
                out.push(char::from(ALPHABET[(acc >> (18 - 6 * i) & 63) as usize]));
            }
        }
        out
    }

    fn jwt(claims: &str) -> String {
        format!("{}.{}.c2ln", b64(br#"{"alg":"RS256"}"#), b64(claims.as_bytes()))
    }

    fn token(secret: &str, expires_at: Option<u64>, scheme: Scheme) -> Token {
        Token { secret: Secret::new(secret.to_string()), expires_at, scheme }
    }

    #[test]
    fn rfc3339_times() {
        let cases: &[(&str, Option<u64>)] = &[
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2026-12-07T03:04:05Z", Some(1_796_612_645)),
            ("2026-12-07t03:04:05z", Some(1_796_612_645)),
            ("2026-12-07T03:04:05.123Z", Some(1_796_612_645)),
            ("2026-12-07T03:04:05.999999999Z", Some(1_796_612_645)),
            ("2026-12-07T03:04:05+00:00", Some(1_796_612_645)),
            ("2026-12-07T03:04:05-00:00", Some(1_796_612_645)),
            ("2026-12-07T03:04:05+05:30", Some(1_796_592_845)),
            ("2026-12-07T03:04:05.5-08:00", Some(1_796_641_445)),
            ("2026-12-07T03:04:05+23:59", Some(1_796_612_645 - 86_340)),
            ("2024-02-29T00:00:00Z", Some(1_709_164_800)),
            ("2000-02-29T12:00:00Z", Some(951_825_600)),
            ("2000-03-01T00:00:00Z", Some(951_868_800)),
            ("2100-02-28T23:59:59Z", Some(4_107_542_399)),
            ("9999-12-31T23:59:59Z", Some(253_402_300_799)),
            ("1972-06-30T23:59:60Z", Some(78_796_800)),
            ("1970-01-01T01:00:00+01:00", Some(0)),
            // Not dates.
            ("2026-13-01T00:00:00Z", None),
            ("2026-00-01T00:00:00Z", None),
            ("2026-01-32T00:00:00Z", None),
            ("2026-01-00T00:00:00Z", None),
            ("2026-04-31T00:00:00Z", None),
            ("2026-02-29T00:00:00Z", None),
            ("2100-02-29T00:00:00Z", None),
            ("1900-02-29T00:00:00Z", None),
            ("2026-12-07T24:00:00Z", None),
            ("2026-12-07T03:60:00Z", None),
            ("2026-12-07T03:04:61Z", None),
            ("2026-12-07T03:04:05+24:00", None),
            ("2026-12-07T03:04:05+05:60", None),
            // Before 1970, after 1970 once offset.
            ("1969-12-31T23:59:59Z", None),
            ("1970-01-01T00:00:00+00:01", None),
            ("1970-01-01T00:00:00-00:01", Some(60)),
            // Not the grammar.
            ("", None),
            ("2026-12-07", None),
            ("2026-12-07T03:04:05", None),
            ("2026-12-07 03:04:05Z", None),
            ("2026-12-07T03:04Z", None),
            ("2026-12-07T03:04:05.Z", None),
            ("2026-12-07T03:04:05,5Z", None),
            ("2026-12-07T03:04:05ZZ", None),
            ("2026-12-07T03:04:05Z ", None),
            ("2026-12-07T03:04:05+0100", None),
            ("2026-12-07T03:04:05+01", None),
            ("2026-12-07T03:04:05UTC", None),
            ("+026-12-07T03:04:05Z", None),
            ("26-12-07T03:04:05Z", None),
            ("20261207T030405Z", None),
            ("2026-1a-07T03:04:05Z", None),
            ("2026-12-07T03:04:05+a1:00", None),
            ("2026-12-07T03:04:05.1é", None),
        ];
        for (s, want) in cases {
            assert_eq!(rfc3339(s.as_bytes()), *want, "{s}");
        }
    }

    #[test]
    fn days_from_civil_agrees_with_counting() {
        // A naive count, a day at a time, from 1970 to 2400 (four leap
        // centuries' worth of rules: 2000 and 2400 leap, 2100 and 2200 not).
        let mut days = 0i64;
        for year in 1970..=2400 {
            for month in 1..=12 {
                for day in 1..=days_in_month(year, month) {
                    let civil = days_from_civil(year as i64, month as i64, day as i64);
                    assert_eq!(civil, days, "{year}-{month}-{day}");
                    days += 1;
                }
            }
        }
        assert_eq!(days_from_civil(0, 1, 1), -719_528);
        assert_eq!(days_from_civil(1900, 3, 1), -25_508);
    }

    #[test]
    fn exec_credentials() {
        let cases: &[(&str, Result<Token, OutputError>)] = &[
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","spec":{"interactive":false},"status":{"token":"k8s-token","expirationTimestamp":"2026-12-07T03:04:05Z"}}"#,
                Ok(token("k8s-token", Some(1_796_612_645), Scheme::Bearer)),
            ),
            (
                r#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"k8s-token"}}"#,
                Ok(token("k8s-token", None, Scheme::Bearer)),
            ),
            (
                r#" {"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"k\u0038s","expirationTimestamp":null}}
"#,
                Ok(token("k8s", None, Scheme::Bearer)),
            ),
            // Not under the API group.
            (
                r#"{"kind":"ExecCredential","apiVersion":"v1","status":{"token":"t"}}"#,
                Err(OutputError::ApiVersion),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/","status":{"token":"t"}}"#,
                Err(OutputError::ApiVersion),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"xclient.authentication.k8s.io/v1","status":{"token":"t"}}"#,
                Err(OutputError::ApiVersion),
            ),
            (r#"{"kind":"ExecCredential","status":{"token":"t"}}"#, Err(OutputError::ApiVersion)),
            (
                r#"{"kind":"ExecCredential","apiVersion":1,"status":{"token":"t"}}"#,
                Err(OutputError::ApiVersion),
            ),
            // Another kind, even of the same group, is not a credential.
            (
                r#"{"kind":"Pod","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t"}}"#,
                Err(OutputError::UnknownObject),
            ),
            (
                r#"{"kind":"execcredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t"}}"#,
                Err(OutputError::UnknownObject),
            ),
            // The status.
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1"}"#,
                Err(OutputError::Missing { field: "status.token" }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":"t"}"#,
                Err(OutputError::WrongType { field: "status" }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"clientCertificateData":"x"}}"#,
                Err(OutputError::Missing { field: "status.token" }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":7}}"#,
                Err(OutputError::WrongType { field: "status.token" }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"\ud800"}}"#,
                Err(OutputError::NotText { field: "status.token" }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":""}}"#,
                Err(OutputError::EmptyToken),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"a b"}}"#,
                Err(OutputError::TokenByte { offset: 1 }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"ab\r\nX-Evil: 1"}}"#,
                Err(OutputError::TokenByte { offset: 2 }),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t","expirationTimestamp":"2026-13-07T03:04:05Z"}}"#,
                Err(OutputError::Timestamp),
            ),
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"t","expirationTimestamp":1796612645}}"#,
                Err(OutputError::WrongType { field: "status.expirationTimestamp" }),
            ),
            // Twice is ambiguous.
            (
                r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"a","token":"b"}}"#,
                Err(OutputError::Duplicate { field: "status.token" }),
            ),
            (
                r#"{"kind":"ExecCredential","kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"a"}}"#,
                Err(OutputError::Duplicate { field: "kind" }),
            ),
        ];
        for (out, want) in cases {
            assert_eq!(parse(out.as_bytes(), NOW), *want, "{out}");
        }
    }

    #[test]
    fn token_responses() {
        let cases: &[(&str, Result<Token, OutputError>)] = &[
            (
                r#"{"access_token":"at-1","token_type":"Bearer","expires_in":3600}"#,
                Ok(token("at-1", Some(NOW + 3600), Scheme::Bearer)),
            ),
            (
                r#"{"access_token":"at-1","expires_in":"3600"}"#,
                Ok(token("at-1", Some(NOW + 3600), Scheme::Bearer)),
            ),
            (r#"{"access_token":"at-1","expires_in":0}"#, Ok(token("at-1", Some(NOW), Scheme::Bearer))),
            (
                r#"{"access_token":"at-1","expires_in":18446744073709551615}"#,
                Ok(token("at-1", Some(u64::MAX), Scheme::Bearer)),
            ),
            (r#"{"access_token":"at-1"}"#, Ok(token("at-1", None, Scheme::Bearer))),
            (
                r#"{"access_token":"at-1","expires_in":null,"token_type":null}"#,
                Ok(token("at-1", None, Scheme::Bearer)),
            ),
            (r#"{"access_token":"at-1","token_type":"bearer"}"#, Ok(token("at-1", None, Scheme::Bearer))),
            (
                r#"{"access_token":"at-1","token_type":"DPoP","expires_in":60,"refresh_token":"r","scope":"a b"}"#,
                Ok(token("at-1", Some(NOW + 60), Scheme::DPoP)),
            ),
            (r#"{"access_token":"at-1","token_type":"dpop"}"#, Ok(token("at-1", None, Scheme::DPoP))),
            (r#"{"access_token":"at\/1"}"#, Ok(token("at/1", None, Scheme::Bearer))),
            // `kind` of another sort does not hide a token response.
            (r#"{"kind":"Other","access_token":"at-1"}"#, Ok(token("at-1", None, Scheme::Bearer))),
            // token_type.
            (r#"{"access_token":"at-1","token_type":"mac"}"#, Err(OutputError::TokenType)),
            (r#"{"access_token":"at-1","token_type":""}"#, Err(OutputError::TokenType)),
            (
                r#"{"access_token":"at-1","token_type":1}"#,
                Err(OutputError::WrongType { field: "token_type" }),
            ),
            // expires_in.
            (r#"{"access_token":"at-1","expires_in":-1}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":3600.5}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":3600.0}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":3.6e3}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":18446744073709551616}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":NaN}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":"+3600"}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":" 3600"}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":""}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":true}"#, Err(OutputError::ExpiresIn)),
            (r#"{"access_token":"at-1","expires_in":[3600]}"#, Err(OutputError::ExpiresIn)),
            // access_token.
            (r#"{"access_token":null}"#, Err(OutputError::WrongType { field: "access_token" })),
            (r#"{"access_token":""}"#, Err(OutputError::EmptyToken)),
            (r#"{"access_token":"é"}"#, Err(OutputError::TokenByte { offset: 0 })),
            (r#"{"access_token":"a\u0000"}"#, Err(OutputError::TokenByte { offset: 1 })),
            (
                r#"{"access_token":"a","access_token":"b"}"#,
                Err(OutputError::Duplicate { field: "access_token" }),
            ),
            (
                r#"{"access_token":"a","expires_in":1,"expires_in":2}"#,
                Err(OutputError::Duplicate { field: "expires_in" }),
            ),
            // Other objects.
            (r#"{}"#, Err(OutputError::UnknownObject)),
            (r#"{"token":"t"}"#, Err(OutputError::UnknownObject)),
            (r#"{"error":"invalid_grant","error_description":"x"}"#, Err(OutputError::ErrorResponse)),
            (r#"{"id_token":"a.b.c"}"#, Err(OutputError::UnknownObject)),
        ];
        for (out, want) in cases {
            assert_eq!(parse(out.as_bytes(), NOW), *want, "{out}");
        }
    }

    #[test]
    fn output_that_opens_an_object_is_json_or_an_error() {
        for out in [
            &b"{"[..],
            b"{not json}",
            b"{\"access_token\":\"t\"} trailing",
            b"{\"access_token\":\"\xff\"}",
            b"\x0c{}",
        ] {
            assert!(matches!(parse(out, NOW), Err(OutputError::Json(_))), "{out:?}");
        }
        // Other JSON values are tokens or not on their own merits.
        assert_eq!(parse(b"[1]", NOW), Ok(token("[1]", None, Scheme::Bearer)));
        assert_eq!(parse(b"\"quoted\"", NOW), Ok(token("\"quoted\"", None, Scheme::Bearer)));
        assert_eq!(parse(b"[1, 2]", NOW), Err(OutputError::TokenByte { offset: 3 }));
    }

    #[test]
    fn bare_tokens() {
        let long = "x".repeat(MAX_TOKEN_LEN);
        let too_long = "x".repeat(MAX_TOKEN_LEN + 1);
        let cases: &[(&[u8], Result<Token, OutputError>)] = &[
            (b"ghp_abc123", Ok(token("ghp_abc123", None, Scheme::Bearer))),
            (b"ghp_abc123\n", Ok(token("ghp_abc123", None, Scheme::Bearer))),
            (b"ghp_abc123\r\n", Ok(token("ghp_abc123", None, Scheme::Bearer))),
            (b"\n\t  ghp_abc123 \n\n", Ok(token("ghp_abc123", None, Scheme::Bearer))),
            (b"!~", Ok(token("!~", None, Scheme::Bearer))),
            (b"a.b", Ok(token("a.b", None, Scheme::Bearer))),
            (long.as_bytes(), Ok(token(&long, None, Scheme::Bearer))),
            (too_long.as_bytes(), Err(OutputError::TooLong { len: MAX_TOKEN_LEN + 1 })),
            (b"", Err(OutputError::Empty)),
            (b" \n\r\t\x0c", Err(OutputError::Empty)),
            (b"line1\nline2\n", Err(OutputError::Lines)),
            (b"line1\rline2", Err(OutputError::Lines)),
            (b"token\n\nmore", Err(OutputError::Lines)),
            (b"Bearer abc", Err(OutputError::TokenByte { offset: 6 })),
            (b"  a\tb", Err(OutputError::TokenByte { offset: 1 })),
            (b"ab\x00", Err(OutputError::TokenByte { offset: 2 })),
            (b"ab\x1bc", Err(OutputError::TokenByte { offset: 2 })),
            (b"ab\x7f", Err(OutputError::TokenByte { offset: 2 })),
            (b"ab\x0bc", Err(OutputError::TokenByte { offset: 2 })),
            ("tökén".as_bytes(), Err(OutputError::TokenByte { offset: 1 })),
            (b"ab\xff\xfe", Err(OutputError::TokenByte { offset: 2 })),
        ];
        for (out, want) in cases {
            assert_eq!(parse(out, NOW), *want, "{:?}", String::from_utf8_lossy(out));
        }
    }

    #[test]
    fn jwt_exp_is_the_fallback_expiry() {
        let exp = jwt(r#"{"sub":"a","exp":1796612645}"#);
        let cases: &[(String, Option<u64>)] = &[
            (exp.clone(), Some(1_796_612_645)),
            (jwt(r#"{"exp":1796612645.75}"#), Some(1_796_612_645)),
            (jwt(r#"{"exp":0}"#), Some(0)),
            // Unsecured (`alg: none`): the signature is empty.
            (format!("{}.{}.", b64(br#"{"alg":"none"}"#), b64(br#"{"exp":5}"#)), Some(5)),
            // Padded parts.
            ("eyJhbGciOiJub25lIn0=.eyJleHAiOjV9.".to_string(), Some(5)),
            // Not an exp to read.
            (jwt(r#"{"exp":"1796612645"}"#), None),
            (jwt(r#"{"exp":-5}"#), None),
            (jwt(r#"{"exp":1.7e9}"#), None),
            (jwt(r#"{"exp":1,"exp":2}"#), None),
            (jwt(r#"{"exp":99999999999999999999}"#), None),
            (jwt(r#"{"nbf":1}"#), None),
            (jwt(r#"[1]"#), None),
            (jwt("not json"), None),
            // Not a JWS.
            (format!("{exp}.x"), None),
            (exp.replacen('.', "", 1), None),
            (format!(".{}.", b64(br#"{"exp":5}"#)), None),
            (format!("a*.{}.", b64(br#"{"exp":5}"#)), None),
            (format!("{}.{}.a+b", b64(b"{}"), b64(br#"{"exp":5}"#)), None),
            (format!("{}.{}x.", b64(b"{}"), b64(br#"{"exp":5}"#)), None),
            (format!("{}.{}*.", b64(b"{}"), b64(br#"{"exp":5}"#)), None),
        ];
        for (t, want) in cases {
            assert_eq!(jwt_exp(t), *want, "{t}");
            assert_eq!(parse(t.as_bytes(), NOW), Ok(token(t, *want, Scheme::Bearer)), "{t}");
        }
        // Any form, only when the output gave no expiry.
        let json = format!(r#"{{"access_token":"{exp}"}}"#);
        assert_eq!(parse(json.as_bytes(), NOW), Ok(token(&exp, Some(1_796_612_645), Scheme::Bearer)));
        let json = format!(r#"{{"access_token":"{exp}","expires_in":60}}"#);
        assert_eq!(parse(json.as_bytes(), NOW), Ok(token(&exp, Some(NOW + 60), Scheme::Bearer)));
        let json = format!(
            r#"{{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{{"token":"{exp}"}}}}"#
        );
        assert_eq!(parse(json.as_bytes(), NOW), Ok(token(&exp, Some(1_796_612_645), Scheme::Bearer)));
    }

    #[test]
    fn base64url_decodes() {
        let cases: &[(&str, Option<&[u8]>)] = &[
            ("", Some(b"")),
            ("YQ", Some(b"a")),
            ("YQ==", Some(b"a")),
            ("YWI", Some(b"ab")),
            ("YWI=", Some(b"ab")),
            ("YWJj", Some(b"abc")),
            ("-_8", Some(&[0xfb, 0xff])),
            ("Y", None),
            ("YWJjZ", None),
            ("YQ===", None),
            ("Y+8", None),
            ("Y/8", None),
            ("YW=I", None),
        ];
        for (s, want) in cases {
            assert_eq!(b64::decode_url(s.as_bytes()).as_deref(), *want, "{s}");
        }
        // The test encoder's output of every length decodes back.
        let bytes: Vec<u8> = (0..=255).collect();
        for n in 0..bytes.len() {
            assert_eq!(b64::decode_url(b64(&bytes[..n]).as_bytes()).as_deref(), Some(&bytes[..n]));
        }
    }

    #[test]
    fn errors_carry_no_output() {
        let secret = "SECRET-abc.def_ghi";
        let outputs = [
            format!("{secret}\n{secret}"),
            format!("Bearer {secret}"),
            format!("{{\"access_token\":\"{secret} \"}}"),
            format!("{{\"access_token\":\"{secret}\",\"token_type\":\"{secret}\"}}"),
            format!("{{\"access_token\":\"{secret}\",\"expires_in\":\"{secret}\"}}"),
            format!("{{\"{secret}\":1}}"),
            format!("{{\"access_token\":{secret}}}"),
            format!(
                r#"{{"kind":"ExecCredential","apiVersion":"{secret}","status":{{"token":"{secret}","expirationTimestamp":"{secret}"}}}}"#
            ),
            format!(
                r#"{{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{{"token":"{secret}","expirationTimestamp":"{secret}"}}}}"#
            ),
        ];
        for out in &outputs {
            let e = parse(out.as_bytes(), NOW).unwrap_err();
            let shown = format!("{e} {e:?}");
            assert!(!shown.contains("SECRET"), "{shown}");
        }
        let messages = [
            (OutputError::Empty, "the credential program printed nothing"),
            (
                OutputError::Json(ScanError::Syntax { offset: 3 }),
                "the credential output opens a JSON object but is not JSON: invalid JSON at byte 3",
            ),
            (OutputError::Missing { field: "access_token" }, "the credential output has no `access_token`"),
            (OutputError::TooLong { len: 20_000 }, "the token is 20000 bytes long, over the limit of 16384"),
            (
                OutputError::TokenByte { offset: 6 },
                "the token has a space, a control character or a non-ASCII byte at byte 6 \
                 (only visible ASCII can be sent in an Authorization field)",
            ),
        ];
        for (e, want) in messages {
            assert_eq!(e.to_string(), want);
        }
    }

    #[test]
    fn every_prefix_and_mutation_is_handled() {
        // No panic, and an accepted token is always sendable.
        use crate::test_rng::Rng;
        let seeds = [
            r#"{"kind":"ExecCredential","apiVersion":"client.authentication.k8s.io/v1","status":{"token":"k","expirationTimestamp":"2026-12-07T03:04:05.5+01:00"}}"#.to_string(),
            r#"{"access_token":"at","token_type":"DPoP","expires_in":"60"}"#.to_string(),
            jwt(r#"{"exp":1796612645}"#),
        ];
        let mut r = Rng(0xC0FF_EE00);
        for seed in &seeds {
            let b = seed.as_bytes();
            for i in 0..=b.len() {
                let _ = parse(&b[..i], NOW);
            }
            for _ in 0..2_000 {
                let mut m = b.to_vec();
                let at = r.below(m.len());
                m[at] = r.pick(b"{}[]\":,.\\0123456789Z+-T \n\x00\xffe");
                if let Ok(t) = parse(&m, NOW) {
                    assert!(check_token(t.secret.expose().as_bytes()).is_ok());
                }
            }
        }
    }
}
