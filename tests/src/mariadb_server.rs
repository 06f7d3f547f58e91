//! MariaDB servers for tests: `mariadb-install-db` into a temporary
//! directory, `mariadbd` on a free loopback port, killed, frozen and
//! restarted on purpose, shut down on drop. Root logs in from `127.0.0.1`
//! without a password; database `locks` is made at start.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::TestCerts;
use crate::server_process::{free_port, ready_or_exited, temp_dir};

/// One MariaDB server on `127.0.0.1`, with a small buffer pool and redo
/// log, no binary log, and commits written to the OS at once (a killed
/// server keeps them; only a machine crash could lose the last second).
#[derive(Debug)]
pub struct MariaDbServer {
    port: u16,
    dir: PathBuf,
    /// Set when the server accepts TLS: its CA and certificates.
    tls: Option<TestCerts>,
    child: Option<Child>,
}

/// `mariadbd` and its tools: `LOCK_TEST_MARIADB_BIN` (a directory holding
/// `mariadbd`, `mariadb` and `mariadb-install-db`), else the `PATH` and
/// `/usr/sbin`.
fn tool(name: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("LOCK_TEST_MARIADB_BIN") {
        return Path::new(&dir).join(name);
    }
    let sbin = Path::new("/usr/sbin").join(name);
    if sbin.exists() {
        return sbin;
    }
    PathBuf::from(name)
}

impl MariaDbServer {
    /// Makes a new data directory and starts the server on it.
    pub fn new() -> MariaDbServer {
        MariaDbServer::start(false)
    }

    /// As [`new`](Self::new), accepting TLS with a certificate for
    /// `127.0.0.1` from a CA of its own ([`certs`](Self::certs)); user
    /// `tls` must show a client certificate of that CA (`REQUIRE X509`).
    pub fn with_tls() -> MariaDbServer {
        let server = MariaDbServer::start(true);
        server.sql("CREATE USER 'tls'@'%' REQUIRE X509; GRANT ALL ON locks.* TO 'tls'@'%'");
        server
    }

    /// The certificates of a server made by [`with_tls`](Self::with_tls).
    pub fn certs(&self) -> &TestCerts {
        self.tls.as_ref().expect("a server made with_tls")
    }

    fn start(tls: bool) -> MariaDbServer {
        let dir = temp_dir("mariadb");
        let mut server = MariaDbServer {
            port: 0,
            tls: tls.then(|| TestCerts::make(dir.join("certs"))),
            dir,
            child: None,
        };
        let install = Command::new(tool("mariadb-install-db"))
            .arg("--no-defaults")
            .arg(format!("--datadir={}", server.data().display()))
            .arg(format!("--tmpdir={}", server.dir.display()))
            .args([
                "--user=root",
                "--auth-root-authentication-method=normal",
                "--skip-test-db",
                "--innodb-log-file-size=8M",
            ])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|error| {
                panic!(
                    "run mariadb-install-db ({error}); install the server \
                     (apt-get install -y mariadb-server-core mariadb-client-core) \
                     or point LOCK_TEST_MARIADB_BIN at its binaries"
                )
            });
        assert!(
            install.status.success(),
            "mariadb-install-db failed: {}{}",
            String::from_utf8_lossy(&install.stdout),
            String::from_utf8_lossy(&install.stderr)
        );
        for _ in 0..3 {
            server.port = free_port();
            if server.spawn() {
                server.sql("CREATE DATABASE IF NOT EXISTS locks");
                return server;
            }
        }
        panic!(
            "mariadbd did not start in 3 attempts; log:\n{}",
            server.log()
        );
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    /// Starts `mariadbd` on `self.port`; `true` once it answers a query.
    fn spawn(&mut self) -> bool {
        let mut command = Command::new(tool("mariadbd"));
        // `--no-defaults` must come first.
        command.arg("--no-defaults");
        if let Some(certs) = &self.tls {
            command
                .arg(format!("--ssl-ca={}", certs.path("ca.crt").display()))
                .arg(format!("--ssl-cert={}", certs.path("server.crt").display()))
                .arg(format!("--ssl-key={}", certs.path("server.key").display()));
        }
        let mut child = command
            .arg(format!("--datadir={}", self.data().display()))
            .arg(format!("--tmpdir={}", self.dir.display()))
            .arg(format!("--socket={}", self.dir.join("sock").display()))
            .arg(format!("--port={}", self.port))
            .arg(format!("--pid-file={}", self.dir.join("pid").display()))
            .arg(format!(
                "--log-error={}",
                self.dir.join("err.log").display()
            ))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-log-bin",
                "--skip-name-resolve",
                "--innodb-log-file-size=8M",
                "--innodb-buffer-pool-size=32M",
                "--innodb-flush-log-at-trx-commit=2",
                "--max-connections=300",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run mariadbd");
        let ready = ready_or_exited(
            &mut child,
            Duration::from_secs(30),
            Duration::from_millis(50),
            || self.try_sql("SELECT 1").is_some(),
        );
        self.child = Some(child);
        if !ready {
            self.kill();
        }
        ready
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `mysql://root@127.0.0.1:PORT/locks`.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/locks", self.port)
    }

    /// Runs SQL in database `locks` (once it exists) through the `mariadb`
    /// client as root; returns its output, tab-separated, without headers.
    pub fn sql(&self, sql: &str) -> String {
        self.try_sql(sql)
            .unwrap_or_else(|| panic!("mariadb failed on {sql:?}; log:\n{}", self.log()))
    }

    /// Runs a script (statements, `DELIMITER` lines) in database `locks`
    /// through the `mariadb` client's standard input, as an administrator
    /// would; panics with the client's error when it fails.
    pub fn script(&self, script: &str) {
        use std::io::Write;
        let mut child = Command::new(tool("mariadb"))
            .args(["--no-defaults", "-uroot", "-h127.0.0.1"])
            .arg(format!("-P{}", self.port))
            .arg("locks")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run mariadb");
        child
            .stdin
            .take()
            .expect("the client's input")
            .write_all(script.as_bytes())
            .expect("write the script");
        let out = child.wait_with_output().expect("wait for mariadb");
        assert!(
            out.status.success(),
            "the script failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn try_sql(&self, sql: &str) -> Option<String> {
        let out = Command::new(tool("mariadb"))
            .args(["--no-defaults", "-uroot", "-h127.0.0.1", "-N", "-B"])
            .arg(format!("-P{}", self.port))
            .args(["--connect-timeout=5", "-e", sql])
            .stdin(Stdio::null())
            .output()
            .ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Kills the server (SIGKILL); its connections end with it.
    pub fn kill(&mut self) {
        crate::server_process::kill(&mut self.child);
    }

    /// Kills the server and starts it again on the same port and data
    /// (crash recovery keeps what was committed). Returns when the server
    /// now up was started: nothing answered on the port between the kill
    /// and then.
    pub fn restart(&mut self) -> SystemTime {
        self.kill();
        for _ in 0..50 {
            let started = SystemTime::now();
            if self.spawn() {
                return started;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "mariadbd did not restart on port {}:\n{}",
            self.port,
            self.log()
        );
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        crate::server_process::signal(self.child.as_ref(), "-STOP");
    }

    /// Thaws a server frozen by [`pause`](Self::pause).
    pub fn resume(&self) {
        crate::server_process::signal(self.child.as_ref(), "-CONT");
    }

    /// The server's error log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("err.log")).unwrap_or_default()
    }
}

impl crate::StoreServer for MariaDbServer {
    fn url(&self) -> String {
        MariaDbServer::url(self)
    }

    fn url_through(port: u16) -> String {
        format!("mysql://root@127.0.0.1:{port}/locks")
    }

    fn port(&self) -> u16 {
        MariaDbServer::port(self)
    }

    fn kill(&mut self) {
        MariaDbServer::kill(self);
    }

    fn restart(&mut self) {
        MariaDbServer::restart(self);
    }

    fn pause(&self) {
        MariaDbServer::pause(self);
    }

    fn resume(&self) {
        MariaDbServer::resume(self);
    }
}

impl Default for MariaDbServer {
    fn default() -> Self {
        MariaDbServer::new()
    }
}

impl Drop for MariaDbServer {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A clean shutdown, bounded; killed below if it hangs (frozen).
            let _ = self.try_sql("SHUTDOWN");
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Some(child) = self.child.as_mut() {
                if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
