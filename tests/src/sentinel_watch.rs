//! What a Sentinel group does by itself, for the soak's history: spells in
//! which its Sentinels see the master down, and failovers they start on
//! their own (on a loaded machine one can lose sight of a master for the
//! second it is given, and fail over again).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::soak::{Seen, Spells, StoreWatch};
use crate::{RedisSentinels, SENTINEL_MASTER};

/// How often the Sentinels are asked.
const POLL: Duration = Duration::from_millis(20);

/// How long after the Sentinels name another master a store's clients may
/// still be on the old one: the store asks them every second.
const FOLLOWED_WITHIN: Duration = Duration::from_secs(1);

/// A watch on a Sentinel group, polling every Sentinel from a thread of its
/// own until [`seen`](StoreWatch::seen) is asked.
#[derive(Debug)]
pub struct SentinelWatch {
    stop: Arc<AtomicBool>,
    thread: Mutex<Option<JoinHandle<Vec<Seen>>>>,
}

impl RedisSentinels {
    /// Watches the Sentinels for the faults they make by themselves. A
    /// spell in which one of them flags the master down (`s_down`,
    /// `o_down`) or is failing over, or they disagree, or one does not
    /// answer, is a fault; if the master they name afterwards is another,
    /// it is lossy (the old one may have taken writes the new one never
    /// got), and lasts until a second past the change (the store asks the
    /// Sentinels every second). Faults the
    /// harness made itself are seen too; they overlap its own records.
    pub fn watch(&self) -> SentinelWatch {
        let clients: Vec<redis::Client> = self.sentinels().iter().map(|s| s.client()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || poll(&clients, &stop)
        });
        SentinelWatch {
            stop,
            thread: Mutex::new(Some(thread)),
        }
    }
}

impl StoreWatch for SentinelWatch {
    fn seen(&self) -> Vec<Seen> {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.lock().expect("thread").take();
        thread.map_or_else(Vec::new, |thread| thread.join().expect("the watch"))
    }
}

impl Drop for SentinelWatch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// One Sentinel's view: the master's port, and whether it is troubled
/// (flagged down, or a failover in progress).
fn view(client: &redis::Client, conn: &mut Option<redis::Connection>) -> Option<(u16, bool)> {
    if conn.is_none() {
        let opened = client.get_connection_with_timeout(POLL * 10).ok()?;
        opened.set_read_timeout(Some(POLL * 10)).ok()?;
        *conn = Some(opened);
    }
    let master: Result<std::collections::HashMap<String, String>, _> = redis::cmd("SENTINEL")
        .arg("master")
        .arg(SENTINEL_MASTER)
        .query(conn.as_mut()?);
    let Ok(master) = master else {
        *conn = None;
        return None;
    };
    let port = master.get("port")?.parse().ok()?;
    let flags = master.get("flags")?;
    let troubled = ["s_down", "o_down", "failover_in_progress"]
        .iter()
        .any(|flag| flags.contains(flag));
    Some((port, troubled))
}

/// Polls until `stop`; every fault seen.
fn poll(clients: &[redis::Client], stop: &AtomicBool) -> Vec<Seen> {
    let mut conns: Vec<Option<redis::Connection>> = clients.iter().map(|_| None).collect();
    let mut spells = Spells::new(
        "sentinels-saw-master-down",
        "sentinels-switched-master",
        FOLLOWED_WITHIN,
    );
    while !stop.load(Ordering::SeqCst) {
        let views: Vec<Option<(u16, bool)>> = clients
            .iter()
            .zip(conns.iter_mut())
            .map(|(client, conn)| view(client, conn))
            .collect();
        let agreed = match views.first() {
            Some(Some((port, _))) if views.iter().all(|v| v.is_some_and(|(p, _)| p == *port)) => {
                Some(*port)
            }
            _ => None,
        };
        let calm = agreed.is_some() && views.iter().all(|v| v.is_some_and(|(_, t)| !t));
        spells.poll(agreed, calm);
        std::thread::sleep(POLL);
    }
    spells.finish()
}
