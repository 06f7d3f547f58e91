//! ZooKeeper for tests: one server or an ensemble of several, on free
//! loopback ports with temporary data directories (a generated `zoo.cfg` and
//! `myid`, the admin server off, the four-letter words `ruok` and `srvr`
//! allowed for readiness, `wchp` for the watches, the server's own log
//! written to a file in its directory); servers are killed, frozen and
//! restarted by pid on purpose, and all of them killed on drop.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::server_process::{free_port, temp_dir};

/// How long an ensemble may take to start serving (JVMs start slowly).
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// ZooKeeper's tick: sessions may last from 2 ticks (400 ms) up to the
/// configured maximum.
const TICK_MS: u32 = 200;

/// Debian's start script, run unless `LOCK_TEST_ZOOKEEPER_BIN` names another.
const DEBIAN_SCRIPT: &str = "/usr/share/zookeeper/bin/zkServer.sh";

/// The start script to run: `LOCK_TEST_ZOOKEEPER_BIN`, else Debian's.
fn script() -> String {
    std::env::var("LOCK_TEST_ZOOKEEPER_BIN").unwrap_or_else(|_| DEBIAN_SCRIPT.into())
}

/// Debian's class path, which binds no logger: the server would log
/// nothing at all.
const DEBIAN_CLASS_PATH: &str = "/etc/zookeeper/conf:/usr/share/java/zookeeper.jar";

/// SLF4J's simple logger, shipped with Debian's ZooKeeper (`libslf4j-java`).
const SIMPLE_LOGGER: &str = "/usr/share/java/slf4j-simple.jar";

/// JVM flags that make Debian's server log to its standard error (which
/// goes to the test's log file), with times: its class path again with the
/// simple logger on it (the JVM takes the last `-cp`). Empty for another
/// script, which binds a logger of its own.
fn logging_flags() -> String {
    let debian = std::env::var_os("LOCK_TEST_ZOOKEEPER_BIN").is_none();
    if !debian || !std::path::Path::new(SIMPLE_LOGGER).exists() {
        return String::new();
    }
    format!(
        " -cp {DEBIAN_CLASS_PATH}:{SIMPLE_LOGGER} \
         -Dorg.slf4j.simpleLogger.showDateTime=true \
         -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS"
    )
}

/// One server: its ports, data directory and process (the JVM).
#[derive(Debug)]
struct Server {
    client: u16,
    quorum: u16,
    election: u16,
    dir: PathBuf,
    child: Option<Child>,
}

/// The JVM the tests run servers on: quick to start (the first compiler
/// tier only, a small heap), which is what a test suite starting dozens of
/// servers needs and not how a server is deployed.
const TEST_JVM: &str = "-Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1";

/// The JVM as ZooKeeper's own scripts deploy a server: both compiler tiers,
/// the default collector and ZooKeeper's default heap (`zkEnv.sh`'s
/// `ZK_SERVER_HEAP` of 1000 MB). For measurements.
const DEPLOYED_JVM: &str = "-Xmx1000m";

/// A ZooKeeper ensemble of one or more servers on `127.0.0.1`, with a
/// 200 ms tick (sessions of 400 ms to 60 s). Every server is killed
/// (SIGKILL) and its directory removed on drop.
#[derive(Debug)]
pub struct ZooKeeperEnsemble {
    servers: Vec<Server>,
    /// `JVMFLAGS` for every server.
    jvm: &'static str,
}

impl ZooKeeperEnsemble {
    /// One server, standalone.
    pub fn single() -> ZooKeeperEnsemble {
        ZooKeeperEnsemble::spawn(1)
    }

    /// One server, standalone, on the JVM as ZooKeeper deploys it rather
    /// than the tests' quick-starting one: slower to start and to warm up,
    /// for the benchmark.
    pub fn single_deployed() -> ZooKeeperEnsemble {
        ZooKeeperEnsemble::start_all(1, DEPLOYED_JVM)
    }

    /// `n` servers, started together; returns once every one serves (a
    /// leader is elected).
    pub fn spawn(n: usize) -> ZooKeeperEnsemble {
        ZooKeeperEnsemble::start_all(n, TEST_JVM)
    }

    fn start_all(n: usize, jvm: &'static str) -> ZooKeeperEnsemble {
        let mut last = String::new();
        for _ in 0..3 {
            let mut ensemble = ZooKeeperEnsemble::planned(n, jvm);
            for i in 0..n {
                ensemble.start(i);
            }
            match ensemble.wait_serving(READY_DEADLINE) {
                Ok(()) => return ensemble,
                Err(why) => last = why,
            }
        }
        panic!("ZooKeeper did not start in 3 attempts; the last: {last}");
    }

    fn planned(n: usize, jvm: &'static str) -> ZooKeeperEnsemble {
        let servers: Vec<Server> = (0..n)
            .map(|_| {
                let dir = temp_dir("zookeeper");
                std::fs::create_dir_all(dir.join("data")).expect("create the data directory");
                Server {
                    client: free_port(),
                    quorum: free_port(),
                    election: free_port(),
                    dir,
                    child: None,
                }
            })
            .collect();
        let ensemble = ZooKeeperEnsemble { servers, jvm };
        for i in 0..n {
            ensemble.configure(i);
        }
        ensemble
    }

    /// Writes server `i`'s `zoo.cfg` and `myid`.
    fn configure(&self, i: usize) {
        let server = &self.servers[i];
        let mut conf = format!(
            "tickTime={TICK_MS}\ninitLimit=10\nsyncLimit=5\ndataDir={}\n\
             clientPort={}\nclientPortAddress=127.0.0.1\nadmin.enableServer=false\n\
             4lw.commands.whitelist=ruok,srvr,wchp\nminSessionTimeout={}\nmaxSessionTimeout=60000\n",
            server.dir.join("data").display(),
            server.client,
            2 * TICK_MS,
        );
        if self.servers.len() > 1 {
            for (id, peer) in self.servers.iter().enumerate() {
                conf.push_str(&format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    id + 1,
                    peer.quorum,
                    peer.election
                ));
            }
        }
        std::fs::write(server.dir.join("zoo.cfg"), conf).expect("write zoo.cfg");
        std::fs::write(server.dir.join("data").join("myid"), format!("{}\n", i + 1))
            .expect("write myid");
    }

    /// Starts server `i` (again, on its ports and data). `start-foreground`
    /// execs the JVM, so the child's pid is the server's.
    fn start(&mut self, i: usize) {
        let server = &self.servers[i];
        let log = std::fs::File::create(server.dir.join("zookeeper.log")).expect("log file");
        let child = Command::new(script())
            .arg("start-foreground")
            .arg(server.dir.join("zoo.cfg"))
            .env("JVMFLAGS", format!("{}{}", self.jvm, logging_flags()))
            .env("ZOO_LOG_DIR", &server.dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|err| {
                panic!(
                    "cannot run `{}`: {err}; install ZooKeeper (apt-get install -y zookeeper) \
                     or point LOCK_TEST_ZOOKEEPER_BIN at its zkServer.sh",
                    script()
                )
            });
        self.servers[i].child = Some(child);
    }

    /// Returns once every running server serves clients; else, when one
    /// exits (a port was taken, say) or `within` passes, what went wrong
    /// with every server's state and log (see [`ZooKeeperEnsemble::report`]).
    fn wait_serving(&mut self, within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + within;
        loop {
            let exited = self.servers.iter_mut().position(|s| {
                s.child
                    .as_mut()
                    .is_some_and(|child| matches!(child.try_wait(), Ok(Some(_))))
            });
            if let Some(i) = exited {
                return Err(format!("server {i} exited\n{}", self.report()));
            }
            let serving = (0..self.servers.len())
                .filter(|&i| self.servers[i].child.is_some())
                .all(|i| self.mode(i).is_some());
            if serving {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "not every server served within {within:?}\n{}",
                    self.report()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every server's state (its mode, or how it exited) and the last 60
    /// lines of its log, for a failure message.
    pub fn report(&mut self) -> String {
        let mut report = String::new();
        for i in 0..self.servers.len() {
            let state = match self.servers[i].child.as_mut().map(Child::try_wait) {
                None => "not running (killed by the test)".to_owned(),
                Some(Ok(Some(status))) => format!("exited: {status}"),
                Some(Ok(None)) => match self.mode(i) {
                    Some(mode) => format!("serving as {mode}"),
                    None => "running, not serving".to_owned(),
                },
                Some(Err(err)) => format!("cannot tell: {err}"),
            };
            report.push_str(&format!(
                "--- server {i} (client port {}): {state}; its log ends:\n{}\n",
                self.servers[i].client,
                crate::last_lines(&self.log(i), 60)
            ));
        }
        report
    }

    /// Server `i`'s mode (`standalone`, `leader`, `follower`) while it
    /// serves clients; `None` otherwise.
    pub fn mode(&self, i: usize) -> Option<String> {
        let answer = four_letters(self.servers[i].client, "srvr");
        answer
            .lines()
            .find_map(|line| line.strip_prefix("Mode: "))
            .map(|mode| mode.trim().to_owned())
    }

    /// The zxid of the last transaction server `i` has applied, by its
    /// `srvr` report; `None` if it does not answer. Every write request
    /// (one transaction, however many operations; a failed one too) takes
    /// the next zxid; reads, watches and pings take none.
    pub fn last_zxid(&self, i: usize) -> Option<i64> {
        let answer = four_letters(self.servers[i].client, "srvr");
        let hex = answer
            .lines()
            .find_map(|line| line.strip_prefix("Zxid: 0x"))?;
        i64::from_str_radix(hex.trim(), 16).ok()
    }

    /// The watches server `i` keeps, by its `wchp` report: each watched
    /// path with the sessions watching it (ids as the server prints them),
    /// data and child watches alike. Empty if it does not answer.
    pub fn watches(&self, i: usize) -> BTreeMap<String, Vec<String>> {
        let mut watches: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut path = None;
        for line in four_letters(self.servers[i].client, "wchp").lines() {
            if let Some(session) = line.strip_prefix('\t') {
                if let Some(path) = &path {
                    watches
                        .entry(String::clone(path))
                        .or_default()
                        .push(session.trim().to_owned());
                }
            } else if line.starts_with('/') {
                path = Some(line.trim_end().to_owned());
            }
        }
        watches
    }

    /// The index of the server that leads now, if one does.
    pub fn leader(&self) -> Option<usize> {
        (0..self.servers.len())
            .find(|&i| self.servers[i].child.is_some() && self.mode(i).as_deref() == Some("leader"))
    }

    /// The connect string of every server: `127.0.0.1:p1,127.0.0.1:p2`.
    pub fn connect_string(&self) -> String {
        (0..self.servers.len())
            .map(|i| self.address(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `zookeeper://127.0.0.1:p1,...?session_ms=N`: every server, with the
    /// session timeout the test worker asks for.
    pub fn worker_url(&self, session: Duration) -> String {
        format!(
            "zookeeper://{}?session_ms={}",
            self.connect_string(),
            session.as_millis()
        )
    }

    /// `127.0.0.1:PORT` of server `i`.
    pub fn address(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.servers[i].client)
    }

    /// The client port of server `i`.
    pub fn client_port(&self, i: usize) -> u16 {
        self.servers[i].client
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.servers.len()
    }

    /// Never: an ensemble has at least one server.
    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    /// Kills server `i` (SIGKILL); its data stays for a restart.
    pub fn kill(&mut self, i: usize) {
        crate::server_process::kill(&mut self.servers[i].child);
    }

    /// Starts server `i` again on its data; waits until every running
    /// server serves (without quorum they may not). The error says what
    /// went wrong, with every server's state and log.
    pub fn restart(&mut self, i: usize) -> Result<(), String> {
        self.kill(i);
        self.start(i);
        self.wait_serving(READY_DEADLINE)
    }

    /// Freezes server `i` (SIGSTOP).
    pub fn pause(&self, i: usize) {
        self.signal(i, "-STOP");
    }

    /// Thaws server `i`.
    pub fn resume(&self, i: usize) {
        self.signal(i, "-CONT");
    }

    fn signal(&self, i: usize, signal: &str) {
        crate::server_process::signal(self.servers[i].child.as_ref(), signal);
    }

    /// Server `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.servers[i].dir.join("zookeeper.log")).unwrap_or_default()
    }
}

impl Drop for ZooKeeperEnsemble {
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            // SIGKILL ends a frozen (SIGSTOPped) server too.
            self.kill(i);
            let _ = std::fs::remove_dir_all(&self.servers[i].dir);
        }
    }
}

/// A four-letter word to the server's client port; its answer, or empty
/// on any error.
fn four_letters(port: u16, word: &str) -> String {
    let attempt = || -> std::io::Result<String> {
        let mut stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_millis(500)))?;
        stream.write_all(word.as_bytes())?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer)?;
        Ok(answer)
    };
    attempt().unwrap_or_default()
}
