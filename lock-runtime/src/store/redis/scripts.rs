//! The Lua scripts, from the `.lua` files beside this one. Each runs by
//! `EVALSHA`, and is loaded again after `SCRIPT FLUSH` or a server restart
//! (`NOSCRIPT`). The files say what `KEYS` and `ARGV` each takes and what
//! it returns.

use ::redis::Script;
use ::redis::aio::ConnectionLike;
use futures_util::future::join_all;
use once_cell::sync::Lazy;

/// A script whose text is the given files, joined.
macro_rules! script {
    ($($file:literal),+) => {
        Lazy::new(|| Script::new(concat!($(include_str!(concat!("lua/", $file))),+)))
    };
}

pub(super) static ACQUIRE: Lazy<Script> = script!("fence.lua", "waited.lua", "acquire.lua");
pub(super) static SHARE_ACQUIRE: Lazy<Script> =
    script!("fence.lua", "waited.lua", "shares.lua", "share_acquire.lua");
pub(super) static RENEW: Lazy<Script> = script!("waited.lua", "renew.lua");
pub(super) static RELEASE: Lazy<Script> = script!("waited.lua", "release.lua");
pub(super) static MARK: Lazy<Script> = script!("waited.lua", "mark.lua");
pub(super) static RELEASE_EXCLUSIVE: Lazy<Script> = script!("release_exclusive.lua");
pub(super) static HAND_OVER: Lazy<Script> = script!("fence.lua", "waited.lua", "hand_over.lua");
pub(super) static SHARE_HAND_OVER: Lazy<Script> =
    script!("fence.lua", "shares.lua", "share_hand_over.lua");
pub(super) static ISSUE: Lazy<Script> = script!("fence.lua", "waited.lua", "issue.lua");
pub(super) static FORCE_RELEASE: Lazy<Script> = script!("force_release.lua");
pub(super) static INSPECT: Lazy<Script> = script!("inspect.lua");
pub(super) static RAISE: Lazy<Script> = script!("raise.lua");
pub(super) static FAIR_ACQUIRE: Lazy<Script> =
    script!("fence.lua", "shares.lua", "queue.lua", "fair_acquire.lua");
pub(super) static FAIR_SHARE_ACQUIRE: Lazy<Script> = script!(
    "fence.lua",
    "shares.lua",
    "queue.lua",
    "fair_share_acquire.lua"
);
pub(super) static FAIR_RELEASE: Lazy<Script> =
    script!("fence.lua", "shares.lua", "queue.lua", "fair_release.lua");
pub(super) static FAIR_HAND_OVER: Lazy<Script> =
    script!("fence.lua", "shares.lua", "queue.lua", "fair_hand_over.lua");

/// Loads every script on the server (on every primary of a cluster), so
/// that the first lock sends each in one `EVALSHA` rather than learning
/// of `NOSCRIPT` first: three round trips, which a first lock on a busy
/// machine may not make within a short deadline (Redlock's node timeout).
/// A server that refuses is left to the `NOSCRIPT` fallback.
pub(super) async fn load<C: ConnectionLike + Clone>(conn: &C) {
    let loads = all().map(|script| {
        let mut conn = conn.clone();
        async move { script.load_async(&mut conn).await }
    });
    for loaded in join_all(loads).await {
        if let Err(error) = loaded {
            tracing::debug!(%error, "the Redis server did not load a script; it is loaded at its first use");
            return;
        }
    }
}

/// Every script.
fn all() -> [&'static Script; 16] {
    [
        &ACQUIRE,
        &SHARE_ACQUIRE,
        &RENEW,
        &RELEASE,
        &MARK,
        &RELEASE_EXCLUSIVE,
        &HAND_OVER,
        &SHARE_HAND_OVER,
        &ISSUE,
        &FORCE_RELEASE,
        &INSPECT,
        &RAISE,
        &FAIR_ACQUIRE,
        &FAIR_SHARE_ACQUIRE,
        &FAIR_RELEASE,
        &FAIR_HAND_OVER,
    ]
}
