//! etcd for tests: one member or a cluster of several, on free loopback
//! ports with temporary data directories; members are killed, frozen and
//! restarted by pid on purpose, and all of them killed on drop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::certs::TestCerts;
use crate::server_process::{free_port, temp_dir};

/// How long a cluster may take to elect its first leader.
const READY_DEADLINE: Duration = Duration::from_secs(15);

/// The binary to run: `LOCK_TEST_ETCD_BIN`, else `etcd` on `PATH`.
fn binary() -> String {
    std::env::var("LOCK_TEST_ETCD_BIN").unwrap_or_else(|_| "etcd".into())
}

/// One member: its ports, data directory and process.
#[derive(Debug)]
struct Member {
    name: String,
    client: u16,
    peer: u16,
    /// Serves `/health` over plain HTTP (the client port may be TLS).
    metrics: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// An etcd cluster of one or more members on `127.0.0.1`, with fast Raft
/// timings (10 ms heartbeats, 100 ms elections: the shortest lease is then
/// 1 s). Every member is killed (SIGKILL) and its directory removed on drop.
#[derive(Debug)]
pub struct EtcdCluster {
    members: Vec<Member>,
    initial: String,
    /// Set: the members serve their clients over TLS with these.
    tls: Option<TestCerts>,
}

/// Where the etcd store keeps `key`'s lock under its default prefix: the
/// start of the key's range (`locks/`, the key, a NUL), under which each
/// contender's entry is named by its token; read or delete the entries
/// with `with_prefix`.
pub fn etcd_lock_range(key: &str) -> String {
    format!("locks/{key}\0")
}

/// The entries of `key`'s lock (see [`etcd_lock_range`]), oldest first:
/// its holder's, then its waiters' in queue order.
pub async fn etcd_lock_entries(
    client: &mut etcd_client::Client,
    key: &str,
) -> Vec<etcd_client::KeyValue> {
    let oldest_first = etcd_client::GetOptions::new().with_prefix().with_sort(
        etcd_client::SortTarget::Create,
        etcd_client::SortOrder::Ascend,
    );
    let got = client.get(etcd_lock_range(key), Some(oldest_first)).await;
    got.expect("read a lock's entries").kvs().to_vec()
}

/// Deletes every entry of `key`'s lock behind the store's back; returns
/// how many there were.
pub async fn etcd_delete_lock(client: &mut etcd_client::Client, key: &str) -> i64 {
    let prefixed = etcd_client::DeleteOptions::new().with_prefix();
    let deleted = client.delete(etcd_lock_range(key), Some(prefixed)).await;
    deleted.expect("delete a lock's entries").deleted()
}

impl EtcdCluster {
    /// One member.
    pub fn single() -> EtcdCluster {
        EtcdCluster::spawn(1)
    }

    /// One member serving its clients over TLS only, with a client
    /// certificate required: the certificates are in [`certs`](Self::certs).
    pub fn single_tls() -> EtcdCluster {
        EtcdCluster::spawn_with(1, true)
    }

    /// `n` members, started together; returns once a leader is elected.
    pub fn spawn(n: usize) -> EtcdCluster {
        EtcdCluster::spawn_with(n, false)
    }

    fn spawn_with(n: usize, tls: bool) -> EtcdCluster {
        let mut last_log = String::new();
        for _ in 0..3 {
            let mut cluster = EtcdCluster::planned(n);
            if tls {
                cluster.tls = Some(TestCerts::make(cluster.members[0].dir.join("certs")));
            }
            for i in 0..n {
                cluster.start(i);
            }
            if cluster.wait_healthy(READY_DEADLINE) {
                return cluster;
            }
            last_log = (0..n)
                .map(|i| cluster.log(i))
                .collect::<Vec<_>>()
                .join("\n---\n");
        }
        panic!("etcd did not start in 3 attempts; last logs:\n{last_log}");
    }

    fn planned(n: usize) -> EtcdCluster {
        let members: Vec<Member> = (0..n)
            .map(|i| {
                let dir = temp_dir("etcd");
                Member {
                    name: format!("m{i}"),
                    client: free_port(),
                    peer: free_port(),
                    metrics: free_port(),
                    dir,
                    child: None,
                }
            })
            .collect();
        let initial = members
            .iter()
            .map(|m| format!("{}=http://127.0.0.1:{}", m.name, m.peer))
            .collect::<Vec<_>>()
            .join(",");
        EtcdCluster {
            members,
            initial,
            tls: None,
        }
    }

    /// Starts member `i` (again, on its ports and data).
    fn start(&mut self, i: usize) {
        let member = &self.members[i];
        let client = self.endpoint(i);
        let peer = format!("http://127.0.0.1:{}", member.peer);
        let metrics = format!("http://127.0.0.1:{}", member.metrics);
        let log = std::fs::File::create(member.dir.join("etcd.log")).expect("log file");
        let mut command = Command::new(binary());
        if let Some(certs) = &self.tls {
            command
                .arg("--cert-file")
                .arg(certs.path("server.crt"))
                .arg("--key-file")
                .arg(certs.path("server.key"))
                .arg("--trusted-ca-file")
                .arg(certs.path("ca.crt"))
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", &member.name])
            .arg("--data-dir")
            .arg(member.dir.join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--listen-metrics-urls", &metrics])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &self.initial])
            .args(["--initial-cluster-token", "lock-tests"])
            .args(["--heartbeat-interval", "10", "--election-timeout", "100"])
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot run `{}`: {err}; install etcd (apt-get install -y etcd-server) \
                     or point LOCK_TEST_ETCD_BIN at it",
                    binary()
                )
            });
        self.members[i].child = Some(child);
    }

    /// True once every running member says it is healthy (has a leader)
    /// and, over plain HTTP, commits a write: a cluster that has just
    /// elected its first leader on a loaded machine may still take seconds
    /// over its first writes, and a store connecting then would time out.
    fn wait_healthy(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let exited = self.members.iter_mut().any(|m| {
                m.child
                    .as_mut()
                    .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))))
            });
            if exited {
                return false; // a port was taken, say
            }
            let tls = self.tls.is_some();
            let healthy = self.members.iter().filter(|m| m.child.is_some()).all(|m| {
                http(m.metrics, "GET", "/health", "").contains("\"health\":\"true\"")
                    && (tls || commits(m.client, Duration::from_millis(500)).is_some())
            });
            if healthy {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// The client URLs of every member.
    pub fn endpoints(&self) -> Vec<String> {
        (0..self.members.len()).map(|i| self.endpoint(i)).collect()
    }

    /// The client URL of member `i` (`https://` when it serves TLS).
    pub fn endpoint(&self, i: usize) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.members[i].client)
    }

    /// The certificates of a [`single_tls`](Self::single_tls) member.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.tls.as_ref()
    }

    /// `etcd://127.0.0.1:PORT,...`: every member, as the test worker
    /// takes them.
    pub fn worker_url(&self) -> String {
        let members: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client))
            .collect();
        format!("etcd://{}", members.join(","))
    }

    /// The client port of member `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.members[i].client
    }

    /// How many watchers member `i` serves now (its
    /// `etcd_debugging_mvcc_watcher_total` metric).
    pub fn watchers(&self, i: usize) -> u64 {
        let metrics = http(self.members[i].metrics, "GET", "/metrics", "");
        metrics
            .lines()
            .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
            .and_then(|n| n.trim().parse().ok())
            .expect("the member's watcher count")
    }

    /// The number of members.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Never: a cluster has at least one member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The index of the member that leads now, if a running one knows.
    pub fn leader(&self) -> Option<usize> {
        for m in self.members.iter().filter(|m| m.child.is_some()) {
            let status = http(m.client, "POST", "/v3/maintenance/status", "{}");
            let (Some(me), Some(leader)) = (
                json_field(&status, "member_id"),
                json_field(&status, "leader"),
            ) else {
                continue;
            };
            if leader == "0" {
                continue;
            }
            // Ask each member its own id to find the leader's index.
            if me == leader {
                return self.members.iter().position(|x| x.client == m.client);
            }
            for (i, other) in self.members.iter().enumerate() {
                if other.child.is_none() {
                    continue;
                }
                let theirs = http(other.client, "POST", "/v3/maintenance/status", "{}");
                if json_field(&theirs, "member_id").as_deref() == Some(leader.as_str()) {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Kills member `i` (SIGKILL); its data stays for a restart.
    pub fn kill(&mut self, i: usize) {
        crate::server_process::kill(&mut self.members[i].child);
    }

    /// Starts member `i` again on its data; waits until the cluster is
    /// healthy again (it may not be, without quorum: then returns `false`).
    pub fn restart(&mut self, i: usize) -> bool {
        self.kill(i);
        self.start(i);
        self.wait_healthy(READY_DEADLINE)
    }

    /// Freezes member `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws member `i`.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        crate::server_process::signal(self.members[i].child.as_ref(), signal);
    }

    /// Member `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.members[i].dir.join("etcd.log")).unwrap_or_default()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for i in 0..self.members.len() {
            // SIGKILL ends a frozen (SIGSTOPped) member too.
            self.kill(i);
            let _ = std::fs::remove_dir_all(&self.members[i].dir);
        }
    }
}

/// One HTTP/1.1 request to the member's client port; the response, or
/// empty on any error.
fn http(port: u16, method: &str, path: &str, body: &str) -> String {
    http_within(port, method, path, body, Duration::from_millis(500))
}

/// [`http`], waiting at most `timeout` for each read of the response.
fn http_within(port: u16, method: &str, path: &str, body: &str, timeout: Duration) -> String {
    let attempt = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        write!(
            stream,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut response = String::new();
        stream.read_to_string(&mut response)?;
        Ok(response)
    };
    attempt().unwrap_or_default()
}

/// A probe's write: a key outside every lock prefix (`soak-watch`), base64
/// as etcd's JSON gateway takes it.
const PROBE: &str = r#"{"key":"c29hay13YXRjaA==","value":"MQ=="}"#;

/// The Raft term in which the member serving plain HTTP on `port`
/// committed a probe write, if it did within `within`.
pub(crate) fn commits(port: u16, within: Duration) -> Option<u64> {
    let answer = http_within(port, "POST", "/v3/kv/put", PROBE, within);
    json_field(&answer, "raft_term")?.parse().ok()
}

/// The string value of `"name":"..."` in a JSON text.
fn json_field(json: &str, name: &str) -> Option<String> {
    let start = json.find(&format!("\"{name}\":\""))? + name.len() + 4;
    let end = json[start..].find('"')? + start;
    Some(json[start..end].to_owned())
}
