//! Leak checks for tests: what is on the host whose name carries a given fragment (a test's
//! unique prefix, a port-id fragment), seen from the outside, not through vireo.
//!
//! [`scan`] lists links (sysfs `/sys/class/net`, bridges included), OVS bridges, ports and
//! interfaces (`ovs-vsctl`), and libvirt domains on `qemu:///system` (`virsh`). A missing
//! `ovs-vsctl`/`virsh` or a daemon that does not answer is an error, never an empty list.
//! [`LeakGuard`] runs the check when dropped (also on panic): it first removes the test's
//! declared fixtures, then scans; anything left is removed and, unless the test is already
//! panicking, the guard panics with the list.

use std::fmt;
use std::process::Command;

/// A failed scan.
#[derive(Debug, thiserror::Error)]
pub enum LeakError {
    /// Running a program failed.
    #[error("run {0}")]
    Spawn(&'static str, #[source] std::io::Error),
    /// A program exited with an error.
    #[error("{program} failed: {stderr}")]
    Failed {
        /// The program.
        program: &'static str,
        /// Its stderr.
        stderr: String,
    },
    /// Reading sysfs failed.
    #[error("read /sys/class/net")]
    Sysfs(#[source] std::io::Error),
}

/// What a scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leaks {
    /// Links (any kind).
    pub links: Vec<String>,
    /// OVS bridges.
    pub ovs_bridges: Vec<String>,
    /// OVS ports.
    pub ovs_ports: Vec<String>,
    /// OVS interfaces.
    pub ovs_interfaces: Vec<String>,
    /// libvirt domains (qemu:///system, active or defined).
    pub domains: Vec<String>,
}

impl Leaks {
    /// Nothing found.
    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
            && self.ovs_bridges.is_empty()
            && self.ovs_ports.is_empty()
            && self.ovs_interfaces.is_empty()
            && self.domains.is_empty()
    }
}

impl fmt::Display for Leaks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "links {:?}, OVS bridges {:?}, OVS ports {:?}, OVS interfaces {:?}, domains {:?}",
            self.links, self.ovs_bridges, self.ovs_ports, self.ovs_interfaces, self.domains
        )
    }
}

fn run(program: &'static str, args: &[&str]) -> Result<String, LeakError> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| LeakError::Spawn(program, e))?;
    if !out.status.success() {
        return Err(LeakError::Failed {
            program,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn matching(names: impl IntoIterator<Item = String>, fragments: &[String]) -> Vec<String> {
    let mut v: Vec<String> = names
        .into_iter()
        .filter(|n| fragments.iter().any(|f| n.contains(f.as_str())))
        .collect();
    v.sort();
    v.dedup();
    v
}

fn ovs_names(table: &str) -> Result<Vec<String>, LeakError> {
    let out = run(
        "ovs-vsctl",
        &["--timeout=10", "--bare", "--columns=name", "list", table],
    )?;
    Ok(out
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect())
}

/// Everything on the host whose name contains one of `fragments`.
pub fn scan(fragments: &[String]) -> Result<Leaks, LeakError> {
    let links = std::fs::read_dir("/sys/class/net")
        .map_err(LeakError::Sysfs)?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned());
    let domains = run(
        "virsh",
        &["-c", "qemu:///system", "list", "--all", "--name"],
    )?;
    Ok(Leaks {
        links: matching(links, fragments),
        ovs_bridges: matching(ovs_names("Bridge")?, fragments),
        ovs_ports: matching(ovs_names("Port")?, fragments),
        ovs_interfaces: matching(ovs_names("Interface")?, fragments),
        domains: matching(domains.lines().map(str::trim).map(str::to_owned), fragments),
    })
}

/// Remove everything `leaks` lists (domains, OVS bridges and ports, links). Best effort.
pub fn purge(leaks: &Leaks) {
    for d in &leaks.domains {
        let _ = run("virsh", &["-c", "qemu:///system", "destroy", d]);
        let _ = run("virsh", &["-c", "qemu:///system", "undefine", d]);
    }
    for p in &leaks.ovs_ports {
        let _ = run("ovs-vsctl", &["--timeout=10", "--if-exists", "del-port", p]);
    }
    for b in &leaks.ovs_bridges {
        let _ = run("ovs-vsctl", &["--timeout=10", "--if-exists", "del-br", b]);
    }
    for l in &leaks.links {
        let _ = run("ip", &["link", "del", "dev", l]);
    }
}

/// A test's host fixture, removed by the guard before it scans.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fixture {
    /// A transient or defined domain on qemu:///system.
    Domain(String),
    /// An OVS bridge.
    OvsBridge(String),
    /// A link (Linux bridge, veth, ...).
    Link(String),
}

/// Checks, when dropped, that nothing whose name carries one of its fragments is left.
#[derive(Debug)]
pub struct LeakGuard {
    fragments: Vec<String>,
    fixtures: Vec<Fixture>,
}

impl LeakGuard {
    /// A guard for names containing any of `fragments`.
    pub fn new<I, S>(fragments: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        LeakGuard {
            fragments: fragments.into_iter().map(Into::into).collect(),
            fixtures: Vec::new(),
        }
    }

    /// Also watch names containing `fragment`.
    pub fn watch(&mut self, fragment: impl Into<String>) {
        self.fragments.push(fragment.into());
    }

    /// Declare a fixture the test made itself; the guard removes it before scanning.
    pub fn fixture(&mut self, f: Fixture) {
        self.fixtures.push(f);
    }

    /// Scan now.
    pub fn scan(&self) -> Result<Leaks, LeakError> {
        scan(&self.fragments)
    }

    fn remove_fixtures(&self) {
        for f in self.fixtures.iter().rev() {
            match f {
                Fixture::Domain(d) => {
                    let _ = run("virsh", &["-c", "qemu:///system", "destroy", d]);
                    let _ = run("virsh", &["-c", "qemu:///system", "undefine", d]);
                }
                Fixture::OvsBridge(b) => {
                    let _ = run("ovs-vsctl", &["--timeout=10", "--if-exists", "del-br", b]);
                }
                Fixture::Link(l) => {
                    let _ = run("ip", &["link", "del", "dev", l]);
                }
            }
        }
    }
}

impl Drop for LeakGuard {
    fn drop(&mut self) {
        self.remove_fixtures();
        let panicking = std::thread::panicking();
        match scan(&self.fragments) {
            Ok(leaks) if leaks.is_empty() => {}
            Ok(leaks) => {
                purge(&leaks);
                if !panicking {
                    panic!("leak check: left on the host: {leaks}");
                }
            }
            Err(e) => {
                if !panicking {
                    panic!("leak check could not scan the host: {e}");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matching_filters_and_sorts() {
        let names = ["tapabc", "eth0", "qbrabc", "tapabc"].map(String::from);
        assert_eq!(
            matching(names, &["abc".to_owned()]),
            vec!["qbrabc".to_owned(), "tapabc".to_owned()]
        );
    }
}
