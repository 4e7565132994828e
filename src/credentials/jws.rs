//! Signed JWTs for the OAuth client (RFC 7515 compact JWS): a
//! `private_key_jwt` client assertion (RFC 7523 §2.2 and §3) and a DPoP
//! proof (RFC 9449 §4.2), signed ES256 with an EC P-256 key or RS256 with
//! an RSA key (RFC 7518 §3.4, §3.3) by ring, which TLS already brings.
//!
//! Keys come from PEM in the three forms tools write: PKCS#8 `PRIVATE KEY`
//! (an EC P-256 or RSA key), SEC1 `EC PRIVATE KEY` and PKCS#1 `RSA PRIVATE
//! KEY`; a DPoP key can also be made here. The DER inside is read only far
//! enough to say what is wrong with a key ring would refuse with a bare
//! "InvalidEncoding" (another curve, another algorithm, too short, no
//! public key); ring then parses and checks the key itself.
//!
//! Pure but for the system's random source (ECDSA nonces, `jti`s, a new
//! key): no file, no clock (time comes in as unix seconds). JSON is written
//! with the project's string writer, and neither an error nor `Debug`
//! shows a byte of a key.

use std::fmt;

use ring::digest::{digest, SHA256};
use ring::rand::{SecureRandom, SystemRandom};
use ring::signature::{
    EcdsaKeyPair, KeyPair as _, RsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING, RSA_PKCS1_SHA256,
};
use rustls_pki_types::pem::{PemObject, SectionKind};

use crate::credentials::b64::encode_url;
use crate::mcp::json::write_json_string;

/// A client assertion's lifetime (`exp - iat`). RFC 7523 §3 leaves it to
/// the authorization server; the assertion is used at once, so five
/// minutes only covers clock skew.
pub const ASSERTION_LIFETIME_SECS: u64 = 300;

/// The JWS `alg` a key signs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Alg {
    /// ECDSA P-256 with SHA-256, the signature as `r || s` (RFC 7518 §3.4).
    Es256,
    /// RSASSA-PKCS1-v1_5 with SHA-256 (RFC 7518 §3.3).
    Rs256,
}

impl Alg {
    /// The `alg` header value.
    pub fn as_str(self) -> &'static str {
        match self {
            Alg::Es256 => "ES256",
            Alg::Rs256 => "RS256",
        }
    }
}

/// Why a key could not be loaded or a JWT signed. The text says what is
/// wrong and, where there is one, how to fix it; it never holds key bytes
/// (ring's own reason, when it refuses, is one of its fixed words).
#[derive(Debug)]
pub enum KeyError {
    /// No private key section in the text.
    NotPem,
    /// A section without its END line, or a body that is not base64.
    Armour,
    /// A private key section that is not the only one.
    SeveralKeys,
    /// A passphrase-protected key (PKCS#8 `ENCRYPTED PRIVATE KEY`, or
    /// OpenSSL's legacy `Proc-Type: 4,ENCRYPTED`).
    Encrypted,
    /// The DER inside the armour is not the structure its label names.
    Malformed(&'static str),
    /// A key of another algorithm (named when known).
    Algorithm(&'static str),
    /// An EC key on a curve other than P-256.
    Curve,
    /// An EC key whose curve is spelled out instead of named by its OID.
    ExplicitCurve,
    /// An EC key without its public key (optional in RFC 5915 §3; ring
    /// needs it and has no public way to compute it from the private one).
    NoPublicKey,
    /// An RSA modulus of this many bits, under 2048.
    RsaTooShort(usize),
    /// An RSA modulus of this many bits, over ring's 4096.
    RsaTooLong(usize),
    /// ring refused a key that looked well formed.
    Rejected(ring::error::KeyRejected),
    /// A client assertion with no audience (`aud` is required, RFC 7523 §3).
    NoAudience,
    /// The system's random source failed.
    Random,
    /// The signature could not be made.
    Sign,
}

impl fmt::Display for KeyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyError::NotPem => f.write_str(
                "not a PEM private key (no PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY section)",
            ),
            KeyError::Armour => {
                f.write_str("broken PEM armour (a section without its END line, or not base64)")
            }
            KeyError::SeveralKeys => f.write_str("more than one private key in the PEM"),
            KeyError::Encrypted => f.write_str(
                "an encrypted private key: decrypt it first (openssl pkey -in KEY -out PLAIN.pem)",
            ),
            KeyError::Malformed(what) => write!(f, "not a well-formed {what}"),
            KeyError::Algorithm(what) => {
                write!(f, "{what}: only EC P-256 (ES256) and RSA (RS256) keys can sign")
            }
            KeyError::Curve => f.write_str("an EC key on a curve other than P-256"),
            KeyError::ExplicitCurve => f.write_str(
                "an EC key with explicit curve parameters: P-256 must be named by its OID \
                 (openssl ec -in KEY -param_enc named_curve -out FIXED.pem)",
            ),
            KeyError::NoPublicKey => f.write_str(
                "an EC key without its public key, which signing here needs \
                 (openssl ec -in KEY -out FIXED.pem writes it back)",
            ),
            KeyError::RsaTooShort(bits) => write!(f, "RSA key shorter than 2048 bits ({bits})"),
            KeyError::RsaTooLong(bits) => write!(f, "RSA key longer than 4096 bits ({bits})"),
            KeyError::Rejected(why) => write!(f, "the key is not valid ({why})"),
            KeyError::NoAudience => f.write_str("a client assertion needs an audience"),
            KeyError::Random => f.write_str("the system's random source failed"),
            KeyError::Sign => f.write_str("signing failed"),
        }
    }
}

impl std::error::Error for KeyError {}

/// A private key that signs JWTs, and its public JWK.
pub struct SigningKey {
    pair: Pair,
    rng: SystemRandom,
    /// The public JWK, made once (it is in every DPoP proof).
    jwk: String,
}

enum Pair {
    Es256(EcdsaKeyPair),
    Rs256(RsaKeyPair),
}

/// Only the algorithm: the key's bytes never reach a log.
impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey").field("alg", &self.alg()).finish_non_exhaustive()
    }
}

impl SigningKey {
    /// The one private key in `pem`: PKCS#8 `PRIVATE KEY` (EC P-256 or
    /// RSA), SEC1 `EC PRIVATE KEY` (P-256) or PKCS#1 `RSA PRIVATE KEY`.
    /// Other sections (a certificate, `EC PARAMETERS`) are skipped.
    pub fn from_pem(pem: &[u8]) -> Result<SigningKey, KeyError> {
        if memchr::memmem::find(pem, b"-----BEGIN ENCRYPTED PRIVATE KEY-----").is_some()
            || memchr::memmem::find(pem, b"Proc-Type: 4,ENCRYPTED").is_some()
        {
            return Err(KeyError::Encrypted);
        }
        let mut key = None;
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
            let (kind, der) = section.map_err(|_| KeyError::Armour)?;
            if matches!(
                kind,
                SectionKind::PrivateKey | SectionKind::EcPrivateKey | SectionKind::RsaPrivateKey
            ) {
                if key.is_some() {
                    return Err(KeyError::SeveralKeys);
                }
                key = Some((kind, der));
            }
        }
        match key {
            Some((SectionKind::PrivateKey, der)) => SigningKey::from_pkcs8(&der),
            Some((SectionKind::EcPrivateKey, der)) => SigningKey::from_sec1(&der),
            Some((SectionKind::RsaPrivateKey, der)) => SigningKey::from_pkcs1(&der),
            _ => Err(KeyError::NotPem),
        }
    }

    /// A new P-256 key (a DPoP key made at start).
    pub fn generate_p256() -> Result<SigningKey, KeyError> {
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .map_err(|_| KeyError::Random)?;
        let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .map_err(KeyError::Rejected)?;
        SigningKey::new(Pair::Es256(pair), rng)
    }

    pub fn alg(&self) -> Alg {
        match self.pair {
            Pair::Es256(_) => Alg::Es256,
            Pair::Rs256(_) => Alg::Rs256,
        }
    }

    /// The public key as a JWK's JSON text: `{"crv":"P-256","kty":"EC",
    /// "x":..,"y":..}` (RFC 7518 §6.2) or `{"e":..,"kty":"RSA","n":..}`
    /// (§6.3). The members are the required ones in lexicographic order
    /// with no white space, so the text is also the RFC 7638 §3 thumbprint
    /// input.
    pub fn public_jwk(&self) -> String {
        self.jwk.clone()
    }

    /// The RFC 7638 JWK thumbprint (SHA-256, base64url): DPoP's `jkt`.
    pub fn thumbprint(&self) -> String {
        thumbprint_of(&self.jwk)
    }

    /// The compact JWS `b64url(header).b64url(claims).b64url(signature)`
    /// (RFC 7515 §7.1) of the two JSON texts, which are signed as given.
    pub fn sign(&self, header_json: &str, claims_json: &str) -> Result<String, KeyError> {
        let mut jws = encode_url(header_json.as_bytes());
        jws.push('.');
        jws.push_str(&encode_url(claims_json.as_bytes()));
        let signature = match &self.pair {
            Pair::Es256(pair) => {
                pair.sign(&self.rng, jws.as_bytes()).map_err(|_| KeyError::Sign)?.as_ref().to_vec()
            }
            Pair::Rs256(pair) => {
                let mut signature = vec![0; pair.public().modulus_len()];
                pair.sign(&RSA_PKCS1_SHA256, &self.rng, jws.as_bytes(), &mut signature)
                    .map_err(|_| KeyError::Sign)?;
                signature
            }
        };
        jws.push('.');
        jws.push_str(&encode_url(&signature));
        Ok(jws)
    }

    fn from_pkcs8(der: &[u8]) -> Result<SigningKey, KeyError> {
        let rng = SystemRandom::new();
        let pair = match pkcs8_kind(der)? {
            Alg::Es256 => Pair::Es256(
                EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, der, &rng)
                    .map_err(KeyError::Rejected)?,
            ),
            Alg::Rs256 => Pair::Rs256(RsaKeyPair::from_pkcs8(der).map_err(KeyError::Rejected)?),
        };
        SigningKey::new(pair, rng)
    }

    /// A SEC1 key is checked, then handed to ring as the PKCS#8 it would
    /// be inside (ring reads EC keys only as PKCS#8).
    fn from_sec1(der: &[u8]) -> Result<SigningKey, KeyError> {
        let ec = ec_private_key(der).ok_or(KeyError::Malformed("EC PRIVATE KEY (RFC 5915)"))?;
        match ec.curve {
            Some(Curve::Named(oid)) if oid == OID_P256 => {}
            Some(Curve::Named(_)) => return Err(KeyError::Curve),
            Some(Curve::Explicit) => return Err(KeyError::ExplicitCurve),
            // RFC 5915 §3: a SEC1 key on its own MUST name its curve.
            None => return Err(KeyError::Malformed("EC PRIVATE KEY (RFC 5915): no curve named")),
        }
        if !ec.has_public_key {
            return Err(KeyError::NoPublicKey);
        }
        SigningKey::from_pkcs8(&sec1_in_pkcs8(der))
    }

    fn from_pkcs1(der: &[u8]) -> Result<SigningKey, KeyError> {
        rsa_size_check(der, "RSA PRIVATE KEY (RFC 8017 A.1.2)")?;
        let pair = RsaKeyPair::from_der(der).map_err(KeyError::Rejected)?;
        SigningKey::new(Pair::Rs256(pair), SystemRandom::new())
    }

    fn new(pair: Pair, rng: SystemRandom) -> Result<SigningKey, KeyError> {
        let jwk = match &pair {
            Pair::Es256(pair) => {
                // SEC1 §2.3.3's uncompressed point: 0x04 || x || y.
                let point = pair.public_key().as_ref();
                match (point.first(), point.get(1..33), point.get(33..65)) {
                    (Some(4), Some(x), Some(y)) if point.len() == 65 => ec_jwk(x, y),
                    _ => return Err(KeyError::Malformed("P-256 public key")),
                }
            }
            Pair::Rs256(pair) => {
                let public = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(pair.public());
                rsa_jwk(&public.n, &public.e)
            }
        };
        Ok(SigningKey { pair, rng, jwk })
    }
}

/// 16 random bytes in base64url: a `jti` (RFC 7519 §4.1.7) that does not
/// repeat.
pub fn random_id() -> Result<String, KeyError> {
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).map_err(|_| KeyError::Random)?;
    Ok(encode_url(&bytes))
}

/// A `private_key_jwt` client assertion (RFC 7523 §2.2, claims per §3):
/// `iss` and `sub` are the client id, `aud` the authorization server (one
/// string, or an array when there are several), `iat` now, `exp` five
/// minutes later and `jti` the caller's (`random_id`).
pub fn client_assertion(
    key: &SigningKey,
    client_id: &str,
    audiences: &[&str],
    now: u64,
    jti: &str,
) -> Result<String, KeyError> {
    let header = Object::new().string("alg", key.alg().as_str()).string("typ", "JWT").end();
    let claims = Object::new().string("iss", client_id).string("sub", client_id);
    let claims = match audiences {
        [] => return Err(KeyError::NoAudience),
        [one] => claims.string("aud", one),
        several => claims.strings("aud", several),
    };
    let claims = claims
        .number("iat", now)
        .number("exp", now.saturating_add(ASSERTION_LIFETIME_SECS))
        .string("jti", jti)
        .end();
    key.sign(&header, &claims)
}

/// A DPoP proof (RFC 9449 §4.2) for one request: the public key in the
/// header; `htm` the method, `htu` the URI without its query and fragment
/// (cut here too), `iat`, `jti`, `ath` (the base64url SHA-256 of the access
/// token, §4.3) when the proof goes with a token, and the server's
/// `DPoP-Nonce` when it sent one (§8).
pub fn dpop_proof(
    key: &SigningKey,
    htm: &str,
    htu: &str,
    now: u64,
    jti: &str,
    access_token: Option<&str>,
    nonce: Option<&str>,
) -> Result<String, KeyError> {
    let header =
        Object::new().string("alg", key.alg().as_str()).raw("jwk", &key.jwk).string("typ", "dpop+jwt").end();
    let htu = htu.find(['?', '#']).and_then(|at| htu.get(..at)).unwrap_or(htu);
    let mut claims =
        Object::new().string("htm", htm).string("htu", htu).number("iat", now).string("jti", jti);
    if let Some(token) = access_token {
        claims = claims.string("ath", &encode_url(digest(&SHA256, token.as_bytes()).as_ref()));
    }
    if let Some(nonce) = nonce {
        claims = claims.string("nonce", nonce);
    }
    key.sign(&header, &claims.end())
}

/// RFC 7638 §3: the base64url SHA-256 of the JWK's canonical text.
fn thumbprint_of(jwk: &str) -> String {
    encode_url(digest(&SHA256, jwk.as_bytes()).as_ref())
}

/// RFC 7518 §6.2.1: the coordinates as they are (32 bytes each for P-256).
fn ec_jwk(x: &[u8], y: &[u8]) -> String {
    Object::new()
        .string("crv", "P-256")
        .string("kty", "EC")
        .string("x", &encode_url(x))
        .string("y", &encode_url(y))
        .end()
}

/// RFC 7518 §6.3.1: the modulus and the exponent big-endian, without
/// leading zero bytes.
fn rsa_jwk(n: &[u8], e: &[u8]) -> String {
    let unsigned = |v: &[u8]| v.get(v.iter().take_while(|&&b| b == 0).count()..).map(encode_url);
    Object::new()
        .string("e", &unsigned(e).unwrap_or_default())
        .string("kty", "RSA")
        .string("n", &unsigned(n).unwrap_or_default())
        .end()
}

/// A JSON object written member by member, in the order given, with no
/// white space; every string goes through `write_json_string`.
struct Object(Vec<u8>);

impl Object {
    fn new() -> Object {
        Object(vec![b'{'])
    }

    fn name(mut self, name: &str) -> Object {
        if self.0.len() > 1 {
            self.0.push(b',');
        }
        write_json_string(name, &mut self.0);
        self.0.push(b':');
        self
    }

    fn string(self, name: &str, value: &str) -> Object {
        let mut o = self.name(name);
        write_json_string(value, &mut o.0);
        o
    }

    fn strings(self, name: &str, values: &[&str]) -> Object {
        let mut o = self.name(name);
        o.0.push(b'[');
        for (i, value) in values.iter().enumerate() {
            if i > 0 {
                o.0.push(b',');
            }
            write_json_string(value, &mut o.0);
        }
        o.0.push(b']');
        o
    }

    fn number(self, name: &str, value: u64) -> Object {
        let mut o = self.name(name);
        o.0.extend_from_slice(value.to_string().as_bytes());
        o
    }

    /// A member whose value is JSON text already (the JWK).
    fn raw(self, name: &str, json: &str) -> Object {
        let mut o = self.name(name);
        o.0.extend_from_slice(json.as_bytes());
        o
    }

    fn end(mut self) -> String {
        self.0.push(b'}');
        // Only `&str`s and ASCII went in, so the bytes are UTF-8 and
        // nothing is replaced.
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

// ---------------------------------------------------------------------
// Just enough DER (X.690 §10: definite lengths) to tell keys apart.

const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OBJECT_IDENTIFIER: u8 = 0x06;
const SEQUENCE: u8 = 0x30;
/// ECPrivateKey's `[0] parameters` and `[1] publicKey` (EXPLICIT tags).
const CONTEXT_0: u8 = 0xa0;
const CONTEXT_1: u8 = 0xa1;

/// OBJECT IDENTIFIER contents (no tag, no length).
/// id-ecPublicKey, 1.2.840.10045.2.1 (RFC 5480 §2.1.1).
const OID_EC_PUBLIC_KEY: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];
/// secp256r1 (prime256v1, P-256), 1.2.840.10045.3.1.7 (RFC 5480 §2.1.1.1).
const OID_P256: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x03, 0x01, 0x07];
/// rsaEncryption, 1.2.840.113549.1.1.1 (RFC 8017 A.1).
const OID_RSA: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01];
/// Keys of other algorithms, named in the error: RFC 8410 §3, RFC 4055
/// §3.1 (RSASSA-PSS), RFC 3279 §2.3.2 (DSA).
const OTHER_ALGORITHMS: &[(&[u8], &str)] = &[
    (&[0x2b, 0x65, 0x70], "an Ed25519 key"),
    (&[0x2b, 0x65, 0x71], "an Ed448 key"),
    (&[0x2b, 0x65, 0x6e], "an X25519 key"),
    (&[0x2b, 0x65, 0x6f], "an X448 key"),
    (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x0a], "an RSA-PSS key"),
    (&[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01], "a DSA key"),
];

/// One element off the front of `input`: its tag, its contents and what
/// follows. Lengths of up to three bytes (16 MiB) are read; an indefinite
/// length (BER, not DER) is refused.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = match first {
        0..=0x7f => (usize::from(first), rest),
        0x81..=0x83 => {
            let (bytes, rest) = rest.split_at_checked(usize::from(first & 0x7f))?;
            (bytes.iter().fold(0usize, |acc, &b| acc << 8 | usize::from(b)), rest)
        }
        _ => return None,
    };
    let (contents, rest) = rest.split_at_checked(len)?;
    Some((tag, contents, rest))
}

/// The contents of the element at the front of `input` if its tag is
/// `tag`, and what follows it.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    match element(input)? {
        (found, contents, rest) if found == tag => Some((contents, rest)),
        _ => None,
    }
}

/// The contents of `input` if it is one element of tag `tag` and nothing
/// after it.
fn whole(input: &[u8], tag: u8) -> Option<&[u8]> {
    match expect(input, tag)? {
        (contents, []) => Some(contents),
        _ => None,
    }
}

/// Which key a PKCS#8 PrivateKeyInfo (RFC 5208 §5; RFC 5958 §2 calls it
/// OneAsymmetricKey) holds, and whether ring can sign with it:
///
/// ```text
/// PrivateKeyInfo ::= SEQUENCE {
///   version              INTEGER,              -- 0 (v1) or 1 (v2)
///   privateKeyAlgorithm  AlgorithmIdentifier,  -- SEQUENCE { OID, parameters }
///   privateKey           OCTET STRING,         -- ECPrivateKey / RSAPrivateKey
///   attributes       [0] IMPLICIT ... OPTIONAL,
///   publicKey        [1] IMPLICIT ... OPTIONAL }  -- v2 only
/// ```
fn pkcs8_kind(der: &[u8]) -> Result<Alg, KeyError> {
    let (oid, parameters, private_key) = whole(der, SEQUENCE)
        .and_then(|info| expect(info, INTEGER))
        .and_then(|(_version, rest)| expect(rest, SEQUENCE))
        .and_then(|(algorithm, rest)| {
            Some((expect(algorithm, OBJECT_IDENTIFIER)?, expect(rest, OCTET_STRING)?))
        })
        .map(|((oid, parameters), (private_key, _attributes))| (oid, parameters, private_key))
        .ok_or(KeyError::Malformed("PRIVATE KEY (PKCS#8, RFC 5208)"))?;
    if oid == OID_EC_PUBLIC_KEY {
        // RFC 5480 §2.1.1: ECParameters ::= CHOICE { namedCurve OID,
        // implicitCurve NULL, specifiedCurve SpecifiedECDomain }.
        match expect(parameters, OBJECT_IDENTIFIER) {
            Some((curve, _)) if curve == OID_P256 => {}
            Some(_) => return Err(KeyError::Curve),
            None => return Err(KeyError::ExplicitCurve),
        }
        let ec = ec_private_key(private_key).ok_or(KeyError::Malformed("EC key in PKCS#8 (RFC 5915)"))?;
        if matches!(ec.curve, Some(Curve::Named(curve)) if curve != OID_P256) {
            return Err(KeyError::Curve);
        }
        if !ec.has_public_key {
            return Err(KeyError::NoPublicKey);
        }
        Ok(Alg::Es256)
    } else if oid == OID_RSA {
        rsa_size_check(private_key, "RSA key in PKCS#8 (RFC 8017 A.1.2)")?;
        Ok(Alg::Rs256)
    } else {
        let named = OTHER_ALGORITHMS.iter().find(|(known, _)| *known == oid).map(|(_, name)| *name);
        Err(KeyError::Algorithm(named.unwrap_or("a key of another algorithm")))
    }
}

/// What an ECPrivateKey says about its curve.
enum Curve<'a> {
    /// `namedCurve`: the OID's contents.
    Named(&'a [u8]),
    /// `specifiedCurve` or `implicitCurve`.
    Explicit,
}

/// The parts of an ECPrivateKey that decide whether it can be used.
struct EcPrivateKey<'a> {
    curve: Option<Curve<'a>>,
    has_public_key: bool,
}

/// Reads an ECPrivateKey (RFC 5915 §3, the SEC1 form):
///
/// ```text
/// ECPrivateKey ::= SEQUENCE {
///   version        INTEGER { ecPrivkeyVer1(1) },
///   privateKey     OCTET STRING,               -- the scalar, big-endian
///   parameters [0] ECParameters OPTIONAL,      -- RFC 5480 §2.1.1
///   publicKey  [1] BIT STRING OPTIONAL }       -- 0x04 || x || y
/// ```
fn ec_private_key(der: &[u8]) -> Option<EcPrivateKey<'_>> {
    let key = whole(der, SEQUENCE)?;
    let (version, rest) = expect(key, INTEGER)?;
    if version != [1] {
        return None;
    }
    let (_scalar, mut rest) = expect(rest, OCTET_STRING)?;
    let mut curve = None;
    if let Some((parameters, after)) = expect(rest, CONTEXT_0) {
        curve = Some(match whole(parameters, OBJECT_IDENTIFIER) {
            Some(oid) => Curve::Named(oid),
            None => Curve::Explicit,
        });
        rest = after;
    }
    let has_public_key = match expect(rest, CONTEXT_1) {
        Some((public_key, [])) => whole(public_key, BIT_STRING).is_some_and(|bits| bits.len() > 1),
        Some(_) => return None,
        None if rest.is_empty() => false,
        None => return None,
    };
    Some(EcPrivateKey { curve, has_public_key })
}

/// Refuses an RSAPrivateKey (RFC 8017 A.1.2: SEQUENCE { version, modulus,
/// publicExponent, .. }) whose modulus ring cannot sign with: 2048 to 4096
/// bits.
fn rsa_size_check(der: &[u8], what: &'static str) -> Result<(), KeyError> {
    let modulus = whole(der, SEQUENCE)
        .and_then(|key| expect(key, INTEGER))
        .and_then(|(_version, rest)| expect(rest, INTEGER))
        .map(|(modulus, _)| modulus)
        .ok_or(KeyError::Malformed(what))?;
    let significant = modulus.get(modulus.iter().take_while(|&&b| b == 0).count()..).unwrap_or_default();
    let bits = match significant.first() {
        Some(&top) => significant.len() * 8 - top.leading_zeros() as usize,
        None => 0,
    };
    match bits {
        0..=2047 => Err(KeyError::RsaTooShort(bits)),
        2048..=4096 => Ok(()),
        _ => Err(KeyError::RsaTooLong(bits)),
    }
}

/// The PKCS#8 PrivateKeyInfo (RFC 5208 §5) around a SEC1 ECPrivateKey
/// (RFC 5915 §3), as `openssl pkcs8 -topk8` writes it:
///
/// ```text
/// SEQUENCE {
///   INTEGER 0,                                  -- version v1
///   SEQUENCE {                                  -- RFC 5480 §2.1.1
///     OBJECT IDENTIFIER 1.2.840.10045.2.1,      -- id-ecPublicKey
///     OBJECT IDENTIFIER 1.2.840.10045.3.1.7 },  -- namedCurve P-256
///   OCTET STRING { the ECPrivateKey as it is } }
/// ```
///
/// The ECPrivateKey keeps its `[0] parameters`; ring accepts them when
/// they name the same curve (checked before this).
fn sec1_in_pkcs8(sec1: &[u8]) -> Vec<u8> {
    let mut algorithm = Vec::with_capacity(21);
    push_element(&mut algorithm, OBJECT_IDENTIFIER, OID_EC_PUBLIC_KEY);
    push_element(&mut algorithm, OBJECT_IDENTIFIER, OID_P256);
    let mut info = Vec::with_capacity(sec1.len() + 32);
    push_element(&mut info, INTEGER, &[0]);
    push_element(&mut info, SEQUENCE, &algorithm);
    push_element(&mut info, OCTET_STRING, sec1);
    let mut out = Vec::with_capacity(info.len() + 4);
    push_element(&mut out, SEQUENCE, &info);
    out
}

/// Appends one DER element: the tag, the length in its shortest form
/// (X.690 §10.1) and the contents.
fn push_element(out: &mut Vec<u8>, tag: u8, contents: &[u8]) {
    out.push(tag);
    match u8::try_from(contents.len()) {
        Ok(short) if short < 0x80 => out.push(short),
        _ => {
            let len = contents.len().to_be_bytes();
            let skip = len.iter().take_while(|&&b| b == 0).count();
            let digits = len.get(skip..).unwrap_or_default();
            out.push(0x80 | digits.len() as u8);
            out.extend_from_slice(digits);
        }
    }
    out.extend_from_slice(contents);
}

#[cfg(test)]
mod tests {
    // The tests that need openssl or node are Unix-only (see `have`); their
    // helpers are then unused in the Windows build (run under wine).
    #![cfg_attr(not(unix), allow(dead_code, unused_imports))]
    use super::*;
    use crate::credentials::b64::{decode_url, encode};
    use ring::signature::{UnparsedPublicKey, ECDSA_P256_SHA256_FIXED, RSA_PKCS1_2048_8192_SHA256};
    use serde_json::Value;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// A fresh scratch directory for one test (tests run in parallel in
    /// one process).
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("jws-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Whether `tool` runs. A test that needs a missing tool fails when
    /// `CI` is set and is skipped, saying why, otherwise.
    fn have(tool: &str, version_arg: &str) -> bool {
        // The Windows test build runs under wine, which cannot start the
        // Linux openssl and node: the tests that need them are compiled for
        // Unix only, and `rsa_key`'s RS256 cases run on Unix only (the
        // signing code is the same ring code on every platform).
        if cfg!(not(unix)) {
            return false;
        }
        let runs = Command::new(tool).arg(version_arg).output().is_ok_and(|o| o.status.success());
        if !runs {
            assert!(std::env::var_os("CI").is_none(), "{tool} is needed by this test and CI is set");
            eprintln!("skipped: {tool} not found (with CI set this test fails instead)");
        }
        runs
    }

    /// Runs `argv` in `dir`, which must succeed; its stdout.
    fn run(dir: &Path, argv: &[&str]) -> String {
        let (program, args) = argv.split_first().unwrap();
        let out = Command::new(program).args(args).current_dir(dir).output().unwrap();
        assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    }

    /// A compact JWS's header and claims (parsed), signing input and
    /// signature.
    fn parts(jws: &str) -> (Value, Value, String, Vec<u8>) {
        let pieces: Vec<&str> = jws.split('.').collect();
        assert_eq!(pieces.len(), 3, "{jws}");
        let json = |s: &str| serde_json::from_slice(&decode_url(s.as_bytes()).unwrap()).unwrap();
        (
            json(pieces[0]),
            json(pieces[1]),
            format!("{}.{}", pieces[0], pieces[1]),
            decode_url(pieces[2].as_bytes()).unwrap(),
        )
    }

    /// Checks `jws`'s signature with ring's verifier against the public key
    /// read back out of `jwk` (the JWK's text, as `public_jwk` gives it).
    fn verify_with_ring(jwk: &str, jws: &str) {
        let jwk: Value = serde_json::from_str(jwk).unwrap();
        let (_, _, input, signature) = parts(jws);
        let member = |name: &str| decode_url(jwk[name].as_str().unwrap().as_bytes()).unwrap();
        match jwk["kty"].as_str().unwrap() {
            "EC" => {
                let point = [&[4u8][..], &member("x"), &member("y")].concat();
                assert_eq!(point.len(), 65);
                UnparsedPublicKey::new(&ECDSA_P256_SHA256_FIXED, point)
                    .verify(input.as_bytes(), &signature)
                    .unwrap();
            }
            "RSA" => ring::signature::RsaPublicKeyComponents { n: member("n"), e: member("e") }
                .verify(&RSA_PKCS1_2048_8192_SHA256, input.as_bytes(), &signature)
                .unwrap(),
            other => panic!("kty {other}"),
        }
    }

    /// Node's view, from outside: the public JWK of `pem`'s key, and
    /// whether `jws` verifies under the JWK we made (imported as a JWK).
    const NODE_CHECK: &str = r#"
const c = require('crypto'), fs = require('fs');
const [pemFile, ourJwk, jws] = process.argv.slice(1);
const theirs = c.createPublicKey(fs.readFileSync(pemFile)).export({ format: 'jwk' });
const jwk = JSON.parse(ourJwk);
const key = c.createPublicKey({ key: jwk, format: 'jwk' });
const [h, p, s] = jws.split('.');
const opts = jwk.kty === 'EC' ? { key, dsaEncoding: 'ieee-p1363' } : key;
const ok = c.verify('sha256', Buffer.from(h + '.' + p), opts, Buffer.from(s, 'base64url'));
process.stdout.write(JSON.stringify({ theirs, verified: ok }));
"#;

    /// Node writes the keys it makes: KeyObject exports (PKCS#8, SEC1,
    /// PKCS#1) and WebCrypto's PKCS#8, which is what jose's `exportPKCS8`
    /// returns for the key the conformance suite's client-credentials-jwt
    /// scenario generates (base64 in 64-character lines, as jose writes it).
    const NODE_KEYS: &str = r#"
const c = require('crypto'), fs = require('fs');
const ec = c.generateKeyPairSync('ec', { namedCurve: 'P-256' }).privateKey;
const rsa = c.generateKeyPairSync('rsa', { modulusLength: 2048 }).privateKey;
fs.writeFileSync('ec-pkcs8-node.pem', ec.export({ type: 'pkcs8', format: 'pem' }));
fs.writeFileSync('ec-sec1-node.pem', ec.export({ type: 'sec1', format: 'pem' }));
fs.writeFileSync('rsa-pkcs8-node.pem', rsa.export({ type: 'pkcs8', format: 'pem' }));
fs.writeFileSync('rsa-pkcs1-node.pem', rsa.export({ type: 'pkcs1', format: 'pem' }));
(async () => {
  const pair = await c.webcrypto.subtle.generateKey({ name: 'ECDSA', namedCurve: 'P-256' }, true, ['sign']);
  const der = Buffer.from(await c.webcrypto.subtle.exportKey('pkcs8', pair.privateKey));
  const body = der.toString('base64').match(/.{1,64}/g).join('\n');
  fs.writeFileSync('ec-pkcs8-webcrypto.pem', `-----BEGIN PRIVATE KEY-----\n${body}\n-----END PRIVATE KEY-----\n`);
})();
"#;

    /// Every key form openssl and node write loads with the right
    /// algorithm; its JWK is the public key node reads from the same file;
    /// its signatures verify with ring against that JWK and with node from
    /// outside; the thumbprint is the JWK's SHA-256.
    #[test]
    #[cfg(unix)]
    fn keys_from_openssl_and_node_load_sign_and_verify() {
        if !have("openssl", "version") || !have("node", "--version") {
            return;
        }
        let dir = scratch("load");
        let made: &[(&str, &[&str], Alg)] = &[
            (
                "ec-pkcs8-openssl.pem",
                &["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
                Alg::Es256,
            ),
            // With an `EC PARAMETERS` section before the key.
            ("ec-sec1-ecparam.pem", &["openssl", "ecparam", "-name", "prime256v1", "-genkey"], Alg::Es256),
            ("ec-sec1-openssl.pem", &["openssl", "ec", "-in", "ec-pkcs8-openssl.pem"], Alg::Es256),
            (
                "rsa-pkcs8-openssl.pem",
                &["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
                Alg::Rs256,
            ),
            (
                "rsa-pkcs1-openssl.pem",
                &["openssl", "rsa", "-in", "rsa-pkcs8-openssl.pem", "-traditional"],
                Alg::Rs256,
            ),
            (
                "rsa-3072-openssl.pem",
                &["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072"],
                Alg::Rs256,
            ),
            ("ec-pkcs8-node.pem", &[], Alg::Es256),
            ("ec-sec1-node.pem", &[], Alg::Es256),
            ("rsa-pkcs8-node.pem", &[], Alg::Rs256),
            ("rsa-pkcs1-node.pem", &[], Alg::Rs256),
            ("ec-pkcs8-webcrypto.pem", &[], Alg::Es256),
        ];
        run(&dir, &["node", "-e", NODE_KEYS]);
        for (file, argv, _) in made {
            if !argv.is_empty() {
                let mut argv = argv.to_vec();
                argv.extend(["-out", file]);
                run(&dir, &argv);
            }
        }
        let labels =
            |pem: &str| pem.lines().filter(|l| l.starts_with("-----BEGIN")).collect::<Vec<_>>().join(" ");
        for (file, _, alg) in made {
            let pem = std::fs::read_to_string(dir.join(file)).unwrap();
            let key = SigningKey::from_pem(pem.as_bytes()).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(key.alg(), *alg, "{file}");
            assert_eq!(format!("{key:?}"), format!("SigningKey {{ alg: {alg:?}, .. }}"));
            let jwk = key.public_jwk();
            let header = format!(r#"{{"alg":"{}","typ":"JWT"}}"#, alg.as_str());
            let jws = key.sign(&header, r#"{"sub":"x"}"#).unwrap();
            verify_with_ring(&jwk, &jws);
            let (h, c, _, signature) = parts(&jws);
            assert_eq!(h["alg"], alg.as_str());
            assert_eq!(c["sub"], "x");
            assert_eq!(signature.len(), signature_len(&key), "{file}");
            assert_eq!(key.thumbprint(), thumbprint_of(&jwk));

            let node = run(&dir, &["node", "-e", NODE_CHECK, file, &jwk, &jws]);
            let node: Value = serde_json::from_str(&node).unwrap();
            assert_eq!(node["verified"], true, "{file}: node does not verify {jws}");
            let ours: Value = serde_json::from_str(&jwk).unwrap();
            assert_eq!(node["theirs"], ours, "{file} ({})", labels(&pem));
        }
    }

    /// A JWS signature's length: 64 bytes for ES256 (r || s), the modulus's for RS256.
    fn signature_len(key: &SigningKey) -> usize {
        match &key.pair {
            Pair::Rs256(pair) => pair.public().modulus_len(),
            Pair::Es256(_) => 64,
        }
    }

    /// Keys that cannot sign here are refused with the reason, and the
    /// reason holds nothing of the key. A key without its public key loads
    /// once repaired as the error says.
    #[test]
    #[cfg(unix)]
    fn keys_that_cannot_sign_are_refused_with_the_reason() {
        if !have("openssl", "version") {
            return;
        }
        let dir = scratch("refuse");
        let ec = |curve: &'static str| -> Vec<&'static str> {
            vec!["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", curve]
        };
        let p384 = ec("ec_paramgen_curve:P-384");
        let p256 = ec("ec_paramgen_curve:P-256");
        let cases: &[(&str, &[&str], fn(&KeyError) -> bool)] = &[
            ("p384-pkcs8.pem", &p384, |e| matches!(e, KeyError::Curve)),
            ("p384-sec1.pem", &["openssl", "ec", "-in", "p384-pkcs8.pem"], |e| matches!(e, KeyError::Curve)),
            ("k256-sec1.pem", &["openssl", "ecparam", "-name", "secp256k1", "-genkey"], |e| {
                matches!(e, KeyError::Curve)
            }),
            ("ed25519.pem", &["openssl", "genpkey", "-algorithm", "ed25519"], |e| {
                matches!(e, KeyError::Algorithm("an Ed25519 key"))
            }),
            ("rsa-pss.pem", &["openssl", "genpkey", "-algorithm", "RSA-PSS"], |e| {
                matches!(e, KeyError::Algorithm("an RSA-PSS key"))
            }),
            (
                "rsa-1024.pem",
                &["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:1024"],
                |e| matches!(e, KeyError::RsaTooShort(1024)),
            ),
            ("rsa-1024-pkcs1.pem", &["openssl", "rsa", "-in", "rsa-1024.pem", "-traditional"], |e| {
                matches!(e, KeyError::RsaTooShort(1024))
            }),
            ("ec.pem", &p256, |_| false),
            (
                "ec-encrypted.pem",
                &["openssl", "pkey", "-in", "ec.pem", "-aes256", "-passout", "pass:x"],
                |e| matches!(e, KeyError::Encrypted),
            ),
            (
                "rsa-legacy-encrypted.pem",
                &["openssl", "rsa", "-in", "rsa-1024.pem", "-traditional", "-aes128", "-passout", "pass:x"],
                |e| matches!(e, KeyError::Encrypted),
            ),
            ("ec-no-public-sec1.pem", &["openssl", "ec", "-in", "ec.pem", "-no_public"], |e| {
                matches!(e, KeyError::NoPublicKey)
            }),
            ("ec-no-public-pkcs8.pem", &["openssl", "pkey", "-in", "ec-no-public-sec1.pem"], |e| {
                matches!(e, KeyError::NoPublicKey)
            }),
            ("ec-explicit.pem", &["openssl", "ec", "-in", "ec.pem", "-param_enc", "explicit"], |e| {
                matches!(e, KeyError::ExplicitCurve)
            }),
            ("ec-explicit-pkcs8.pem", &["openssl", "pkey", "-in", "ec-explicit.pem"], |e| {
                matches!(e, KeyError::ExplicitCurve)
            }),
            (
                "cert.pem",
                &["openssl", "req", "-x509", "-key", "ec.pem", "-subj", "/CN=x", "-days", "1"],
                |e| matches!(e, KeyError::NotPem),
            ),
        ];
        for (file, argv, _) in cases {
            let mut argv = argv.to_vec();
            argv.extend(["-out", file]);
            run(&dir, &argv);
        }
        for (file, _, want) in cases {
            if *file == "ec.pem" {
                continue;
            }
            let pem = std::fs::read_to_string(dir.join(file)).unwrap();
            let err = SigningKey::from_pem(pem.as_bytes()).expect_err(file);
            assert!(want(&err), "{file}: {err:?}");
            let shown = format!("{err} {err:?}");
            for line in pem.lines().filter(|l| !l.starts_with("-----") && l.len() > 8) {
                assert!(!shown.contains(line), "{file}: {shown}");
            }
        }
        // The repair the error names: openssl ec writes the public key back.
        run(&dir, &["openssl", "ec", "-in", "ec-no-public-sec1.pem", "-out", "repaired.pem"]);
        let repaired = std::fs::read(dir.join("repaired.pem")).unwrap();
        assert_eq!(SigningKey::from_pem(&repaired).unwrap().alg(), Alg::Es256);
        // A certificate beside its key is skipped; two keys are refused.
        let cert = std::fs::read_to_string(dir.join("cert.pem")).unwrap();
        let key = std::fs::read_to_string(dir.join("ec.pem")).unwrap();
        assert_eq!(SigningKey::from_pem(format!("{cert}{key}").as_bytes()).unwrap().alg(), Alg::Es256);
        let two = format!("{key}{}", std::fs::read_to_string(dir.join("repaired.pem")).unwrap());
        assert!(matches!(SigningKey::from_pem(two.as_bytes()), Err(KeyError::SeveralKeys)));
    }

    /// PEM of a PKCS#8 document, the body in one line.
    fn pem(label: &str, der: &[u8]) -> String {
        format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", encode(der))
    }

    /// Text that is not a key, broken armour and damaged DER: refused,
    /// never a panic, whatever the damage.
    #[test]
    fn garbage_and_truncated_pem_are_refused() {
        let cases: &[(&[u8], fn(&KeyError) -> bool)] = &[
            (b"", |e| matches!(e, KeyError::NotPem)),
            (b"hello\n", |e| matches!(e, KeyError::NotPem)),
            (b"-----BEGIN PRIVATE KEY-----\nMIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0w\n", |e| {
                matches!(e, KeyError::Armour)
            }),
            (b"-----BEGIN PRIVATE KEY-----\n!!!!\n-----END PRIVATE KEY-----\n", |e| {
                matches!(e, KeyError::Armour)
            }),
            (b"-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n", |e| {
                matches!(e, KeyError::Malformed(_))
            }),
            (b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", |e| {
                matches!(e, KeyError::Malformed(_))
            }),
            (b"-----BEGIN EC PRIVATE KEY-----\nMAA=\n-----END EC PRIVATE KEY-----\n", |e| {
                matches!(e, KeyError::Malformed(_))
            }),
            (b"-----BEGIN RSA PRIVATE KEY-----\nMAA=\n-----END RSA PRIVATE KEY-----\n", |e| {
                matches!(e, KeyError::Malformed(_))
            }),
            (b"-----BEGIN PUBLIC KEY-----\nMAA=\n-----END PUBLIC KEY-----\n", |e| {
                matches!(e, KeyError::NotPem)
            }),
            (b"-----BEGIN PRIVATE KEY----\nMAA=\n", |e| matches!(e, KeyError::Armour)),
        ];
        for (input, want) in cases {
            let err = SigningKey::from_pem(input).expect_err(&String::from_utf8_lossy(input));
            assert!(want(&err), "{:?}: {err:?}", String::from_utf8_lossy(input));
        }

        let rng = SystemRandom::new();
        let der = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
        let der = der.as_ref();
        let whole = pem("PRIVATE KEY", der);
        assert_eq!(SigningKey::from_pem(whole.as_bytes()).unwrap().alg(), Alg::Es256);
        for cut in 0..whole.len() - 1 {
            assert!(SigningKey::from_pem(&whole.as_bytes()[..cut]).is_err(), "text cut at {cut}");
        }
        for cut in 0..der.len() {
            assert!(
                SigningKey::from_pem(pem("PRIVATE KEY", &der[..cut]).as_bytes()).is_err(),
                "DER cut at {cut}"
            );
        }
        // Every byte flipped: ring's checks or ours refuse it, or (in the
        // key's own bytes) it is another valid key; it never panics.
        for at in 0..der.len() {
            let mut flipped = der.to_vec();
            flipped[at] ^= 0xff;
            let _ = SigningKey::from_pem(pem("PRIVATE KEY", &flipped).as_bytes());
        }
    }

    /// The DER writer and reader agree on lengths of each size class, and
    /// the reader refuses indefinite and overlong lengths.
    #[test]
    fn der_lengths() {
        for len in [0usize, 1, 0x7f, 0x80, 0xff, 0x100, 0xffff, 0x10000] {
            let contents = vec![7u8; len];
            let mut out = Vec::new();
            push_element(&mut out, OCTET_STRING, &contents);
            let header = match len {
                0..=0x7f => 2,
                0x80..=0xff => 3,
                0x100..=0xffff => 4,
                _ => 5,
            };
            assert_eq!(out.len(), header + len, "{len}");
            assert_eq!(element(&out), Some((OCTET_STRING, &contents[..], &[][..])), "{len}");
        }
        let cases: &[&[u8]] =
            &[&[], &[0x04], &[0x04, 0x80, 0, 0], &[0x04, 0x84, 0, 0, 0, 1, 0], &[0x04, 0x02, 0]];
        for input in cases {
            assert_eq!(element(input), None, "{input:?}");
        }
    }

    /// RFC 7638 §3.1's example: the RSA key's thumbprint.
    #[test]
    fn thumbprint_of_rfc_7638_example() {
        const N: &str = "0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw";
        let n = decode_url(N.as_bytes()).unwrap();
        // A leading zero byte (as a DER INTEGER carries it) is dropped.
        let jwks = [rsa_jwk(&n, &[1, 0, 1]), rsa_jwk(&[&[0u8][..], &n].concat(), &[0, 1, 0, 1])];
        for jwk in jwks {
            assert_eq!(jwk, format!(r#"{{"e":"AQAB","kty":"RSA","n":"{N}"}}"#));
            assert_eq!(thumbprint_of(&jwk), "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs");
        }
    }

    /// A generated key's JWK has the RFC 7638 member order, and its
    /// signatures verify.
    #[test]
    fn generated_p256_key() {
        let key = SigningKey::generate_p256().unwrap();
        assert_eq!(key.alg(), Alg::Es256);
        let jwk = key.public_jwk();
        let names: Vec<String> =
            serde_json::from_str::<serde_json::Map<String, Value>>(&jwk).unwrap().keys().cloned().collect();
        assert_eq!(names, ["crv", "kty", "x", "y"]);
        assert!(jwk.starts_with(r#"{"crv":"P-256","kty":"EC","x":""#), "{jwk}");
        let jws = key.sign(r#"{"alg":"ES256"}"#, "{}").unwrap();
        verify_with_ring(&jwk, &jws);
        assert_ne!(key.thumbprint(), SigningKey::generate_p256().unwrap().thumbprint());
        assert_eq!(key.thumbprint().len(), 43);
        assert_eq!(format!("{key:?}"), "SigningKey { alg: Es256, .. }");
    }

    #[test]
    fn random_ids_differ() {
        let (a, b) = (random_id().unwrap(), random_id().unwrap());
        assert_ne!(a, b);
        for id in [a, b] {
            assert_eq!(decode_url(id.as_bytes()).unwrap().len(), 16);
            assert_eq!(id.len(), 22);
        }
    }

    /// An RSA key made by openssl, for the RS256 cases (`None`, the
    /// test then covers ES256 only, when openssl is missing outside CI).
    fn rsa_key() -> Option<SigningKey> {
        if !have("openssl", "version") {
            return None;
        }
        let dir = scratch("rsa");
        let pem = run(&dir, &["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]);
        Some(SigningKey::from_pem(pem.as_bytes()).unwrap())
    }

    /// RFC 7523 §3's claims, decoded back; `aud` a string for one audience
    /// and an array for several; strings escaped.
    #[test]
    fn client_assertion_claims() {
        let mut keys = vec![SigningKey::generate_p256().unwrap()];
        keys.extend(rsa_key());
        let cases: &[(&str, &[&str], Value)] = &[
            ("client-1", &["https://as.example/token"], Value::from("https://as.example/token")),
            (
                "client \"2\"\\",
                &["https://as.example", "https://as.example/token"],
                serde_json::json!(["https://as.example", "https://as.example/token"]),
            ),
        ];
        for key in &keys {
            for (client_id, audiences, aud) in cases {
                let jws = client_assertion(key, client_id, audiences, 1_700_000_000, "jti-1").unwrap();
                verify_with_ring(&key.public_jwk(), &jws);
                let (header, claims, _, _) = parts(&jws);
                assert_eq!(header, serde_json::json!({"alg": key.alg().as_str(), "typ": "JWT"}));
                let want = serde_json::json!({
                    "iss": client_id, "sub": client_id, "aud": aud,
                    "iat": 1_700_000_000u64, "exp": 1_700_000_300u64, "jti": "jti-1",
                });
                assert_eq!(claims, want);
            }
            assert!(matches!(client_assertion(key, "c", &[], 0, "j"), Err(KeyError::NoAudience)));
        }
    }

    /// RFC 9449 §4.2's header and claims; `ath` as RFC 9449 §7.1's
    /// example gives it for its token; the nonce only when given; `htu`
    /// without query or fragment.
    #[test]
    fn dpop_proof_header_and_claims() {
        const TOKEN: &str = "Kz~8mXK1EalYznwH-LC-1fBAo.4Ljp~zsPE_NeO.gxU";
        const ATH: &str = "fUHyO2r2Z3DZ53EsNrWBb0xWXoaNy59IiKCAqksmQEo";
        let key = SigningKey::generate_p256().unwrap();
        let cases: &[(&str, Option<&str>, Option<&str>, Value)] = &[
            (
                "https://rs.example/mcp",
                None,
                None,
                serde_json::json!({"htm": "POST", "htu": "https://rs.example/mcp", "iat": 5, "jti": "j"}),
            ),
            (
                "https://rs.example/mcp?session=1#frag",
                Some(TOKEN),
                None,
                serde_json::json!({"htm": "POST", "htu": "https://rs.example/mcp", "iat": 5, "jti": "j", "ath": ATH}),
            ),
            (
                "https://rs.example/a#b?c",
                Some(TOKEN),
                Some("eyJ7S_zG.eyJH0-Z.HX4w-7v"),
                serde_json::json!({"htm": "POST", "htu": "https://rs.example/a", "iat": 5, "jti": "j",
                    "ath": ATH, "nonce": "eyJ7S_zG.eyJH0-Z.HX4w-7v"}),
            ),
            (
                "https://as.example/token",
                None,
                Some("n"),
                serde_json::json!({"htm": "POST", "htu": "https://as.example/token", "iat": 5, "jti": "j", "nonce": "n"}),
            ),
        ];
        for (htu, token, nonce, want) in cases {
            let jws = dpop_proof(&key, "POST", htu, 5, "j", *token, *nonce).unwrap();
            verify_with_ring(&key.public_jwk(), &jws);
            let (header, claims, _, _) = parts(&jws);
            let jwk: Value = serde_json::from_str(&key.public_jwk()).unwrap();
            assert_eq!(header, serde_json::json!({"alg": "ES256", "jwk": jwk, "typ": "dpop+jwt"}));
            assert_eq!(&claims, want, "{htu}");
        }
        let header = parts(&dpop_proof(&key, "GET", "https://x", 0, "j", None, None).unwrap()).2;
        let header = decode_url(header.split('.').next().unwrap().as_bytes()).unwrap();
        assert_eq!(
            String::from_utf8(header).unwrap(),
            format!(r#"{{"alg":"ES256","jwk":{},"typ":"dpop+jwt"}}"#, key.public_jwk())
        );
    }

    /// `ath` is the token's SHA-256 as openssl computes it from outside.
    #[test]
    #[cfg(unix)]
    fn ath_matches_openssl() {
        if !have("openssl", "version") {
            return;
        }
        let dir = scratch("ath");
        let token = "Kz~8mXK1EalYznwH-LC-1fBAo.4Ljp~zsPE_NeO.gxU";
        std::fs::write(dir.join("token"), token).unwrap();
        let hex = run(&dir, &["openssl", "dgst", "-sha256", "-r", "token"]);
        let hex = hex.split_whitespace().next().unwrap();
        let bytes: Vec<u8> =
            (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
        let key = SigningKey::generate_p256().unwrap();
        let claims = parts(&dpop_proof(&key, "GET", "https://x", 0, "j", Some(token), None).unwrap()).1;
        assert_eq!(claims["ath"], encode_url(&bytes));
    }
}
