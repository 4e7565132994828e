//! The reopen decision, driven alone: no socket, clock or table.

use super::*;

const ORIGINAL: &[u8] = b"HTTP/1.1 404 Not Found\r\ncontent-length: 5\r\n\r\nlost!";

fn seen(known: bool, mapped: bool, reopening: bool, initialized: bool) -> Seen {
    Seen { known, mapped_since_sent: mapped, reopening, initialized_sent: initialized }
}

/// A reopen that holds the 404 and leads: at `Step::Initialize`, its
/// replayed `initialize` answered with (status, new id, body).
fn leading(status: u16, new_id: Option<&[u8]>, format: Format, body: &[u8]) -> Reopen {
    let mut r = Reopen::new(b"u1", true);
    assert_eq!(r.on_collected(ORIGINAL, seen(true, false, false, true)), Action::TryLead);
    assert_eq!(r.on_lead(Ok(())), Action::SendInitialize);
    r.prepare_initialize(br#"{"jsonrpc":"2.0","id":7,"method":"initialize","params":{}}"#, "2025-06-18")
        .unwrap();
    r.step = Step::Initialize;
    let head = Head { status, session_id: new_id, format: Some(format), keep_alive: true };
    assert_eq!(r.on_head(&head), OnHead::Collect);
    r.read_payload(body);
    r
}

fn answer(version: &str) -> Vec<u8> {
    format!(r#"{{"jsonrpc":"2.0","id":7,"result":{{"protocolVersion":"{version}"}}}}"#).into_bytes()
}

#[test]
fn the_replayed_initialize_decides_the_next_step() {
    use Format::{EventStream, Json};
    let sse = |v: &str| {
        let mut b = b"event: message\r\ndata: ".to_vec();
        b.extend(answer(v));
        b.extend(b"\r\n\r\n");
        b
    };
    // (status, new id, format, body, client sent initialized) -> action.
    let cases: Vec<(u16, Option<&[u8]>, Format, Vec<u8>, bool, Action)> = vec![
        (200, Some(b"u2"), Json, answer("2025-06-18"), true, Action::SendInitialized),
        (200, Some(b"u2"), Json, answer("2025-06-18"), false, Action::Finish),
        (200, Some(b"u2"), EventStream, sse("2025-06-18"), true, Action::SendInitialized),
        (
            200,
            Some(b"u2"),
            Json,
            answer("2025-03-26"),
            true,
            Action::fail("a different protocol version", true),
        ),
        (
            200,
            None,
            Json,
            answer("2025-06-18"),
            true,
            Action::fail("no session id in the answer to initialize", true),
        ),
        (
            500,
            Some(b"u2"),
            Json,
            answer("2025-06-18"),
            true,
            Action::fail("initialize not answered 200", true),
        ),
        (
            200,
            Some(b"u2"),
            Json,
            br#"{"jsonrpc":"2.0","id":7,"error":{"code":1,"message":"m"}}"#.to_vec(),
            true,
            Action::fail("no protocol version in the answer to initialize", true),
        ),
        (
            200,
            Some(b"u2"),
            Json,
            br#"{"jsonrpc":"2.0","id":8,"result":{}}"#.to_vec(),
            true,
            Action::fail("no protocol version in the answer to initialize", true),
        ),
        (
            200,
            Some(b"u2"),
            Json,
            b"{\"id\":7,".to_vec(),
            true,
            Action::fail("no protocol version in the answer to initialize", true),
        ),
    ];
    for (status, id, format, body, initialized, want) in cases {
        let mut r = leading(status, id, format, &body);
        let got = r.on_collected(b"", seen(true, false, true, initialized));
        assert_eq!(got, want, "{status} {id:?} {format:?} {}", String::from_utf8_lossy(&body));
    }
}

#[test]
fn the_held_404_leads_waits_retries_or_is_relayed() {
    // (seen when the 404 is whole) -> action.
    for (s, want) in [
        (seen(true, false, false, true), Action::TryLead),
        (seen(true, true, false, true), Action::Retry),
        (seen(false, false, false, false), Action::relay_original()),
    ] {
        let mut r = Reopen::new(b"u1", false);
        assert_eq!(r.on_collected(ORIGINAL, s), want, "{s:?}");
    }
    // The outcome of trying to lead.
    for (outcome, want, step) in [
        (Ok(()), Action::SendInitialize, Step::Original),
        (Err(ReopenRefused::InFlight), Action::Wait, Step::Wait),
        (Err(ReopenRefused::Unknown), Action::relay_original(), Step::Original),
    ] {
        let mut r = Reopen::new(b"u1", false);
        assert_eq!(r.on_lead(outcome), want);
        assert_eq!(r.step, step);
    }
    let mut r = Reopen::new(b"u1", false);
    assert!(matches!(
        r.on_lead(Err(ReopenRefused::TooSoon)),
        Action::GiveUp { forget: true, release_lead: false, .. }
    ));
    // Waiting: (seen, waited long enough) -> action.
    for (s, late, want) in [
        (seen(true, true, false, true), false, Action::Retry),
        (seen(true, false, true, true), false, Action::KeepWaiting),
        (seen(true, false, true, true), true, Action::relay_original()),
        (seen(true, false, false, true), false, Action::relay_original()),
        (seen(false, false, false, false), false, Action::relay_original()),
    ] {
        let mut r = Reopen::new(b"u1", false);
        r.step = Step::Wait;
        assert_eq!(r.on_check(s, late), want, "{s:?} late {late}");
    }
}

#[test]
fn heads_are_collected_only_while_replaying_and_a_second_404_forgets() {
    let head =
        |status| Head { status, session_id: Some(b"u9"), format: Some(Format::Json), keep_alive: false };
    for (step, status, want) in [
        (Step::Initialize, 200, OnHead::Collect),
        (Step::Initialize, 404, OnHead::Collect),
        (Step::Initialized, 202, OnHead::Collect),
        (Step::Retry, 404, OnHead::ForgetAndRelay),
        (Step::Retry, 200, OnHead::Relay),
        (Step::Done, 404, OnHead::Relay),
        (Step::Wait, 404, OnHead::Relay),
    ] {
        let mut r = Reopen::new(b"u1", true);
        r.step = step;
        assert_eq!(r.on_head(&head(status)), want, "{step:?} {status}");
    }
    let mut r = Reopen::new(b"u1", true);
    r.step = Step::Initialized;
    r.on_head(&head(202));
    assert_eq!(r.on_collected(b"", seen(true, false, true, true)), Action::Finish);
    r.on_head(&head(400));
    assert_eq!(
        r.on_collected(b"", seen(true, false, true, true)),
        Action::fail("notifications/initialized refused", true)
    );
}

#[test]
fn every_failure_relays_the_original_404_byte_for_byte() {
    type Event = fn(&mut Reopen) -> Action;
    let own_request: Event = |r| r.on_own_request_failed("connect refused".into());
    let not_whole: Event = |r| r.on_collect_failed();
    let too_soon: Event = |r| r.on_lead(Err(ReopenRefused::TooSoon));
    let unknown: Event = |r| r.on_lead(Err(ReopenRefused::Unknown));
    let gone_while_waiting: Event = |r| r.on_check(Seen::default(), false);
    let waited_too_long: Event = |r| r.on_check(seen(true, false, true, true), true);
    let not_mapped: Event = |r| r.on_finished(Err("IdInUse"));
    let refused: Event = |r| {
        r.status = 400;
        r.on_collected(b"", seen(true, false, true, true))
    };
    // (step, event, whether it must give the lead back).
    let failures: Vec<(Step, Event, bool)> = vec![
        (Step::Initialize, own_request, true),
        (Step::Initialized, own_request, true),
        (Step::Initialize, not_whole, true),
        (Step::Initialized, not_whole, true),
        (Step::Initialize, refused, true),
        (Step::Initialized, refused, true),
        (Step::Original, too_soon, false),
        (Step::Original, unknown, false),
        (Step::Wait, gone_while_waiting, false),
        (Step::Wait, waited_too_long, false),
        (Step::Initialized, not_mapped, false),
    ];
    for (i, (step, event, lead)) in failures.into_iter().enumerate() {
        let mut r = Reopen::new(b"u1", true);
        r.on_collected(ORIGINAL, seen(true, false, false, true));
        r.step = step;
        match event(&mut r) {
            Action::GiveUp { release_lead, .. } => {
                assert_eq!(release_lead, lead, "failure {i} at {step:?}");
                assert_eq!(r.take_original(), ORIGINAL, "failure {i} at {step:?}");
                assert_eq!(r.step, Step::Done);
            }
            other => panic!("failure {i} at {step:?} did not give up: {other:?}"),
        }
    }
    // A 404 that cannot be held whole is relayed as it comes instead.
    let mut r = Reopen::new(b"u1", true);
    assert_eq!(r.on_collect_failed(), Action::RelayAsItComes);
    assert_eq!(r.step, Step::Done);
}

#[test]
fn a_401_waits_for_a_new_token_and_is_sent_again_once_under_it() {
    const REFUSED: &[u8] = b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 2\r\n\r\n{}";
    let held = |r: &mut Reopen| {
        assert_eq!(r.on_collected(REFUSED, seen(false, false, false, false)), Action::AwaitToken);
        assert_eq!(r.step, Step::Wait);
    };
    // (token generation now, a new one may still come, waited long enough) -> action.
    let cases = [
        (5, true, false, Action::KeepWaiting),
        (5, false, false, Action::relay_original()),
        (5, true, true, Action::relay_original()),
        (6, true, false, Action::RetryToken),
        (6, false, true, Action::RetryToken),
    ];
    for (now, renewing, passed, want) in cases {
        let mut r = Reopen::for_token(5, true);
        held(&mut r);
        assert_eq!(
            r.on_token_check(now, renewing, passed),
            want,
            "now {now}, renewing {renewing}, passed {passed}"
        );
    }
    // Sent again: whatever answers is relayed, a 404 or a second 401 alike
    // (never a session's forgetting: no session was lost).
    let mut r = Reopen::for_token(5, true);
    held(&mut r);
    r.step = Step::Retry;
    for status in [200, 401, 404] {
        let head = Head { status, session_id: None, format: None, keep_alive: true };
        assert_eq!(r.on_head(&head), OnHead::Relay, "{status}");
    }
    // The held 401 is what a give-up relays.
    let mut r = Reopen::for_token(5, true);
    held(&mut r);
    assert_eq!(r.take_original(), REFUSED);
    // A request not sent because the token expired: the same wait, and
    // without a new token the outage answer (there is no 401 to relay).
    for (now, renewing, passed, want) in [
        (5, true, false, Action::KeepWaiting),
        (5, false, false, Action::TokenExpired),
        (5, true, true, Action::TokenExpired),
        (6, true, false, Action::RetryToken),
        (6, false, true, Action::RetryToken),
    ] {
        let mut r = Reopen::for_expired(5);
        assert_eq!(r.on_token_check(now, renewing, passed), want, "expired: now {now}, {renewing}, {passed}");
    }
}
