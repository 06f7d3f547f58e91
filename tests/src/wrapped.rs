//! Test stores that wrap another store and change only how it acquires
//! (or what leases it grants).

use std::sync::Arc;

use lock_runtime::MemoryStore;
use lock_runtime::store::Store;

/// A store a test store wraps, as the calls it passes through see it.
pub trait Inner {
    /// The wrapped store.
    fn store(&self) -> &dyn Store;
}

impl Inner for MemoryStore {
    fn store(&self) -> &dyn Store {
        self
    }
}

impl Inner for Arc<dyn Store> {
    fn store(&self) -> &dyn Store {
        &**self
    }
}

/// Writes, inside an `impl Store for ..` block, every method of a store
/// that wraps another (`self.$inner`, an [`Inner`]) but `acquire`: each
/// passes the call through unchanged.
#[macro_export]
macro_rules! forward_store_to {
    ($inner:tt) => {
        fn capabilities(&self) -> &::lock_runtime::store::Capabilities {
            ::lock_runtime::store::Store::capabilities($crate::Inner::store(&self.$inner))
        }

        fn abandon<'a>(
            &'a self,
            key: &'a str,
            token: ::lock_runtime::store::LockToken,
        ) -> ::lock_runtime::store::Reply<'a, bool> {
            ::lock_runtime::store::Store::abandon($crate::Inner::store(&self.$inner), key, token)
        }

        fn watch<'a>(
            &'a self,
            key: &'a str,
        ) -> ::lock_runtime::store::Reply<'a, ::lock_runtime::store::ReleaseWatch> {
            ::lock_runtime::store::Store::watch($crate::Inner::store(&self.$inner), key)
        }

        fn force_release<'a>(&'a self, key: &'a str) -> ::lock_runtime::store::Reply<'a, bool> {
            ::lock_runtime::store::Store::force_release($crate::Inner::store(&self.$inner), key)
        }

        fn inspect<'a>(
            &'a self,
            key: &'a str,
        ) -> ::lock_runtime::store::Reply<'a, Option<::lock_runtime::store::LeaseInfo>> {
            ::lock_runtime::store::Store::inspect($crate::Inner::store(&self.$inner), key)
        }
    };
}
