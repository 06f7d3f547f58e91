//! A TCP proxy on a free loopback port, for network partitions: it forwards
//! to one upstream port, or black-holes (keeps every connection open and
//! moves no byte in either direction, as a cut cable does, until it is told
//! to forward again), for everyone or for one client process alone.

use std::collections::HashSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// What is black-holed.
    cut: Mutex<Cut>,
    changed: Condvar,
    stop: AtomicBool,
    /// Both ends of every connection, to close them on drop.
    streams: Mutex<Vec<TcpStream>>,
    /// Chunks read while black-holed, held back.
    held: AtomicUsize,
}

/// What a proxy black-holes.
#[derive(Debug, Default)]
struct Cut {
    /// Every connection.
    all: bool,
    /// The connections of these client processes: each pid with the local
    /// ports of its TCP sockets, as last looked up.
    processes: Vec<(u32, HashSet<u16>)>,
}

impl Cut {
    fn holds(&self, client: u16) -> bool {
        self.all
            || self
                .processes
                .iter()
                .any(|(_, ports)| ports.contains(&client))
    }
}

impl Shared {
    /// Waits while the connection from the client port `client` is
    /// black-holed; `false` once the proxy is stopping.
    fn wait_forwarding(&self, client: u16) -> bool {
        let mut cut = self.cut.lock().unwrap();
        while cut.holds(client) && !self.stop.load(Ordering::SeqCst) {
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
        self.shared.cut.lock().unwrap().all = true;
    }

    /// A handle that black-holes one client process's connections through
    /// this proxy, for a runner that does not own the proxy.
    pub fn switch(&self) -> ProxySwitch {
        ProxySwitch(self.shared.clone())
    }

    /// Closes every open connection, both ends, as a crashed middlebox
    /// would; new ones are served or held as before.
    pub fn reset(&self) {
        for stream in self.shared.streams.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// How many chunks of data (in either direction) were read and held
    /// back while black-holed: a signal that a request is on its way.
    pub fn held_back(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    /// Forwards again, for everyone; what was held back goes through.
    pub fn forward(&self) {
        *self.shared.cut.lock().unwrap() = Cut::default();
        self.shared.changed.notify_all();
    }
}

/// Black-holes the connections of one client process through a
/// [`Proxy`], as a cable cut between that process and the server: the
/// connections it has and those it makes meanwhile. Other processes'
/// connections, the servers' own among them, pass.
#[derive(Clone, Debug)]
pub struct ProxySwitch(Arc<Shared>);

impl ProxySwitch {
    /// From now on nothing passes to or from process `pid`.
    pub fn black_hole_process(&self, pid: u32) {
        let ports = local_ports(pid);
        let mut cut = self.0.cut.lock().unwrap();
        cut.processes.retain(|(cut_pid, _)| *cut_pid != pid);
        cut.processes.push((pid, ports));
    }

    /// Forwards process `pid`'s connections again; what was held back
    /// goes through.
    pub fn forward_process(&self, pid: u32) {
        self.0
            .cut
            .lock()
            .unwrap()
            .processes
            .retain(|(cut_pid, _)| *cut_pid != pid);
        self.0.changed.notify_all();
    }
}

/// The local ports of process `pid`'s IPv4 TCP sockets: its sockets'
/// inodes from `/proc/PID/fd`, their ports from `/proc/net/tcp`. Empty
/// once the process is gone.
fn local_ports(pid: u32) -> HashSet<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let target = std::fs::read_link(entry.ok()?.path()).ok()?;
            let target = target.to_str()?;
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (local, inode) = (fields.get(1)?, fields.get(9)?);
            if !inodes.contains(*inode) {
                return None;
            }
            u16::from_str_radix(local.rsplit(':').next()?, 16).ok()
        })
        .collect()
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
        let (client, peer) = match listener.accept() {
            Ok((client, peer)) => (client, peer.port()),
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            Err(_) => return,
        };
        {
            // A process cut off may have made this connection since its
            // ports were looked up.
            let mut cut = shared.cut.lock().unwrap();
            for (pid, ports) in &mut cut.processes {
                *ports = local_ports(*pid);
            }
        }
        let shared = shared.clone();
        std::thread::spawn(move || {
            // A connection made while cut is held open, not served.
            if !shared.wait_forwarding(peer) {
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
                move || pump(server2, client2, peer, &shared)
            });
            pump(client, server, peer, &shared);
            let _ = back.join();
        });
    }
}

/// Copies `from` to `to`, holding each chunk back while the connection
/// from the client port `client` is cut.
fn pump(mut from: TcpStream, mut to: TcpStream, client: u16, shared: &Shared) {
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if shared.cut.lock().unwrap().holds(client) {
            shared.held.fetch_add(1, Ordering::SeqCst);
        }
        if !shared.wait_forwarding(client) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}
