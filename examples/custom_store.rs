//! A lock store of your own: a table of leases, as a database would keep
//! them, written against `lock_runtime::store`'s contract and checked by its
//! suite (`cargo test -p examples --example custom_store`).
//!
//! A `HashMap` behind a mutex stands in for a table of rows `(key, token,
//! claim, fencing, expires_at)`: each method does what one statement would
//! under the row's lock. It serves mutexes and semaphores, keeps a released
//! lease for a while (`hold_at_least`) and numbers its grants; it cannot
//! tell waiters of a release, so they ask again every 50 ms.
//!
//! Run it: `cargo run -p examples --example custom_store`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lock_runtime::store::{
    Acquire, AcquireRequest, Capabilities, Claim, FencingPromise, Lease, LeaseInfo, LockToken,
    Meeting, ReleaseWatch, Reply, Store,
};
use lock_runtime::{LockError, LockOptions, LockRegistry};
use tokio::time::Instant;

/// One lease: a row of the table.
#[derive(Clone, Debug)]
struct Row {
    token: LockToken,
    claim: Claim,
    fencing: u64,
    expires_at: Instant,
}

/// The table: the live and expired rows of each key, and the last fencing
/// number handed out (a database would use a sequence).
#[derive(Debug, Default)]
struct Table {
    rows: HashMap<String, Vec<Row>>,
    last_fencing: u64,
}

impl Table {
    /// The key's live rows (what `WHERE expires_at > now()` would select).
    fn live(&mut self, key: &str, now: Instant) -> &mut Vec<Row> {
        let rows = self.rows.entry(key.to_owned()).or_default();
        rows.retain(|row| row.expires_at > now);
        rows
    }
}

/// The store: clones share one table, as clients share one database.
#[derive(Clone, Debug, Default)]
struct TableStore {
    table: Arc<Mutex<Table>>,
}

/// What the table can do. The margin is the default for a store on another
/// machine, which a database is.
const CAPABILITIES: Capabilities = Capabilities::new("table")
    .with_ttl(Duration::from_millis(50), Duration::from_millis(1))
    .with_linger()
    .with_permits()
    .with_polled_releases(Duration::from_millis(50))
    .with_fencing(FencingPromise::INCREASING);

impl Store for TableStore {
    fn capabilities(&self) -> &Capabilities {
        &CAPABILITIES
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            let now = Instant::now();
            let mut table = self.lock();
            let rows = table.live(request.key, now);
            // A retry by the same token: the same lease, renewed.
            if let Some(row) = rows.iter_mut().find(|row| row.token == request.token) {
                row.expires_at = now + request.ttl;
                return Ok(self.granted(&request, row.fencing));
            }
            // The claim rule: a mismatch is an error at once, and nothing
            // was written.
            for row in rows.iter() {
                request.claim.fits(row.claim)?;
            }
            let joins = rows
                .first()
                .is_none_or(|held| request.claim.meets(held.claim) == Meeting::Joins);
            let limit = request.claim.limit();
            if !joins || limit.is_some_and(|limit| rows.len() >= limit.get() as usize) {
                let soonest = rows.iter().map(|row| row.expires_at).min();
                return Ok(Acquire::Held {
                    remaining: soonest.map(|at| at - now),
                });
            }
            table.last_fencing += 1;
            let fencing = table.last_fencing;
            table.live(request.key, now).push(Row {
                token: request.token,
                claim: request.claim,
                fencing,
                expires_at: now + request.ttl,
            });
            Ok(self.granted(&request, fencing))
        })
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        Reply::new(async move { Ok(self.delete(key, Some(token)) > 0) })
    }

    fn watch<'a>(&'a self, _key: &'a str) -> Reply<'a, ReleaseWatch> {
        // No notifications: waiters ask again every 50 ms.
        Reply::ready(Ok(ReleaseWatch::never()))
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        Reply::new(async move { Ok(self.delete(key, None) > 0) })
    }

    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        Reply::new(async move {
            let now = Instant::now();
            let mut table = self.lock();
            let rows = table.live(key, now);
            let first = rows.iter().min_by_key(|row| row.expires_at);
            Ok(first.map(|row| {
                LeaseInfo::new(Some(row.token), row.fencing, Some(row.expires_at - now))
                    .with_holders(row.claim, rows.len())
            }))
        })
    }
}

impl TableStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The answer granting `request` its lease, numbered `fencing`.
    fn granted(&self, request: &AcquireRequest<'_>, fencing: u64) -> Acquire {
        let lease = TableLease {
            store: self.clone(),
            key: request.key.to_owned(),
            token: request.token,
            ttl: request.ttl,
        };
        Acquire::Acquired {
            fencing: Some(fencing),
            lease: Box::new(lease),
        }
    }

    /// Deletes the key's live rows of `token` (of everyone for `None`);
    /// how many.
    fn delete(&self, key: &str, token: Option<LockToken>) -> usize {
        let mut table = self.lock();
        let rows = table.live(key, Instant::now());
        let before = rows.len();
        rows.retain(|row| token.is_some_and(|token| row.token != token));
        let deleted = before - rows.len();
        if rows.is_empty() {
            table.rows.remove(key);
        }
        deleted
    }

    /// Sets the expiry of `token`'s live row to `ends`; whether it had one.
    fn extend(&self, key: &str, token: LockToken, ends: Instant) -> bool {
        let mut table = self.lock();
        let rows = table.live(key, Instant::now());
        let row = rows.iter_mut().find(|row| row.token == token);
        row.map(|row| row.expires_at = ends).is_some()
    }
}

/// One held lease: the row it owns, by its token.
#[derive(Debug)]
struct TableLease {
    store: TableStore,
    key: String,
    token: LockToken,
    ttl: Duration,
}

impl Lease for TableLease {
    fn renew(&self) -> Reply<'_, bool> {
        let ends = Instant::now() + self.ttl;
        Reply::ready(Ok(self.store.extend(&self.key, self.token, ends)))
    }

    fn release(&mut self, linger: Duration) -> Reply<'_, bool> {
        Reply::ready(Ok(if linger.is_zero() {
            self.store.delete(&self.key, Some(self.token)) > 0
        } else {
            self.store
                .extend(&self.key, self.token, Instant::now() + linger)
        }))
    }
}

#[tokio::main]
async fn main() -> Result<(), LockError> {
    demo().await
}

/// Two holders of a semaphore of 2 on the table, and a third turned away.
async fn demo() -> Result<(), LockError> {
    let locks = LockRegistry::new(TableStore::default());
    let two = LockOptions::default().permits(2);
    let first = locks.lock("reports", two.clone()).await?;
    let second = locks.lock("reports", two.clone()).await?;
    let turned_away = locks.try_lock("reports", two).await?.is_none();
    let tokens = (first.fencing_token().await?, second.fencing_token().await?);
    println!(
        "2 permits held, fencing tokens {tokens:?}; a third caller turned away: {turned_away}"
    );
    first.release().await?;
    second.release().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_runtime::store::testkit::Clients;

    /// Two clients of one table.
    async fn table() -> Clients {
        let store = TableStore::default();
        Clients::new(Arc::new(store.clone()), Arc::new(store), ())
    }

    /// The demo `main` runs.
    #[tokio::test]
    async fn the_demo_runs() {
        demo().await.expect("the demo");
    }

    lock_runtime::store_contract!(table_contract, table, skip: [
        a_hand_over_moves_the_lease_to_a_new_token,
        a_forced_release_is_pushed_to_the_holder,
        a_watch_fires_on_release_and_only_then,
        shares_hold_together_and_an_exclusive_claim_alone,
        a_forced_release_frees_every_share,
        a_waiting_exclusive_claim_stops_new_shares,
    ]);
}
