//! The connection slab: `Conn`s addressed by token slot, with slot reuse
//! deferred to the end of an events batch.

use crate::conn::Conn;

/// `Vec<Option<Conn>>` with a free list (no `Rc<RefCell<_>>`).
#[derive(Default)]
pub(super) struct Slab {
    pub(super) entries: Vec<Option<Conn>>,
    free: Vec<usize>,
    /// Slots freed during the current events batch: they rejoin `free` only
    /// after it, so a stale event can never reach a reused slot.
    freed: Vec<usize>,
    pub(super) live: usize,
}

impl Slab {
    pub(super) fn insert(&mut self, conn: Conn) -> usize {
        self.live += 1;
        match self.free.pop() {
            Some(i) => {
                self.entries[i] = Some(conn);
                i
            }
            None => {
                self.entries.push(Some(conn));
                self.entries.len() - 1
            }
        }
    }

    pub(super) fn remove(&mut self, slot: usize) -> Option<Conn> {
        let conn = self.entries.get_mut(slot)?.take()?;
        self.live -= 1;
        self.freed.push(slot);
        Some(conn)
    }

    pub(super) fn end_batch(&mut self) {
        self.free.append(&mut self.freed);
    }
}

impl Slab {
    /// The slot the next `insert` will use (its token is registered first).
    pub(super) fn next_slot(&self) -> usize {
        self.free.last().copied().unwrap_or(self.entries.len())
    }

    /// Slots holding a connection.
    pub(super) fn occupied(&self) -> impl Iterator<Item = usize> + '_ {
        self.entries.iter().enumerate().filter(|(_, c)| c.is_some()).map(|(i, _)| i)
    }
}
