//! Limits: oversized heads and bodies, chunk-size and field-character errors, request-target forms.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{assert_refused, start, write_ignoring_errors};
use crate::support::exchange::{
    assert_healthy, assert_jsonrpc_error, chunk, chunked_post_head, client, host, ok_upstream,
};

#[test]
fn head_of_128_kib_gets_431_and_nothing_reaches_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let big = "a".repeat(128 * 1024);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX-Big: {big}\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 431, true);
}

#[test]
fn head_that_never_ends_gets_431_once_past_64_kib() {
    // No blank line ever: the proxy must answer at the limit, not wait.
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    let t0 = Instant::now();
    c.send(format!("GET /mcp HTTP/1.1\r\nHost: {}\r\n", host(&p)).as_bytes());
    let line = format!("X-Filler: {}\r\n", "f".repeat(1000));
    let mut sent = 0;
    while sent < 80 * 1024 {
        if write_ignoring_errors(&mut c.stream, line.as_bytes()) < line.len() {
            break;
        }
        sent += line.len();
    }
    let resp = c.read_response("GET");
    assert_jsonrpc_error(&resp, 431);
    assert!(t0.elapsed() < Duration::from_secs(3), "431 took {:?}", t0.elapsed());
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn head_with_200_fields_gets_431_and_nothing_reaches_upstream() {
    let up = ok_upstream();
    let p = start(&up);
    let fields: String = (0..200).map(|i| format!("X-F{i}: v\r\n")).collect();
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\n{fields}\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 431, true);
}

#[test]
fn body_of_16_mib_gets_413_while_the_client_is_still_sending_it() {
    let up = ok_upstream();
    let p = start(&up);
    let total = 16 * 1024 * 1024;
    let mut c = client(&p);
    c.send(
        format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nContent-Length: {total}\r\n\r\n",
            host(&p)
        )
        .as_bytes(),
    );
    // The client keeps sending at ~5 MiB/s (16 MiB would take >3 s).
    let written = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut w = c.stream.try_clone().unwrap();
    let (wr, st) = (written.clone(), stop.clone());
    let writer = std::thread::spawn(move || {
        let piece = vec![b' '; 256 * 1024];
        while wr.load(Ordering::SeqCst) < total && !st.load(Ordering::SeqCst) {
            let n = write_ignoring_errors(&mut w, &piece);
            wr.fetch_add(n, Ordering::SeqCst);
            if n < piece.len() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let t0 = Instant::now();
    let resp = c.read_response("POST");
    let at = written.load(Ordering::SeqCst);
    let took = t0.elapsed();
    stop.store(true, Ordering::SeqCst);
    assert_jsonrpc_error(&resp, 413);
    assert!(took < Duration::from_secs(2), "413 took {took:?}");
    assert!(at < total / 2, "413 came only after {at} of {total} body bytes were sent");
    assert!(c.closed_within(Duration::from_secs(5)), "connection kept open after 413 for an unread body");
    writer.join().unwrap();
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn body_of_16_mib_with_expect_100_continue_gets_413_and_no_100() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nExpect: 100-continue\r\nContent-Length: {}\r\n\r\n",
        host(&p),
        16 * 1024 * 1024
    );
    let mut c = client(&p);
    c.send(raw.as_bytes());
    let resp = c.read_response("POST");
    assert_jsonrpc_error(&resp, 413);
    assert!(c.closed_within(Duration::from_secs(3)), "connection kept open after 413 for an unsent body");
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn chunked_body_growing_past_8_mib_gets_413() {
    let up = ok_upstream();
    let p = start(&up);
    let mut c = client(&p);
    c.send(&chunked_post_head(&p));
    let mut w = c.stream.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let piece = chunk(&vec![b' '; 1024 * 1024]);
        let mut sent = 0;
        for _ in 0..12 {
            if write_ignoring_errors(&mut w, &piece) < piece.len() {
                break;
            }
            sent += 1;
        }
        sent
    });
    let resp = c.read_response("POST");
    assert_jsonrpc_error(&resp, 413);
    assert!(c.closed_within(Duration::from_secs(5)), "connection kept open after 413");
    let sent = writer.join().unwrap();
    assert!(sent >= 8, "413 before 8 MiB of chunks were sent ({sent} MiB)");
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

#[test]
fn chunk_extension_of_10_kib_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!(
        "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n2;x={}\r\n{{}}\r\n0\r\n\r\n",
        host(&p),
        "e".repeat(10 * 1024)
    );
    let mut c = client(&p);
    write_ignoring_errors(&mut c.stream, raw.as_bytes());
    let resp = c.read_response("POST");
    assert!(resp.status == 400 || resp.status == 413, "{:?}", resp.raw_text());
    assert_jsonrpc_error(&resp, resp.status);
    assert_eq!(up.request_count(), 0);
    assert_healthy(&p, &up);
}

/// RFC 9112 §7.1: `chunk-size = 1*HEXDIG`, then only `BWS ";"` may start
/// an extension. A tracker that reads `0x5` as a last chunk with extension
/// `x5` ends the body early and reads the rest as trailers.
#[test]
fn chunk_size_with_junk_after_the_digits_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    // text/plain: not a JSON body the stamper would refuse for its own reasons.
    for size_line in ["0x5", "5 5", "5zz", "5\""] {
        let raw = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n{size_line}\r\nhello\r\n0\r\n\r\n",
            host(&p)
        );
        assert_refused(&p, &up, raw.as_bytes(), 400, true);
    }
}

#[test]
fn cr_inside_a_field_value_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX-Bad: a\rb\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn cr_smuggling_a_second_field_gets_400() {
    // `X-A: 1\rAuthorization: ...`: a parser that splits on a bare CR would
    // see a second field.
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX-A: 1\rMcp-Session-Id: forged\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn nul_in_the_request_target_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp\0x HTTP/1.1\r\nHost: {}\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn invalid_character_in_field_name_gets_400() {
    let up = ok_upstream();
    let p = start(&up);
    let raw = format!("GET /mcp HTTP/1.1\r\nHost: {}\r\nX(Bad): v\r\n\r\n", host(&p));
    assert_refused(&p, &up, raw.as_bytes(), 400, true);
}

#[test]
fn absolute_form_and_authority_form_targets_get_400() {
    let up = ok_upstream();
    let p = start(&up);
    let h = host(&p);
    for raw in [
        format!("GET http://evil.com/mcp HTTP/1.1\r\nHost: {h}\r\n\r\n"),
        format!("GET http://{h}/mcp HTTP/1.1\r\nHost: {h}\r\n\r\n"),
        format!("CONNECT 127.0.0.1:22 HTTP/1.1\r\nHost: {h}\r\n\r\n"),
    ] {
        assert_refused(&p, &up, raw.as_bytes(), 400, false);
    }
}
