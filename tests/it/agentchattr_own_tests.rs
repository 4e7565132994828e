//! agentchattr's own proxy tests (`tests/test_mcp_proxy.py` in its source tree, five tests: one session
//! header on `initialize`, the session id kept on a follow-up POST, DELETE relayed with its body, session
//! header and the agent's token, DELETE's 404 relayed, and the mcp 1.x SDK client's initialize + tools/list
//! through the proxy), run unchanged against the project's drop-in: the snapshot in
//! `../shared/agentchattr/` is unpacked into a scratch directory, its `mcp_proxy.py` is replaced by the
//! one line `from mcp_identity_proxy import McpIdentityProxy`, and `python -m unittest` runs with `python/`
//! on `PYTHONPATH` and this build's binary in `MCP_IDENTITY_PROXY_BIN`, in the `agentchattr` venv (its
//! pinned requirements: FastAPI, uvicorn, mcp 1.30.0). `.ci/dist-check` runs the same tests once more
//! against the installed Linux wheel.

use crate::support::proxy_process::{drain, scratch_dir, BIN};
use crate::support::realenv::agentchattr_py;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The agentchattr snapshot (maxlamagna/agentchattr a813e38), beside the project in the workplace.
const TARBALL: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/agentchattr/agentchattr-maxlamagna-a813e38.tar.gz");

/// The five tests of agentchattr's `tests/test_mcp_proxy.py`, by name.
const TESTS: [&str; 5] = [
    "test_delete_relays_upstream_http_error",
    "test_delete_relays_upstream_success_body_and_session_header",
    "test_follow_up_post_preserves_client_session_id",
    "test_initialize_response_has_one_case_insensitive_session_header",
    "test_sdk_initialize_notification_and_tools_list_through_proxy",
];

/// The whole unittest run (five proxy starts, one SDK session) takes about 3 s; this bounds a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// Unpack the tarball into a scratch directory; the source tree it holds (`agentchattr/`).
fn unpack() -> PathBuf {
    assert!(
        Path::new(TARBALL).is_file(),
        "agentchattr's source snapshot is missing: expected {TARBALL} (the workplace's \
         shared/agentchattr/, beside the project's checkout); this test needs it and does not skip"
    );
    let dir = scratch_dir("agentchattr-own-tests");
    let out = Command::new("tar")
        .arg("-xzf")
        .arg(TARBALL)
        .arg("-C")
        .arg(&dir)
        .output()
        .expect("run tar to unpack agentchattr's snapshot");
    assert!(
        out.status.success(),
        "tar -xzf {TARBALL} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let tree = dir.join("agentchattr");
    for file in ["mcp_proxy.py", "tests/test_mcp_proxy.py"] {
        assert!(tree.join(file).is_file(), "the snapshot has no agentchattr/{file}");
    }
    tree
}

/// unittest's verdict on `name` in a `-v` report: the first verdict word after its `name (...) ... `
/// (on that line, or on a later one when the test wrote to stderr meanwhile); None if the test did not run.
fn verdict(report: &str, name: &str) -> Option<&'static str> {
    const VERDICTS: [&str; 6] = ["ok", "FAIL", "ERROR", "skipped", "expected failure", "unexpected success"];
    let header = format!("{name} (");
    let mut lines = report.lines().skip_while(|l| !l.starts_with(&header));
    let first = lines.next()?.split_once(" ... ").map_or("", |(_, rest)| rest);
    std::iter::once(first)
        .chain(lines)
        .map(str::trim)
        .find_map(|l| VERDICTS.into_iter().find(|v| l == *v || l.starts_with(&format!("{v} "))))
}

#[test]
fn agentchattr_test_mcp_proxy_passes_with_the_drop_in() {
    let python = agentchattr_py();
    let tree = unpack();
    // The one-line mcp_proxy.py of the README's drop-in section.
    std::fs::write(tree.join("mcp_proxy.py"), "from mcp_identity_proxy import McpIdentityProxy\n")
        .expect("replace agentchattr's mcp_proxy.py with the one-line import");
    let package_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python");

    let started = Instant::now();
    let mut child = Command::new(python)
        .args(["-m", "unittest", "-v", "tests.test_mcp_proxy"])
        .current_dir(&tree)
        .env("PYTHONPATH", &package_dir)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("PYTHONUNBUFFERED", "1")
        .env("MCP_IDENTITY_PROXY_BIN", BIN)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agentchattr venv's python");
    let stdout = drain(child.stdout.take().expect("piped stdout"));
    let stderr = drain(child.stderr.take().expect("piped stderr"));
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for python -m unittest") {
            break Some(status);
        }
        if started.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Let the drain threads see EOF.
    std::thread::sleep(Duration::from_millis(50));
    let out = String::from_utf8_lossy(&stdout.lock().expect("stdout buffer")).into_owned();
    let err = String::from_utf8_lossy(&stderr.lock().expect("stderr buffer")).into_owned();
    let transcript = format!("--- stdout ---\n{out}\n--- stderr (unittest's report) ---\n{err}");
    let Some(status) = status else {
        panic!("python -m unittest tests.test_mcp_proxy killed after {LIMIT:?}\n{transcript}");
    };

    // unittest reports on stderr: one "<name> (...) ... ok" per test, "Ran 5 tests in ...s", then "OK".
    let ran = err.lines().find(|l| l.starts_with("Ran ")).unwrap_or("");
    assert!(ran.starts_with("Ran 5 tests"), "expected `Ran 5 tests`, got {ran:?}\n{transcript}");
    let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
    assert_eq!(last.trim(), "OK", "unittest did not end with OK\n{transcript}");
    for name in TESTS {
        let got = verdict(&err, name);
        assert_eq!(got, Some("ok"), "agentchattr's {name}: verdict {got:?}, not ok\n{transcript}");
    }
    assert!(status.success(), "python -m unittest exited with {status}\n{transcript}");
    // Every test started the real binary: its port line, echoed by start() as agentchattr's proxy prints it.
    let port_lines = format!("{out}{err}").matches("  MCP proxy: port ").count();
    assert_eq!(port_lines, TESTS.len(), "expected one port line per test\n{transcript}");
}
