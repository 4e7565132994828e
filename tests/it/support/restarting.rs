//! `RestartingUpstream`: an upstream on a fixed port that dies and comes back
//! as a restarted server process does. `stop` closes the listener (connects
//! are refused) and cuts every open connection at once, whatever it was doing
//! (idle, reading a request, halfway through a response); `restart` binds the
//! same port again and starts a new `Generation`. What a generation remembers
//! (a FastMCP server's sessions) is the handler's business: it is told which
//! generation each request arrived in.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::support::wire::{read_request, Next, Req, STUB_LIMIT};

/// How long an idle keep-alive connection is kept: uvicorn's default
/// `timeout_keep_alive`, what a FastMCP server does.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(5);

/// One life of the server process, from bind to `stop`.
pub struct Generation {
    /// 1 for the first start, then one more for each restart.
    pub number: u64,
    alive: AtomicBool,
    /// A clone of every open connection, to cut them all when it dies.
    open: Mutex<HashMap<usize, TcpStream>>,
    accepted: AtomicUsize,
}

impl Generation {
    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::SeqCst)
    }

    /// Connections accepted in this generation.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn die(&self) {
        let mut open = self.open.lock().unwrap();
        self.alive.store(false, Ordering::SeqCst);
        for (_, s) in open.drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

type Handler = dyn Fn(&Req, &mut TcpStream, &Generation) -> Next + Send + Sync;

pub struct RestartingUpstream {
    pub port: u16,
    handler: Arc<Handler>,
    current: Option<(Arc<Generation>, JoinHandle<()>)>,
    generations: u64,
}

impl RestartingUpstream {
    /// Bind a free loopback port and serve generation 1: a thread per
    /// connection reads requests and hands each to `handler`, which writes
    /// whatever it likes and says whether to keep the connection.
    pub fn start(
        handler: impl Fn(&Req, &mut TcpStream, &Generation) -> Next + Send + Sync + 'static,
    ) -> RestartingUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind restarting upstream");
        let port = listener.local_addr().unwrap().port();
        let mut up = RestartingUpstream { port, handler: Arc::new(handler), current: None, generations: 0 };
        up.serve(listener);
        up
    }

    /// Start a new generation on `listener` (bound to `self.port`).
    pub fn serve(&mut self, listener: TcpListener) {
        assert!(self.current.is_none(), "serve while a generation is running");
        self.generations += 1;
        let generation = Arc::new(Generation {
            number: self.generations,
            alive: AtomicBool::new(true),
            open: Mutex::default(),
            accepted: AtomicUsize::new(0),
        });
        let handler = self.handler.clone();
        let gen = generation.clone();
        let accept = std::thread::spawn(move || accept_loop(listener, gen, handler));
        self.current = Some((generation, accept));
    }

    /// Die as a killed process does: the listener is closed when this
    /// returns, and every open connection is shut down at once.
    pub fn stop(&mut self) {
        let Some((gen, accept)) = self.current.take() else {
            return;
        };
        gen.alive.store(false, Ordering::SeqCst);
        // Wake the blocking accept; it sees the generation dead and drops the
        // listener. A connect that fails means the listener is gone already.
        let waker = TcpStream::connect(("127.0.0.1", self.port));
        let _ = accept.join();
        drop(waker);
        gen.die();
    }

    /// Bind the same port again and serve a new generation. The port may be
    /// taken for a moment by a socket in another test: retried for 2 s.
    #[track_caller]
    pub fn restart(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        let listener = loop {
            match TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => break l,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("cannot bind port {} again to restart the upstream: {e}", self.port),
            }
        };
        self.serve(listener);
    }

    pub fn is_running(&self) -> bool {
        self.current.is_some()
    }

    /// Generations started so far (restarts + 1).
    pub fn generations(&self) -> u64 {
        self.generations
    }

    /// `http://127.0.0.1:PORT/mcp`
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/mcp", self.port)
    }
}

impl Drop for RestartingUpstream {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, gen: Arc<Generation>, handler: Arc<Handler>) {
    let mut next_id = 0;
    for stream in listener.incoming() {
        if !gen.is_alive() {
            return;
        }
        let Ok(stream) = stream else {
            // EMFILE and the like: do not spin on a listener that stays readable.
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Ok(clone) = stream.try_clone() else { continue };
        let id = next_id;
        next_id += 1;
        {
            let mut open = gen.open.lock().unwrap();
            if !gen.is_alive() {
                return;
            }
            open.insert(id, clone);
        }
        gen.accepted.fetch_add(1, Ordering::SeqCst);
        let gen = gen.clone();
        let handler = handler.clone();
        std::thread::spawn(move || serve_connection(stream, id, &gen, &*handler));
    }
}

/// Forgets the connection's clone however its thread ends, so the socket is
/// closed when the thread's own handle drops.
struct Registered<'a> {
    gen: &'a Generation,
    id: usize,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.gen.open.lock().unwrap().remove(&self.id);
    }
}

fn serve_connection(mut stream: TcpStream, id: usize, gen: &Generation, handler: &Handler) {
    let _registered = Registered { gen, id };
    let _ = stream.set_read_timeout(Some(KEEPALIVE_IDLE));
    let _ = stream.set_write_timeout(Some(STUB_LIMIT));
    let mut buf = Vec::new();
    loop {
        let Some(req) = read_request(&mut stream, &mut buf, id) else {
            return;
        };
        if !gen.is_alive() || handler(&req, &mut stream, gen) == Next::Close {
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    }
}
