//! Defends the reading of a `WWW-Authenticate` value
//! (`credentials::challenge::parse`): fed any bytes, it never panics; every
//! challenge has a token scheme and either a token68 or parameters, whose
//! names are lowercase tokens, each once; the challenges written back in
//! canonical form (every value quoted) read back to themselves; and every
//! error is one of the fixed messages (numbers aside), never the input.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::credentials::challenge::{self, Challenge, ChallengeError, MAX_CHALLENGE_LEN};
use mcp_identity_proxy::http::headers::is_tchar;

/// A message's fixed text: each run of digits becomes one `#`.
fn shape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if !c.is_ascii_digit() {
            out.push(c);
        } else if !out.ends_with('#') {
            out.push('#');
        }
    }
    out
}

/// Does not compile when a variant is added: `fixed_messages` must list it.
fn listed(e: ChallengeError) {
    use ChallengeError::*;
    match e {
        TooLong { .. }
        | Byte { .. }
        | Scheme { .. }
        | AfterScheme { .. }
        | Body { .. }
        | Equals { .. }
        | ParamValue { .. }
        | Unterminated { .. }
        | NotUtf8 { .. }
        | StrayParam { .. }
        | DuplicateParam { .. }
        | Comma { .. } => {}
    }
}

fn fixed_messages() -> &'static [String] {
    static ALL: OnceLock<Vec<String>> = OnceLock::new();
    ALL.get_or_init(|| {
        use ChallengeError::*;
        let offset = 0;
        let all = [
            TooLong { len: 0 },
            Byte { offset },
            Scheme { offset },
            AfterScheme { offset },
            Body { offset },
            Equals { offset },
            ParamValue { offset },
            Unterminated { offset },
            NotUtf8 { offset },
            StrayParam { offset },
            DuplicateParam { offset },
            Comma { offset },
        ];
        all.iter().for_each(|&e| listed(e));
        all.iter().map(|e| shape(&e.to_string())).collect()
    })
}

/// The challenges in canonical form: one space after the scheme, every
/// parameter value a quoted string, `", "` between elements.
fn write(challenges: &[Challenge]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, c) in challenges.iter().enumerate() {
        if i > 0 {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(c.scheme.as_bytes());
        if let Some(t) = &c.token68 {
            out.push(b' ');
            out.extend_from_slice(t.as_bytes());
        }
        for (j, (name, value)) in c.params.iter().enumerate() {
            out.extend_from_slice(if j == 0 { b" " } else { b", " });
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"=\"");
            for &b in value.as_bytes() {
                if matches!(b, b'"' | b'\\') {
                    out.push(b'\\');
                }
                out.push(b);
            }
            out.push(b'"');
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    match challenge::parse(data) {
        Ok(challenges) => {
            assert!(data.len() <= MAX_CHALLENGE_LEN);
            for c in &challenges {
                assert!(!c.scheme.is_empty() && c.scheme.bytes().all(is_tchar), "scheme {:?}", c.scheme);
                assert!(c.token68.is_none() || c.params.is_empty(), "a token68 and parameters");
                for (i, (name, _)) in c.params.iter().enumerate() {
                    assert!(!name.is_empty() && name.bytes().all(is_tchar), "name {name:?}");
                    assert!(!name.bytes().any(|b| b.is_ascii_uppercase()), "name {name:?} not lowercase");
                    assert!(c.params[..i].iter().all(|(n, _)| n != name), "{name:?} twice");
                    assert_eq!(
                        c.param(&name.to_ascii_uppercase()).map(str::len),
                        c.param(name).map(str::len)
                    );
                }
            }
            let again = write(&challenges);
            if again.len() <= MAX_CHALLENGE_LEN {
                let reread = challenge::parse(&again).expect("canonical form reads back");
                assert_eq!(reread, challenges, "round trip through {:?}", String::from_utf8_lossy(&again));
            }
        }
        Err(e) => {
            let shown = e.to_string();
            assert!(fixed_messages().contains(&shape(&shown)), "not a fixed message: {shown:?}");
        }
    }
});
