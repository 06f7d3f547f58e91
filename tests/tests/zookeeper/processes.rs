//! Real OS processes (`lock-worker`) locking through ZooKeeper; the data
//! they race on lives in a Redis server. The shared scenarios with 30 s
//! sessions (their ttls go up to 30 s), crashed and frozen holders freed
//! within their ttl whatever the session timeout, live holders never
//! taken for overdue, and a node deleted under a running body.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_runtime::LockRegistry;
use lock_tests::processes::Processes;
use lock_tests::{RedisServer, ZooKeeperEnsemble, process_scenarios, unique_key};
use lock_tests::{Worker, field};

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

/// How long past its ttl a crashed holder's node may stay: the store's
/// overdue margin (1 s), and the waiter's look once it is due.
const EXPIRY_SLACK: Duration = Duration::from_millis(1300);

/// One server with 30 s sessions and the data server, and the processes
/// of the scenarios every store passes.
fn shared() -> (Servers, Processes) {
    let servers = Servers::new(1);
    let processes = servers
        .processes(Duration::from_secs(30))
        .expiry_slack(EXPIRY_SLACK);
    (servers, processes)
}

fn now_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

process_scenarios!(
    shared:
    four_processes_sell_exactly_the_stock,
    opposite_transfers_across_processes_never_deadlock,
    without_the_lock_the_same_processes_oversell,
    skip_mode_skips_while_another_process_runs_the_job,
    fencing_tokens_strictly_increase_across_processes,
    a_waiter_in_another_process_is_woken_by_the_release,
    a_sigkilled_holder_blocks_others_for_at_most_its_ttl,
    a_semaphore_of_three_across_processes_is_reached_and_never_exceeded,
    a_sigkilled_permit_holder_frees_its_permit_within_its_ttl,
    readers_overlap_and_a_writer_gets_in_within_a_bound,
);

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

/// The case users meet moving from Redis: a holder with a 3 s ttl and a
/// 30 s session is SIGKILLed on a three-server ensemble; another process,
/// waiting with a 12 s `wait_timeout`, holds the lock within the ttl and
/// the slack, not after the session timeout.
#[test]
fn a_sigkilled_holder_blocks_others_for_its_ttl_not_its_session_timeout() {
    let servers = Servers::new(3);
    let processes = servers.processes(Duration::from_secs(30));
    let key = unique_key("crash");
    let mut holder = processes.worker("hold-3s", &key, &["60000"]);
    holder.expect("acquired", Duration::from_secs(10));
    let mut waiter = processes.worker("wait-12s", &key, &[]);
    waiter.expect("ready", Duration::from_secs(10));
    holder.kill();
    let killed_at = Instant::now();
    waiter.expect("acquired", Duration::from_secs(12));
    let blocked = killed_at.elapsed();
    eprintln!("ttl 3 s, session 30 s: the waiter got the lock {blocked:?} after the SIGKILL");
    assert!(
        blocked < Duration::from_secs(3) + EXPIRY_SLACK,
        "blocked {blocked:?} after SIGKILL; the ttl is 3 s"
    );
}

/// A holder (1 s ttl, 30 s session) frozen with SIGSTOP: a waiter deletes
/// its overdue node and gets the lock after the frozen holder's lease
/// ended (it renewed last before the freeze), by a margin, with a larger
/// fencing token; thawed, the holder reports `Lost` and never finishes its
/// body.
#[test]
fn a_frozen_holder_is_taken_over_after_its_lease_and_told_it_lost() {
    let servers = Servers::new(3);
    let processes = servers.processes(Duration::from_secs(30));
    let key = unique_key("frozen");
    let mut holder = processes.worker("hold-1s", &key, &["60000"]);
    let held = holder.expect("acquired", Duration::from_secs(10));
    let mut waiter = processes.worker("wait", &key, &[]);
    waiter.expect("ready", Duration::from_secs(10));
    // Its renewals so far were all sent before this.
    let frozen_at = now_ms();
    holder.pause();
    let taken = waiter.expect("acquired", Duration::from_secs(10));
    holder.resume();
    let acquired: u128 = field(&taken, "at_ms").parse().unwrap();
    let fencing = |line: &str| field(line, "fencing").parse::<u64>().unwrap();
    assert!(
        fencing(&taken) > fencing(&held),
        "fencing went back after a holder was taken over: {held} then {taken}"
    );
    let lease_end = frozen_at + 1000;
    assert!(
        acquired > lease_end,
        "granted at {acquired}, before the frozen holder's lease ended at {lease_end} at the latest"
    );
    eprintln!(
        "frozen holder: the waiter got the lock {} ms after the holder's lease ended at the latest",
        acquired - lease_end
    );
    let (_, lines) = holder.finish(Duration::from_secs(10));
    let outcome = lines.last().cloned().unwrap_or_default();
    assert!(
        outcome.starts_with("error") && outcome.to_lowercase().contains("lost"),
        "the thawed holder did not report Lost: {lines:?}"
    );
    assert!(
        !lines.iter().any(|line| line.starts_with("releasing")),
        "the thawed holder finished its body: {lines:?}"
    );
}

/// Four processes x two keys, each holding its key for 2.1 s on a 1 s
/// lease (renewed every 333 ms) for a minute, on a three-server ensemble:
/// waiters look at the holders' nodes all along, and never take a live,
/// renewing holder for overdue: no holder's node is deleted under it (a
/// renewal refused, or the deletion seen), and no two bodies overlap. A holder may still lose its
/// lease by its own clock, when no renewal got through in time (a write
/// slower than two thirds of the lease on a machine the other tests'
/// servers share); those losses are counted and shown, and every failed
/// section must be one of them.
#[test]
fn holders_renewing_under_load_are_never_taken_for_overdue() {
    let servers = Servers::new(3);
    let processes = servers.processes(Duration::from_secs(30));
    let key = unique_key("renewed");
    let workers: Vec<Worker> = (0..4)
        .map(|_| processes.worker("renewed", &key, &["60"]))
        .collect();
    let (mut entries, mut errors, mut refused, mut late) = (0, 0, 0, 0);
    for mut worker in workers {
        let done = worker.expect("done", Duration::from_secs(90));
        let count = |name| field(&done, name).parse::<u64>().unwrap();
        entries += count("entries");
        errors += count("errors");
        refused += count("refused");
        late += count("late");
    }
    let mut data = servers.data.connection();
    let overlaps: Vec<String> = (0..2)
        .flat_map(|task| {
            redis::Commands::lrange::<_, Vec<String>>(
                &mut data,
                format!("renewed:{key}-{task}:overlaps"),
                0,
                -1,
            )
            .unwrap()
        })
        .collect();
    eprintln!(
        "a minute of renewed holders: {entries} sections, {errors} errors \
         ({refused} leases refused, {late} late)"
    );
    assert_eq!(refused, 0, "a live holder's node was deleted under it");
    assert_eq!(
        errors, late,
        "an error other than a late loss (see the workers' stderr)"
    );
    assert!(overlaps.is_empty(), "overlaps: {overlaps:?}");
    assert!(entries > 40, "no progress: {entries} sections");
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

/// The scheduled-job scenarios on three servers.
fn three() -> (Servers, Processes) {
    let servers = Servers::new(3);
    let processes = servers
        .processes(Duration::from_secs(30))
        .expiry_slack(EXPIRY_SLACK);
    (servers, processes)
}

lock_tests::job_scenarios!(three);

/// The leader killed while a fire is due: the fire runs once, through
/// the leader the others elect.
#[test]
fn a_fire_due_while_the_leader_is_killed_runs_once_late() {
    let (mut servers, processes) = three();
    processes.a_fire_due_in_a_store_outage_runs_once_late(Duration::from_secs(4), || {
        let leader = servers.locks.leader().expect("a leader");
        servers.locks.kill(leader);
        lock_tests::wait_until_blocking("a new leader", Duration::from_secs(15), || {
            servers.locks.leader().is_some()
        });
        None
    });
}
