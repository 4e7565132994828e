//! `ProxyProcess`: the real proxy binary as a child process; scratch files.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The proxy binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_mcp-identity-proxy");

/// A fresh scratch directory under `target/` for one test.
#[track_caller]
pub fn scratch_dir(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

/// Write `token` to a fresh file and return its path.
#[track_caller]
pub fn token_file(token: &str) -> PathBuf {
    let path = scratch_dir("token").join("token");
    std::fs::write(&path, format!("{token}\n")).expect("write token file");
    path
}

/// A running proxy child process. Killed on drop.
pub struct ProxyProcess {
    child: Child,
    pub port: u16,
    stderr: Arc<Mutex<Vec<u8>>>,
    stdout_rest: Arc<Mutex<Vec<u8>>>,
}

impl ProxyProcess {
    /// Start the proxy with `args` and extra environment, wait for the
    /// `  MCP proxy: port N` line (10 s bound) and return it.
    #[track_caller]
    pub fn start(args: &[&str], envs: &[(&str, &str)]) -> ProxyProcess {
        Self::start_with_stdin(args, envs, false)
    }

    /// Like `start`, with a piped stdin (for `--control-stdin`).
    #[track_caller]
    pub fn start_with_stdin(args: &[&str], envs: &[(&str, &str)], piped_stdin: bool) -> ProxyProcess {
        let mut cmd = Command::new(BIN);
        cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).stdin(if piped_stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "debug");
        }
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawn proxy binary");
        let stderr = drain(child.stderr.take().expect("stderr piped"));
        let out = child.stdout.take().expect("stdout piped");
        let (tx, rx) = std::sync::mpsc::channel();
        let stdout_rest = Arc::new(Mutex::new(Vec::new()));
        let rest = stdout_rest.clone();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(out);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let mut buf = Vec::new();
            let _ = reader.read_to_end(&mut buf);
            rest.lock().unwrap().extend_from_slice(&buf);
        });
        let line = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) => line,
            Err(_) => {
                let _ = child.kill();
                panic!(
                    "proxy printed no port line in 10 s; stderr:\n{}",
                    String::from_utf8_lossy(&stderr.lock().unwrap())
                );
            }
        };
        let port = line.strip_prefix("  MCP proxy: port ").and_then(|p| p.trim_end().parse::<u16>().ok());
        let Some(port) = port else {
            let status = child.wait().ok();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "unexpected first stdout line {line:?} (exit {status:?}); stderr:\n{}",
                String::from_utf8_lossy(&stderr.lock().unwrap())
            );
        };
        ProxyProcess { child, port, stderr, stdout_rest }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    /// A new raw client connection (5 s read/write timeouts).
    #[track_caller]
    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr()).expect("connect to proxy");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
        s
    }

    pub fn stdin(&mut self) -> Option<&mut ChildStdin> {
        self.child.stdin.as_mut()
    }

    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.stdin.take()
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the proxy wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }

    /// Send a signal (`TERM`, `INT`, `HUP`) to the child with kill(1): Unix
    /// only (Windows has console events, not signals).
    #[cfg(unix)]
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill").args([&format!("-{sig}"), &self.child.id().to_string()]).status();
    }

    /// Ask for a graceful shutdown the portable way: close stdin when it is
    /// piped (the proxy runs with `--control-stdin`), else SIGTERM on Unix;
    /// on Windows a proxy without a control stdin is killed.
    pub fn stop(&mut self) {
        if self.child.stdin.take().is_some() {
            return;
        }
        #[cfg(unix)]
        self.signal("TERM");
        #[cfg(not(unix))]
        let _ = self.child.kill();
    }

    /// Whether the child is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Wait up to `limit` for the process to exit.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Collects a child's pipe into a shared buffer.
pub fn drain(pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    drain_into(pipe, buf.clone());
    buf
}

/// Appends a child's pipe to `sink` until EOF.
pub fn drain_into(mut pipe: impl Read + Send + 'static, sink: Arc<Mutex<Vec<u8>>>) {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
}
