//! A store written outside `lock-runtime` (here, one that hands every call
//! to a memory store), checked with the contract suite through the
//! `testkit` feature, with the runtime renamed in Cargo.toml as a user may
//! have it.

use std::sync::Arc;

use locks::store::memory::MemoryStore;
use locks::store::testkit::Clients;
use locks::store::{
    Acquire, AcquireRequest, Capabilities, LeaseInfo, LockToken, ReleaseWatch, Reply, Store,
};

/// A store of our own, over a memory store's table.
#[derive(Debug, Clone, Default)]
struct Outside(MemoryStore);

impl Store for Outside {
    fn capabilities(&self) -> &Capabilities {
        self.0.capabilities()
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> Reply<'a, Acquire> {
        self.0.acquire(request)
    }

    fn abandon<'a>(&'a self, key: &'a str, token: LockToken) -> Reply<'a, bool> {
        self.0.abandon(key, token)
    }

    fn watch<'a>(&'a self, key: &'a str) -> Reply<'a, ReleaseWatch> {
        self.0.watch(key)
    }

    fn force_release<'a>(&'a self, key: &'a str) -> Reply<'a, bool> {
        self.0.force_release(key)
    }

    fn inspect<'a>(&'a self, key: &'a str) -> Reply<'a, Option<LeaseInfo>> {
        self.0.inspect(key)
    }
}

/// Two clients of one table.
async fn outside() -> Clients {
    let store = Outside::default();
    Clients::new(Arc::new(store.clone()), Arc::new(store), ())
}

locks::store_contract!(outside_store_contract, outside);
