//! Worker processes: real OS processes running `lock-worker`, whose stdout
//! lines the test reads as events.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// A running worker process. Killed on drop if still running.
#[derive(Debug)]
pub struct Worker {
    name: String,
    child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
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
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|err| panic!("start worker {exe}: {err}"));
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
        Worker {
            name: format!(
                "{} {}",
                args.first().copied().unwrap_or_default(),
                child.id()
            ),
            child,
            lines,
            seen: Vec::new(),
        }
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
                    "worker {} printed no `{prefix}` line within {timeout:?}; saw {:?}",
                    self.name, self.seen
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "worker {} exited without a `{prefix}` line; saw {:?}",
                    self.name, self.seen
                ),
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
                    "worker {} still running after {timeout:?}; saw {:?}",
                    self.name, self.seen
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
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
        let _ = self.child.kill();
        let _ = self.child.wait();
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
            let (status, lines) = worker.finish(Duration::from_secs(60));
            assert!(status.success(), "worker failed: {lines:?}");
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
