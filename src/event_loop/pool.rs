//! Idle upstream connections kept for reuse across clients, newest last.

use crate::conn::idle_usable;
use crate::limits::{MAX_POOLED_UPSTREAM, POOL_IDLE_TIMEOUT};
use crate::transport::Transport;
use std::time::Instant;

#[derive(Default)]
pub(super) struct Pool {
    idle: Vec<(Transport, Instant)>,
}

impl Pool {
    /// Keep `stream` (already deregistered) if there is room.
    /// A TLS connection keeps its session: reused, it needs no handshake.
    pub(super) fn put(&mut self, stream: Transport, now: Instant) {
        if self.idle.len() < MAX_POOLED_UPSTREAM {
            self.idle.push((stream, now));
        }
    }

    /// The most recently pooled connection that is still open and silent.
    pub(super) fn take(&mut self, now: Instant) -> Option<Transport> {
        while let Some((mut stream, since)) = self.idle.pop() {
            // Deregistered, so its readiness is unknown: a peek (a read of
            // its TLS records) tells whether it spoke (data, EOF or an
            // error) while pooled.
            if idle_usable(since, now, || stream.idle_spoke(None)) {
                return Some(stream);
            }
        }
        None
    }

    /// Drop connections idle for `POOL_IDLE_TIMEOUT` (below uvicorn's 5 s
    /// keep-alive, so the upstream rarely closes one we are about to use).
    pub(super) fn expire(&mut self, now: Instant) {
        self.idle.retain(|(_, since)| now.saturating_duration_since(*since) < POOL_IDLE_TIMEOUT);
    }

    /// When the oldest connection expires.
    pub(super) fn next_expiry(&self) -> Option<Instant> {
        self.idle.first().map(|(_, since)| *since + POOL_IDLE_TIMEOUT)
    }
}
