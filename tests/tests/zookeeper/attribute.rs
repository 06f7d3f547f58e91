//! The attribute over ZooKeeper in one process: the global registry points
//! at one server this single test owns. A body cancelled or panicking
//! frees its key at once: its node is deleted, not left for the 30 s
//! session to take with it.

use lock_runtime::LockRegistry;
use lock_tests::ZooKeeperEnsemble;
use lock_tests::attribute::an_ended_body_frees_its_key_at_once;

/// The key's queue, read by a session of its own (empty once the key's
/// node is gone too).
async fn queue(client: &zookeeper_client::Client, key: &str) -> Vec<String> {
    match client.list_children(&format!("/locks/{key}")).await {
        Ok(children) => children,
        Err(zookeeper_client::Error::NoNode) => Vec::new(),
        Err(err) => panic!("listing the queue of `{key}`: {err}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_zookeeper() {
    let zk = ZooKeeperEnsemble::single();
    let connect = zk.connect_string();
    lock_runtime::init(LockRegistry::zookeeper(&connect).await.unwrap()).unwrap();
    let client = zookeeper_client::Client::connect(&connect).await.unwrap();
    let mut entries = async |key: &str| queue(&client, key).await.len();
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
}
