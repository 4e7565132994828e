//! Base64 for the credentials' wire forms: RFC 4648 §4 with padding (an
//! HTTP Basic credential, RFC 7617 §2) and §5 base64url without padding
//! (the parts of a JWS, RFC 7515 §2), and the base64url reader for a JWT's
//! claims. Pure.

const STD: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
const URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn encode_with(input: &[u8], alphabet: &[u8; 64], pad: bool) -> String {
    let sym = |n: u32| char::from(alphabet.get((n & 63) as usize).copied().unwrap_or(b'='));
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |acc, (i, &c)| acc | u32::from(c) << (16 - 8 * i));
        out.push(sym(n >> 18));
        out.push(sym(n >> 12));
        if chunk.len() > 1 {
            out.push(sym(n >> 6));
        } else if pad {
            out.push('=');
        }
        if chunk.len() > 2 {
            out.push(sym(n));
        } else if pad {
            out.push('=');
        }
    }
    out
}

/// RFC 4648 §4, padded.
pub fn encode(input: &[u8]) -> String {
    encode_with(input, STD, true)
}

/// RFC 4648 §5, unpadded (RFC 7515 §2's base64url).
pub fn encode_url(input: &[u8]) -> String {
    encode_with(input, URL, false)
}

fn url_sextet(c: u8) -> Option<u8> {
    match c {
        b'A'..=b'Z' => Some(c - b'A'),
        b'a'..=b'z' => Some(c - b'a' + 26),
        b'0'..=b'9' => Some(c - b'0' + 52),
        b'-' => Some(62),
        b'_' => Some(63),
        _ => None,
    }
}

/// Whether `s` is base64url (a JWS's parts), `=` allowed at the end.
pub fn is_url(s: &str) -> bool {
    s.trim_end_matches('=').bytes().all(|c| url_sextet(c).is_some())
}

/// Decodes base64url (RFC 4648 §5), padding optional. Bits left over in
/// the last character are ignored.
pub fn decode_url(s: &[u8]) -> Option<Vec<u8>> {
    let s = s.strip_suffix(b"==").or_else(|| s.strip_suffix(b"=")).unwrap_or(s);
    if s.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(s.len() / 4 * 3 + 2);
    for group in s.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in group.iter().enumerate() {
            acc |= u32::from(url_sextet(c)?) << (18 - 6 * i);
        }
        // 2, 3 or 4 characters carry 1, 2 or 3 bytes.
        out.extend_from_slice(acc.to_be_bytes().get(1..group.len())?);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4648 §10's vectors, padded and in base64url without padding,
    /// and each read back.
    #[test]
    fn rfc_4648_vectors() {
        let cases: &[(&str, &str)] = &[
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ];
        for (plain, want) in cases {
            assert_eq!(encode(plain.as_bytes()), *want, "{plain:?}");
            let url = encode_url(plain.as_bytes());
            assert_eq!(url, want.trim_end_matches('='), "{plain:?}");
            assert_eq!(decode_url(url.as_bytes()).as_deref(), Some(plain.as_bytes()), "{plain:?}");
            assert_eq!(decode_url(want.as_bytes()).as_deref(), Some(plain.as_bytes()), "{plain:?}");
        }
    }

    /// The two alphabets differ in the last two symbols only.
    #[test]
    fn url_alphabet_and_bad_input() {
        let bytes = [0xfb, 0xff, 0xbf];
        assert_eq!(encode(&bytes), "+/+/");
        assert_eq!(encode_url(&bytes), "-_-_");
        assert_eq!(decode_url(b"-_-_").as_deref(), Some(&bytes[..]));
        assert_eq!(decode_url(b"+/+/"), None);
        assert_eq!(decode_url(b"a"), None);
        assert_eq!(decode_url(b"ab c"), None);
        assert!(is_url("abc-_=="));
        assert!(!is_url("ab/c"));
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode_url(encode_url(&all).as_bytes()), Some(all));
    }
}
