//! stdout for `--stdio`: whole lines handed to a writer thread through a
//! bounded queue, so a host that stops reading blocks that thread only,
//! never the event loop; and the one line lock that keeps two messages
//! from interleaving when one is too large to hold and streams.

use std::collections::VecDeque;
use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;

/// Bytes queued for stdout past which no more is read from the exchanges
/// (a streamed message may pass it by one step).
pub const OUT_CAP: usize = 256 * 1024;
/// A streamed message goes to the writer in chunks of about this size.
const FLUSH_AT: usize = 64 * 1024;

#[derive(Default)]
struct State {
    chunks: VecDeque<Vec<u8>>,
    /// Bytes queued or being written.
    bytes: usize,
    /// The loop sends nothing more: the writer ends once the queue is empty.
    closed: bool,
    /// Writing failed (the host closed stdout): nothing more goes out.
    failed: bool,
    /// The loop waits for room: wake it when the queue drains below half.
    waiting: bool,
}

struct Shared {
    state: Mutex<State>,
    ready: Condvar,
}

/// The loop's side of the stdout queue.
pub struct Stdout {
    shared: Arc<Shared>,
    /// The chunk being filled (moved to the queue by `flush`).
    buf: Vec<u8>,
    /// The id of the exchange whose streamed message holds the line.
    lock: Option<u64>,
    writer: Option<thread::JoinHandle<()>>,
}

impl Stdout {
    /// Starts the writer thread on `sink` (stdout; a test's buffer);
    /// `wake` is called from it when room comes back.
    pub fn start<W, F>(mut sink: W, wake: F) -> std::io::Result<Stdout>
    where
        W: Write + Send + 'static,
        F: Fn() + Send + 'static,
    {
        let shared = Arc::new(Shared { state: Mutex::new(State::default()), ready: Condvar::new() });
        let theirs = shared.clone();
        let writer = thread::Builder::new().name("stdout".into()).spawn(move || loop {
            let chunk = {
                let mut s = theirs.state.lock().unwrap_or_else(PoisonError::into_inner);
                loop {
                    if let Some(c) = s.chunks.pop_front() {
                        break c;
                    }
                    if s.closed || s.failed {
                        return;
                    }
                    s = theirs.ready.wait(s).unwrap_or_else(PoisonError::into_inner);
                }
            };
            let ok = sink.write_all(&chunk).and_then(|()| sink.flush());
            let mut s = theirs.state.lock().unwrap_or_else(PoisonError::into_inner);
            s.bytes = s.bytes.saturating_sub(chunk.len());
            if let Err(e) = ok {
                log::warn!("stdout: {e}; the host stopped reading");
                s.failed = true;
                s.chunks.clear();
                s.bytes = 0;
            }
            if s.failed || (s.waiting && s.bytes < OUT_CAP / 2) || (s.bytes == 0 && s.closed) {
                s.waiting = false;
                drop(s);
                wake();
            }
        })?;
        Ok(Stdout { shared, buf: Vec::new(), lock: None, writer: Some(writer) })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Room for more: below `OUT_CAP` (else the writer is asked to wake
    /// the loop when it drains).
    pub fn has_room(&self) -> bool {
        let mut s = self.state();
        let room = s.bytes + self.buf.len() < OUT_CAP || s.failed;
        if !room {
            s.waiting = true;
        }
        room
    }

    /// A whole line (a message and its `\n`), if the line is free.
    pub fn try_line(&mut self, line: &[u8]) -> bool {
        if self.lock.is_some() {
            return false;
        }
        self.buf.extend_from_slice(line);
        self.buf.push(b'\n');
        true
    }

    /// Hands what was written this round to the writer thread.
    pub fn flush(&mut self) {
        if self.buf.is_empty() {
            return;
        }
        let chunk = std::mem::take(&mut self.buf);
        let mut s = self.state();
        if s.failed {
            return;
        }
        s.bytes += chunk.len();
        s.chunks.push_back(chunk);
        drop(s);
        self.shared.ready.notify_one();
    }

    /// Nothing is queued or being written.
    pub fn is_idle(&self) -> bool {
        self.buf.is_empty() && self.state().bytes == 0
    }

    /// The host closed stdout.
    pub fn failed(&self) -> bool {
        self.state().failed
    }

    /// The writer thread ends after the last queued byte.
    pub fn close(&mut self) {
        self.flush();
        self.state().closed = true;
        self.shared.ready.notify_one();
    }

    /// Closes, and waits for the writer thread to end (after the last byte,
    /// or a failed write): for a caller that starts many (a fuzz target).
    /// The process does not wait (`finished` bounds the wait instead).
    pub fn join(mut self) {
        self.close();
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }

    /// What one exchange may write: its lines, and a streamed message.
    pub fn emit(&mut self, id: u64) -> Emit<'_> {
        Emit { out: self, id }
    }
}

/// One exchange's access to stdout.
pub struct Emit<'a> {
    out: &'a mut Stdout,
    id: u64,
}

impl Emit<'_> {
    pub fn has_room(&self) -> bool {
        self.out.has_room()
    }

    /// Takes the line for a streamed message; false while another holds it
    /// or there is no room.
    pub fn take_line(&mut self) -> bool {
        match self.out.lock {
            Some(holder) => holder == self.id,
            None if self.out.has_room() => {
                self.out.lock = Some(self.id);
                true
            }
            None => false,
        }
    }

    /// Bytes of the streamed message (the line is held).
    pub fn write(&mut self, bytes: &[u8]) {
        debug_assert_eq!(self.out.lock, Some(self.id), "streamed without the line");
        self.out.buf.extend_from_slice(bytes);
        if self.out.buf.len() >= FLUSH_AT {
            self.out.flush();
        }
    }

    pub fn release_line(&mut self) {
        if self.out.lock == Some(self.id) {
            self.out.lock = None;
        }
    }

    /// A whole message on its line; false while another holds the line.
    pub fn line(&mut self, message: &[u8]) -> bool {
        match self.out.lock {
            Some(holder) if holder != self.id => false,
            _ => {
                self.out.buf.extend_from_slice(message);
                self.out.buf.push(b'\n');
                true
            }
        }
    }
}
