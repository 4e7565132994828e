//! `application/x-www-form-urlencoded` as the OAuth client writes it: a
//! token request's body (RFC 6749 §4.4.2, Appendix B) and the client id and
//! secret inside an HTTP Basic credential (RFC 6749 §2.3.1). The WHATWG URL
//! standard's form serializer: UTF-8, alphanumerics and `*-._` kept, space
//! as `+`, every other byte `%XX` in uppercase hex. Pure.

use crate::credentials::b64;

const HEX: &[u8; 16] = b"0123456789ABCDEF";

/// Whether the serializer writes `b` as it is (the WHATWG
/// application/x-www-form-urlencoded percent-encode set's complement,
/// which is RFC 6749 Appendix B's set as well).
fn kept(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'*' | b'-' | b'.' | b'_')
}

/// Appends `s` form-encoded to `out`.
fn push_encoded(out: &mut String, s: &str) {
    for b in s.bytes() {
        if kept(b) {
            out.push(char::from(b));
        } else if b == b' ' {
            out.push('+');
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0x0f)]));
        }
    }
}

/// The pairs as a form body: `name=value` joined by `&`, in order, each
/// part encoded. No pairs give the empty string.
pub fn encode(pairs: &[(&str, &str)]) -> String {
    let mut out = String::with_capacity(pairs.iter().map(|(n, v)| n.len() + v.len() + 2).sum());
    for (i, (name, value)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        push_encoded(&mut out, name);
        out.push('=');
        push_encoded(&mut out, value);
    }
    out
}

/// The whole `Authorization` value for `client_secret_basic`:
/// `Basic base64(form(id) ":" form(secret))`. RFC 6749 §2.3.1 has the id
/// and secret form-encoded before they are joined, so a colon in the id
/// (which RFC 7617 §2 forbids in a user-id) arrives as `%3A`, and the
/// server decodes both halves the same way.
pub fn basic(client_id: &str, secret: &str) -> String {
    let mut pair = String::with_capacity(3 * (client_id.len() + secret.len()) + 1);
    push_encoded(&mut pair, client_id);
    pair.push(':');
    push_encoded(&mut pair, secret);
    format!("Basic {}", b64::encode(pair.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A form decoder, the serializer's twin: `+` is a space and `%XX` a
    /// byte; `None` for a malformed escape or bytes that are not UTF-8.
    fn decode(s: &str) -> Option<String> {
        let mut out = Vec::new();
        let mut bytes = s.bytes();
        while let Some(b) = bytes.next() {
            match b {
                b'+' => out.push(b' '),
                b'%' => {
                    let hex = [bytes.next()?, bytes.next()?];
                    out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
                }
                b => out.push(b),
            }
        }
        String::from_utf8(out).ok()
    }

    fn pairs_of(body: &str) -> Vec<(String, String)> {
        body.split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (n, v) = p.split_once('=').unwrap();
                (decode(n).unwrap(), decode(v).unwrap())
            })
            .collect()
    }

    #[test]
    fn encodes_bytes_as_the_form_serializer_does() {
        let cases: &[(&str, &str)] = &[
            ("", ""),
            ("abcXYZ019", "abcXYZ019"),
            ("*-._", "*-._"),
            (" ", "+"),
            ("a b  c", "a+b++c"),
            ("~", "%7E"),
            ("+", "%2B"),
            ("%", "%25"),
            ("&=", "%26%3D"),
            (":/?#[]@", "%3A%2F%3F%23%5B%5D%40"),
            ("!$'()", "%21%24%27%28%29"),
            ("\"\\", "%22%5C"),
            ("\t\n\r\0\x7f", "%09%0A%0D%00%7F"),
            ("é", "%C3%A9"),
            ("€", "%E2%82%AC"),
            ("😀", "%F0%9F%98%80"),
            // RFC 6749 Appendix B's example.
            (" %&+£€", "+%25%26%2B%C2%A3%E2%82%AC"),
        ];
        for (value, want) in cases {
            assert_eq!(encode(&[("", value)]), format!("={want}"), "{value:?}");
            assert_eq!(encode(&[(value, "")]), format!("{want}="), "{value:?}");
            assert_eq!(decode(want).as_deref(), Some(*value), "{want}");
        }
    }

    #[test]
    fn pairs_join_in_order() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[], ""),
            (&[("grant_type", "client_credentials")], "grant_type=client_credentials"),
            (
                &[("grant_type", "client_credentials"), ("scope", "files:read files:write")],
                "grant_type=client_credentials&scope=files%3Aread+files%3Awrite",
            ),
            (
                &[("resource", "https://mcp.example.com/mcp?x=1&y=2")],
                "resource=https%3A%2F%2Fmcp.example.com%2Fmcp%3Fx%3D1%26y%3D2",
            ),
            (&[("a", ""), ("", "b"), ("", "")], "a=&=b&="),
            (&[("a&b", "c=d")], "a%26b=c%3Dd"),
        ];
        for (pairs, want) in cases {
            assert_eq!(encode(pairs), *want, "{pairs:?}");
        }
    }

    #[test]
    fn every_string_round_trips() {
        use crate::test_rng::Rng;
        let alphabet: Vec<char> = " azAZ09*-._~+%&=:/?#\"\\\t\n\0é€😀\u{7f}".chars().collect();
        let mut r = Rng(0xF0_4D5E);
        for _ in 0..2_000 {
            let word = |r: &mut Rng| (0..r.below(12)).map(|_| r.pick(&alphabet)).collect::<String>();
            let (n1, v1, n2, v2) = (word(&mut r), word(&mut r), word(&mut r), word(&mut r));
            let body = encode(&[(&n1, &v1), (&n2, &v2)]);
            // Only the serializer's bytes, and the pairs come back.
            assert!(body.bytes().all(|b| kept(b) || matches!(b, b'+' | b'%' | b'&' | b'=')), "{body}");
            assert_eq!(pairs_of(&body), [(n1, v1), (n2, v2)], "{body}");
        }
    }

    #[test]
    fn basic_encodes_id_and_secret_before_base64() {
        let cases: &[(&str, &str, &str)] = &[
            // RFC 7617 §2's example, where form-encoding changes nothing.
            ("Aladdin", "open sesame", "Aladdin:open+sesame"),
            ("client-1", "s3cret", "client-1:s3cret"),
            // A colon in either half stays inside its half (RFC 6749
            // §2.3.1): the one unescaped colon is the separator.
            ("urn:client:1", "pa:ss", "urn%3Aclient%3A1:pa%3Ass"),
            ("id", "a+b/c=", "id:a%2Bb%2Fc%3D"),
            ("é", "€ 1", "%C3%A9:%E2%82%AC+1"),
            ("", "", ":"),
        ];
        for (id, secret, pair) in cases {
            let got = basic(id, secret);
            assert_eq!(got, format!("Basic {}", b64::encode(pair.as_bytes())), "{id:?} {secret:?}");
            let (enc_id, enc_secret) = pair.split_once(':').unwrap();
            assert!(!enc_id.contains(':') && !enc_secret.contains(':'));
            assert_eq!(
                (decode(enc_id).as_deref(), decode(enc_secret).as_deref()),
                (Some(*id), Some(*secret))
            );
        }
        // RFC 7617 §2's credential, byte for byte (its secret has a space,
        // which the form encoding makes `+`, so only the id is shared).
        assert_eq!(basic("Aladdin", "opensesame"), "Basic QWxhZGRpbjpvcGVuc2VzYW1l");
    }
}
