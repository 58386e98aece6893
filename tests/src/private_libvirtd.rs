//! [`PrivateLibvirtd`]: a libvirtd of the test's own, serving libvirt's test driver over a
//! unix socket in a temporary directory, that a test may kill, restart, freeze and thaw.
//!
//! The daemon runs with its own config file (`unix_sock_dir` in the temp directory, no TCP or
//! TLS listener, no authentication on its sockets), its own `--pid-file`, and
//! `LIBVIRT_DRIVER_DIR` pointing at an empty directory, so it loads no driver module: no QEMU,
//! network, storage or nodedev driver, nothing that could touch the host's domains or the system
//! libvirtd's state (`/run/libvirt/*` is left alone). Only the test driver, built into libvirt
//! itself, is served: connect with [`PrivateLibvirtd::uri`] (`test+unix:///default?socket=...`,
//! the daemon's process-wide default test state) or [`PrivateLibvirtd::uri_for`] (a node file of
//! your own). Requires root (the daemon runs in privileged mode) and `libvirtd` on `PATH` or in
//! `/usr/sbin`.
//!
//! Dropping the guard thaws and kills the daemon and removes the directory.

use std::fs::File;
use std::io;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tempfile::TempDir;

/// How long [`PrivateLibvirtd::start`] waits for the socket.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the private daemon could not be run or signalled.
#[derive(Debug, thiserror::Error)]
pub enum PrivateLibvirtdError {
    /// Creating its directory or files failed.
    #[error("preparing the private libvirtd directory")]
    Prepare(#[source] io::Error),
    /// Running `libvirtd` failed.
    #[error("running libvirtd")]
    Spawn(#[source] io::Error),
    /// The daemon exited before it listened.
    #[error("libvirtd exited ({status}) before listening; its log:\n{log}")]
    Exited {
        /// Its exit status.
        status: ExitStatus,
        /// Its log.
        log: String,
    },
    /// The daemon did not listen in time.
    #[error("libvirtd did not listen on {} within {waited:?}; its log:\n{log}", socket.display())]
    NotReady {
        /// The socket it should have created.
        socket: PathBuf,
        /// How long we waited.
        waited: Duration,
        /// Its log.
        log: String,
    },
    /// Sending a signal failed.
    #[error("sending {signal} to libvirtd")]
    Signal {
        /// The signal.
        signal: Signal,
        /// The OS error.
        #[source]
        source: nix::Error,
    },
    /// The daemon is not running (killed, or never started).
    #[error("libvirtd is not running")]
    NotRunning,
}

/// A private libvirtd (see the module docs).
#[derive(Debug)]
pub struct PrivateLibvirtd {
    dir: TempDir,
    child: Option<Child>,
    frozen: bool,
}

impl PrivateLibvirtd {
    /// Writes the config and starts the daemon; returns once its socket accepts connections.
    pub fn start() -> Result<Self, PrivateLibvirtdError> {
        let dir = tempfile::Builder::new()
            .prefix("vireo-lvd-")
            .tempdir()
            .map_err(PrivateLibvirtdError::Prepare)?;
        for sub in ["run", "drivers"] {
            std::fs::create_dir(dir.path().join(sub)).map_err(PrivateLibvirtdError::Prepare)?;
        }
        let config = format!(
            "listen_tls = 0\n\
             listen_tcp = 0\n\
             unix_sock_dir = \"{}\"\n\
             unix_sock_ro_perms = \"0700\"\n\
             unix_sock_rw_perms = \"0700\"\n\
             unix_sock_admin_perms = \"0700\"\n\
             auth_unix_ro = \"none\"\n\
             auth_unix_rw = \"none\"\n\
             log_outputs = \"3:stderr\"\n",
            dir.path().join("run").display()
        );
        std::fs::write(dir.path().join("libvirtd.conf"), config)
            .map_err(PrivateLibvirtdError::Prepare)?;
        let mut daemon = Self {
            dir,
            child: None,
            frozen: false,
        };
        daemon.spawn()?;
        Ok(daemon)
    }

    /// The socket clients connect to.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("run").join("libvirt-sock")
    }

    /// `test+unix:///default?socket=...`: the daemon's default test state (one running domain
    /// named `test`), fresh after every restart.
    pub fn uri(&self) -> String {
        format!("test+unix:///default?socket={}", self.socket().display())
    }

    /// `test+unix:///ABS/NODE.xml?socket=...`: a test-driver node file read by the daemon.
    pub fn uri_for(&self, node_file: &Path) -> String {
        format!(
            "test+unix://{}?socket={}",
            node_file.display(),
            self.socket().display()
        )
    }

    /// The daemon's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("libvirtd.log")).unwrap_or_default()
    }

    /// SIGKILLs the daemon and reaps it (its sockets are left behind, as after a crash).
    pub fn kill(&mut self) -> Result<(), PrivateLibvirtdError> {
        let mut child = self.child.take().ok_or(PrivateLibvirtdError::NotRunning)?;
        signal(&child, Signal::SIGKILL)?;
        self.frozen = false;
        child.wait().map_err(PrivateLibvirtdError::Spawn)?;
        Ok(())
    }

    /// Starts the daemon again on the same socket (killing it first if it runs).
    pub fn restart(&mut self) -> Result<(), PrivateLibvirtdError> {
        if self.child.is_some() {
            self.kill()?;
        }
        self.spawn()
    }

    /// SIGSTOPs the daemon: its socket still accepts connections, nothing answers.
    pub fn freeze(&mut self) -> Result<(), PrivateLibvirtdError> {
        let child = self
            .child
            .as_ref()
            .ok_or(PrivateLibvirtdError::NotRunning)?;
        signal(child, Signal::SIGSTOP)?;
        self.frozen = true;
        Ok(())
    }

    /// SIGCONTs a frozen daemon.
    pub fn thaw(&mut self) -> Result<(), PrivateLibvirtdError> {
        let child = self
            .child
            .as_ref()
            .ok_or(PrivateLibvirtdError::NotRunning)?;
        signal(child, Signal::SIGCONT)?;
        self.frozen = false;
        Ok(())
    }

    fn spawn(&mut self) -> Result<(), PrivateLibvirtdError> {
        let dir = self.dir.path();
        for stale in ["libvirt-sock", "libvirt-sock-ro", "libvirt-admin-sock"] {
            let _ = std::fs::remove_file(dir.join("run").join(stale));
        }
        let log = File::options()
            .create(true)
            .append(true)
            .open(dir.join("libvirtd.log"))
            .map_err(PrivateLibvirtdError::Prepare)?;
        let log_err = log.try_clone().map_err(PrivateLibvirtdError::Prepare)?;
        let child = Command::new(libvirtd_binary())
            .arg("--config")
            .arg(dir.join("libvirtd.conf"))
            .arg("--pid-file")
            .arg(dir.join("libvirtd.pid"))
            .env("LIBVIRT_DRIVER_DIR", dir.join("drivers"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .map_err(PrivateLibvirtdError::Spawn)?;
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<(), PrivateLibvirtdError> {
        let socket = self.socket();
        let started = Instant::now();
        loop {
            if UnixStream::connect(&socket).is_ok() {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(PrivateLibvirtdError::Exited {
                        status,
                        log: self.log(),
                    });
                }
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(PrivateLibvirtdError::NotReady {
                    socket,
                    waited: READY_TIMEOUT,
                    log: self.log(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for PrivateLibvirtd {
    fn drop(&mut self) {
        if self.frozen {
            let _ = self.thaw();
        }
        if self.child.is_some() {
            let _ = self.kill();
        }
    }
}

fn signal(child: &Child, signal: Signal) -> Result<(), PrivateLibvirtdError> {
    let pid = i32::try_from(child.id()).map_err(|_| PrivateLibvirtdError::NotRunning)?;
    kill(Pid::from_raw(pid), signal)
        .map_err(|source| PrivateLibvirtdError::Signal { signal, source })
}

fn libvirtd_binary() -> PathBuf {
    let sbin = Path::new("/usr/sbin/libvirtd");
    if sbin.exists() {
        sbin.to_path_buf()
    } else {
        PathBuf::from("libvirtd")
    }
}
