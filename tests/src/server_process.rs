//! What the harnesses do to the server processes they start: kill them
//! (SIGKILL, then reap), freeze and thaw them (SIGSTOP, SIGCONT), by pid.

use std::process::{Child, Command};

/// Kills `child` (SIGKILL, which ends a frozen process too) and reaps it;
/// nothing if it is not running.
pub(crate) fn kill(child: &mut Option<Child>) {
    if let Some(mut child) = child.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Sends `signal` (`-STOP`, `-CONT`) to the running `child`.
pub(crate) fn signal(child: Option<&Child>, signal: &str) {
    let child = child.expect("the server is running");
    let status = Command::new("kill")
        .arg(signal)
        .arg(child.id().to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} failed");
}
