//! Scenarios across processes: the worker process, the hot key shared by four processes, and the hand-off from one process to another.

use super::*;

/// Worker process: `--worker hot LIB URL KEY TASKS OPS START_NS` or
/// `--worker handoff LIB URL KEY ROUNDS START_NS`.
pub(crate) async fn worker(args: &[String]) -> Result<(), Error> {
    let [kind, lib, url, key, count, start] = args else {
        return Err("worker arguments: KIND LIB URL KEY COUNT START_NS".into());
    };
    let count: u64 = count.parse()?;
    let start: u128 = start.parse()?;
    if kind.starts_with("wake") {
        return wake_worker(kind, url, key, count, start).await;
    }
    let lib = make_lib(lib, url).await?;

    // Start together with the other processes.
    let wait = start.saturating_sub(now_ns());
    tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
    match kind.as_str() {
        "hot" => {
            let began = now_ns();
            let mut handles = Vec::new();
            for _ in 0..4 {
                let (lib, key) = (lib.clone(), key.clone());
                handles.push(tokio::spawn(async move {
                    let mut waits = Vec::new();
                    for _ in 0..count {
                        waits.push(lib.section(&key).await?.as_nanos());
                    }
                    Ok::<_, Error>(waits)
                }));
            }
            let mut waits = Vec::new();
            for handle in handles {
                waits.extend(handle.await??);
            }
            let ended = now_ns();
            let list: Vec<String> = waits.iter().map(u128::to_string).collect();
            println!("span {began} {ended}");
            println!("waits {}", list.join(","));
        }
        "handoff" => {
            // Hold 5 ms, release, pause 1 ms so the other process (already
            // waiting) takes over, then queue again behind it.
            for _ in 0..count {
                let called = Instant::now();
                let hold = async {
                    let acquired = now_ns();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    (acquired, now_ns())
                };
                let (_, (acquired, released)) = lib.with_lock(key, hold).await?;
                println!("hold {acquired} {released} {}", called.elapsed().as_nanos());
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            println!("cpu {}", cpu_time().as_nanos());
        }
        other => return Err(format!("unknown worker kind {other}").into()),
    }
    Ok(())
}

/// A worker's arguments, as [`worker`] reads them: `KIND LIB URL KEY COUNT
/// START_NS`.
pub(crate) fn worker_args(
    kind: &str,
    lib: &str,
    url: &str,
    key: &str,
    count: u64,
    start: u128,
) -> Vec<String> {
    let (count, start) = (count.to_string(), start.to_string());
    [kind, lib, url, key, &count, &start]
        .iter()
        .map(|arg| arg.to_string())
        .collect()
}

/// How long one row's worker processes may run, all of them together:
/// a worker still running then (a peer library's waiter that never wakes)
/// is killed, and its row says so rather than holding up the whole run.
const WORKERS_LIMIT: Duration = Duration::from_secs(180);

/// The workers of a row did not all end within [`WORKERS_LIMIT`]; they
/// were killed.
#[derive(Debug)]
struct WorkersTimedOut;

impl std::fmt::Display for WorkersTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "a worker process did not end within {} s and was killed",
            WORKERS_LIMIT.as_secs()
        )
    }
}

impl std::error::Error for WorkersTimedOut {}

/// Starts `processes` worker processes; returns their stdout lines, or
/// [`WorkersTimedOut`] once they have been killed for running too long.
pub(crate) fn spawn_workers(processes: usize, args: &[String]) -> Result<Vec<Vec<String>>, Error> {
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for _ in 0..processes {
        children.push(
            Command::new(&exe)
                .arg("--worker")
                .args(args)
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    // Each worker's stdout is read on a thread of its own, which says when
    // it reaches its end (the worker exited, or closed it).
    let (ended, ends) = std::sync::mpsc::channel();
    let mut readers = Vec::new();
    for child in &mut children {
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let ended = ended.clone();
        readers.push(std::thread::spawn(move || {
            let lines = BufReader::new(stdout)
                .lines()
                .collect::<Result<Vec<String>, _>>();
            let _ = ended.send(());
            lines
        }));
    }
    let deadline = Instant::now() + WORKERS_LIMIT;
    let mut timed_out = false;
    for _ in 0..children.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if ends.recv_timeout(left).is_err() {
            timed_out = true;
            break;
        }
    }
    if timed_out {
        for child in &mut children {
            let _ = child.kill();
        }
    }
    let mut statuses = Vec::new();
    for child in &mut children {
        statuses.push(child.wait()?);
    }
    let mut outputs = Vec::new();
    for reader in readers {
        outputs.push(reader.join().map_err(|_| "a worker's reader panicked")??);
    }
    if timed_out {
        return Err(Box::new(WorkersTimedOut));
    }
    if !statuses.iter().all(std::process::ExitStatus::success) {
        return Err("a worker process failed".into());
    }
    Ok(outputs)
}

/// The row of `scenario` for `name` that says its workers were killed for
/// running too long, if that is what `error` is.
fn timed_out_row(error: &Error, scenario: &str, name: &str) -> Option<Measured> {
    if !error.is::<WorkersTimedOut>() {
        return None;
    }
    eprintln!("{scenario} / {name}: {error}");
    Some(Measured::new(scenario, name, 0, Duration::ZERO, Vec::new()).noted(error.to_string()))
}

/// Runs `processes` workers of `kind` on a fresh key, starting together
/// 300 ms from now; their stdout lines.
fn run_workers(
    processes: usize,
    kind: &str,
    name: &str,
    url: &str,
    count: u64,
) -> Result<Vec<Vec<String>>, Error> {
    let key = format!("bench:{}:{kind}", rand_u128() as u32);
    let start = now_ns() + 300_000_000;
    spawn_workers(processes, &worker_args(kind, name, url, &key, count, start))
}

/// Scenario 4: 4 processes x 4 tasks on one hot key.
pub(crate) fn run_processes(
    scenario: &str,
    name: &str,
    url: &str,
    ops: u64,
) -> Result<Measured, Error> {
    let outputs = match run_workers(4, "hot", name, url, ops) {
        Ok(outputs) => outputs,
        Err(error) => return timed_out_row(&error, scenario, name).ok_or(error),
    };
    let (mut first, mut last) = (u128::MAX, 0u128);
    let mut waits = Vec::new();
    for lines in &outputs {
        for line in lines {
            if let Some(span) = line.strip_prefix("span ") {
                let mut parts = span.split(' ').filter_map(|p| p.parse::<u128>().ok());
                first = first.min(parts.next().unwrap_or(u128::MAX));
                last = last.max(parts.next().unwrap_or(0));
            } else if let Some(list) = line.strip_prefix("waits ") {
                waits.extend(
                    list.split(',')
                        .filter_map(|w| w.parse::<u64>().ok())
                        .map(Duration::from_nanos),
                );
            }
        }
    }
    waits.sort_unstable();
    let elapsed = Duration::from_nanos(last.saturating_sub(first) as u64);
    Ok(Measured::new(
        scenario,
        name,
        waits.len() as u64,
        elapsed,
        waits,
    ))
}

/// Scenario 5: release in one process to acquire in the other.
pub(crate) fn run_handoff(
    scenario: &str,
    name: &str,
    url: &str,
    rounds: u64,
) -> Result<Measured, Error> {
    let outputs = match run_workers(2, "handoff", name, url, rounds) {
        Ok(outputs) => outputs,
        Err(error) => return timed_out_row(&error, scenario, name).ok_or(error),
    };
    let mut holds: Vec<(u128, u128, usize)> = Vec::new();
    let mut cpu = 0u128;
    for (process, lines) in outputs.iter().enumerate() {
        for line in lines {
            if let Some(ns) = line.strip_prefix("cpu ") {
                cpu += ns.parse::<u128>().unwrap_or(0);
            } else if let Some(rest) = line.strip_prefix("hold ") {
                let parts: Vec<u128> = rest.split(' ').filter_map(|p| p.parse().ok()).collect();
                if let [acquired, released, _] = parts[..] {
                    holds.push((acquired, released, process));
                }
            }
        }
    }
    holds.sort_unstable();
    let mut handoffs: Vec<Duration> = holds
        .windows(2)
        .filter(|w| w[0].2 != w[1].2 && w[1].0 >= w[0].1)
        .map(|w| Duration::from_nanos((w[1].0 - w[0].1) as u64))
        .collect();
    handoffs.sort_unstable();
    let count = handoffs.len();
    // Both processes' CPU time, connecting and start-up included, over
    // the locks taken.
    let cpu_per_lock = cpu / u128::from(2 * rounds.max(1));
    Ok(
        Measured::new(scenario, name, count as u64, Duration::ZERO, handoffs).noted(format!(
            "{count} hand-offs, CPU {} µs per lock",
            cpu_per_lock / 1000
        )),
    )
}
