//! `Buf`: a byte buffer with start/end cursors (sozu's verbs: `space`,
//! `fill`, `data`, `consume`, `shift`). It starts at `IO_BUF_SIZE` and grows
//! only on request, up to a fixed limit, so a connection's memory is bounded.
//! Released buffers of the base size go to a small free list and are reused,
//! so a stream that goes quiet between events costs no allocation and no
//! zeroing when the next event comes, and an idle stream holds no buffer.

use crate::limits::{BUF_POOL, IO_BUF_SIZE};
use std::cell::RefCell;

thread_local! {
    /// Base-size buffers given back by quiet connections (one thread: the
    /// event loop's).
    static POOL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// A base-size buffer: from the free list, else a new one.
fn take_buffer() -> Vec<u8> {
    POOL.with(|p| p.borrow_mut().pop()).unwrap_or_else(|| vec![0; IO_BUF_SIZE])
}

/// Keep a base-size buffer for reuse (at most `BUF_POOL`); grown ones are
/// freed, so a burst does not pin its large buffers.
fn give_back(bytes: Vec<u8>) {
    if bytes.len() == IO_BUF_SIZE {
        POOL.with(|p| {
            let mut pool = p.borrow_mut();
            if pool.len() < BUF_POOL {
                pool.push(bytes);
            }
        });
    }
}

#[derive(Debug)]
pub struct Buf {
    bytes: Vec<u8>,
    start: usize,
    end: usize,
    limit: usize,
}

impl Buf {
    /// A buffer that may grow up to `limit` bytes. Memory is taken on the
    /// first `space()` call, so an idle connection holds none.
    pub fn new(limit: usize) -> Self {
        Buf { bytes: Vec::new(), start: 0, end: 0, limit: limit.max(IO_BUF_SIZE) }
    }

    /// Bytes held and not yet consumed.
    pub fn data(&self) -> &[u8] {
        &self.bytes[self.start..self.end]
    }

    pub fn len(&self) -> usize {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Free room after the data, shifting the data to the front first when
    /// that frees room. Empty when the buffer is full at its current size.
    pub fn space(&mut self) -> &mut [u8] {
        if self.bytes.is_empty() {
            self.bytes = take_buffer();
        }
        if self.end == self.bytes.len() && self.start > 0 {
            self.shift();
        }
        &mut self.bytes[self.end..]
    }

    /// Whether `space()` would be non-empty without growing.
    pub fn has_space(&self) -> bool {
        self.bytes.is_empty() || self.end < self.bytes.len() || self.start > 0
    }

    /// Double the capacity (up to the limit); false when already at it.
    pub fn grow(&mut self) -> bool {
        let cap = self.bytes.len();
        if cap >= self.limit {
            return false;
        }
        let new = (cap * 2).clamp(IO_BUF_SIZE, self.limit);
        self.bytes.resize(new, 0);
        true
    }

    /// Appends `data`, growing as needed; false (nothing appended) when it
    /// would pass the limit.
    pub fn push(&mut self, data: &[u8]) -> bool {
        if self.len() + data.len() > self.limit {
            return false;
        }
        let mut rest = data;
        while !rest.is_empty() {
            if !self.has_space() && !self.grow() {
                return false;
            }
            let space = self.space();
            let n = space.len().min(rest.len());
            space[..n].copy_from_slice(&rest[..n]);
            self.fill(n);
            rest = &rest[n..];
        }
        true
    }

    /// Mark `n` bytes of `space()` as filled.
    pub fn fill(&mut self, n: usize) {
        debug_assert!(self.end + n <= self.bytes.len(), "fill past capacity");
        self.end = (self.end + n).min(self.bytes.len());
    }

    /// Drop `n` bytes from the front of `data()`.
    pub fn consume(&mut self, n: usize) {
        debug_assert!(n <= self.len(), "consume past data");
        self.start = (self.start + n).min(self.end);
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Move the data to the front.
    pub fn shift(&mut self) {
        if self.start > 0 {
            self.bytes.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// Give the memory back when empty (idle keep-alive connections and
    /// quiet streams hold no buffer).
    pub fn release_if_empty(&mut self) {
        if self.is_empty() && !self.bytes.is_empty() {
            give_back(std::mem::take(&mut self.bytes));
            self.start = 0;
            self.end = 0;
        }
    }

    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        give_back(std::mem::take(&mut self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors() {
        let mut b = Buf::new(IO_BUF_SIZE * 4);
        assert!(b.is_empty());
        let s = b.space();
        assert_eq!(s.len(), IO_BUF_SIZE);
        s[..5].copy_from_slice(b"hello");
        b.fill(5);
        assert_eq!(b.data(), b"hello");
        b.consume(2);
        assert_eq!(b.data(), b"llo");
        let n = b.space().len();
        b.space()[..n].fill(b'x');
        b.fill(n);
        assert_eq!(b.len(), IO_BUF_SIZE - 2);
        // Full at the end with a consumed prefix: space() shifts.
        assert_eq!(b.space().len(), 2);
        assert!(b.data().starts_with(b"llo"));
        assert!(b.grow());
        assert_eq!(b.space().len(), IO_BUF_SIZE + 2);
        b.consume(b.len());
        assert!(b.is_empty());
        b.release_if_empty();
        assert!(b.has_space());
    }

    fn pooled() -> usize {
        POOL.with(|p| p.borrow().len())
    }

    #[test]
    fn released_buffers_are_reused() {
        let before = pooled();
        let mut a = Buf::new(IO_BUF_SIZE);
        a.space()[0] = 7;
        let ptr = a.space().as_ptr();
        a.release_if_empty();
        assert_eq!(pooled(), before + 1);
        let mut b = Buf::new(IO_BUF_SIZE);
        assert_eq!(b.space().as_ptr(), ptr, "the freed buffer is taken again");
        assert_eq!(b.space().len(), IO_BUF_SIZE);
        assert_eq!(pooled(), before);
        // A grown buffer is freed, not pooled; a dropped base one is pooled.
        let mut c = Buf::new(IO_BUF_SIZE * 2);
        c.space();
        assert!(c.grow());
        drop(c);
        assert_eq!(pooled(), before);
        drop(b);
        assert_eq!(pooled(), before + 1);
    }

    #[test]
    fn grow_stops_at_limit() {
        let mut b = Buf::new(IO_BUF_SIZE * 2);
        b.space();
        assert!(b.grow());
        assert!(!b.grow());
    }
}
