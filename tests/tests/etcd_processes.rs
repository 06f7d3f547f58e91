//! Real OS processes (`lock-worker`) locking through etcd; the data they
//! race on lives in a Redis server. The shared scenarios on one member, the
//! faults on three: the key deleted or its lease revoked under a running
//! body, and the leader killed while processes contend.

use std::time::{Duration, Instant};

use lock_tests::processes::Processes;
use lock_tests::{EtcdCluster, RedisServer, unique_key};
use redis::Commands;

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// The lock cluster and the data server.
struct Servers {
    locks: EtcdCluster,
    data: RedisServer,
}

impl Servers {
    fn new(members: usize) -> Servers {
        Servers {
            locks: EtcdCluster::spawn(members),
            data: RedisServer::new(),
        }
    }

    /// The scenarios every store passes. etcd's leader looks for expired
    /// leases every 500 ms, and counts them in whole seconds: a killed
    /// holder's lease may outlive its ttl by up to a second.
    fn shared(&self) -> Processes {
        Processes::new(WORKER, &self.locks.worker_url(), &self.data.url())
            .expiry_slack(Duration::from_secs(1))
    }

    async fn client(&self) -> etcd_client::Client {
        etcd_client::Client::connect(self.locks.endpoints(), None)
            .await
            .expect("connect to etcd")
    }
}

macro_rules! shared_scenarios {
    ($($scenario:ident),* $(,)?) => {
        $(
            #[test]
            fn $scenario() {
                let servers = Servers::new(1);
                servers.shared().$scenario();
            }
        )*
    };
}

shared_scenarios!(
    four_processes_sell_exactly_the_stock,
    without_the_lock_the_same_processes_oversell,
    skip_mode_skips_while_another_process_runs_the_job,
    a_sigkilled_holder_blocks_others_for_at_most_its_ttl,
    fencing_tokens_strictly_increase_across_processes,
    a_waiter_in_another_process_is_woken_by_the_release,
);

/// Deletes the held key, or revokes its lease, under a running body.
fn undone_under_a_running_body(undo: &str) {
    let servers = Servers::new(1);
    servers
        .shared()
        .a_lease_undone_under_a_running_body_cancels_it(undo, |key| {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let mut client = servers.client().await;
                let full = format!("locks/{key}");
                match undo {
                    "deleted" => {
                        let deleted = client.delete(full, None).await.unwrap();
                        assert_eq!(deleted.deleted(), 1);
                    }
                    _ => {
                        let kv = client.get(full, None).await.unwrap().kvs()[0].clone();
                        client.lease_revoke(kv.lease()).await.unwrap();
                    }
                }
            });
        });
}

#[test]
fn the_key_deleted_under_a_running_body_cancels_it() {
    undone_under_a_running_body("deleted");
}

#[test]
fn the_lease_revoked_under_a_running_body_cancels_it() {
    undone_under_a_running_body("revoked");
}

/// Two processes of two tasks contend on one key for 6 s; the leader of the
/// three members is killed after 2 s. No entry ever finds another inside,
/// fencing tokens grow in holding order, and locks resume.
#[test]
fn killing_the_leader_while_processes_contend_breaks_no_exclusion() {
    let mut servers = Servers::new(3);
    let key = unique_key("leader");
    let shared = servers.shared();
    let workers: Vec<_> = (0..2)
        .map(|_| shared.worker("chaos", &key, &["6"]))
        .collect();
    let mut data = servers.data.connection();
    let entries = |data: &mut redis::Connection| -> usize {
        data.llen(format!("chaos:{key}:tokens")).unwrap()
    };
    lock_tests::wait_until_blocking("the first entries", Duration::from_secs(10), || {
        entries(&mut data) > 20
    });
    std::thread::sleep(Duration::from_secs(1));
    let leader = servers.locks.leader().expect("a leader");
    let before = entries(&mut data);
    servers.locks.kill(leader);
    let killed_at = Instant::now();
    lock_tests::wait_until_blocking("an entry after the kill", Duration::from_secs(10), || {
        entries(&mut data) > before + 1
    });
    let resumed = killed_at.elapsed();
    eprintln!("locks resumed {resumed:?} after the leader was killed");
    let mut errors = 0;
    for worker in workers {
        let (status, lines) = worker.finish(Duration::from_secs(60));
        assert!(status.success(), "worker failed: {lines:?}");
        let done = lines
            .iter()
            .find(|l| l.starts_with("done"))
            .expect("summary line");
        errors += lock_tests::field(done, "errors").parse::<u64>().unwrap();
    }
    let overlaps: Vec<String> = data.lrange(format!("chaos:{key}:overlaps"), 0, -1).unwrap();
    let tokens: Vec<u64> = data.lrange(format!("chaos:{key}:tokens"), 0, -1).unwrap();
    let lost: u64 = data.llen(format!("chaos:{key}:lost")).unwrap();
    eprintln!(
        "{} entries, {errors} errors (calls that failed while no leader answered), {lost} bodies cancelled",
        tokens.len()
    );
    assert!(overlaps.is_empty(), "overlapping holders: {overlaps:?}");
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens out of holding order: {tokens:?}"
    );
    assert!(resumed < Duration::from_secs(5), "{resumed:?}");
}
