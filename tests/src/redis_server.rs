//! `redis-server` processes for tests: started on free loopback ports,
//! stopped, killed and restarted on purpose, cleaned up on drop.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::certs::TestCerts;
use crate::proxy::{Proxy, ProxySwitch};
use crate::server_process::{free_port, ready_or_exited, temp_dir};

/// How long a server may take to answer its first PING.
const READY_DEADLINE: Duration = Duration::from_secs(5);

/// One `redis-server` process on `127.0.0.1`, with its own temporary
/// directory. Killed (SIGKILL) and its directory removed on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    password: Option<String>,
    persistent: bool,
    /// Extra `redis-server` arguments, given on every (re)start.
    extra: Vec<String>,
    /// For a Sentinel: its configuration file's first contents (Sentinel
    /// rewrites the file as it learns).
    sentinel: Option<String>,
    /// The port it serves TLS on, if it does (beside `port`, which the
    /// harness uses).
    tls_port: Option<u16>,
    /// A proxy in front of it that clients reach it through, if it has one
    /// (`{proxy}` in an extra argument stands for the proxy's port).
    proxy: Option<Proxy>,
    child: Option<Child>,
}

/// The binary to run: `LOCK_TEST_REDIS_BIN`, else `redis-server` on `PATH`.
fn binary() -> String {
    std::env::var("LOCK_TEST_REDIS_BIN").unwrap_or_else(|_| "redis-server".into())
}

impl RedisServer {
    /// Starts a server with no password.
    pub fn new() -> RedisServer {
        RedisServer::start(None, false)
    }

    /// Starts a server that requires `password` (`requirepass`).
    pub fn with_password(password: &str) -> RedisServer {
        RedisServer::start(Some(password.to_owned()), false)
    }

    /// Starts a server that writes every change to its append-only file
    /// before answering (`appendfsync always`), so a kill and restart keeps
    /// its data.
    pub fn persistent() -> RedisServer {
        RedisServer::start(None, true)
    }

    /// Starts a server with extra `redis-server` arguments (`{dir}` in an
    /// argument stands for the server's own directory).
    pub fn with_args(args: &[&str]) -> RedisServer {
        RedisServer::start_with(None, false, args.iter().map(|a| a.to_string()).collect())
    }

    /// Starts a server for replicas to follow: one that sends them its data
    /// at once (without the 5 s wait for a diskless sync).
    pub fn master() -> RedisServer {
        RedisServer::with_args(&["--repl-diskless-sync-delay", "0"])
    }

    /// Starts a replica of `master` and waits until it acknowledges writes
    /// (a `SET` on the master that `WAIT 1` confirms).
    pub fn replica_of(master: &RedisServer) -> RedisServer {
        let port = master.port().to_string();
        let replica = RedisServer::with_args(&["--replicaof", "127.0.0.1", &port]);
        wait_acknowledged(master);
        replica
    }

    /// Starts a Sentinel (`redis-server <conf> --sentinel`) whose
    /// configuration file holds `conf`.
    pub fn sentinel(conf: &str) -> RedisServer {
        RedisServer::start_as(None, false, Vec::new(), Some(conf.to_owned()), false)
    }

    /// Starts a server (a Sentinel if `sentinel` holds its configuration)
    /// that also serves TLS on a port of its own with `certs`' server
    /// certificate, and reaches the servers it replicates from or
    /// monitors over TLS (`tls-replication yes`). With `client_certs`, its
    /// TLS port refuses clients without a certificate `certs`' CA signed.
    fn start_tls(
        certs: &TestCerts,
        client_certs: bool,
        mut extra: Vec<String>,
        sentinel: Option<String>,
    ) -> RedisServer {
        let path = |name: &str| certs.path(name).to_string_lossy().into_owned();
        let auth = if client_certs { "yes" } else { "no" };
        for (name, value) in [
            // A free port for each attempt to start (see `start_as`).
            ("--tls-port", String::new()),
            ("--tls-cert-file", path("server.crt")),
            ("--tls-key-file", path("server.key")),
            ("--tls-ca-cert-file", path("ca.crt")),
            ("--tls-auth-clients", auth.to_owned()),
            ("--tls-replication", "yes".to_owned()),
        ] {
            extra.extend([name.to_owned(), value]);
        }
        RedisServer::start_as(None, false, extra, sentinel, false)
    }

    fn start(password: Option<String>, persistent: bool) -> RedisServer {
        RedisServer::start_with(password, persistent, Vec::new())
    }

    fn start_with(password: Option<String>, persistent: bool, extra: Vec<String>) -> RedisServer {
        RedisServer::start_as(password, persistent, extra, None, false)
    }

    /// Starts a server; with `proxied`, behind a [`Proxy`] of its own that
    /// it is known by (see [`announced_port`](Self::announced_port)).
    fn start_as(
        password: Option<String>,
        persistent: bool,
        extra: Vec<String>,
        sentinel: Option<String>,
        proxied: bool,
    ) -> RedisServer {
        let dir = temp_dir("redis");
        let mut last_log = String::new();
        for _ in 0..3 {
            // A TLS port, if asked for, is chosen afresh with the plain
            // one: either may have been taken since it was found free.
            let mut extra = extra.clone();
            let tls_port = extra.iter().position(|arg| arg == "--tls-port").map(|at| {
                let port = free_port();
                extra[at + 1] = port.to_string();
                port
            });
            let port = free_port();
            let mut server = RedisServer {
                port,
                dir: dir.clone(),
                password: password.clone(),
                persistent,
                extra,
                sentinel: sentinel.clone(),
                tls_port,
                proxy: proxied.then(|| Proxy::start(port)),
                child: None,
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(log) => {
                    last_log = log;
                    // Keep the directory for the next attempt.
                    server.dir = PathBuf::new();
                }
            }
        }
        panic!("redis-server did not start in 3 attempts; last log:\n{last_log}");
    }

    /// Spawns the process on `self.port` and waits for it to answer.
    fn spawn(&mut self) -> Result<(), String> {
        let log = self.dir.join("redis.log");
        let mut command = Command::new(binary());
        if let Some(conf) = &self.sentinel {
            // The file must come first, and be writable: Sentinel rewrites it.
            let path = self.dir.join("sentinel.conf");
            if !path.exists() {
                std::fs::write(&path, conf).expect("write the Sentinel's configuration");
            }
            command.arg(&path).arg("--sentinel");
        }
        command
            .arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if self.sentinel.is_some() {
            // Nothing of a data server applies.
        } else if self.persistent {
            command.args(["--appendonly", "yes", "--appendfsync", "always"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        if let Some(password) = &self.password {
            command.args(["--requirepass", password]);
        }
        let dir = self.dir.to_string_lossy().into_owned();
        let proxy = self.proxy.as_ref().map_or(0, Proxy::port).to_string();
        command.args(
            self.extra
                .iter()
                .map(|arg| arg.replace("{dir}", &dir).replace("{proxy}", &proxy)),
        );
        let child = command.spawn().unwrap_or_else(|err| {
            panic!(
                "cannot run `{}`: {err}; install redis-server (apt-get install -y redis-server) \
                 or point LOCK_TEST_REDIS_BIN at it",
                binary()
            )
        });
        self.child = Some(child);
        if self.wait_ready() {
            return Ok(());
        }
        self.kill();
        Err(std::fs::read_to_string(&log).unwrap_or_else(|err| format!("(no log: {err})")))
    }

    /// True once the server answers PING (or asks for a password).
    fn wait_ready(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let ready = ready_or_exited(
            &mut child,
            READY_DEADLINE,
            Duration::from_millis(10),
            || {
                let reply = self.raw_command("PING").unwrap_or_default();
                reply.starts_with("+PONG") || reply.starts_with("-NOAUTH")
            },
        );
        self.child = Some(child);
        ready
    }

    /// Sends one inline command over a fresh TCP connection; returns the
    /// first reply line.
    fn raw_command(&self, command: &str) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(1)))?;
        stream.write_all(format!("{command}\r\n").as_bytes())?;
        let mut line = String::new();
        BufReader::new(&mut stream).read_line(&mut line)?;
        Ok(line)
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port it serves TLS on, if it does.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls_port
    }

    /// The port other servers and clients know it by: its TLS port if it
    /// serves TLS (as a TLS replica or Sentinel announces), its proxy's if
    /// it has one, else its port.
    pub fn announced_port(&self) -> u16 {
        self.tls_port
            .or(self.proxy.as_ref().map(Proxy::port))
            .unwrap_or(self.port)
    }

    /// The switch of the proxy in front of it, if it has one: it cuts one
    /// client process off from the server.
    pub fn proxy_switch(&self) -> Option<ProxySwitch> {
        self.proxy.as_ref().map(Proxy::switch)
    }

    /// `redis://127.0.0.1:PORT`, with the password if there is one.
    pub fn url(&self) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}", self.port),
            None => format!("redis://127.0.0.1:{}", self.port),
        }
    }

    /// A client for inspecting and changing the server from the test.
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("valid test URL")
    }

    /// A blocking connection, for setting up and checking data.
    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection()
            .unwrap_or_else(|err| panic!("connect to test redis on port {}: {err}", self.port))
    }

    /// Kills the server (SIGKILL): connections drop, data is gone.
    pub fn kill(&mut self) {
        crate::server_process::kill(&mut self.child);
    }

    /// Starts the server again on the same port: empty, or with its data
    /// if it is [`persistent`](Self::persistent). Returns when the server
    /// now up was started: nothing answered on the port between the kill
    /// and then.
    pub fn restart(&mut self) -> SystemTime {
        self.kill();
        for _ in 0..3 {
            let started = SystemTime::now();
            if self.spawn().is_ok() {
                return started;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("redis-server did not restart on port {}", self.port);
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Thaws a server frozen by [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        crate::server_process::signal(self.child.as_ref(), signal);
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Default for RedisServer {
    fn default() -> Self {
        RedisServer::new()
    }
}

/// Waits until `server`, if a cluster primary, has a write confirmed by
/// `replicas` replicas (`WAIT`): a replica "online" just after it joined
/// may not stream writes yet.
fn wait_replicated(server: &RedisServer, replicas: usize, deadline: Instant) {
    let mut conn = server.connection();
    let role: String = redis::cmd("ROLE")
        .query::<Vec<redis::Value>>(&mut conn)
        .ok()
        .and_then(|role| match role.first() {
            Some(redis::Value::BulkString(role)) => {
                Some(String::from_utf8_lossy(role).into_owned())
            }
            _ => None,
        })
        .unwrap_or_default();
    if role != "master" {
        return;
    }
    // A key this primary owns: the first probe it does not redirect.
    let key = (0..)
        .map(|i| format!("replication-probe:{i}"))
        .find(|key| {
            redis::cmd("SET")
                .arg(key)
                .arg(1)
                .query::<()>(&mut conn)
                .is_ok()
        })
        .expect("a key of this primary");
    loop {
        let () = redis::cmd("SET").arg(&key).arg(1).query(&mut conn).unwrap();
        let acked: usize = redis::cmd("WAIT")
            .arg(replicas)
            .arg(100)
            .query(&mut conn)
            .unwrap();
        if acked >= replicas {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "replicas never confirmed a write"
        );
    }
}

/// A `redis-server` that serves TLS on its own port (beside a plain port
/// the harness uses to see it is up), with a certificate for `127.0.0.1`
/// from a throwaway CA, and a password.
#[derive(Debug)]
pub struct RedisTlsServer {
    /// The server (its plain port is for the harness only).
    pub server: RedisServer,
    /// The CA, the server's and a client's certificates, and a second CA.
    pub certs: TestCerts,
    tls_port: u16,
    password: String,
}

impl RedisTlsServer {
    /// Starts the server; with `client_certs`, it refuses clients that do
    /// not show a certificate its CA signed (`tls-auth-clients yes`).
    pub fn new(password: &str, client_certs: bool) -> RedisTlsServer {
        let certs = TestCerts::make(temp_dir("redis-certs"));
        let extra = vec!["--requirepass".to_owned(), password.to_owned()];
        let server = RedisServer::start_tls(&certs, client_certs, extra, None);
        RedisTlsServer {
            tls_port: server.announced_port(),
            server,
            certs,
            password: password.to_owned(),
        }
    }

    /// `rediss://:PASSWORD@127.0.0.1:TLS_PORT`.
    pub fn url(&self) -> String {
        format!("rediss://:{}@127.0.0.1:{}", self.password, self.tls_port)
    }

    /// The TLS port.
    pub fn tls_port(&self) -> u16 {
        self.tls_port
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // SIGKILL ends a frozen (SIGSTOPped) server too.
        self.kill();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Several independent servers (for Redlock), each stoppable on its own.
#[derive(Debug)]
pub struct RedisServers {
    servers: Vec<RedisServer>,
}

impl RedisServers {
    /// Starts `n` servers.
    pub fn spawn(n: usize) -> RedisServers {
        RedisServers {
            servers: (0..n).map(|_| RedisServer::new()).collect(),
        }
    }

    /// Starts `n` servers that keep their data across a kill and restart.
    pub fn spawn_persistent(n: usize) -> RedisServers {
        RedisServers {
            servers: (0..n).map(|_| RedisServer::persistent()).collect(),
        }
    }

    /// How many servers there are.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Their URLs, in order.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// Kills server `i`.
    pub fn stop(&mut self, i: usize) {
        self.servers[i].kill();
    }

    /// Restarts server `i` on its port.
    pub fn restart(&mut self, i: usize) {
        self.servers[i].restart();
    }

    /// Server `i`.
    pub fn get(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }
}

/// A Redis Cluster of primaries (and replicas, if asked), all on loopback, built
/// with `redis-cli --cluster create`.
#[derive(Debug)]
pub struct RedisCluster {
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts the nodes, joins them and waits for `cluster_state:ok`.
    pub fn spawn(n: usize) -> RedisCluster {
        RedisCluster::spawn_with_replicas(n, 0)
    }

    /// Starts `primaries * (1 + replicas)` nodes, joins them with
    /// `replicas` replicas per primary, and waits for `cluster_state:ok`
    /// and for every primary to see its replicas online.
    pub fn spawn_with_replicas(primaries: usize, replicas: usize) -> RedisCluster {
        RedisCluster::build(primaries, replicas, false)
    }

    /// As [`spawn`](Self::spawn), each node behind a [`Proxy`] of its own
    /// that it announces to the others and to clients (`cluster-announce-port`),
    /// so that [`proxy_switches`](Self::proxy_switches) can cut a client
    /// process off from every node.
    pub fn spawn_proxied(n: usize) -> RedisCluster {
        RedisCluster::build(n, 0, true)
    }

    fn build(primaries: usize, replicas: usize, proxied: bool) -> RedisCluster {
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "{dir}/nodes.conf",
            "--cluster-node-timeout",
            "5000",
            "--repl-diskless-sync-delay",
            "0",
        ];
        if proxied {
            args.extend(["--cluster-announce-port", "{proxy}"]);
        }
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let servers: Vec<RedisServer> = (0..primaries * (1 + replicas))
            .map(|_| RedisServer::start_as(None, false, args.clone(), None, proxied))
            .collect();
        let nodes: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let output = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli (it comes with redis-server, in redis-tools)");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let deadline = Instant::now() + Duration::from_secs(20);
        for server in &servers {
            wait_cluster_ok(server, deadline);
        }
        if replicas > 0 {
            for server in &servers {
                wait_replicated(server, replicas, deadline);
            }
        }
        RedisCluster { servers }
    }

    /// `redis+cluster://127.0.0.1:P1,127.0.0.1:P2,...`: every node (by
    /// its proxy, if it has one).
    pub fn url(&self) -> String {
        let nodes: Vec<String> = self
            .servers
            .iter()
            .map(|server| format!("127.0.0.1:{}", server.announced_port()))
            .collect();
        format!("redis+cluster://{}", nodes.join(","))
    }

    /// The switches of the nodes' proxies (none unless
    /// [`spawn_proxied`](Self::spawn_proxied)).
    pub fn proxy_switches(&self) -> Vec<ProxySwitch> {
        self.servers
            .iter()
            .filter_map(RedisServer::proxy_switch)
            .collect()
    }

    /// Every node's URL.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }

    /// Kills node `i` and starts it again on its port, without its data
    /// but with its cluster configuration (its identity and slots), and
    /// waits until it says the cluster is ok.
    pub fn restart(&mut self, i: usize) {
        self.servers[i].restart();
        wait_cluster_ok(&self.servers[i], Instant::now() + Duration::from_secs(20));
    }
}

/// Waits until `server` says `cluster_state:ok`; panics at `deadline`.
fn wait_cluster_ok(server: &RedisServer, deadline: Instant) {
    loop {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut server.connection())
            .unwrap_or_default();
        if info.contains("cluster_state:ok") {
            return;
        }
        assert!(Instant::now() < deadline, "cluster not ok: {info}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A master, one replica and three Sentinels watching them (quorum 2, the
/// master declared down after 1 s), all on loopback; with
/// [`spawn_tls`](Self::spawn_tls), all of them over TLS.
#[derive(Debug)]
pub struct RedisSentinels {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<RedisServer>,
    /// The certificates, for a group over TLS.
    certs: Option<TestCerts>,
    /// Which server `kill_master_until_replaced` killed: the first master
    /// (`true`) or the first replica.
    failed: Option<bool>,
}

/// The name the Sentinels know the master by.
pub const SENTINEL_MASTER: &str = "locks";

impl RedisSentinels {
    /// Starts the group and waits until the replica is in sync and every
    /// Sentinel knows the replica and the other Sentinels.
    pub fn spawn() -> RedisSentinels {
        RedisSentinels::start(None, false)
    }

    /// As [`spawn`](Self::spawn), each server and Sentinel behind a
    /// [`Proxy`] of its own: the servers announce their proxies
    /// (`replica-announce-port`), the Sentinels watch the master through
    /// its proxy and name the proxies to clients, and [`url`](Self::url)
    /// lists the Sentinels' proxies, so that
    /// [`proxy_switches`](Self::proxy_switches) can cut a client process
    /// off from the whole group.
    pub fn spawn_proxied() -> RedisSentinels {
        RedisSentinels::start(None, true)
    }

    /// As [`spawn`](Self::spawn), every server and Sentinel serving TLS
    /// with a certificate from a throwaway CA ([`certs`](Self::certs)) and
    /// talking to the others over TLS: replication, monitoring, the
    /// Sentinels' gossip and the addresses they give clients.
    pub fn spawn_tls() -> RedisSentinels {
        RedisSentinels::start(Some(TestCerts::make(temp_dir("redis-certs"))), false)
    }

    fn start(certs: Option<TestCerts>, proxied: bool) -> RedisSentinels {
        let server = |mut extra: Vec<String>, sentinel: Option<String>| match &certs {
            Some(certs) => RedisServer::start_tls(certs, false, extra, sentinel),
            None => {
                if proxied && sentinel.is_none() {
                    extra.extend(["--replica-announce-port".into(), "{proxy}".into()]);
                }
                RedisServer::start_as(None, false, extra, sentinel, proxied)
            }
        };
        let master = server(vec!["--repl-diskless-sync-delay".into(), "0".into()], None);
        let port = master.announced_port();
        let replica = server(
            vec![
                "--replicaof".into(),
                "127.0.0.1".into(),
                port.to_string(),
                "--repl-diskless-sync-delay".into(),
                "0".into(),
            ],
            None,
        );
        wait_acknowledged(&master);
        let conf = format!(
            "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} 1000\n\
             sentinel failover-timeout {SENTINEL_MASTER} 5000\n\
             sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
        );
        let sentinels: Vec<RedisServer> = (0..3)
            .map(|_| server(Vec::new(), Some(conf.clone())))
            .collect();
        for sentinel in &sentinels {
            wait_for("the Sentinels to know each other and the replica", || {
                let master: Vec<(String, String)> = sentinel_master(sentinel);
                let field = |name: &str| {
                    master
                        .iter()
                        .find(|(key, _)| key == name)
                        .map(|(_, value)| value.clone())
                        .unwrap_or_default()
                };
                field("num-slaves") == "1" && field("num-other-sentinels") == "2"
            });
        }
        RedisSentinels {
            master,
            replica,
            sentinels,
            certs,
            failed: None,
        }
    }

    /// The certificates of a group over TLS: `ca.crt` signed every
    /// server's, `other-ca.crt` none.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/locks`
    /// (`rediss+sentinel://` and the TLS ports for a group over TLS).
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.announced_port()))
            .collect();
        let scheme = match self.certs {
            Some(_) => "rediss+sentinel",
            None => "redis+sentinel",
        };
        format!("{scheme}://{}/{SENTINEL_MASTER}", hosts.join(","))
    }

    /// The switches of the proxies in front of every server and Sentinel
    /// (none unless [`spawn_proxied`](Self::spawn_proxied)).
    pub fn proxy_switches(&self) -> Vec<ProxySwitch> {
        [&self.master, &self.replica]
            .into_iter()
            .chain(&self.sentinels)
            .filter_map(RedisServer::proxy_switch)
            .collect()
    }

    /// The Sentinels.
    pub(crate) fn sentinels(&self) -> &[RedisServer] {
        &self.sentinels
    }

    /// The master the group started with.
    pub fn master(&mut self) -> &mut RedisServer {
        &mut self.master
    }

    /// The replica the group started with.
    pub fn replica(&mut self) -> &mut RedisServer {
        &mut self.replica
    }

    /// Kills the master the Sentinels name now, waits until they name the
    /// other server, starts the killed one again (empty) and waits until it
    /// replicates the new master.
    pub fn fail_over(&mut self) {
        self.kill_master_until_replaced();
        self.restart_failed_master();
        // The Sentinels can leave the restarted server a master for tens of
        // seconds before they turn it into a replica; the master they name
        // is asked again each time.
        wait_for_long(
            "the new master's replica to acknowledge writes",
            Duration::from_secs(90),
            || acknowledged(self.current_master()),
        );
    }

    /// Kills the master the Sentinels name now and waits until every one
    /// of them names the other server.
    pub fn kill_master_until_replaced(&mut self) {
        let master_port = self.master.announced_port();
        let killed_master = self.current_master_port() == Some(master_port);
        let (dead, alive) = if killed_master {
            (&mut self.master, &self.replica)
        } else {
            (&mut self.replica, &self.master)
        };
        dead.kill();
        let promoted = alive.announced_port();
        self.wait_named(promoted);
        self.failed = Some(killed_master);
    }

    /// Has the Sentinels fail over with the master up (`SENTINEL
    /// FAILOVER`), and waits until every one names the replica. The old
    /// master goes on as a master, taking writes, until they demote it
    /// (seconds later); returns it.
    pub fn fail_over_leaving_the_master_up(&mut self) -> &RedisServer {
        let master_port = self.master.announced_port();
        let (old, replica) = if self.current_master_port() == Some(master_port) {
            (&self.master, &self.replica)
        } else {
            (&self.replica, &self.master)
        };
        let promoted = replica.announced_port();
        redis::cmd("SENTINEL")
            .arg("failover")
            .arg(SENTINEL_MASTER)
            .exec(&mut self.sentinels[0].connection())
            .expect("SENTINEL FAILOVER");
        self.wait_named(promoted);
        old
    }

    /// Waits until every Sentinel names the server on `port` the master.
    fn wait_named(&self, port: u16) {
        wait_for("the Sentinels to name the promoted replica", || {
            self.sentinels
                .iter()
                .all(|sentinel| named_port(sentinel) == Some(port))
        });
    }

    /// Starts the server [`kill_master_until_replaced`] killed again, on
    /// its port and empty: it says it is a master until the Sentinels turn
    /// it into a replica of the new one. Returns it.
    ///
    /// [`kill_master_until_replaced`]: Self::kill_master_until_replaced
    pub fn restart_failed_master(&mut self) -> &RedisServer {
        let failed = match self.failed.take() {
            Some(true) => &mut self.master,
            Some(false) => &mut self.replica,
            None => panic!("no master was killed"),
        };
        failed.restart();
        failed
    }

    /// The server the Sentinels name as master now.
    fn current_master(&self) -> &RedisServer {
        let mut port = None;
        wait_for("a Sentinel to name the master", || {
            port = self.current_master_port();
            port.is_some()
        });
        if port == Some(self.master.announced_port()) {
            &self.master
        } else {
            &self.replica
        }
    }

    /// The port of the master the Sentinels name now (its
    /// [`announced_port`](RedisServer::announced_port)).
    pub fn current_master_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(named_port)
    }

    /// Whether a Sentinel names a master other than the one announced on
    /// `port`: a failover from it happened. Sentinels learn of a failover
    /// from the one that led it, some of them a while later, so those that
    /// still name `port` do not say it did not.
    pub fn failed_over_from(&self, port: u16) -> bool {
        self.sentinels
            .iter()
            .filter_map(named_port)
            .any(|named| named != port)
    }
}

/// The port of the master `sentinel` names; `None` if it names none or
/// does not answer.
fn named_port(sentinel: &RedisServer) -> Option<u16> {
    let addr: Option<(String, String)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(SENTINEL_MASTER)
        .query(&mut sentinel.connection())
        .ok()?;
    addr?.1.parse().ok()
}

/// Waits until `master`'s replica acknowledges writes (a `SET` that
/// `WAIT 1` confirms).
fn wait_acknowledged(master: &RedisServer) {
    wait_for("the replica to acknowledge writes", || acknowledged(master));
}

/// Whether a replica of `master` acknowledges a write (a `SET` that
/// `WAIT 1` confirms within 100 ms); `false` on any error.
fn acknowledged(master: &RedisServer) -> bool {
    let acked = master.client().get_connection().and_then(|mut conn| {
        redis::cmd("SET").arg("probe").arg(1).exec(&mut conn)?;
        redis::cmd("WAIT").arg(1).arg(100).query::<u32>(&mut conn)
    });
    acked.is_ok_and(|acked| acked == 1)
}

fn sentinel_master(sentinel: &RedisServer) -> Vec<(String, String)> {
    redis::cmd("SENTINEL")
        .arg("master")
        .arg(SENTINEL_MASTER)
        .query(&mut sentinel.connection())
        .unwrap_or_default()
}

/// Polls `ready` every 20 ms, up to 20 s; panics naming `what`.
fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    wait_for_long(what, Duration::from_secs(20), ready);
}

/// Polls `ready` every 20 ms, up to `limit`; panics naming `what`.
fn wait_for_long(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ready() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
