//! What the Redis suites share: a registry on a server, a locking task,
//! and the server's own counts of the commands it ran and the errors it
//! answered.

use lock_runtime::{LockGuard, LockOptions, LockRegistry};
use lock_tests::RedisServer;

pub(crate) async fn registry(server: &RedisServer) -> LockRegistry {
    LockRegistry::redis(&server.url()).await.unwrap()
}

/// Checks the commands the server ran since [`reset_stats`] (sorted by
/// name, with their counts): `expected`.
pub(crate) fn assert_commands(server: &RedisServer, expected: &[(&str, u64)]) {
    let mut calls = command_calls(server);
    calls.retain(|(name, _)| name != "config|resetstat");
    calls.sort();
    let expected: Vec<(String, u64)> = expected
        .iter()
        .map(|&(name, n)| (name.to_owned(), n))
        .collect();
    assert_eq!(calls, expected);
}

/// A task of its own that takes `key`'s lock (default options) and
/// returns the guard.
pub(crate) fn lock_in_task(
    registry: &LockRegistry,
    key: &str,
) -> tokio::task::JoinHandle<LockGuard> {
    let (registry, key) = (registry.clone(), key.to_owned());
    tokio::spawn(async move { registry.lock(&key, LockOptions::default()).await.unwrap() })
}

/// Calls of each command since the last `CONFIG RESETSTAT`.
pub(crate) fn command_calls(server: &RedisServer) -> Vec<(String, u64)> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.connection())
        .unwrap();
    info.lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        .filter(|(name, _)| !matches!(name.as_str(), "info" | "config"))
        .collect()
}

/// The number of `name` calls in a `command_calls` list.
pub(crate) fn calls_of(calls: &[(String, u64)], name: &str) -> u64 {
    calls.iter().find(|(n, _)| n == name).map_or(0, |(_, n)| *n)
}

pub(crate) fn reset_stats(server: &RedisServer) {
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut server.connection())
        .unwrap();
}

/// How many errors starting `ERR` the server answered since it started
/// (or the last `CONFIG RESETSTAT`), asked on `conn`. Each connection the
/// `redis` crate opens to Redis 7.0 adds two (its `CLIENT SETINFO`, which
/// 7.2 brought): compare counts taken on one connection, with no other
/// opened in between.
pub(crate) fn errors(conn: &mut redis::Connection) -> u64 {
    let info: String = redis::cmd("INFO").arg("errorstats").query(conn).unwrap();
    info.lines()
        .find_map(|line| line.strip_prefix("errorstat_ERR:count="))
        .map_or(0, |count| count.trim().parse().unwrap())
}
