//! The scripts' calls: acquire, renew, release and hand-over of one lock,
//! by its Redis name, on the command connection.

use std::any::Any;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use ::redis::Script;
use ::redis::aio::ConnectionLike;

use super::connection::RedisConnection;
use super::keys::{released_channel, suffixed};
use super::owner_checks::{self, Checks, OwnerChecks};
use super::scripts;
use crate::error::StoreError;
use crate::store::FencingPromise;
use crate::store::{Claim, ClaimMismatch, HandOver, LockToken};

/// How fencing tokens are made. See the [module docs](super).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fencing {
    /// Tokens from the server's clock and a counter that lives as long as the
    /// lease: strictly increasing per key, after data loss too, with no
    /// per-key state left once the lease ends.
    #[default]
    PerKey,
    /// As [`PerKey`](Fencing::PerKey), with the counter kept at least this
    /// long after each grant: a longer guard against the server's clock
    /// being stepped back between two grants.
    ExpireAfter(Duration),
    /// No tokens: every fencing token is 0, and no counter is kept.
    Off,
}

impl Fencing {
    /// What tokens promise in this mode.
    pub(super) fn promise(self) -> FencingPromise {
        match self {
            Fencing::PerKey | Fencing::ExpireAfter(_) => {
                FencingPromise::INCREASING.surviving_data_loss()
            }
            Fencing::Off => FencingPromise::NONE,
        }
    }

    /// The scripts' fencing argument for a lease of `ttl`: 0 for none,
    /// else how long the counter lives after a grant, in ms.
    pub(super) fn counter_life(self, ttl: Duration) -> u64 {
        match self {
            Fencing::PerKey => millis(ttl).max(1),
            Fencing::Off => 0,
            Fencing::ExpireAfter(after) => millis(after.max(ttl)).max(1),
        }
    }
}

/// Which fencing token an exclusive grant comes with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Tokens {
    /// None: the caller asked for none, or the store makes none (0).
    Unfenced,
    /// Issued by the grant's script, in the same round trip (Redlock's
    /// nodes, fair mode).
    WithGrant,
    /// Issued when the holder first reads it ([`Commands::issue`]): the
    /// grant is the plain `SET`.
    OnDemand,
}

/// How many replicas must have a grant before it is handed out (`WAIT`).
#[derive(Clone, Copy, Debug)]
pub(super) struct ReplicaAcks {
    pub(super) replicas: u32,
    pub(super) timeout: Duration,
}

/// The command connection and how grants are made: all a lease handle needs.
#[derive(Clone)]
pub(super) struct Commands<C> {
    pub(super) conn: C,
    pub(super) fencing: Fencing,
    pub(super) replica_acks: Option<ReplicaAcks>,
    /// Fair mode's grant timeout; `None` when not fair.
    pub(super) fair: Option<Duration>,
    /// Whether a lease's release and renewal use the server's own
    /// owner-checked commands.
    pub(super) checks: Arc<Checks>,
}

impl<C> Commands<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// An invocation of a script that takes the lock and counter keys (and
    /// in fair mode the queue's) and the token, ttl and fencing mode
    /// (acquire, hand-over).
    pub(super) fn fenced<'s>(
        &self,
        script: &'s Script,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> Call<'s> {
        self.with_keys(script, lock)
            .arg(&token.hex()[..])
            .arg(millis(ttl))
            .arg(self.fencing.counter_life(ttl))
    }

    /// A call of `script` with the lock's keys: the lock and its counter,
    /// and in fair mode its queue, the queue's deadlines, and the kind and
    /// fencing tokens of shares or permits (which a release may grant).
    pub(super) fn with_keys<'s>(&self, script: &'s Script, lock: &[u8]) -> Call<'s> {
        if self.fair.is_none() {
            return Call::on_lock(script, lock, &[b":fence"]);
        }
        Call::on_lock(
            script,
            lock,
            &[b":fence", b":queue", b":waiters", b":kind", b":tokens"],
        )
    }

    /// The tokens an exclusive grant asked to come with `asked` gets
    /// here: none with fencing off; with the grant in fair mode, whose
    /// grants are scripts anyway.
    fn tokens(&self, asked: Tokens) -> Tokens {
        match asked {
            _ if self.fencing == Fencing::Off => Tokens::Unfenced,
            Tokens::OnDemand if self.fair.is_some() => Tokens::WithGrant,
            asked => asked,
        }
    }

    /// One exclusive attempt: when granted, the fencing token as `tokens`
    /// says (`Some(0)` for none, `None` when issued on demand); otherwise
    /// how long the holder has left, and whether this waiting writer
    /// marked the key against new shares (it passes `marked` on its next
    /// attempts, and clears the mark once granted).
    pub(super) async fn acquire(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
        (waits, marked): (bool, bool),
        tokens: Tokens,
    ) -> Result<Result<Option<u64>, (Option<Duration>, bool)>, StoreError> {
        let tokens = self.tokens(tokens);
        let granted = |fencing: u64| match tokens {
            Tokens::Unfenced => Some(0),
            Tokens::WithGrant => Some(fencing),
            Tokens::OnDemand => None,
        };
        if self.fair.is_none()
            && tokens != Tokens::WithGrant
            && !marked
            && let Some(answer) = self.acquire_plain(lock, token, ttl, waits).await?
        {
            return Ok(answer.map(|()| granted(0)));
        }
        let call = match self.fair {
            None => Call::on_lock(&scripts::ACQUIRE, lock, &[b":fence", b":writer", b":kind"])
                .arg(&token.hex()[..])
                .arg(millis(ttl))
                .arg(match tokens {
                    Tokens::WithGrant => self.fencing.counter_life(ttl),
                    Tokens::Unfenced | Tokens::OnDemand => 0,
                })
                .arg(u8::from(waits) + u8::from(waits && marked)),
            Some(grant_timeout) => self
                .fenced(&scripts::FAIR_ACQUIRE, lock, token, ttl)
                .arg(u8::from(waits))
                .arg(millis(grant_timeout)),
        };
        let answer: Vec<::redis::Value> =
            invoke(&self.conn, call, Retry::IfConnectionFailed).await?;
        if let [acquired, held] = &answer[..]
            && integer(acquired)? == 2
        {
            return Err(mismatch(held, Claim::Exclusive)?.into());
        }
        let (acquired, value, marks) = match &answer[..] {
            [acquired, value] => (integer(acquired)?, integer(value)?, false),
            [acquired, value, _] => (integer(acquired)?, integer(value)?, true),
            _ => return Err(format!("the acquire script answered {answer:?}").into()),
        };
        if acquired != 1 {
            // -1: no expiry (set by hand); -3 (fair mode): the key is free,
            // but it is another waiter's turn.
            let remaining = u64::try_from(value).ok().map(Duration::from_millis);
            return Ok(Err((remaining, marks)));
        }
        self.replicated().await?;
        Ok(Ok(granted(u64::try_from(value).unwrap_or(0))))
    }

    /// Issues the fencing token of `token`'s exclusive lease on `lock`,
    /// checked to hold it in the same script: `None` when it does not.
    /// Sent again after a connection failure: a second token is larger,
    /// and as good.
    pub(super) async fn issue(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
    ) -> Result<Option<u64>, StoreError> {
        let call = Call::on_lock(&scripts::ISSUE, lock, &[b":fence"])
            .arg(&token.hex()[..])
            .arg(self.fencing.counter_life(ttl));
        let issued: ::redis::Value = invoke(&self.conn, call, Retry::IfConnectionFailed).await?;
        if issued == ::redis::Value::Nil {
            return Ok(None);
        }
        let fencing = u64::try_from(integer(&issued)?).unwrap_or(0);
        self.replicated().await?;
        Ok(Some(fencing))
    }

    /// An exclusive attempt without a fencing token, in the one command a
    /// plain lock sends: `SET lock token NX PX ttl GET` (its old value
    /// tells a retried attempt that it holds the key already). Refused, a
    /// `PTTL` says for how long; a caller that `waits` marks the key in
    /// the same call, so that the release wakes it (`waited.lua`). `None`
    /// when shares or permits hold the key (not a string): the script
    /// decides then.
    async fn acquire_plain(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
        waits: bool,
    ) -> Result<Option<Result<(), (Option<Duration>, bool)>>, StoreError> {
        let hex = token.hex();
        let mut set = ::redis::Cmd::with_capacity(7, 64 + lock.len());
        set.arg("SET")
            .arg(lock)
            .arg(&hex[..])
            .arg("NX")
            .arg("PX")
            .arg(millis(ttl))
            .arg("GET");
        let mut conn = self.conn.clone();
        // Sent again after a connection failure: the key may be ours
        // already, and the old value says so.
        let sent = Retry::IfConnectionFailed
            .query::<_, Option<::redis::Value>>(&set, &mut conn)
            .await;
        let old = match sent {
            Ok(old) => old,
            Err(err) if err.code() == Some("WRONGTYPE") => return Ok(None),
            Err(err) => return Err(err.into()),
        };
        let held_by = match &old {
            None => None,
            Some(::redis::Value::BulkString(held)) => Some(held.as_slice()),
            Some(other) => return Err(format!("SET .. GET answered {other:?}").into()),
        };
        match held_by {
            None => {}
            Some(held) if held.strip_suffix(b"~").unwrap_or(held) == hex.as_slice() => {
                // A retry of an attempt whose reply was lost: ours, for a
                // full ttl from now.
                let mut pexpire = ::redis::cmd("PEXPIRE");
                pexpire.arg(lock).arg(millis(ttl));
                let _: i64 = query(&pexpire, &mut conn).await?;
            }
            Some(_) => {
                let pttl: i64 = if waits {
                    invoke(
                        &conn,
                        Call::new(&scripts::MARK, &[lock]),
                        Retry::IfConnectionFailed,
                    )
                    .await?
                } else {
                    let mut pttl = ::redis::cmd("PTTL");
                    pttl.arg(lock);
                    query(&pttl, &mut conn).await?
                };
                let remaining = u64::try_from(pttl).ok().map(Duration::from_millis);
                return Ok(Some(Err((remaining, false))));
            }
        }
        self.replicated().await?;
        Ok(Some(Ok(())))
    }

    /// One attempt at a share or a permit (`claim`) of the key: the
    /// fencing token when granted, how long at least until a retry may be
    /// granted otherwise; an error naming both when the key serves
    /// another claim.
    pub(super) async fn share_acquire(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
        claim: Claim,
        waits: bool,
    ) -> Result<Result<u64, Option<Duration>>, StoreError> {
        let asked = claim_name(claim);
        let call = match self.fair {
            None => Call::on_lock(
                &scripts::SHARE_ACQUIRE,
                lock,
                &[b":fence", b":kind", b":tokens", b":writer"],
            )
            .arg(&token.hex()[..])
            .arg(millis(ttl))
            .arg(self.fencing.counter_life(ttl))
            .arg(&asked[..]),
            Some(grant_timeout) => self
                .fenced(&scripts::FAIR_SHARE_ACQUIRE, lock, token, ttl)
                .arg(u8::from(waits))
                .arg(millis(grant_timeout))
                .arg(&asked[..]),
        };
        let (answer, value): (i64, ::redis::Value) =
            invoke(&self.conn, call, Retry::IfConnectionFailed).await?;
        match answer {
            1 => {
                self.replicated().await?;
                Ok(Ok(u64::try_from(integer(&value)?).unwrap_or(0)))
            }
            2 => Err(mismatch(&value, claim)?.into()),
            _ => Ok(Err(u64::try_from(integer(&value)?)
                .ok()
                .map(Duration::from_millis))),
        }
    }

    /// With [`RedisStoreBuilder::replica_acks`], waits until enough
    /// replicas have every write sent on this connection so far (the grant
    /// just made among them).
    pub(super) async fn replicated(&self) -> Result<(), StoreError> {
        let Some(acks) = self.replica_acks else {
            return Ok(());
        };
        let mut conn = self.conn.clone();
        let mut wait = ::redis::cmd("WAIT");
        wait.arg(acks.replicas).arg(millis(acks.timeout).max(1));
        let acked: u32 = query(&wait, &mut conn).await?;
        if acked < acks.replicas {
            return Err(format!(
                "the grant reached {acked} of the {} replicas required within {:?}",
                acks.replicas, acks.timeout
            )
            .into());
        }
        Ok(())
    }

    /// Renews `token`'s lease on `lock` to `ttl`; `plain` for an exclusive
    /// lease that nobody was seen waiting for, which the server's own
    /// command may renew.
    pub(super) async fn renew(
        &self,
        lock: &[u8],
        token: LockToken,
        ttl: Duration,
        plain: bool,
    ) -> Result<bool, StoreError> {
        if plain && self.fair.is_none() {
            let renew = |_| owner_checks::expire(lock, &token.hex(), millis(ttl));
            if self.checked(renew, Retry::IfConnectionFailed).await? {
                return Ok(true);
            }
        }
        let call = Call::on_lock(&scripts::RENEW, lock, &[b":kind", b":tokens"])
            .arg(&token.hex()[..])
            .arg(millis(ttl));
        let renewed: i64 = invoke(&self.conn, call, Retry::IfConnectionFailed).await?;
        Ok(renewed == 1)
    }

    /// Releases `token`'s lease on `lock` (or shortens it to `linger`);
    /// `exclusive` when the caller knows it is an exclusive lease of its
    /// own, which a script of one key releases (or, `plain` for one that
    /// nobody was seen waiting for, the server's own command).
    pub(super) async fn release(
        &self,
        lock: &[u8],
        token: LockToken,
        linger: Duration,
        exclusive: bool,
        plain: bool,
    ) -> Result<bool, StoreError> {
        let hex = token.hex();
        if plain && self.fair.is_none() {
            let release = |sent| match linger.is_zero() {
                true => owner_checks::delete(sent, lock, &hex),
                false => owner_checks::expire(lock, &hex, millis(linger)),
            };
            if self.checked(release, Retry::IfNeverSent).await? {
                return Ok(true);
            }
        }
        let call = match self.fair {
            None if exclusive => {
                let call = Call::new(&scripts::RELEASE_EXCLUSIVE, &[lock]).arg(&hex[..]);
                match linger.is_zero() {
                    true => call,
                    false => call.arg(millis(linger)),
                }
            }
            None => Call::on_lock(&scripts::RELEASE, lock, &[b":tokens", b":writer"])
                .arg(&hex[..])
                .arg(millis(linger))
                .arg(released_channel(lock)),
            Some(grant_timeout) => self
                .with_keys(&scripts::FAIR_RELEASE, lock)
                .arg(&hex[..])
                .arg(millis(linger))
                .arg(released_channel(lock))
                .arg(millis(grant_timeout)),
        };
        let released: i64 = invoke(&self.conn, call, Retry::IfNeverSent).await?;
        Ok(released == 1)
    }

    /// Moves `token`'s lease on `lock` to `next`: with a new fencing token
    /// unless the lease's tokens are issued `on_demand` (the next holder's
    /// then is, too). A permit (not `exclusive`) moves within the key's
    /// holders; in fair mode it is released instead, so that the store's
    /// queue has its turn.
    pub(super) async fn hand_over(
        &self,
        lock: &[u8],
        (token, next): (LockToken, LockToken),
        ttl: Duration,
        (exclusive, on_demand): (bool, bool),
    ) -> Result<HandOver, StoreError> {
        let call = match (exclusive, self.fair) {
            // Fair mode: the store's queue has its turn.
            (false, Some(_)) => {
                let released = self.release(lock, token, Duration::ZERO, false, false);
                return Ok(match released.await? {
                    true => HandOver::Released,
                    false => HandOver::Lost,
                });
            }
            (false, None) => Call::on_lock(
                &scripts::SHARE_HAND_OVER,
                lock,
                &[b":fence", b":kind", b":tokens"],
            )
            .arg(&token.hex()[..])
            .arg(millis(ttl))
            .arg(self.fencing.counter_life(ttl))
            .arg(&next.hex()[..]),
            // A counter life of 0: the lease moves without a new token.
            (true, None) => self
                .with_keys(&scripts::HAND_OVER, lock)
                .arg(&token.hex()[..])
                .arg(millis(ttl))
                .arg(match on_demand {
                    true => 0,
                    false => self.fencing.counter_life(ttl),
                })
                .arg(&next.hex()[..]),
            // Handed over only while no other process waits in the queue.
            (true, Some(grant_timeout)) => self
                .fenced(&scripts::FAIR_HAND_OVER, lock, token, ttl)
                .arg(&next.hex()[..])
                .arg(released_channel(lock))
                .arg(millis(grant_timeout)),
        };
        // Not idempotent (it issues a new token): resent only if never sent.
        let fencing: ::redis::Value = invoke(&self.conn, call, Retry::IfNeverSent).await?;
        Ok(match integer(&fencing)? {
            -2 => HandOver::Released,
            fencing => {
                let mut handed = HandOver::from(u64::try_from(fencing).ok());
                if let HandOver::Moved { fencing } = &mut handed {
                    if on_demand {
                        *fencing = None;
                    }
                    self.replicated().await?;
                }
                handed
            }
        })
    }
}

impl<C> Commands<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// Sends the owner-checked command that `command` makes for the
    /// commands the store sends, if not scripts: whether it did its work
    /// (deleted the key, set its expiry). Not when the key is not the
    /// caller's unmarked string (the scripts then decide), nor when the
    /// server refused the command (scripts from now on).
    async fn checked(
        &self,
        command: impl FnOnce(OwnerChecks) -> ::redis::Cmd,
        retry: Retry,
    ) -> Result<bool, StoreError> {
        let sent = self.checks.sent();
        if sent == OwnerChecks::Scripts {
            return Ok(false);
        }
        let command = command(sent);
        let mut conn = self.conn.clone();
        match retry.query(&command, &mut conn).await {
            // `SET … IFEQ`'s `OK`; `DELEX`'s and `DELIFEQ`'s count.
            Ok(::redis::Value::Okay | ::redis::Value::Int(1)) => Ok(true),
            Ok(::redis::Value::SimpleString(ok)) if ok == "OK" => Ok(true),
            Ok(::redis::Value::Nil | ::redis::Value::Int(0)) => Ok(false),
            Ok(other) => Err(format!("an owner-checked command answered {other:?}").into()),
            Err(err) if err.code() == Some("WRONGTYPE") => Ok(false),
            Err(err) if owner_checks::is_refusal(&err) => {
                self.checks.refused(&err);
                Ok(false)
            }
            Err(err) => Err(err.into()),
        }
    }
}

/// Which failed calls may be sent once more at once.
#[derive(Clone, Copy)]
pub(super) enum Retry {
    /// Idempotent calls (acquire, renew): after any connection failure.
    IfConnectionFailed,
    /// Release: only when the command surely never reached the server.
    IfNeverSent,
}

impl Retry {
    pub(super) fn allows(self, err: &::redis::RedisError) -> bool {
        match self {
            // A response timeout is an I/O error too, but the server may
            // still be working on the command: resending it would hold the
            // caller for another timeout.
            Retry::IfConnectionFailed => {
                (err.is_connection_refusal() || err.is_connection_dropped() || err.is_io_error())
                    && !err.is_timeout()
            }
            Retry::IfNeverSent => err.is_connection_refusal(),
        }
    }

    /// Sends `cmd`; after a failure this allows, once more.
    pub(super) async fn query<C, T>(
        self,
        cmd: &::redis::Cmd,
        conn: &mut C,
    ) -> ::redis::RedisResult<T>
    where
        C: ConnectionLike + 'static,
        T: ::redis::FromRedisValue,
    {
        match query(cmd, conn).await {
            Err(err) if self.allows(&err) => query(cmd, conn).await,
            answer => answer,
        }
    }
}

/// Sends `cmd` and reads its reply as `T`, as `Cmd::query_async` does; on
/// this crate's own connection through [`RedisConnection::send`], which
/// spares the boxed future of a `ConnectionLike` call.
pub(super) async fn query<C, T>(cmd: &::redis::Cmd, conn: &mut C) -> ::redis::RedisResult<T>
where
    C: ConnectionLike + 'static,
    T: ::redis::FromRedisValue,
{
    let reply = match (conn as &mut dyn Any).downcast_mut::<RedisConnection>() {
        Some(conn) => conn.send(cmd).await,
        None => conn.req_packed_command(cmd).await,
    }?;
    Ok(::redis::from_redis_value(reply.extract_error()?)?)
}

/// A script call written straight into one `EVALSHA` command, with no
/// buffer per key or argument (`ScriptInvocation` copies each into a
/// vector of its own, then all of them into the command).
pub(super) struct Call<'s> {
    script: &'s Script,
    cmd: ::redis::Cmd,
}

impl<'s> Call<'s> {
    pub(super) fn new(script: &'s Script, keys: &[&[u8]]) -> Self {
        let mut cmd = ::redis::Cmd::with_capacity(8, 160);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        Call { script, cmd }
    }

    /// A call whose keys are `lock` and its keys named by `suffixes`
    /// (`:fence`, `:kind`, ...), in that order.
    pub(super) fn on_lock(script: &'s Script, lock: &[u8], suffixes: &[&[u8]]) -> Self {
        let mut cmd = ::redis::Cmd::with_capacity(8, 160);
        cmd.arg("EVALSHA")
            .arg(script.get_hash())
            .arg(1 + suffixes.len())
            .arg(lock);
        for suffix in suffixes {
            cmd.arg(suffixed(lock, suffix));
        }
        Call { script, cmd }
    }

    pub(super) fn arg(mut self, arg: impl ::redis::ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Sends the call; loads the script first if the server lacks it (a
    /// restart, `SCRIPT FLUSH`), then sends it again.
    pub(super) async fn send<C, T>(&self, conn: &mut C) -> Result<T, ::redis::RedisError>
    where
        C: ConnectionLike + 'static,
        T: ::redis::FromRedisValue,
    {
        use ::redis::{ErrorKind, ServerErrorKind};
        match query(&self.cmd, conn).await {
            Err(err) if err.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                query(&self.cmd, conn).await
            }
            other => other,
        }
    }
}

/// Runs a script; after a connection failure that `retry` allows, once more
/// on the reconnected connection. A failed reconnect is reported to the first
/// caller after the server is back; the retry spares that caller the error.
pub(super) async fn invoke<C, T>(
    conn: &C,
    call: Call<'_>,
    retry: Retry,
) -> Result<T, ::redis::RedisError>
where
    C: ConnectionLike + Clone + 'static,
    T: ::redis::FromRedisValue,
{
    let mut conn = conn.clone();
    match call.send(&mut conn).await {
        Err(err) if retry.allows(&err) => call.send(&mut conn).await,
        other => other,
    }
}

/// A script's number: an integer reply, or digits in a string (a fencing
/// token, which Lua would turn into a float).
pub(super) fn integer(value: &::redis::Value) -> Result<i64, StoreError> {
    let parsed = match value {
        ::redis::Value::Int(n) => Some(*n),
        ::redis::Value::BulkString(digits) => std::str::from_utf8(digits)
            .ok()
            .and_then(|digits| digits.parse().ok()),
        _ => None,
    };
    parsed.ok_or_else(|| format!("a script answered {value:?} where a number was expected").into())
}

/// A claim as the share script takes it: `shared`, or a semaphore's limit.
pub(super) fn claim_name(claim: Claim) -> String {
    match claim {
        Claim::Permit { limit } => limit.to_string(),
        _ => "shared".to_owned(),
    }
}

/// The mismatch a script answered with `{2, kind}`: the key serves the
/// claim `kind` names (see [`claim_of`]), not `asked`.
fn mismatch(kind: &::redis::Value, asked: Claim) -> Result<ClaimMismatch, StoreError> {
    let kind: String = ::redis::from_redis_value_ref(kind)
        .map_err(|err| format!("a script named a key's kind as {kind:?}: {err}"))?;
    Ok(ClaimMismatch::new(claim_of(&kind), asked))
}

/// The claim a share script's name stands for (see [`claim_name`]).
pub(super) fn claim_of(name: &str) -> Claim {
    match name.parse().ok().and_then(NonZeroU32::new) {
        Some(limit) => Claim::permits(limit),
        None => Claim::Shared,
    }
}

/// A duration in whole milliseconds, as the scripts take them.
pub(super) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}
