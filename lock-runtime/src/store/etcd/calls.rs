//! The store's calls to etcd, with its timeouts and retries, and what they
//! answer.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, KeyValue, LeaseClient, Txn, TxnOpResponse, TxnResponse,
};
use tokio::time::Instant;

use super::keys::{queue_end, queue_start};
use super::state::{Queued, Spare};
use super::{EtcdStore, RETRY};
use crate::error::StoreError;
use crate::store::LockToken;

impl EtcdStore {
    /// The shortest lease the cluster grants: ask for 1 s, see what it gave.
    pub(super) async fn min_ttl(&self) -> Result<Duration, StoreError> {
        let granted = self
            .lease_call(|mut c| async move { c.grant(1, None).await })
            .await?;
        let id = granted.id();
        let _ = self
            .lease_call(|mut c| async move { c.revoke(id).await })
            .await;
        Ok(Duration::from_secs(granted.ttl().max(1).unsigned_abs()))
    }

    pub(super) fn queue_of(&self, key: &str) -> Vec<u8> {
        queue_start(&self.inner.prefix, key)
    }

    /// Runs `txn` (see [`timed`](Self::timed)).
    pub(super) async fn txn(&self, txn: &Txn) -> Result<TxnResponse, StoreError> {
        self.txn_built(|| txn.clone()).await
    }

    /// Runs the transaction `build` makes, made again only for a retry
    /// (the client takes it by value).
    pub(super) async fn txn_built(
        &self,
        build: impl Fn() -> Txn,
    ) -> Result<TxnResponse, StoreError> {
        self.timed(|| {
            let (mut kv, txn) = (self.inner.kv.clone(), build());
            async move { kv.txn(txn).await }
        })
        .await
    }

    /// Runs a call on the lease service (see [`timed`](Self::timed)).
    pub(super) async fn lease_call<T, F, Fut>(&self, call: F) -> Result<T, StoreError>
    where
        F: Fn(LeaseClient) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        self.timed(|| call(self.inner.leases.clone())).await
    }

    /// Runs one call within the response timeout, again while no member
    /// can take it (an endpoint that just died, an election, a connection
    /// that broke under the call): each of the
    /// store's calls may run twice (an acquire by the same token gets the
    /// same answer, a release or a renewal is owner-checked).
    pub(super) async fn timed<T, F, Fut>(&self, mut call: F) -> Result<T, StoreError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let deadline = Instant::now() + self.inner.timeout;
        let mut refused = None;
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Ok(answer)) => return Ok(answer),
                Ok(Err(err)) if undelivered(&err) && Instant::now() + RETRY < deadline => {
                    tracing::debug!(%err, "etcd: the call may not have arrived; again");
                    refused = Some(etcd_error(err));
                    tokio::time::sleep(RETRY).await;
                }
                Ok(Err(err)) => return Err(etcd_error(err)),
                Err(_) => {
                    let timeout = self.inner.timeout;
                    return Err(match refused {
                        Some(last) => format!("no answer from etcd within {timeout:?} ({last})"),
                        None => format!("no answer from etcd within {timeout:?}"),
                    }
                    .into());
                }
            }
        }
    }

    /// A lease of `secs` for an entry in `queue`: a prepared one (see
    /// [`Shared::take`](super::state::Shared::take)), else a new one.
    pub(super) async fn spare(&self, secs: i64, queue: &[u8]) -> Result<Spare, StoreError> {
        match self.inner.shared.take(secs, queue) {
            Some(spare) => Ok(spare),
            None => self.grant(secs).await,
        }
    }

    /// A new lease of `secs`, counted from before its request was sent.
    pub(super) async fn grant(&self, secs: i64) -> Result<Spare, StoreError> {
        let fresh_at = Instant::now();
        let granted = self
            .lease_call(|mut c| async move { c.grant(secs, None).await })
            .await?;
        if granted.ttl() != secs {
            // Only if the cluster's minimum rose since we connected.
            let id = granted.id();
            let _ = self
                .lease_call(|mut c| async move { c.revoke(id).await })
                .await;
            return Err(format!(
                "etcd granted a {}s lease for a {secs}s ttl (its minimum changed?)",
                granted.ttl()
            )
            .into());
        }
        Ok(Spare {
            id: granted.id(),
            fresh_at,
        })
    }

    /// The holder's remaining time, rounded up to whole seconds as etcd
    /// rounds it down.
    pub(super) async fn remaining(&self, lease: i64) -> Result<Option<Duration>, StoreError> {
        if lease == 0 {
            return Ok(None);
        }
        let left = self
            .lease_call(|mut c| async move { c.time_to_live(lease, None).await })
            .await?;
        Ok(Some(Duration::from_secs(
            (left.ttl() + 1).max(0).unsigned_abs(),
        )))
    }

    /// The keys in `queue` with their create revisions, and the revision
    /// they were read at.
    pub(super) async fn list(
        &self,
        queue: &[u8],
    ) -> Result<(Vec<(Vec<u8>, i64)>, i64), StoreError> {
        let options = GetOptions::new()
            .with_range(queue_end(queue))
            .with_keys_only();
        let got = self.get(queue, options).await?;
        let at = got.header().map_or(0, |header| header.revision());
        let entries = got
            .kvs()
            .iter()
            .map(|kv| (kv.key().to_vec(), kv.create_revision()))
            .collect();
        Ok((entries, at))
    }

    /// The entries in `queue` that hold `token`.
    pub(super) async fn entries_of(
        &self,
        queue: &[u8],
        token: LockToken,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let got = self
            .get(queue, GetOptions::new().with_range(queue_end(queue)))
            .await?;
        let value = token.to_string();
        Ok(got
            .kvs()
            .iter()
            .filter(|kv| kv.value() == value.as_bytes())
            .map(|kv| kv.key().to_vec())
            .collect())
    }

    /// Reads from `key` with `options` (see [`timed`](Self::timed)).
    pub(super) async fn get(
        &self,
        key: &[u8],
        options: GetOptions,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        self.timed(|| {
            let (mut kv, options) = (self.inner.kv.clone(), options.clone());
            async move { kv.get(key.to_vec(), Some(options)).await }
        })
        .await
    }

    /// Whether a waiting entry's lease was renewed less than an eighth of
    /// the cluster's shortest lease ago: not yet due to be kept alive.
    pub(super) fn fresh_in_queue(&self, entry: &Queued) -> bool {
        let poll = super::queue_poll(self.min_ttl);
        entry.lease.fresh_at.elapsed() < poll / 2
    }

    /// Keeps `token`'s waiting entry alive if its lease was last renewed
    /// an eighth of the cluster's shortest lease ago or longer; `false` if
    /// the lease (and with it the entry) is gone.
    pub(super) async fn keep_queued(
        &self,
        token: LockToken,
        entry: &mut Queued,
    ) -> Result<bool, StoreError> {
        if self.fresh_in_queue(entry) {
            return Ok(true);
        }
        let sent_at = Instant::now();
        let id = entry.lease.id;
        match self
            .lease_call(|mut c| async move { c.keep_alive(id).await })
            .await
        {
            Ok(_) => {
                entry.lease.fresh_at = sent_at;
                if let Some(known) = self.inner.shared.queued().get_mut(&token) {
                    known.lease.fresh_at = sent_at;
                }
                Ok(true)
            }
            Err(err) if lease_gone(&err) => {
                self.inner.shared.queued().remove(&token);
                Ok(false)
            }
            Err(err) => Err(err),
        }
    }
}

/// Runs `call` within `timeout`; errors and timeouts as store errors.
pub(super) async fn within<T>(
    timeout: Duration,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(err)) => Err(etcd_error(err)),
        Err(_) => Err(format!("no answer from etcd within {timeout:?}").into()),
    }
}

pub(super) fn etcd_error(err: etcd_client::Error) -> StoreError {
    match err {
        etcd_client::Error::GRpcStatus(status) => format!(
            "etcd call failed: {} ({:?})",
            status.message(),
            status.code()
        )
        .into(),
        other => format!("etcd: {other}").into(),
    }
}

/// A call that may not have reached a member that could serve it: gRPC's
/// `UNAVAILABLE` (no member, no leader), or a connection that broke under
/// it (reset by a member's restart or a proxy: "transport error", or
/// `CANCELLED`, which the channel reports for a call queued on a
/// connection that closed; this client cancels none of its own calls).
pub(super) fn undelivered(err: &etcd_client::Error) -> bool {
    const CANCELLED: i32 = 1;
    const UNKNOWN: i32 = 2;
    const UNAVAILABLE: i32 = 14;
    match err {
        etcd_client::Error::GRpcStatus(status) => match i32::from(status.code()) {
            CANCELLED | UNAVAILABLE => true,
            UNKNOWN => status.message().starts_with("transport error"),
            _ => false,
        },
        etcd_client::Error::TransportError(_) => true,
        _ => false,
    }
}

/// Whether `err` says a lease does not exist (expired or revoked).
pub(super) fn lease_gone(err: &StoreError) -> bool {
    err.to_string().contains("lease not found")
}

/// `If value(key) == token`.
pub(super) fn owned(key: &[u8], token: &str) -> Compare {
    Compare::value(key, CompareOp::Equal, token)
}

/// What each `Get` of a transaction read, in order (`None`: nothing).
pub(super) fn gets(answer: &TxnResponse) -> Vec<Option<KeyValue>> {
    answer
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

pub(super) fn revision(answer: &TxnResponse) -> u64 {
    answer
        .header()
        .map_or(0, |header| header.revision().max(0).unsigned_abs())
}

pub(super) fn whole_seconds(duration: Duration) -> i64 {
    let secs = duration.as_secs() + u64::from(duration.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lingers_round_up_to_whole_seconds() {
        assert_eq!(whole_seconds(Duration::from_secs(2)), 2);
        assert_eq!(whole_seconds(Duration::from_millis(2001)), 3);
        assert_eq!(whole_seconds(Duration::from_millis(1)), 1);
    }
}
