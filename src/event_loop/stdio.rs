//! The `--stdio` front-end's connections: `Conn`s whose client is a pipe,
//! in the same slab as accepted ones, driven by the same rounds.

use super::slab::Slab;
use crate::conn::client_sock::{ClientSock, Pipe};
use crate::conn::Conn;
use crate::stdio::Core;
use std::time::Instant;

pub(super) struct PipeConns<'a> {
    pub(super) slab: &'a mut Slab,
    /// Where woken slots go: this round's or the next one's.
    pub(super) wakes: &'a mut Vec<usize>,
    pub(super) next_id: &'a mut u64,
    /// Pipes of connections closed this round, with their last bytes.
    pub(super) closed: &'a mut Vec<(u64, Pipe)>,
    pub(super) now: Instant,
}

impl PipeConns<'_> {
    fn slot(&self, id: u64) -> Option<usize> {
        self.slab.entries.iter().position(|c| c.as_ref().is_some_and(|c| c.id() == id))
    }
}

impl Core for PipeConns<'_> {
    fn open(&mut self) -> Option<u64> {
        *self.next_id += 1;
        let id = *self.next_id;
        let (pipe, peer) = ClientSock::pipe();
        let slot = self.slab.insert(Conn::new(id, pipe, peer, self.now));
        log::debug!("conn {id}: opened for stdio");
        self.wakes.push(slot);
        Some(id)
    }

    fn pipe(&mut self, id: u64) -> Option<&mut Pipe> {
        let slot = self.slot(id)?;
        self.slab.entries.get_mut(slot)?.as_mut()?.client().pipe_mut()
    }

    fn wake(&mut self, id: u64) {
        let Some(slot) = self.slot(id) else { return };
        if let Some(Some(conn)) = self.slab.entries.get_mut(slot) {
            conn.client_event(true, true, false);
            self.wakes.push(slot);
        }
    }

    fn closed(&mut self, id: u64) -> Option<Pipe> {
        let at = self.closed.iter().position(|(i, _)| *i == id)?;
        Some(self.closed.swap_remove(at).1)
    }
}
