//! The ZooKeeper harness itself, before the store is built on it: a single
//! server and a 3-server ensemble start and serve, ephemeral sequential
//! nodes behave as the lock recipe needs (czxid strictly increasing, gone
//! with their session), and a killed leader is replaced.

use std::time::Duration;

use lock_tests::ZooKeeperEnsemble;
use zookeeper_client::{Client, CreateMode, CreateOptions, EventType};

fn ephemeral_sequential() -> CreateOptions<'static> {
    CreateMode::EphemeralSequential.with_acls(zookeeper_client::Acls::anyone_all())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_single_server_keeps_ephemeral_sequential_nodes_for_their_session() {
    let zk = ZooKeeperEnsemble::single();
    assert_eq!(zk.mode(0).as_deref(), Some("standalone"));
    let client = Client::connector()
        .with_session_timeout(Duration::from_secs(2))
        .connect(&zk.connect_string())
        .await
        .unwrap();
    let persistent = CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    client.mkdir("/locks/k", &persistent).await.unwrap();
    let (first, seq1) = client
        .create("/locks/k/lock-", b"a", &ephemeral_sequential())
        .await
        .unwrap();
    let (second, seq2) = client
        .create("/locks/k/lock-", b"b", &ephemeral_sequential())
        .await
        .unwrap();
    assert!(second.czxid > first.czxid, "{first:?} {second:?}");
    assert!(seq2.into_i64() > seq1.into_i64());
    // Another session watches the first node; closing ours deletes both.
    let other = Client::connect(&zk.connect_string()).await.unwrap();
    let path = format!("/locks/k/lock-{seq1}");
    let (_, _, watcher) = other.get_and_watch_data(&path).await.unwrap();
    drop(client);
    let event = tokio::time::timeout(Duration::from_secs(5), watcher.changed())
        .await
        .expect("the node went with its session");
    assert_eq!(event.event_type, EventType::NodeDeleted);
    assert!(other.list_children("/locks/k").await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_ensemble_elects_a_new_leader_when_its_leader_is_killed() {
    let mut zk = ZooKeeperEnsemble::spawn(3);
    let leader = zk.leader().expect("a leader");
    let client = Client::connect(&zk.connect_string()).await.unwrap();
    let persistent = CreateMode::Persistent.with_acls(zookeeper_client::Acls::anyone_all());
    let (before, _) = client.create("/before", b"", &persistent).await.unwrap();
    zk.kill(leader);
    let mut new_leader = None;
    for _ in 0..300 {
        new_leader = zk.leader();
        if new_leader.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let new_leader = new_leader.expect("a new leader within 6 s");
    assert_ne!(new_leader, leader);
    let (after, _) = client.create("/after", b"", &persistent).await.unwrap();
    assert!(after.czxid > before.czxid, "{before:?} {after:?}");
    zk.restart(leader)
        .unwrap_or_else(|why| panic!("restarting the old leader: {why}"));
}
