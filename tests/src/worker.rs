//! Worker processes: real OS processes running `lock-worker`, whose stdout
//! lines the test reads as events and whose last stderr lines a failure
//! message carries.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How many of a worker's last stderr lines a failure message shows.
const STDERR_LINES: usize = 20;

/// A running worker process. Killed on drop if still running.
#[derive(Debug)]
pub struct Worker {
    name: String,
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    /// The last [`STDERR_LINES`] lines it wrote to stderr (each is also
    /// passed on to this process's stderr as it comes).
    stderr: Arc<Mutex<VecDeque<String>>>,
}

impl Worker {
    /// Starts `exe` (pass `env!("CARGO_BIN_EXE_lock-worker")`) with `args`.
    pub fn spawn(exe: &str, args: &[&str]) -> Worker {
        Worker::spawn_with_env(exe, args, &[])
    }

    /// As [`spawn`](Self::spawn), with extra environment variables.
    pub fn spawn_with_env(exe: &str, args: &[&str], env: &[(&str, &str)]) -> Worker {
        let mut child = Command::new(exe)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|err| panic!("start worker {exe}: {err}"));
        let name = format!(
            "{} {}",
            args.first().copied().unwrap_or_default(),
            child.id()
        );
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(VecDeque::new()));
        let pipe = child.stderr.take().expect("piped stderr");
        let (kept, prefix) = (Arc::clone(&stderr), name.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                eprintln!("[worker {prefix}] {line}");
                let mut kept = kept.lock().unwrap_or_else(|e| e.into_inner());
                if kept.len() == STDERR_LINES {
                    kept.pop_front();
                }
                kept.push_back(line);
            }
        });
        Worker {
            name,
            child,
            lines,
            seen: Vec::new(),
            stderr,
        }
    }

    /// The worker's last stderr lines, for a failure message: empty, or
    /// a paragraph headed "its stderr ended with".
    pub fn last_stderr(&self) -> String {
        // The reader may still be taking the last lines of a process that
        // just exited: give it a moment.
        std::thread::sleep(Duration::from_millis(100));
        let kept = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        if kept.is_empty() {
            return String::new();
        }
        let lines: Vec<&str> = kept.iter().map(String::as_str).collect();
        format!("\nits stderr ended with:\n  {}", lines.join("\n  "))
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the next line that starts with `prefix` and returns it;
    /// panics (with every line seen) if none comes within `timeout`.
    pub fn expect(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "worker {} printed no `{prefix}` line within {timeout:?}; saw {:?}{}",
                    self.name,
                    self.seen,
                    self.last_stderr()
                ),
                Err(RecvTimeoutError::Disconnected) => {
                    let status = self.child.wait().map(|s| s.to_string());
                    panic!(
                        "worker {} exited ({}) without a `{prefix}` line; saw {:?}{}",
                        self.name,
                        status.unwrap_or_else(|e| e.to_string()),
                        self.seen,
                        self.last_stderr()
                    )
                }
            }
        }
    }

    /// Waits for the process to exit; returns its status and every line it
    /// printed.
    pub fn finish(mut self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for worker") {
                // The reader thread ends with the pipe; collect what is left.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_secs(1)) {
                    self.seen.push(line);
                }
                return (status, std::mem::take(&mut self.seen));
            }
            if Instant::now() >= deadline {
                panic!(
                    "worker {} still running after {timeout:?}; saw {:?}{}",
                    self.name,
                    self.seen,
                    self.last_stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// As [`finish`](Self::finish), for a worker that must succeed:
    /// returns its lines, or panics with them, its exit status, `why` (what
    /// a failure may mean, or empty) and its last stderr lines.
    pub fn finish_ok(self, timeout: Duration, why: &str) -> Vec<String> {
        let (name, stderr) = (self.name.clone(), Arc::clone(&self.stderr));
        let (status, lines) = self.finish(timeout);
        if !status.success() {
            let kept = stderr.lock().unwrap_or_else(|e| e.into_inner());
            let kept: Vec<&str> = kept.iter().map(String::as_str).collect();
            panic!(
                "worker {name} failed ({status}){why}; saw {lines:?}\nits stderr ended with:\n  {}",
                kept.join("\n  ")
            );
        }
        lines
    }

    /// Freezes the process (SIGSTOP).
    pub fn pause(&self) {
        crate::server_process::signal(Some(&self.child), "-STOP");
    }

    /// Thaws the process (SIGCONT).
    pub fn resume(&self) {
        crate::server_process::signal(Some(&self.child), "-CONT");
    }

    /// Kills the process (SIGKILL): a crash, no clean-up runs.
    pub fn kill(&mut self) {
        self.send_kill();
        let _ = self.child.wait();
    }

    /// Sends SIGKILL, and returns without waiting for the process to end:
    /// from then on it runs none of its own code (a running process is
    /// stopped at once; one waiting for a core dies before it gets one),
    /// though its exit, and so [`kill`](Self::kill), may take a while on
    /// a busy machine.
    pub fn send_kill(&mut self) {
        let _ = self.child.kill();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Waits (60 s at most each) for `workers` to end, each successfully, and
/// sums the `name=` field of their `done` summary lines.
pub fn sum_of_done(workers: Vec<Worker>, name: &str) -> u64 {
    workers
        .into_iter()
        .map(|worker| {
            let lines = worker.finish_ok(Duration::from_secs(60), "");
            let done = lines
                .iter()
                .find(|l| l.starts_with("done"))
                .expect("summary line");
            field(done, name).parse::<u64>().unwrap()
        })
        .sum()
}

/// The value of `name=value` in an event line.
pub fn field<'a>(line: &'a str, name: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(name)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no `{name}=` in line {line:?}"))
}
