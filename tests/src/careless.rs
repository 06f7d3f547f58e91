//! A deliberately broken store for the soak's checker to catch: its leases
//! release the key without checking that they still hold it (a forced
//! release), the bug of a lock whose holder, back from a pause, deletes
//! its successor's lock.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::store::{Acquire, AcquireRequest, Lease, Reply, Store};

/// Wraps a store; every lease it grants releases by force.
#[derive(Debug)]
pub struct Careless(pub Arc<dyn Store>);

/// A lease that releases its key whoever holds it.
#[derive(Debug)]
struct CarelessLease {
    inner: Box<dyn Lease>,
    store: Arc<dyn Store>,
    key: String,
}

impl Lease for CarelessLease {
    fn renew(&self) -> Reply<'_, bool> {
        self.inner.renew()
    }

    fn release(&mut self, _linger: Duration) -> Reply<'_, bool> {
        Reply::new(async move {
            self.store.force_release(&self.key).await?;
            Ok(true)
        })
    }

    fn fencing_token(&self) -> Reply<'_, Option<u64>> {
        self.inner.fencing_token()
    }

    fn others_may_wait(&self) -> bool {
        self.inner.others_may_wait()
    }
}

impl Store for Careless {
    crate::forward_store_to!(0);

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        Reply::new(async move {
            let key = request.key.to_owned();
            Ok(match self.0.acquire(request).await? {
                Acquire::Acquired { fencing, lease } => Acquire::Acquired {
                    fencing,
                    lease: Box::new(CarelessLease {
                        inner: lease,
                        store: self.0.clone(),
                        key,
                    }),
                },
                other => other,
            })
        })
    }
}
