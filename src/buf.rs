//! `Buf`: a byte buffer with start/end cursors (sozu's verbs: `space`,
//! `fill`, `data`, `consume`, `shift`). It starts at `IO_BUF_SIZE` and grows
//! only on request, up to a fixed limit, so a connection's memory is bounded.

use crate::limits::IO_BUF_SIZE;

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
            self.bytes.resize(IO_BUF_SIZE.min(self.limit), 0);
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
            self.bytes = Vec::new();
            self.start = 0;
            self.end = 0;
        }
    }

    pub fn clear(&mut self) {
        self.start = 0;
        self.end = 0;
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

    #[test]
    fn grow_stops_at_limit() {
        let mut b = Buf::new(IO_BUF_SIZE * 2);
        b.space();
        assert!(b.grow());
        assert!(!b.grow());
    }
}
