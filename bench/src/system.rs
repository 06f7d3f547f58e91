//! What the machine and its processes spend: CPU time, resident memory, the machine's description, round trips.

use super::*;

/// A process's parent and CPU time (user and system) in 10 ms ticks, from
/// `/proc/{pid}/stat`: the fields after the command's closing parenthesis,
/// of which the parent is the 2nd and utime and stime the 12th and 13th.
pub(crate) fn proc_stat(pid: &str) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    Some((fields.get(1)?.parse().ok()?, ticks))
}

/// Every process started under this one (the store's servers, and theirs).
fn descendants() -> Vec<u32> {
    let all: Vec<(u32, u32)> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let pid = name.to_str()?;
            let (ppid, _) = proc_stat(pid)?;
            Some((pid.parse().ok()?, ppid))
        })
        .collect();
    let (mut found, mut parents) = (Vec::new(), vec![std::process::id()]);
    while let Some(parent) = parents.pop() {
        for &(pid, ppid) in &all {
            if ppid == parent {
                found.push(pid);
                parents.push(pid);
            }
        }
    }
    found
}

/// The CPU time (user and system) of every process started under this one
/// (the store's servers), read from `/proc`.
pub(crate) fn servers_cpu_time() -> Duration {
    let ticks: u64 = descendants()
        .iter()
        .filter_map(|pid| proc_stat(&pid.to_string()))
        .map(|(_, ticks)| ticks)
        .sum();
    Duration::from_millis(ticks * 10)
}

/// The resident memory of every process started under this one (the
/// store's servers), in bytes.
pub(crate) fn servers_rss_bytes() -> u64 {
    descendants()
        .iter()
        .map(|pid| rss_of(&pid.to_string()))
        .sum()
}

/// This process's CPU time so far: the sum over its threads of
/// `/proc/self/task/*/schedstat`'s first field, the time each spent on a
/// CPU, in ns (a thread whose file cannot be read counts 0).
pub(crate) fn cpu_time() -> Duration {
    let ns: u64 = std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
            stat.split_whitespace().next()?.parse::<u64>().ok()
        })
        .sum();
    Duration::from_nanos(ns)
}

pub(crate) fn rss_bytes() -> u64 {
    rss_of("self")
}

/// The resident memory of process `pid` (or `self`), in bytes.
fn rss_of(pid: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))
                .and_then(|kb| kb.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Scenario 8: RSS growth after `keys` distinct keys locked and released.
pub(crate) async fn run_growth(lib: &Lib, name: &str, keys: u64) -> Result<Measured, Error> {
    let before = rss_bytes();
    let started = Instant::now();
    let tasks = 64u64;
    let mut handles = Vec::new();
    for t in 0..tasks {
        let lib = lib.clone();
        handles.push(tokio::spawn(async move {
            let mut k = t;
            while k < keys {
                lib.section(&format!("bench:growth:{k}")).await?;
                k += tasks;
            }
            Ok::<_, Error>(())
        }));
    }
    for handle in handles {
        handle.await??;
    }
    let elapsed = started.elapsed();
    let after = rss_bytes();
    let grown = after as i64 - before as i64;
    let scenario = format!("8. RSS growth after {keys} distinct keys");
    let note = format!(
        "{:+.1} MB (RSS {:.1} -> {:.1} MB)",
        grown as f64 / 1e6,
        before as f64 / 1e6,
        after as f64 / 1e6
    );
    Ok(Measured::new(scenario, name, keys, elapsed, Vec::new()).noted(note))
}

/// Median PING round trip.
pub(crate) async fn round_trip(conn: &MultiplexedConnection) -> Result<Duration, Error> {
    let mut conn = conn.clone();
    let mut samples = Vec::new();
    for _ in 0..2_000 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        samples.push(t.elapsed());
    }
    samples.sort_unstable();
    Ok(percentile(&samples, 50.0))
}

pub(crate) fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines().next().map(|l| {
                l.split_whitespace()
                    .nth(1)
                    .unwrap_or("0")
                    .parse::<u64>()
                    .unwrap_or(0)
            })
        })
        .map_or(0.0, |kb| kb as f64 / 1024.0 / 1024.0);
    let redis = Command::new("redis-server")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let data = lock_tests::servers_data_root();
    let fsyncs = if data.starts_with("/dev/shm") {
        ", in memory: their fsyncs cost nothing"
    } else {
        ""
    };
    format!(
        "{date}; {cores} cores ({cpu}), {mem:.0} GiB; Linux {}; {redis}; redis-server on loopback; \
         the servers keep their data in {}{fsyncs}",
        kernel.trim(),
        data.display()
    )
}
