//! Real-client environment: pinned Python MCP SDKs, the TypeScript MCP SDK and the rmcp client, installed on
//! first use under `target/realenv/` (or `$MCP_REALENV_DIR`), plus launchers for the FastMCP upstream and the
//! client programs in `tests/support/` and `tests/rmcp_client/`.
//!
//! - `py1`: a venv with `tests/support/requirements-py1.txt` (mcp 1.x: FastMCP and the 1.x client).
//! - `py2`: a venv with `tests/support/requirements-py2.txt` (mcp 2.x: MCPServer and the 2026-07-28 client).
//! - `node`: `npm ci` of `tests/support/package.json` + `package-lock.json` (@modelcontextprotocol/sdk 1.32.x).
//! - `rmcp-client`: `cargo build --locked` of `tests/rmcp_client/` (rmcp 3.11.0, pinned by its Cargo.lock), a
//!   crate of its own so that the root package links none of rmcp, tokio and reqwest.
//!
//! Each component is installed once: a marker file holds the pinned inputs (requirements or lock file, and the
//! interpreter version); a different marker means reinstall. The rmcp client's binary is kept under a name
//! derived from its inputs (sources, Cargo.toml, Cargo.lock, cargo version) instead, so work trees sharing one
//! `$MCP_REALENV_DIR` never run each other's build. An exclusive `flock` per component keeps parallel
//! tests and test binaries from racing. A failed install (e.g. offline) panics with the installer's output.
//! Nothing here ever skips a test: with or without `CI` set, a test that needs a component gets it or fails.
#![allow(dead_code)]

use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// `tests/support/` in the source tree.
pub fn support_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("support")
}

/// `target/realenv/` (next to `target/tmp`), or `$MCP_REALENV_DIR` to share one install between target dirs.
pub fn root() -> PathBuf {
    if let Some(dir) = std::env::var_os("MCP_REALENV_DIR") {
        return PathBuf::from(dir);
    }
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    tmp.parent().unwrap_or(&tmp).join("realenv")
}

/// The interpreter venvs are made from (`python3`, or `$MCP_REALENV_PYTHON`).
fn base_python() -> String {
    std::env::var("MCP_REALENV_PYTHON").unwrap_or_else(|_| "python3".to_string())
}

/// The Python of the `py1` venv (mcp 1.x), installed on first use.
pub fn py1() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_venv("py1", "requirements-py1.txt"))
}

/// The Python of the `py2` venv (mcp 2.x), installed on first use.
pub fn py2() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| install_venv("py2", "requirements-py2.txt"))
}

/// The `node_modules` directory holding @modelcontextprotocol/sdk, installed on first use.
/// Scripts are CommonJS and find it through `NODE_PATH`.
pub fn node_modules() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(install_node)
}

/// An exclusive advisory lock on `path`, released when the file is dropped.
fn lock_file(path: &Path) -> File {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("realenv: cannot open lock file {}: {e}", path.display()));
    // SAFETY: flock on a valid, owned fd; blocks until the lock is ours.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
    assert_eq!(rc, 0, "realenv: flock {} failed: {}", path.display(), std::io::Error::last_os_error());
    file
}

/// Run an installer step; panic with its output if it fails.
fn run_step(what: &str, cmd: &mut Command) -> String {
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("realenv: cannot run {what} ({cmd:?}): {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !out.status.success() {
        let tail: String = {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        };
        panic!(
            "realenv: {what} failed ({}) after {:.1}s.\n\
             The real-client tests install pinned packages from PyPI, the npm registry and crates.io on\n\
             first use; check network access to the registries (an offline machine cannot run them).\n\
             command: {cmd:?}\n--- last lines of output ---\n{tail}",
            out.status,
            started.elapsed().as_secs_f64()
        );
    }
    eprintln!("realenv: {what} done in {:.1}s", started.elapsed().as_secs_f64());
    text
}

fn tool_version(program: &str, arg: &str) -> String {
    let out = Command::new(program)
        .arg(arg)
        .output()
        .unwrap_or_else(|e| panic!("realenv: `{program} {arg}` cannot run: {e}; is {program} installed?"));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
        .trim()
        .to_string()
}

/// Install (once) a venv named `name` with the pinned `requirements`; return its python.
fn install_venv(name: &str, requirements: &str) -> PathBuf {
    let root = root();
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", root.display()));
    let _lock = lock_file(&root.join(format!("{name}.lock")));
    let dir = root.join(name);
    let python = dir.join("bin").join("python");
    let req_path = support_dir().join(requirements);
    let req =
        fs::read_to_string(&req_path).unwrap_or_else(|e| panic!("realenv: read {}: {e}", req_path.display()));
    let base = base_python();
    let expected = format!("{}\n{}\n{req}", tool_version(&base, "--version"), requirements);
    let marker = dir.join(".installed");
    if python.exists() && fs::read_to_string(&marker).ok().as_deref() == Some(expected.as_str()) {
        return python;
    }
    eprintln!("realenv: installing {name} ({requirements}) into {}", dir.display());
    let _ = fs::remove_dir_all(&dir);
    run_step(&format!("{base} -m venv {name}"), Command::new(&base).args(["-m", "venv"]).arg(&dir));
    run_step(
        &format!("pip install -r {requirements}"),
        Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--no-input",
                "--timeout",
                "30",
                "--retries",
                "2",
                "-r",
            ])
            .arg(&req_path),
    );
    fs::write(&marker, &expected).unwrap_or_else(|e| panic!("realenv: write {}: {e}", marker.display()));
    python
}

/// Install (once) the Node project with `npm ci`; return its node_modules.
fn install_node() -> PathBuf {
    let root = root();
    fs::create_dir_all(&root).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", root.display()));
    let _lock = lock_file(&root.join("node.lock"));
    let dir = root.join("node");
    let modules = dir.join("node_modules");
    let pkg =
        fs::read_to_string(support_dir().join("package.json")).expect("read tests/support/package.json");
    let lock = fs::read_to_string(support_dir().join("package-lock.json"))
        .expect("read tests/support/package-lock.json");
    let expected = format!("node {}\n{pkg}\n{lock}", tool_version("node", "--version"));
    let marker = dir.join(".installed");
    if modules.is_dir() && fs::read_to_string(&marker).ok().as_deref() == Some(expected.as_str()) {
        return modules;
    }
    eprintln!("realenv: installing the Node project (npm ci) into {}", dir.display());
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", dir.display()));
    fs::write(dir.join("package.json"), &pkg).expect("copy package.json");
    fs::write(dir.join("package-lock.json"), &lock).expect("copy package-lock.json");
    run_step(
        "npm ci",
        Command::new("npm")
            .args(["ci", "--ignore-scripts", "--no-audit", "--no-fund", "--fetch-timeout=30000"])
            .current_dir(&dir),
    );
    fs::write(&marker, &expected).unwrap_or_else(|e| panic!("realenv: write {}: {e}", marker.display()));
    modules
}

/// The rmcp test client (`tests/rmcp_client/`), built on first use; see [`install_rmcp_client`].
pub fn rmcp_client() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(install_rmcp_client)
}

/// `tests/rmcp_client/` in the source tree.
fn rmcp_client_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests").join("rmcp_client")
}

/// FNV-1a, 64 bits: a hash that stays the same across Rust releases (std's `DefaultHasher` need not), to name
/// the cached binary after its inputs.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// Build (once per set of inputs) the rmcp client with `cargo build --locked` into
/// `<realenv>/rmcp-client/target`, copy the binary to `<realenv>/rmcp-client/bin/<hash of inputs>/`, return it.
/// The dev profile: the crate sets it to build fast, and the client's speed does not matter.
fn install_rmcp_client() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let src = rmcp_client_dir();
    let mut inputs = vec![src.join("Cargo.toml"), src.join("Cargo.lock")];
    let mut sources: Vec<PathBuf> = fs::read_dir(src.join("src"))
        .unwrap_or_else(|e| panic!("realenv: read {}: {e}", src.join("src").display()))
        .map(|entry| entry.expect("read_dir entry").path())
        .collect();
    sources.sort();
    inputs.extend(sources);
    let mut hash = fnv1a(tool_version(&cargo, "--version").as_bytes(), 0xcbf2_9ce4_8422_2325);
    for path in &inputs {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("realenv: read {}: {e}", path.display()));
        hash = fnv1a(path.file_name().unwrap_or_default().as_encoded_bytes(), hash);
        hash = fnv1a(&bytes, hash);
    }

    let dir = root().join("rmcp-client");
    let bin_dir = dir.join("bin").join(format!("{hash:016x}"));
    let exe = bin_dir.join(format!("rmcp-test-client{}", std::env::consts::EXE_SUFFIX));
    if exe.exists() {
        return exe;
    }
    fs::create_dir_all(&bin_dir).unwrap_or_else(|e| panic!("realenv: mkdir {}: {e}", bin_dir.display()));
    let _lock = lock_file(&dir.join("build.lock"));
    if exe.exists() {
        return exe;
    }
    let target = dir.join("target");
    eprintln!("realenv: building the rmcp client ({}) into {}", src.display(), target.display());
    run_step(
        "cargo build --locked (tests/rmcp_client)",
        Command::new(&cargo)
            .args(["build", "--locked", "--manifest-path"])
            .arg(src.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target),
    );
    let built = target.join("debug").join(exe.file_name().expect("exe has a file name"));
    // Copy then rename: a concurrent reader that checks `exe.exists()` without the lock sees all or nothing.
    let partial = bin_dir.join("partial");
    fs::copy(&built, &partial)
        .unwrap_or_else(|e| panic!("realenv: copy {} to {}: {e}", built.display(), partial.display()));
    fs::rename(&partial, &exe).unwrap_or_else(|e| panic!("realenv: rename to {}: {e}", exe.display()));
    exe
}

/// Collects a child's pipe into a shared buffer.
fn drain(mut pipe: impl Read + Send + 'static) -> Arc<Mutex<Vec<u8>>> {
    let buf = Arc::new(Mutex::new(Vec::new()));
    let sink = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    buf
}

/// A running `tests/support/fastmcp_server.py`. Killed on drop.
pub struct FastMcp {
    child: Child,
    pub port: u16,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl FastMcp {
    /// Start the test upstream with `python` (py1 or py2), transport `streamable-http` or `sse`, expecting
    /// `Authorization: Bearer <token>` (passed in the environment). Waits for its `PORT n` line (30 s bound).
    #[track_caller]
    pub fn start(python: &Path, transport: &str, token: &str) -> FastMcp {
        Self::start_with(python, &["--transport", transport], token)
    }

    /// Like `start`, with any `fastmcp_server.py` arguments (e.g. `--absolute-endpoint`); `token` may be a
    /// comma-separated list of accepted tokens.
    #[track_caller]
    pub fn start_with(python: &Path, args: &[&str], token: &str) -> FastMcp {
        let script = support_dir().join("fastmcp_server.py");
        let mut child = Command::new(python)
            .arg(&script)
            .args(args)
            .env("FASTMCP_TEST_TOKEN", token)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", script.display()));
        let stderr = drain(child.stderr.take().unwrap());
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            let _ = tx.send(line);
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).unwrap_or_default();
        let port = line.strip_prefix("PORT ").and_then(|p| p.trim().parse::<u16>().ok());
        let Some(port) = port else {
            let _ = child.kill();
            let _ = child.wait();
            std::thread::sleep(Duration::from_millis(100));
            panic!(
                "fastmcp_server.py printed {line:?} instead of `PORT n`; stderr:\n{}",
                String::from_utf8_lossy(&stderr.lock().unwrap())
            );
        };
        FastMcp { child, port, stderr }
    }

    /// `http://127.0.0.1:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{}", self.port, path)
    }

    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr.lock().unwrap()).into_owned()
    }
}

impl Drop for FastMcp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a client script left behind.
pub struct ScriptRun {
    pub json: serde_json::Value,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Run a client script that prints one JSON object on stdout; bounded by `limit` (the child is killed then).
/// Panics if it does not exit 0 with valid JSON.
#[track_caller]
pub fn run_json(what: &str, mut cmd: Command, limit: Duration) -> ScriptRun {
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start {cmd:?}: {e}"));
    let stdout = drain(child.stdout.take().unwrap());
    let stderr = drain(child.stderr.take().unwrap());
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // Give the drain threads a moment to see EOF.
    std::thread::sleep(Duration::from_millis(20));
    let out = String::from_utf8_lossy(&stdout.lock().unwrap()).into_owned();
    let err = String::from_utf8_lossy(&stderr.lock().unwrap()).into_owned();
    let elapsed = started.elapsed();
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("{what}: exited with {s}\n--- stdout ---\n{out}\n--- stderr ---\n{err}"),
        None => {
            panic!("{what}: killed after {limit:?}\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
        }
    }
    let json = serde_json::from_str(&out).unwrap_or_else(|e| {
        panic!("{what}: stdout is not JSON ({e})\n--- stdout ---\n{out}\n--- stderr ---\n{err}")
    });
    ScriptRun { json, stdout: out, stderr: err, elapsed }
}

/// `python tests/support/<script> <args>`.
pub fn python_script(python: &Path, script: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(python);
    cmd.arg(support_dir().join(script)).args(args).env("PYTHONUNBUFFERED", "1");
    cmd
}

/// `node tests/support/<script> <args>` with the pinned SDK on `NODE_PATH`.
pub fn node_script(script: &str, args: &[&str]) -> Command {
    let modules = node_modules();
    let mut cmd = Command::new("node");
    cmd.arg(support_dir().join(script)).args(args).env("NODE_PATH", modules);
    cmd
}

/// The rmcp test client with `args`.
pub fn rmcp_client_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(rmcp_client());
    cmd.args(args);
    cmd
}

/// `node tests/support/<script> <args>` with no packages (Node's built-in fetch only).
pub fn plain_node_script(script: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("node");
    cmd.arg(support_dir().join(script)).args(args);
    cmd
}
