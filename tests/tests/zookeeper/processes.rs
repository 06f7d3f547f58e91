//! Real OS processes (`lock-worker`) locking through ZooKeeper; the data
//! they race on lives in a Redis server. The shared scenarios with 30 s
//! sessions (their ttls go up to 30 s), a SIGKILLed holder with a 2 s
//! session, and a node deleted under a running body.

use std::time::{Duration, Instant};

use lock_runtime::LockRegistry;
use lock_tests::processes::Processes;
use lock_tests::{RedisServer, ZooKeeperEnsemble, process_scenarios, unique_key};

const WORKER: &str = env!("CARGO_BIN_EXE_lock-worker");

/// The lock ensemble and the data server.
struct Servers {
    locks: ZooKeeperEnsemble,
    data: RedisServer,
}

impl Servers {
    fn new(servers: usize) -> Servers {
        Servers {
            locks: ZooKeeperEnsemble::spawn(servers),
            data: RedisServer::new(),
        }
    }

    /// The workers with a `session` timeout.
    fn processes(&self, session: Duration) -> Processes {
        Processes::new(WORKER, &self.locks.worker_url(session), &self.data.url())
    }
}

/// One server with 30 s sessions and the data server, and the processes
/// of the scenarios every store passes.
fn shared() -> (Servers, Processes) {
    let servers = Servers::new(1);
    let processes = servers.processes(Duration::from_secs(30));
    (servers, processes)
}

process_scenarios!(
    shared:
    four_processes_sell_exactly_the_stock,
    opposite_transfers_across_processes_never_deadlock,
    without_the_lock_the_same_processes_oversell,
    skip_mode_skips_while_another_process_runs_the_job,
    fencing_tokens_strictly_increase_across_processes,
    a_waiter_in_another_process_is_woken_by_the_release,
    a_semaphore_of_three_across_processes_is_reached_and_never_exceeded,
    readers_overlap_and_a_writer_gets_in_within_a_bound,
);

/// A SIGKILLed permit holder's node goes when the server expires its 2 s
/// session (its ttl is 1 s): the permit comes back within the session
/// timeout and a few ticks, as a mutex's lock does.
#[test]
fn a_sigkilled_permit_holder_frees_its_permit_within_its_session_timeout() {
    let servers = Servers::new(1);
    servers
        .processes(Duration::from_secs(2))
        .expiry_slack(Duration::from_millis(1800))
        .a_sigkilled_permit_holder_frees_its_permit_within_its_ttl();
}

#[test]
fn another_process_holding_a_key_is_seen_and_can_be_freed() {
    let servers = Servers::new(1);
    let connect = servers.locks.connect_string();
    servers
        .processes(Duration::from_secs(30))
        .another_process_holding_a_key_is_seen_and_can_be_freed(async || {
            LockRegistry::zookeeper(&connect).await.expect("connect")
        });
}

/// A SIGKILLed holder's node goes when the server expires its session.
/// The holder asks for a 2 s session (its ttl is 1 s, which must not exceed
/// it), the waiter for a 30 s one (its ttl is the default 30 s): the waiter
/// gets the lock within the holder's session timeout and a few ticks.
#[test]
fn a_sigkilled_holder_blocks_others_for_at_most_its_session_timeout() {
    let servers = Servers::new(1);
    let key = unique_key("crash");
    let mut holder = servers
        .processes(Duration::from_secs(2))
        .worker("hold-1s", &key, &["60000"]);
    holder.expect("acquired", Duration::from_secs(10));
    let mut waiter = servers
        .processes(Duration::from_secs(30))
        .worker("wait", &key, &[]);
    waiter.expect("ready", Duration::from_secs(10));
    holder.kill();
    let killed_at = Instant::now();
    waiter.expect("acquired", Duration::from_secs(10));
    let blocked = killed_at.elapsed();
    eprintln!("the waiter got the lock {blocked:?} after the SIGKILL");
    assert!(
        blocked < Duration::from_millis(2800),
        "blocked {blocked:?} after SIGKILL; the session timeout is 2 s"
    );
}

/// The held node deleted by hand under a running body: the body is
/// cancelled and the holder reports `Lost`.
#[test]
fn the_node_deleted_under_a_running_body_cancels_it() {
    let servers = Servers::new(1);
    servers
        .processes(Duration::from_secs(30))
        .a_lease_undone_under_a_running_body_cancels_it("deleted", |key| {
            let runtime = tokio::runtime::Runtime::new().unwrap();
            runtime.block_on(async {
                let client = zookeeper_client::Client::connect(&servers.locks.connect_string())
                    .await
                    .unwrap();
                let parent = format!("/locks/{key}");
                let queue = client.list_children(&parent).await.unwrap();
                assert_eq!(queue.len(), 1, "{queue:?}");
                client
                    .delete(&format!("{parent}/{}", queue[0]), None)
                    .await
                    .unwrap();
            });
        });
}

/// The holder and two waiting processes: the waiters get the lock in the
/// order they queued.
#[test]
fn waiting_processes_get_the_lock_in_the_order_they_queued() {
    let servers = Servers::new(1);
    let processes = servers.processes(Duration::from_secs(30));
    let key = unique_key("fifo");
    let queue_len = || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let client = zookeeper_client::Client::connect(&servers.locks.connect_string())
                .await
                .unwrap();
            client
                .list_children(&format!("/locks/{key}"))
                .await
                .map_or(0, |queue| queue.len())
        })
    };
    let acquired = processes.waiters_in_queue_order(&key, |n| queue_len() > n);
    // When each took the lock, by its own clock.
    let acquired_at: Vec<u128> = acquired.iter().map(|(at, _)| *at).collect();
    assert!(
        acquired_at.windows(2).all(|w| w[0] <= w[1]),
        "not in queue order: {acquired_at:?}"
    );
}

/// Two processes contend while the leader of three servers is killed: no
/// overlap, fencing in holding order across the leader change, locks
/// resume. Sessions of 4 s (the chaos worker's ttl is 1 s) outlive the
/// election, so no held node is lost with its session.
#[test]
fn killing_the_leader_while_processes_contend_breaks_no_exclusion() {
    let mut servers = Servers::new(3);
    let processes = servers.processes(Duration::from_secs(4));
    processes.a_killed_leader_breaks_no_exclusion(|| {
        let leader = servers.locks.leader().expect("a leader");
        servers.locks.kill(leader);
    });
}
