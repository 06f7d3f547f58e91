//! What the harnesses share about the server processes they start: a free
//! loopback port and a directory of their own, killing a server with every
//! process it started (SIGKILL, then reap), freezing and thawing (SIGSTOP,
//! SIGCONT) them by pid.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A loopback port that was free a moment ago. Another process may take it
/// before the server binds it, which is why the harnesses retry a start.
pub(crate) fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

/// Waits up to `within` for `ready`, asked every `every`; `false` if
/// `child` exits first (its port was taken, say) or the time runs out.
pub(crate) fn ready_or_exited(
    child: &mut Child,
    within: Duration,
    every: Duration,
    mut ready: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if matches!(child.try_wait(), Ok(Some(_))) {
            return false;
        }
        if ready() {
            return true;
        }
        std::thread::sleep(every);
    }
    false
}

/// Where the servers the tests start keep their data: in memory
/// (`/dev/shm`) where the machine has room there (4 GiB free: a
/// container's is often 64 MiB, less than one etcd log segment), else the
/// system's temporary directory.
///
/// In memory, a server's fsyncs cost nothing: on a machine whose disk
/// the other tests' servers keep busy, a store's answers are not held up
/// by its log's flush (etcd's and ZooKeeper's wait on it for every write).
/// What the tests do to servers (SIGKILL, SIGSTOP, restarts) keeps every
/// write a server made, as on disk: only the machine's own crash would
/// lose it, which no test makes.
pub fn servers_data_root() -> &'static Path {
    static BASE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BASE.get_or_init(|| {
        let shm = PathBuf::from("/dev/shm");
        let probe = shm.join(format!("lock-tests-probe-{}", std::process::id()));
        let roomy = free_kib(&shm).is_some_and(|kib| kib >= 4 << 20);
        if roomy && std::fs::create_dir(&probe).is_ok() {
            let _ = std::fs::remove_dir(&probe);
            shm
        } else {
            std::env::temp_dir()
        }
    })
}

/// A new directory for a `kind` of server (`redis`, `pg`, ...), named
/// after this process, under [`servers_data_root`].
pub(crate) fn temp_dir(kind: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = servers_data_root().join(format!(
        "lock-tests-{kind}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create the server's temporary directory");
    dir
}

/// The space free under `path`, in KiB, as `df` reports it.
fn free_kib(path: &Path) -> Option<u64> {
    let out = Command::new("df").arg("-Pk").arg(path).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // The second line's fourth column: `Filesystem 1024-blocks Used Available ...`.
    text.lines().nth(1)?.split_whitespace().nth(3)?.parse().ok()
}

/// Kills `child` and every process it started (SIGKILL, which ends a
/// frozen process too), reaps it, and returns once none of them is left
/// to answer on a socket; nothing if it is not running.
///
/// A server such as PostgreSQL serves its open connections from processes
/// of its own: killing only the first process would leave those answering.
pub(crate) fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let killed = kill_tree(child.id());
        let _ = child.wait();
        wait_gone(&killed);
    }
}

/// How long the processes of a killed server may take to go (SIGKILL is
/// not refused; a process stuck in the kernel may take a moment).
const GONE_DEADLINE: Duration = Duration::from_secs(30);

/// Freezes `root` and then each of its descendants, top-down so that
/// none forks another while the tree is listed, then kills them all;
/// returns every pid it killed.
fn kill_tree(root: u32) -> Vec<u32> {
    let mut frozen = Vec::new();
    let mut next = vec![root];
    while let Some(pid) = next.pop() {
        // A process that ended since it was listed is skipped.
        if try_signal_pid(pid, "-STOP") {
            frozen.push(pid);
            next.extend(children(pid));
        }
    }
    for &pid in &frozen {
        try_signal_pid(pid, "-KILL");
    }
    frozen
}

/// Waits until none of `pids` is alive (a zombie holds no socket and
/// counts as gone); panics naming the survivors after [`GONE_DEADLINE`]
/// (only says so on stderr while the thread is already panicking, as when
/// a harness is dropped by a failed test).
fn wait_gone(pids: &[u32]) {
    let deadline = Instant::now() + GONE_DEADLINE;
    loop {
        let alive: Vec<u32> = pids.iter().copied().filter(|&pid| is_alive(pid)).collect();
        if alive.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            let message = format!(
                "processes {alive:?} of a killed server were still alive {GONE_DEADLINE:?} after SIGKILL"
            );
            if std::thread::panicking() {
                eprintln!("{message}");
                return;
            }
            panic!("{message}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether process `pid` exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and
    // may hold spaces.
    let state = stat
        .rfind(')')
        .and_then(|end| stat[end + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}

/// Sends `signal` (`-STOP`, `-CONT`) to the running `child`.
pub(crate) fn signal(child: Option<&Child>, signal: &str) {
    signal_pid(child.expect("the server is running").id(), signal);
}

/// Sends `signal` (`-STOP`, `-CONT`) to process `pid`.
pub(crate) fn signal_pid(pid: u32, signal: &str) {
    assert!(try_signal_pid(pid, signal), "kill {signal} {pid} failed");
}

/// Sends `signal` to process `pid`; whether it was delivered (`false`
/// once the process is gone).
pub(crate) fn try_signal_pid(pid: u32, signal: &str) -> bool {
    Command::new("kill")
        .arg(signal)
        .arg(pid.to_string())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("run kill")
        .success()
}

/// The pids of `parent`'s child processes, from `/proc/*/stat` (the
/// fourth field is the parent's pid).
pub(crate) fn children(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // The command name, in parentheses, may hold spaces.
            let after_name = &stat[stat.rfind(')')? + 1..];
            let ppid: u32 = after_name.split_whitespace().nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
        .collect()
}

/// A store's one server, as the scenarios several stores share start,
/// fault and reach it (PostgreSQL, MariaDB).
pub trait StoreServer {
    /// The store's URL.
    fn url(&self) -> String;
    /// The store's URL through a proxy listening on `port`.
    fn url_through(port: u16) -> String;
    /// The port the server listens on.
    fn port(&self) -> u16;
    /// Kills the server (SIGKILL).
    fn kill(&mut self);
    /// Kills the server and starts it again on its port and data.
    fn restart(&mut self);
    /// Freezes the server: connections stay open, nothing answers.
    fn pause(&self);
    /// Thaws a frozen server.
    fn resume(&self);
}
