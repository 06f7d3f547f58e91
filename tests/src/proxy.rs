//! A TCP proxy on a free loopback port, for network partitions: it forwards
//! to one upstream port, or black-holes (keeps every connection open and
//! moves no byte in either direction, as a cut cable does, until it is told
//! to forward again).

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// A forwarding (or black-holing) TCP proxy; stopped on drop.
#[derive(Debug)]
pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug, Default)]
struct Shared {
    /// `true` while black-holed.
    cut: Mutex<bool>,
    changed: Condvar,
    stop: AtomicBool,
    /// Both ends of every connection, to close them on drop.
    streams: Mutex<Vec<TcpStream>>,
}

impl Shared {
    /// Waits while the proxy is black-holed; `false` once it is stopping.
    fn wait_forwarding(&self) -> bool {
        let mut cut = self.cut.lock().unwrap();
        while *cut && !self.stop.load(Ordering::SeqCst) {
            cut = self
                .changed
                .wait_timeout(cut, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        !self.stop.load(Ordering::SeqCst)
    }
}

impl Proxy {
    /// Starts forwarding `127.0.0.1:<free port>` to `127.0.0.1:upstream`.
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        let acceptor = std::thread::spawn({
            let shared = shared.clone();
            move || accept(listener, upstream, shared)
        });
        Proxy {
            port,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// From now on nothing passes, in either direction; connections stay
    /// open and new ones are accepted but not served.
    pub fn black_hole(&self) {
        *self.shared.cut.lock().unwrap() = true;
    }

    /// Closes every open connection, both ends, as a crashed middlebox
    /// would; new ones are served or held as before.
    pub fn reset(&self) {
        for stream in self.shared.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// Forwards again; what was held back goes through.
    pub fn forward(&self) {
        *self.shared.cut.lock().unwrap() = false;
        self.shared.changed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.changed.notify_all();
        for stream in self.shared.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}

fn accept(listener: TcpListener, upstream: u16, shared: Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(_) => return,
        };
        let shared = shared.clone();
        std::thread::spawn(move || {
            // A connection made while cut is held open, not served.
            if !shared.wait_forwarding() {
                return;
            }
            let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)) else {
                return;
            };
            let _ = client.set_nonblocking(false);
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (Ok(client2), Ok(server2)) = (client.try_clone(), server.try_clone()) else {
                return;
            };
            {
                let mut streams = shared.streams.lock().unwrap();
                for stream in [&client, &server] {
                    if let Ok(stream) = stream.try_clone() {
                        streams.push(stream);
                    }
                }
            }
            let back = std::thread::spawn({
                let shared = shared.clone();
                move || pump(server2, client2, &shared)
            });
            pump(client, server, &shared);
            let _ = back.join();
        });
    }
}

/// Copies `from` to `to`, holding each chunk back while the proxy is cut.
fn pump(mut from: TcpStream, mut to: TcpStream, shared: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !shared.wait_forwarding() || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
