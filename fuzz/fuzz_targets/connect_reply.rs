//! Defends the reading of a forward proxy's answer to CONNECT: no panic on
//! any bytes; the verdict does not depend on how the bytes arrived: the
//! first prefix that is not `Partial` gives the verdict of the whole input,
//! except that more bytes after a 2xx make it `Trailing`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_identity_proxy::route::connect::{read_reply, Invalid, Reply};

fuzz_target!(|data: &[u8]| {
    let data = &data[..data.len().min(2048)];
    let whole = read_reply(data);
    let first = (0..=data.len()).map(|i| read_reply(&data[..i])).find(|r| *r != Reply::Partial);
    match first {
        None => assert_eq!(whole, Reply::Partial),
        Some(Reply::Open) => {
            assert!(matches!(whole, Reply::Open | Reply::Invalid(Invalid::Trailing)), "{whole:?}")
        }
        Some(first) => assert_eq!(whole, first, "{:?}", String::from_utf8_lossy(data)),
    }
});
