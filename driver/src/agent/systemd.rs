//! systemd integration, all of it optional and silent outside systemd.
//!
//! - Notifications (`Type=notify`) through the `sd-notify` crate: `READY=1` once the HTTP
//!   server accepts connections (after the driver recovered the host's instances), `STATUS=`
//!   lines while starting, `STOPPING=1` when a shutdown begins. Without `$NOTIFY_SOCKET` each
//!   is a no-op.
//! - Logging: [`stderr_is_journal`] tells whether stderr is connected to the journal (systemd
//!   sets `$JOURNAL_STREAM` to that stream's `device:inode`), so that `[logging] output =
//!   "auto"` sends events to journald natively (`tracing-journald`: priorities from the
//!   levels, span fields such as the instance uuid as journal fields).
//!
//! Evaluated: `libsystemd` (notify and journal in one crate, but a wider API and more
//! dependencies than the two small crates used here), a hand-written `sd_notify` (a datagram
//! on a unix socket; the crate is that, maintained and tested).

use std::os::fd::AsFd;

use sd_notify::NotifyState;
use tracing::debug;

fn notify(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        debug!(error = %e, "systemd notification not sent");
    }
}

/// Startup finished: the agent serves. `status` is shown by `systemctl status`.
pub fn ready(status: &str) {
    notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A status line for `systemctl status`.
pub fn status(status: &str) {
    notify(&[NotifyState::Status(status)]);
}

/// The shutdown began.
pub fn stopping() {
    notify(&[NotifyState::Stopping, NotifyState::Status("shutting down")]);
}

/// True when `journal_stream` (the value of `$JOURNAL_STREAM`, `device:inode` in decimal)
/// names the file whose device and inode are `dev` and `ino`.
pub fn names_stream(journal_stream: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = journal_stream.split_once(':') else {
        return false;
    };
    d.parse::<u64>().ok() == Some(dev) && i.parse::<u64>().ok() == Some(ino)
}

/// True when this process's stderr is connected to the journal (see the module docs).
pub fn stderr_is_journal() -> bool {
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    let stderr = std::io::stderr();
    match nix::sys::stat::fstat(stderr.as_fd()) {
        Ok(st) => names_stream(&stream, st.st_dev, st.st_ino),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_stream_names_a_device_and_an_inode() {
        assert!(names_stream("64769:123456", 64769, 123456));
        assert!(!names_stream("64769:123456", 64769, 123457));
        assert!(!names_stream("64769:123456", 1, 123456));
        for bad in ["", "64769", "x:1", "1:y", "1:2:3"] {
            assert!(!names_stream(bad, 1, 2), "{bad:?}");
        }
    }

    #[test]
    fn without_a_notify_socket_notifications_are_silent() {
        // The test process was not started by systemd: nothing is sent, nothing fails.
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            ready("serving");
            status("starting");
            stopping();
        }
    }
}
