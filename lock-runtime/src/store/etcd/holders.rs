//! Read shares and semaphore permits: entries in the key's queue, as a
//! mutex's, whose names say what they claim; who holds follows from the
//! queue's order.

use std::num::NonZeroU32;

use etcd_client::{
    GetOptions, KeyValue, PutOptions, SortOrder, SortTarget, Txn, TxnOp, TxnOpResponse,
};

use super::EtcdStore;
use super::calls::{lease_gone, owned};
use super::keys::{entry_for, queue_end};
use super::state::Queued;
use crate::error::StoreError;
use crate::store::common::queue::{Place, holding};
use crate::store::{Acquire, AcquireRequest, Claim};

/// The length of an entry's name after its queue's start: the lease in
/// hex and a digit (see [`entry_for`]); a claim's suffix follows.
const NAME: usize = 17;

/// The suffix of an entry that claims `claim`: none for an exclusive one.
pub(super) fn suffix(claim: Claim) -> String {
    match claim {
        Claim::Exclusive => String::new(),
        Claim::Shared => ":s".to_owned(),
        Claim::Permit { limit } => format!(":p{limit}"),
    }
}

/// What the entry `entry` of the queue starting at `queue` claims, read
/// from its name.
pub(super) fn claim_of(queue: &[u8], entry: &[u8]) -> Claim {
    let rest = entry.get(queue.len() + NAME..).unwrap_or_default();
    match rest {
        b":s" => Claim::Shared,
        _ => std::str::from_utf8(rest)
            .ok()
            .and_then(|rest| rest.strip_prefix(":p"))
            .and_then(|limit| limit.parse().ok())
            .and_then(NonZeroU32::new)
            .map_or(Claim::Exclusive, Claim::permits),
    }
}

impl EtcdStore {
    /// The entries of `queue` that hold its key, in creation order: the
    /// first, and the shares or permits that hold beside it.
    pub(super) async fn holders(&self, queue: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
        let options = GetOptions::new()
            .with_range(queue_end(queue))
            .with_sort(SortTarget::Create, SortOrder::Ascend);
        let mut entries = self.get(queue, options).await?.kvs().to_vec();
        let claims: Vec<_> = entries.iter().map(|kv| claim_of(queue, kv.key())).collect();
        entries.truncate(holding(&claims));
        Ok(entries)
    }

    /// An attempt at a share or permit: our entry queued (or the one a
    /// waiter has) and the queue read in one transaction; held if the
    /// entries ahead allow it. In skip mode a refused entry is deleted
    /// again; in wait mode it keeps its place.
    pub(super) async fn claim(
        &self,
        request: AcquireRequest<'_>,
        queue: Vec<u8>,
        secs: i64,
        mut known: Option<Queued>,
    ) -> Result<Acquire, StoreError> {
        let token = request.token.to_string();
        if let Some(entry) = known.as_mut()
            && !self.keep_queued(request.token, entry).await?
        {
            // Its lease ended (and it is forgotten): queue again.
            known = None;
        }
        let range = GetOptions::new()
            .with_range(queue_end(&queue))
            .with_sort(SortTarget::Create, SortOrder::Ascend)
            .with_keys_only();
        let (spare, entry, fresh, listing) = match known {
            Some(known) => {
                let listing = self.get(&queue, range).await?;
                (known.lease, known.entry, false, listing.kvs().to_vec())
            }
            None => {
                let mut tries = 0;
                loop {
                    tries += 1;
                    let spare = self.spare(secs, &queue).await?;
                    let mut entry = entry_for(&queue, spare.id, false);
                    entry.extend_from_slice(suffix(request.claim).as_bytes());
                    let on_lease = PutOptions::new().with_lease(spare.id);
                    let txn = Txn::new().and_then([
                        TxnOp::put(entry.clone(), token.clone(), Some(on_lease)),
                        TxnOp::get(queue.clone(), Some(range.clone())),
                    ]);
                    match self.txn(&txn).await {
                        Err(err) if tries < 2 && lease_gone(&err) => continue,
                        answer => {
                            let listing = answer?
                                .op_responses()
                                .into_iter()
                                .find_map(|op| match op {
                                    TxnOpResponse::Get(get) => Some(get.kvs().to_vec()),
                                    _ => None,
                                })
                                .unwrap_or_default();
                            break (spare, entry, true, listing);
                        }
                    }
                }
            }
        };
        let Some(at) = listing.iter().position(|kv| kv.key() == entry.as_slice()) else {
            // Deleted under us (a forced release, an expired lease): anew.
            self.inner.shared.queued().remove(&request.token);
            return Ok(Acquire::Held { remaining: None });
        };
        let claims: Vec<Claim> = listing
            .iter()
            .map(|kv| claim_of(&queue, kv.key()))
            .collect();
        let created = listing[at].create_revision();
        let ours = Queued {
            queue,
            entry,
            created,
            lease: spare,
            secs,
            place: Place::Unknown,
        };
        let misfit = claims[..at]
            .iter()
            .find_map(|&ahead| request.claim.fits(ahead).err());
        if misfit.is_none() && at < holding(&claims) {
            self.inner.shared.queued().remove(&request.token);
            let lease = self.granted(ours, request.token, true, request.loss);
            return Ok(Acquire::Acquired {
                fencing: Some(lease.created.max(0).unsigned_abs()),
                lease: Box::new(lease.one_of_many()),
            });
        }
        if misfit.is_some() || !request.hints.waits {
            self.inner.shared.queued().remove(&request.token);
            let drop_ours = Txn::new()
                .when([owned(&ours.entry, &token)])
                .and_then([TxnOp::delete(ours.entry.clone(), None)]);
            self.txn(&drop_ours).await?;
            if fresh {
                self.inner.shared.give_back(secs, spare, &ours.queue);
            }
            if let Some(misfit) = misfit {
                return Err(misfit.into());
            }
            return Ok(Acquire::Held { remaining: None });
        }
        self.inner.shared.queued().insert(request.token, ours);
        Ok(Acquire::Held { remaining: None })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_s_name_says_what_it_claims() {
        let queue = b"locks/k\0".to_vec();
        let three = Claim::permits(NonZeroU32::new(3).unwrap());
        for claim in [Claim::Exclusive, Claim::Shared, three] {
            let mut entry = entry_for(&queue, 0x2a, false);
            entry.extend_from_slice(suffix(claim).as_bytes());
            assert_eq!(claim_of(&queue, &entry), claim);
        }
    }
}
