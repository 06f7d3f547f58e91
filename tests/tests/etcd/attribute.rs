//! The attribute over etcd in one process: the global registry points at
//! one member this single test owns. A body cancelled or panicking frees
//! its key at once (the 30 s lease is not waited out).

use lock_runtime::LockRegistry;
use lock_tests::EtcdCluster;
use lock_tests::attribute::an_ended_body_frees_its_key_at_once;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attribute_over_etcd() {
    let cluster = EtcdCluster::single();
    let endpoint = cluster.endpoint(0);
    lock_runtime::init(LockRegistry::etcd(&[&endpoint]).await.unwrap()).unwrap();
    let mut client = etcd_client::Client::connect([&endpoint], None)
        .await
        .unwrap();
    let mut entries = async |key: &str| lock_tests::etcd_lock_entries(&mut client, key).await.len();
    an_ended_body_frees_its_key_at_once(false, &mut entries).await;
    an_ended_body_frees_its_key_at_once(true, &mut entries).await;
}
