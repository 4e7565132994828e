//! `StdioProxy`: the proxy binary started with `--stdio`, as an MCP host
//! starts a stdio server: stdin, stdout and stderr piped. Lines are written
//! to its stdin; every stdout line is checked as it is read (a JSON-RPC
//! object, or a non-empty array of them, ended by `\n`: the stdio contract)
//! and handed over parsed; reading stdout can be paused, as by a host that
//! stops reading. Started by `ProxyBuilder::start_stdio`.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::proxy_process::{drain, metrics_get, BIN};

/// What the stdout reader found wrong with the lines it read.
#[derive(Default)]
struct StdoutRecord {
    lines: usize,
    bytes: usize,
    /// Lines breaking the contract, each with why (cut to 200 bytes).
    bad: Vec<String>,
    eof: bool,
}

/// The stdout reader stops before its next line while `paused` is set, and
/// closes stdout once it has read `close_at` lines (0: never).
#[derive(Default)]
struct Gate {
    paused: Mutex<bool>,
    changed: Condvar,
    close_at: std::sync::atomic::AtomicUsize,
}

/// A running `--stdio` proxy. Killed on drop.
pub struct StdioProxy {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    /// Messages read and not taken yet (`wait_for` passed them over).
    pending: VecDeque<Value>,
    record: Arc<Mutex<StdoutRecord>>,
    gate: Arc<Gate>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

/// Whether `v` is one JSON-RPC 2.0 message (request, notification, response).
fn is_message(v: &Value) -> bool {
    v.as_object().is_some_and(|o| o.get("jsonrpc") == Some(&Value::from("2.0")))
}

/// `line` (without its `\n`) as a JSON-RPC message or batch, or why it is
/// not one.
pub fn jsonrpc_line(line: &[u8]) -> Result<Value, String> {
    let v: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON ({e})"))?;
    let ok = match &v {
        Value::Array(a) => !a.is_empty() && a.iter().all(is_message),
        v => is_message(v),
    };
    match ok {
        true => Ok(v),
        false => Err("JSON but not a JSON-RPC message or batch".to_string()),
    }
}

fn excerpt(line: &[u8]) -> String {
    String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned()
}

impl StdioProxy {
    /// Spawn `BIN args --stdio` (the builder's argv) with `envs` (`RUST_LOG`
    /// defaults to `debug`, as for `ProxyProcess`). Returns at once: there is
    /// no port line to wait for.
    #[track_caller]
    pub fn spawn(args: &[impl AsRef<OsStr>], envs: &[(impl AsRef<OsStr>, impl AsRef<OsStr>)]) -> StdioProxy {
        let mut cmd = Command::new(BIN);
        cmd.args(args).arg("--stdio").stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "debug");
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = crate::support::proxy_process::spawn(&mut cmd).expect("spawn proxy binary --stdio");
        let stderr = drain(child.stderr.take().expect("stderr piped"));
        let stdin = child.stdin.take();
        let out = child.stdout.take().expect("stdout piped");
        let record = Arc::new(Mutex::new(StdoutRecord::default()));
        let gate = Arc::new(Gate::default());
        let (tx, rx) = mpsc::channel();
        let (rec, g) = (record.clone(), gate.clone());
        std::thread::spawn(move || {
            let mut reader = BufReader::with_capacity(64 * 1024, out);
            let mut line = Vec::new();
            loop {
                {
                    let mut paused = g.paused.lock().unwrap();
                    while *paused {
                        paused = g.changed.wait(paused).unwrap();
                    }
                }
                let close_at = g.close_at.load(std::sync::atomic::Ordering::SeqCst);
                if close_at != 0 && rec.lock().unwrap().lines >= close_at {
                    break;
                }
                line.clear();
                match reader.read_until(b'\n', &mut line) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                let mut r = rec.lock().unwrap();
                r.lines += 1;
                r.bytes += line.len();
                let Some(body) = line.strip_suffix(b"\n") else {
                    r.bad.push(format!("a last line without its \\n: {}", excerpt(&line)));
                    break;
                };
                match jsonrpc_line(body) {
                    Ok(v) => {
                        drop(r);
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(why) => r.bad.push(format!("{why}: {}", excerpt(body))),
                }
            }
            rec.lock().unwrap().eof = true;
        });
        StdioProxy { child, stdin, lines: rx, pending: VecDeque::new(), record, gate, stderr }
    }

    /// Writes `line` and its `\n` to stdin.
    #[track_caller]
    pub fn send(&mut self, line: &[u8]) {
        let mut bytes = line.to_vec();
        bytes.push(b'\n');
        self.send_raw(&bytes);
    }

    /// Writes `bytes` to stdin as they are (no `\n` added).
    #[track_caller]
    pub fn send_raw(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().expect("stdin already closed");
        if let Err(e) = stdin.write_all(bytes).and_then(|()| stdin.flush()) {
            panic!("write to the proxy's stdin: {e}\n--- stderr ---\n{}", self.stderr_text());
        }
    }

    #[track_caller]
    pub fn send_json(&mut self, v: &Value) {
        self.send(v.to_string().as_bytes());
    }

    /// Takes stdin, for a writer of its own (a thread that floods it).
    pub fn take_stdin(&mut self) -> ChildStdin {
        self.stdin.take().expect("stdin already taken")
    }

    /// Closes stdin: the host is done.
    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// The next message on stdout (one passed over by `wait_for` first), or
    /// None after `limit`.
    pub fn try_next(&mut self, limit: Duration) -> Option<Value> {
        if let Some(v) = self.pending.pop_front() {
            return Some(v);
        }
        self.lines.recv_timeout(limit).ok()
    }

    /// The next message on stdout; panics with the log after `limit`.
    #[track_caller]
    pub fn next(&mut self, limit: Duration) -> Value {
        match self.try_next(limit) {
            Some(v) => v,
            None => self.fail(&format!("no message on stdout in {limit:?}")),
        }
    }

    /// The first message matching `pred` (those before it stay for `next`),
    /// or None after `limit`.
    pub fn try_wait_for(&mut self, limit: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
        if let Some(at) = self.pending.iter().position(&pred) {
            return self.pending.remove(at);
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(v) if pred(&v) => return Some(v),
                Ok(v) => self.pending.push_back(v),
                Err(_) => return None,
            }
        }
    }

    /// `try_wait_for`, panicking with `what` and the log after `limit`.
    #[track_caller]
    pub fn wait_for(&mut self, what: &str, limit: Duration, pred: impl Fn(&Value) -> bool) -> Value {
        match self.try_wait_for(limit, pred) {
            Some(v) => v,
            None => self.fail(&format!("no {what} on stdout in {limit:?}")),
        }
    }

    /// The answer (result or error) to the request with `id`.
    #[track_caller]
    pub fn answer_to(&mut self, id: &Value, limit: Duration) -> Value {
        let id = id.clone();
        self.wait_for(&format!("answer to id {id}"), limit, move |v| {
            v.get("id") == Some(&id) && v.get("method").is_none()
        })
    }

    /// Sends the request `msg` and waits (10 s) for its answer.
    #[track_caller]
    pub fn call(&mut self, msg: &Value) -> Value {
        self.send_json(msg);
        self.answer_to(&msg["id"], Duration::from_secs(10))
    }

    /// Messages passed over and not taken.
    pub fn pending(&self) -> Vec<Value> {
        self.pending.iter().cloned().collect()
    }

    /// Stops reading stdout (after the line being read), as a host that
    /// stops reading; `resume_reading` goes on.
    pub fn pause_reading(&self) {
        *self.gate.paused.lock().unwrap() = true;
    }

    pub fn resume_reading(&self) {
        *self.gate.paused.lock().unwrap() = false;
        self.gate.changed.notify_all();
    }

    /// Closes stdout, as a host that went away: the reader drops the pipe
    /// before the next line it would read (so once one more line came).
    pub fn close_stdout_after_next_line(&self) {
        // Counted from the lines read now, so a reader that has not looped
        // back yet still reads the next one.
        let next = self.record.lock().unwrap().lines + 1;
        self.gate.close_at.store(next, std::sync::atomic::Ordering::SeqCst);
    }

    /// Lines and bytes read from stdout so far.
    pub fn stdout_read(&self) -> (usize, usize) {
        let r = self.record.lock().unwrap();
        (r.lines, r.bytes)
    }

    /// Every stdout line read so far was one JSON-RPC message or batch.
    #[track_caller]
    pub fn assert_stdout_clean(&self) {
        let r = self.record.lock().unwrap();
        assert!(
            r.bad.is_empty(),
            "stdout carried {} line(s) that are not JSON-RPC (of {} read):\n{}\n--- stderr ---\n{}",
            r.bad.len(),
            r.lines,
            r.bad.join("\n"),
            self.stderr_text()
        );
    }

    /// Closes stdin, waits up to `limit` for the exit; asserts exit 0, that
    /// stdout ended, and that every line it carried was JSON-RPC.
    #[track_caller]
    pub fn end_session(&mut self, limit: Duration) -> Duration {
        let t0 = Instant::now();
        self.close_stdin();
        let status = self.wait_exit(limit);
        let took = t0.elapsed();
        match status {
            Some(s) if s.success() => {}
            Some(s) => self.fail(&format!("exited with {s} after stdin closed")),
            None => self.fail(&format!("still running {limit:?} after stdin closed")),
        }
        self.wait_stdout_eof();
        self.assert_stdout_clean();
        took
    }

    /// Waits (2 s) for the stdout reader to see EOF (the process exited).
    pub fn wait_stdout_eof(&self) {
        let t0 = Instant::now();
        while !self.record.lock().unwrap().eof && t0.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal (`TERM`, `HUP`) with kill(1). Unix only.
    #[cfg(unix)]
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status();
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// The log once it holds `needle`, or as it stands after `limit`.
    pub fn stderr_once(&self, needle: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let text = self.stderr_text();
            if text.contains(needle) || Instant::now() >= deadline {
                return text;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// With `--metrics-listen`: the port of the `  metrics: port N` line,
    /// which goes to stderr under `--stdio` (10 s bound).
    #[track_caller]
    pub fn metrics_port(&self) -> u16 {
        let text = self.stderr_once("  metrics: port ", Duration::from_secs(10));
        let port = text
            .lines()
            .find_map(|l| l.strip_prefix("  metrics: port "))
            .and_then(|p| p.trim().parse::<u16>().ok());
        port.unwrap_or_else(|| self.fail("printed no `  metrics: port N` line on stderr"))
    }

    /// `GET path` on the metrics listener: its status and body.
    #[track_caller]
    pub fn metrics_get(&self, path: &str) -> (u16, String) {
        metrics_get(self.metrics_port(), path)
    }

    #[track_caller]
    fn fail(&self, why: &str) -> ! {
        let r = self.record.lock().unwrap();
        panic!(
            "stdio proxy: {why}\nstdout: {} lines, {} bytes; passed over: {:?}\n--- stderr ---\n{}",
            r.lines,
            r.bytes,
            self.pending,
            tail(&self.stderr_text(), 20_000)
        )
    }
}

fn tail(text: &str, max: usize) -> &str {
    let mut start = text.len().saturating_sub(max);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

impl Drop for StdioProxy {
    fn drop(&mut self) {
        self.resume_reading();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
