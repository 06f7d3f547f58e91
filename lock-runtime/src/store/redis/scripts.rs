//! The Lua scripts, from the `.lua` files beside this one. Each runs by
//! `EVALSHA`, and is loaded again after `SCRIPT FLUSH` or a server restart
//! (`NOSCRIPT`). The files say what `KEYS` and `ARGV` each takes and what
//! it returns.

use ::redis::Script;
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
