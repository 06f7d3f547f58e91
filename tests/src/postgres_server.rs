//! PostgreSQL servers for tests: `initdb` into a temporary directory, the
//! postmaster on a free loopback port, killed and restarted on purpose,
//! stopped on drop. As root (CI) both run as the `postgres` user, since
//! `initdb` refuses root.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::server_process::{free_port, ready_or_exited, temp_dir};

/// One PostgreSQL server on `127.0.0.1`, trusting local connections (user
/// `postgres`, no password) except role `app`'s, which must give its
/// password (create it with [`psql`](Self::psql)), with `fsync` off (a
/// killed server still keeps its commits).
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    /// The user to run as, when running as root.
    user: Option<(u32, u32)>,
    /// Whether the server accepts TLS (with a self-signed certificate).
    tls: bool,
    child: Option<Child>,
}

/// The directory of `initdb`, `postgres` and `pg_isready`:
/// `LOCK_TEST_PG_BIN`, else the newest `/usr/lib/postgresql/*/bin`.
fn bin_dir() -> PathBuf {
    if let Ok(dir) = std::env::var("LOCK_TEST_PG_BIN") {
        return dir.into();
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|entries| {
            entries
                .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
                .filter(|bin| bin.join("initdb").exists())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop().unwrap_or_else(|| {
        panic!(
            "no PostgreSQL server found under /usr/lib/postgresql; install it \
             (apt-get install -y postgresql) or point LOCK_TEST_PG_BIN at its bin directory"
        )
    })
}

/// The `postgres` user's uid and gid when we are root, else `None`.
fn run_as() -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let me = std::fs::metadata("/proc/self").expect("/proc/self").uid();
    if me != 0 {
        return None;
    }
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").arg(flag).arg("postgres").output().ok()?;
        String::from_utf8(out.stdout).ok()?.trim().parse().ok()
    };
    Some((
        id("-u").expect("a `postgres` user (created by the postgresql package)"),
        id("-g").expect("the `postgres` group"),
    ))
}

impl PostgresServer {
    /// Makes a new database cluster and starts it.
    pub fn new() -> PostgresServer {
        PostgresServer::start(false)
    }

    /// As [`new`](Self::new), accepting TLS with a self-signed certificate
    /// for `127.0.0.1`; role `tls` may connect only over TLS.
    pub fn with_tls() -> PostgresServer {
        PostgresServer::start(true)
    }

    fn start(tls: bool) -> PostgresServer {
        let dir = temp_dir("pg");
        let user = run_as();
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).expect("chown the directory");
        }
        let mut server = PostgresServer {
            port: 0,
            dir,
            bin: bin_dir(),
            user,
            tls,
            child: None,
        };
        let initdb = server
            .command("initdb")
            .arg("-D")
            .arg(server.data())
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
            .output()
            .expect("run initdb");
        assert!(
            initdb.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&initdb.stderr)
        );
        // Role `app` must give its password, role `tls` must use TLS;
        // everyone else is trusted.
        let hba = "host all app 127.0.0.1/32 scram-sha-256\n\
                   hostnossl all tls 127.0.0.1/32 reject\n\
                   host all all 127.0.0.1/32 trust\n\
                   local all all trust\n";
        std::fs::write(server.data().join("pg_hba.conf"), hba).expect("write pg_hba.conf");
        if tls {
            server.make_certificate();
        }
        for _ in 0..3 {
            server.port = free_port();
            if server.spawn() {
                return server;
            }
        }
        panic!(
            "postgres did not start in 3 attempts; log:\n{}",
            server.log()
        );
    }

    /// A self-signed certificate for `127.0.0.1`, readable by the server only.
    fn make_certificate(&self) {
        let (key, cert) = (
            self.data().join("server.key"),
            self.data().join("server.crt"),
        );
        let made = Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .args(["-subj", "/CN=127.0.0.1", "-keyout"])
            .arg(&key)
            .arg("-out")
            .arg(&cert)
            .output()
            .expect("run openssl (apt-get install -y openssl)");
        assert!(
            made.status.success(),
            "openssl failed: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        if let Some((uid, gid)) = self.user {
            for file in [&key, &cert] {
                std::os::unix::fs::chown(file, Some(uid), Some(gid)).expect("chown");
            }
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn command(&self, name: &str) -> Command {
        let mut command = Command::new(self.bin.join(name));
        if let Some((uid, gid)) = self.user {
            command.uid(uid).gid(gid);
        }
        command
    }

    /// Starts the postmaster on `self.port`; `true` once it accepts
    /// connections.
    fn spawn(&mut self) -> bool {
        let log = std::fs::File::create(self.dir.join("postgres.log")).expect("create the log");
        if let Some((uid, gid)) = self.user {
            let _ = std::os::unix::fs::chown(self.dir.join("postgres.log"), Some(uid), Some(gid));
        }
        let mut child = self
            .command("postgres")
            .arg("-D")
            .arg(self.data())
            .arg("-p")
            .arg(self.port.to_string())
            .arg("-k")
            .arg(&self.dir)
            .args(["-c", "listen_addresses=127.0.0.1"])
            // A killed server keeps what it committed (the OS has it);
            // only a machine crash could lose it.
            .args(["-c", "fsync=off"])
            .args(["-c", "full_page_writes=off", "-c", "max_connections=200"])
            .args(["-c", "shared_preload_libraries=pg_stat_statements"])
            .args(if self.tls { &["-c", "ssl=on"][..] } else { &[] })
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run postgres");
        let ready = ready_or_exited(
            &mut child,
            Duration::from_secs(20),
            Duration::from_millis(50),
            || self.is_ready(),
        );
        self.child = Some(child);
        if !ready {
            self.kill();
        }
        ready
    }

    fn is_ready(&self) -> bool {
        Command::new(self.bin.join("pg_isready"))
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
            .status()
            .is_ok_and(|status| status.success())
    }

    /// The port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Runs SQL through `psql` as the superuser; returns its output.
    pub fn psql(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .args([
                "-d",
                "postgres",
                "-X",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                sql,
            ])
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql failed on {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// How many times statements starting with `prefix` ran
    /// (`pg_stat_statements`, created on first use).
    pub fn statement_calls(&self, prefix: &str) -> u64 {
        self.psql("CREATE EXTENSION IF NOT EXISTS pg_stat_statements");
        let prefix = prefix.replace('\'', "''");
        self.psql(&format!(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements WHERE query LIKE '{prefix}%'"
        ))
        .parse()
        .expect("a count")
    }

    /// Kills the postmaster (SIGKILL); its sessions end with it.
    pub fn kill(&mut self) {
        // Backends notice their postmaster is gone and exit; a new
        // postmaster waits for the old shared memory to be released.
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
            "postgres did not restart on port {}:\n{}",
            self.port,
            self.log()
        );
    }

    /// Freezes the server (SIGSTOP to every process of it: the
    /// postmaster first, so that it forks no other meanwhile, then its
    /// backends and workers): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal_all("-STOP");
    }

    /// Thaws a server frozen by [`pause`](Self::pause) (its backends and
    /// workers first, then the postmaster).
    pub fn resume(&self) {
        self.signal_all("-CONT");
    }

    /// Sends `signal` to the postmaster and each of its children, the
    /// postmaster first to stop and last to continue, so the set of
    /// children is looked up while it cannot fork.
    fn signal_all(&self, signal: &str) {
        let postmaster = self.child.as_ref().expect("postgres is running").id();
        let stopping = signal == "-STOP";
        if stopping {
            crate::server_process::signal_pid(postmaster, signal);
        }
        for pid in crate::server_process::children(postmaster) {
            // A child may have ended since it was listed.
            crate::server_process::try_signal_pid(pid, signal);
        }
        if !stopping {
            crate::server_process::signal_pid(postmaster, signal);
        }
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
    }

    /// The data directory (for inspection).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl crate::StoreServer for PostgresServer {
    fn url(&self) -> String {
        PostgresServer::url(self)
    }

    fn url_through(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    fn port(&self) -> u16 {
        PostgresServer::port(self)
    }

    fn kill(&mut self) {
        PostgresServer::kill(self);
    }

    fn restart(&mut self) {
        PostgresServer::restart(self);
    }

    fn pause(&self) {
        PostgresServer::pause(self);
    }

    fn resume(&self) {
        PostgresServer::resume(self);
    }
}

impl Default for PostgresServer {
    fn default() -> Self {
        PostgresServer::new()
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if let Some(child) = &self.child {
            // Immediate shutdown: the postmaster ends its sessions too.
            let _ = Command::new("kill")
                .arg("-QUIT")
                .arg(child.id().to_string())
                .status();
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

/// How a [`PgBouncer`] lends its server connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    /// A client keeps one server connection while it is connected.
    Session,
    /// A client has a server connection for one transaction at a time.
    Transaction,
}

/// A PgBouncer in front of a [`PostgresServer`], on a free loopback port,
/// trusting every user; killed on drop. Runs as the `postgres` user when
/// we are root (PgBouncer refuses root).
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl PgBouncer {
    /// Starts a PgBouncer for `server`'s databases in `mode`, with at most
    /// `pool_size` server connections per database and user.
    pub fn start(server: &PostgresServer, mode: PoolMode, pool_size: u32) -> PgBouncer {
        let dir = temp_dir("pgbouncer");
        let user = run_as();
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let mut last_log = String::new();
        for _ in 0..3 {
            let port = free_port();
            let ini = format!(
                "[databases]\n\
                 * = host=127.0.0.1 port={server_port}\n\
                 [pgbouncer]\n\
                 listen_addr = 127.0.0.1\n\
                 listen_port = {port}\n\
                 unix_socket_dir =\n\
                 auth_type = trust\n\
                 auth_file = {dir}/users.txt\n\
                 pool_mode = {mode}\n\
                 default_pool_size = {pool_size}\n\
                 max_client_conn = 200\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 logfile = {dir}/pgbouncer.log\n",
                server_port = server.port(),
                dir = dir.display(),
            );
            std::fs::write(dir.join("pgbouncer.ini"), ini).expect("write pgbouncer.ini");
            std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").expect("write users.txt");
            if let Some((uid, gid)) = user {
                for path in [
                    dir.clone(),
                    dir.join("pgbouncer.ini"),
                    dir.join("users.txt"),
                ] {
                    std::os::unix::fs::chown(&path, Some(uid), Some(gid)).expect("chown");
                }
            }
            let mut command = Command::new(binary());
            command
                .arg(dir.join("pgbouncer.ini"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            if let Some((uid, gid)) = user {
                command.uid(uid).gid(gid);
            }
            let child = command
                .spawn()
                .expect("run pgbouncer (apt-get install -y pgbouncer)");
            let mut bouncer = PgBouncer {
                port,
                dir: dir.clone(),
                child: Some(child),
            };
            if bouncer.wait_ready() {
                return bouncer;
            }
            last_log = std::fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default();
            bouncer.kill();
        }
        panic!("pgbouncer did not start in 3 attempts; log:\n{last_log}");
    }

    /// True once the port accepts connections.
    fn wait_ready(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return false;
        };
        let port = self.port;
        let ready = ready_or_exited(
            &mut child,
            Duration::from_secs(10),
            Duration::from_millis(20),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        self.child = Some(child);
        ready
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`, through the pooler.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Kills PgBouncer (SIGKILL).
    pub fn kill(&mut self) {
        crate::server_process::kill(&mut self.child);
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The PgBouncer binary: `LOCK_TEST_PGBOUNCER_BIN`, else Debian's.
fn binary() -> PathBuf {
    std::env::var_os("LOCK_TEST_PGBOUNCER_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/pgbouncer"))
}
