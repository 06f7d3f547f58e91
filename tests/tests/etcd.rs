//! The etcd store against real clusters: the contract on one member, ttl
//! rules, bad input, and faults on three members (a killed leader, a killed
//! minority, a lost quorum).

use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_runtime::{EtcdBackend, LockError, LockOptions, LockRegistry};
use lock_tests::contract::Store;
use lock_tests::{EtcdCluster, backend_contract, lock_and_release, time_to_lock, unique_key};

async fn etcd_store() -> Store {
    let cluster = EtcdCluster::single();
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    let connect = || EtcdBackend::builder(&endpoints).connect();
    let (a, b) = (connect().await.unwrap(), connect().await.unwrap());
    Store::new(Arc::new(a), Arc::new(b), cluster)
}

backend_contract!(etcd_contract, etcd_store);

async fn registry(cluster: &EtcdCluster) -> LockRegistry {
    let endpoints = cluster.endpoints();
    let endpoints: Vec<&str> = endpoints.iter().map(String::as_str).collect();
    LockRegistry::etcd(&endpoints).await.unwrap()
}
