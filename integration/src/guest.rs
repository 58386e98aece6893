//! The bootable test guest (`integration/guest/build-guest.sh`: a Debian kernel and a
//! busybox initramfs that prints its NICs on the serial console) and the console log it
//! writes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::env::StackEnv;
use crate::HarnessError;

/// A built guest.
#[derive(Debug)]
pub struct GuestImage {
    /// The kernel.
    pub kernel: PathBuf,
    /// The initramfs.
    pub initrd: PathBuf,
    /// The kernel command line build-guest.sh suggests.
    pub cmdline: String,
    _dir: tempfile::TempDir,
}

/// A directory QEMU (running as another user) can read and write in.
pub fn open_dir(prefix: &str) -> Result<tempfile::TempDir, HarnessError> {
    let io = |what: &str| {
        let what = what.to_owned();
        move |source| HarnessError::Io { what, source }
    };
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/var/tmp")
        .map_err(io("temporary directory"))?;
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777))
        .map_err(io("chmod temporary directory"))?;
    Ok(d)
}

impl GuestImage {
    /// Build the guest (≈1 s).
    pub fn build() -> Result<GuestImage, HarnessError> {
        let dir = open_dir("vireo-it-guest-")?;
        let out = Command::new("bash")
            .arg(StackEnv::guest_builder())
            .arg(dir.path())
            .output()
            .map_err(|source| HarnessError::Io {
                what: "run build-guest.sh".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(HarnessError::Setup(format!(
                "build-guest.sh failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let cmdline = std::fs::read_to_string(dir.path().join("cmdline"))
            .map_err(|source| HarnessError::Io {
                what: "read the guest's cmdline".into(),
                source,
            })?
            .trim()
            .to_owned();
        Ok(GuestImage {
            kernel: dir.path().join("vmlinuz"),
            initrd: dir.path().join("initrd.img"),
            cmdline,
            _dir: dir,
        })
    }
}

/// One `VIREO-NIC` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestNic {
    /// Interface name in the guest.
    pub name: String,
    /// MAC.
    pub mac: String,
    /// operstate.
    pub operstate: String,
    /// carrier.
    pub carrier: String,
    /// Driver.
    pub driver: String,
}

/// One `VIREO-DISK` line: a virtio disk as the guest sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestDisk {
    /// Device name (`vda`).
    pub name: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// Its first 8 bytes, hex.
    pub head: String,
}

/// What the guest printed up to `VIREO-GUEST-READY`.
#[derive(Debug, Clone, PartialEq)]
pub struct GuestBoot {
    /// The NICs.
    pub nics: Vec<GuestNic>,
    /// The virtio disks.
    pub disks: Vec<GuestDisk>,
    /// The guest wrote its marker to `vda` (`VIREO-DISK-WROTE`).
    pub wrote: bool,
    /// The config drive it mounted: the instance uuid in `meta_data.json` and the start of
    /// `user_data` (non-alphanumerics as `_`); `mount=failed` gives `("", "")`.
    pub config_drive: Option<(String, String)>,
    /// Its uptime at READY (seconds), as printed.
    pub uptime: String,
}

fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|w| w.strip_prefix('=')))
}

/// Parse a console log: the NIC lines of the last boot that reached READY.
pub fn parse_console(text: &str) -> Option<GuestBoot> {
    let mut nics = Vec::new();
    let mut disks = Vec::new();
    let mut wrote = false;
    let mut config_drive = None;
    let mut done = None;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with("VIREO-GUEST-BOOT") {
            nics.clear();
            disks.clear();
            wrote = false;
            config_drive = None;
        } else if line.starts_with("VIREO-DISK-WROTE") {
            wrote = true;
        } else if line.starts_with("VIREO-DISK") {
            disks.push(GuestDisk {
                name: field(line, "name").unwrap_or("").to_owned(),
                bytes: field(line, "bytes")
                    .and_then(|b| b.parse().ok())
                    .unwrap_or(0),
                head: field(line, "head").unwrap_or("").to_owned(),
            });
        } else if line.starts_with("VIREO-CONFIG-DRIVE") {
            config_drive = Some((
                field(line, "uuid").unwrap_or("").to_owned(),
                field(line, "user_data").unwrap_or("").to_owned(),
            ));
        } else if line.starts_with("VIREO-NIC") {
            nics.push(GuestNic {
                name: field(line, "name").unwrap_or("").to_owned(),
                mac: field(line, "mac").unwrap_or("").to_owned(),
                operstate: field(line, "operstate").unwrap_or("").to_owned(),
                carrier: field(line, "carrier").unwrap_or("").to_owned(),
                driver: field(line, "driver").unwrap_or("").to_owned(),
            });
        } else if line.starts_with("VIREO-GUEST-READY") {
            done = Some(GuestBoot {
                nics: nics.clone(),
                disks: disks.clone(),
                wrote,
                config_drive: config_drive.clone(),
                uptime: field(line, "uptime").unwrap_or("").to_owned(),
            });
        }
    }
    done
}

/// How many times the guest has printed `VIREO-GUEST-BOOT`.
pub fn boots(text: &str) -> usize {
    text.lines()
        .filter(|l| l.trim().starts_with("VIREO-GUEST-BOOT"))
        .count()
}

/// Poll `log` until the `n`-th boot reached READY or `within` passed.
pub async fn wait_ready(log: &Path, n: usize, within: Duration) -> Result<GuestBoot, HarnessError> {
    let deadline = Instant::now() + within;
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if boots(&text) >= n {
            if let Some(b) = parse_console(&text) {
                let readies = text
                    .lines()
                    .filter(|l| l.trim().starts_with("VIREO-GUEST-READY"))
                    .count();
                if readies >= n {
                    return Ok(b);
                }
            }
        }
        if Instant::now() >= deadline {
            let tail: Vec<&str> = text.lines().rev().take(10).collect();
            return Err(HarnessError::Setup(format!(
                "guest boot {n} not READY within {within:?} ({}); console tail: {:?}",
                log.display(),
                tail
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_lines_of_the_last_ready_boot() {
        let text = "junk\nVIREO-GUEST-BOOT kernel=6.1\n\
            VIREO-NIC name=eth0 mac=fa:16:3e:00:00:01 operstate=up carrier=1 driver=virtio_net\n\
            VIREO-GUEST-READY nics=1 uptime=5.60\n\
            VIREO-GUEST-BOOT kernel=6.1\n\
            VIREO-NIC name=eth0 mac=fa:16:3e:00:00:02 operstate=up carrier=1 driver=virtio_net\n";
        let b = parse_console(text).unwrap();
        // The second boot has not reached READY: the first one's lines.
        assert_eq!(b.nics.len(), 1);
        assert_eq!(b.nics[0].mac, "fa:16:3e:00:00:01");
        assert_eq!(b.uptime, "5.60");
        assert_eq!(boots(text), 2);
        assert!(parse_console("VIREO-GUEST-BOOT\n").is_none());
    }
}
