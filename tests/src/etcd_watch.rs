//! What an etcd cluster does by itself, for the soak's history: spells in
//! which a member takes no write in time, and elections it holds on its
//! own (with 100 ms election timeouts, a loaded machine can starve a
//! leader of its heartbeats long enough for the others to depose it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::EtcdCluster;
use crate::etcd_server::commits;
use crate::soak::{Seen, Spells, StoreWatch};

/// How often every member is written to.
const POLL: Duration = Duration::from_millis(50);

/// How long a member may take to commit a write before the spell counts
/// as a stall: a write on loopback commits in milliseconds, and the
/// store gives a call two seconds.
const STALL: Duration = Duration::from_millis(500);

/// A watch on an etcd cluster, writing to every member from a thread of
/// its own until [`seen`](StoreWatch::seen) is asked.
#[derive(Debug)]
pub struct EtcdWatch {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<Vec<Seen>>>>,
}

impl EtcdCluster {
    /// Watches the cluster for the faults it makes by itself. A spell in
    /// which a member does not commit a write within 500 ms, or the
    /// members name different Raft terms, is a fault; if the term after
    /// it is another than before (the cluster elected a leader), it is
    /// lossy for `lingers` after (a deposed leader may still answer
    /// keep-alives until it learns it was deposed, as the store's docs
    /// say), else kept. Faults the harness made itself (a member frozen
    /// or restarted) are seen too; they overlap its own records.
    pub fn watch(&self, lingers: Duration) -> EtcdWatch {
        let ports: Vec<u16> = (0..self.len()).map(|i| self.client_port(i)).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || poll(&ports, lingers, &stop)
        });
        EtcdWatch {
            stop,
            thread: Mutex::new(Some(thread)),
        }
    }
}

impl StoreWatch for EtcdWatch {
    fn seen(&self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.lock().expect("thread").take();
        thread.map_or_else(Vec::new, |thread| thread.join().expect("the watch"))
    }
}

impl Drop for EtcdWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Polls until `stop`; every fault seen.
fn poll(ports: &[u16], lingers: Duration, stop: &AtomicBool) -> Vec<Seen> {
    let mut spells = Spells::new("etcd-stalled", "etcd-elected-a-leader", lingers);
    while !stop.load(Ordering::SeqCst) {
        let terms: Vec<Option<u64>> = ports.iter().map(|&port| commits(port, STALL)).collect();
        let agreed = match terms.first() {
            Some(Some(first)) if terms.iter().all(|t| *t == Some(*first)) => Some(*first),
            _ => None,
        };
        spells.poll(agreed, agreed.is_some());
        std::thread::sleep(POLL);
    }
    spells.finish()
}
