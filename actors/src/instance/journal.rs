//! The journals: what a restarted agent needs to finish an operation whose domain cannot
//! tell it — a build that died before its domain existed, a live migration whose domain left
//! with the guest.
//!
//! # Builds: why
//! An instance's record lives in its domain's metadata, and recovery rebuilds every instance
//! from the domains libvirt has. A build that allocates ports creates them before it defines
//! the domain (it needs their VIFs to write it), and fetching the image and making the disks
//! can take minutes in between. An agent killed in that window left ports bound to this host
//! that nothing recorded: nobody released them (docs/FAULTS.md, note ¹).
//!
//! # What
//! One file per build, `<dir>/<uuid>.json`, written (and synced) before the first port is
//! created (or, for a build given its networking, before anything is made) and removed when
//! the build ends, whatever its outcome: from then on either the domain holds the record
//! (recovery takes over) or the build released everything itself. The entry says whether
//! vireo allocated the ports and names the user-supplied ones, which are unbound rather than
//! deleted; every port vireo creates carries the instance as its `device_id` from its
//! creation on, so the network service finds them all by instance. The entry also holds a
//! token the build writes into the instance directory with its disks. At start-up, recovery
//! releases the ports of each entry whose instance has no domain here
//! ([`crate::network::release_build_ports`]), removes the disks that carry its token
//! ([`crate::storage::InstanceStorage::remove_build`]: fetching the image and making the disks
//! is the longest step before the domain exists) and removes the entry.
//!
//! # Live migrations
//! A live migration's source records the migration in its domain's metadata, and recovery
//! finishes it from there. But libvirt runs a peer-to-peer migration on without its client:
//! an agent stopped long enough finds, at its next start, no domain at all (the guest runs on
//! the destination, libvirt undefined it here), so nothing said the destination waits to be
//! handed the guest, nor that this host still holds its devices, port bindings and disks. So
//! the source also writes its domain's metadata (the record and the in-flight migration) to
//! `<dir>/<uuid>.json` of the live-migration journal before it starts, and removes the entry
//! when the migration is finished or rolled back. At start-up an entry whose instance has no
//! domain here is recovered as the migration's domain would have been (the destination takes
//! the guest over, the source cleans up); one whose domain is here is that domain's.
//!
//! Each journal is a directory per host (under the agent's `state_dir`, never a shared
//! instances path): `builds` and `live-migrations`.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// Why a journal could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// The directory could not be made.
    #[error("creating the journal {path}")]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An entry could not be written (and synced).
    #[error("writing journal entry {path}")]
    Write {
        /// The entry.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An entry could not be removed.
    #[error("removing journal entry {path}")]
    Remove {
        /// The entry.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The directory or an entry could not be read.
    #[error("reading the journal {path}")]
    Read {
        /// The directory or entry.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// An entry is not one this version wrote.
    #[error("journal entry {path} is unreadable")]
    Parse {
        /// The entry.
        path: PathBuf,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// The writer thread (or the task reading the journal) ended without an answer.
    #[error("the journal's writer ended without an answer")]
    TaskLost,
}

/// One build under way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BuildEntry {
    /// The instance.
    pub instance: Uuid,
    /// The host whose build it is (the ports are bound to it).
    pub host: String,
    /// Ports the caller supplied: unbound, never deleted.
    pub user_ports: Vec<Uuid>,
    /// vireo allocated the build's ports (it releases them); false when the caller brought
    /// its networking (Nova's builds: Nova releases their ports itself). Entries written
    /// before this field existed were all allocating builds.
    #[serde(default = "allocating")]
    pub allocated: bool,
    /// The build's token, written into the instance directory with its disks
    /// ([`crate::storage::DiskPlan::build`]): a restart removes the disks that carry it, and
    /// nothing else (a directory shared with another host, or made by another attempt, is
    /// not this build's).
    #[serde(default)]
    pub build: Option<Uuid>,
}

fn allocating() -> bool {
    true
}

/// One live migration under way, as its source started it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LiveMigrationEntry {
    /// The instance.
    pub instance: Uuid,
    /// Its domain's name.
    pub name: String,
    /// Its domain's vireo metadata as the migration saved it: the record, and the live
    /// migration in flight.
    pub metadata: String,
    /// Whether the migration copies the instance's disks (it has disks and the
    /// destination, once its pre-live-migration answered, does not share the instances
    /// directory); None until the destination answered — the migration had not started.
    /// Only what this says lets a recovered source remove its disks: a probe file cannot
    /// tell (the source wrote it in its own directory).
    #[serde(default)]
    pub copied_disks: Option<bool>,
}

/// What one journal holds: an entry per instance.
pub trait JournalEntry: Serialize + serde::de::DeserializeOwned + Send + 'static {
    /// The instance the entry is for (its file's name).
    fn instance(&self) -> Uuid;
}

impl JournalEntry for BuildEntry {
    fn instance(&self) -> Uuid {
        self.instance
    }
}

impl JournalEntry for LiveMigrationEntry {
    fn instance(&self) -> Uuid {
        self.instance
    }
}

/// The journal of one host's builds that allocate ports, until their domain exists.
pub type BuildJournal = Journal<BuildEntry>;

/// The journal of one host's outgoing live migrations, until they are finished or rolled
/// back.
pub type LiveMigrationJournal = Journal<LiveMigrationEntry>;

/// One of a host's journals. Writes and removals go to one writer thread (`vireo-journal`)
/// that commits what has queued up together: each entry written and synced, then the
/// directory synced once for the batch (when it wrote an entry; removals need not be
/// durable), then every caller answered. Operations that start together share one directory
/// sync, and no operation's file work runs on an actor thread or spawns a thread of its own.
#[derive(Debug)]
pub struct Journal<E> {
    dir: PathBuf,
    writer: Option<std::sync::mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
    entry: std::marker::PhantomData<fn() -> E>,
}

/// One change for the writer thread, and where its answer goes.
#[derive(Debug)]
struct Job {
    change: Change,
    reply: tokio::sync::oneshot::Sender<Result<(), JournalError>>,
}

#[derive(Debug)]
enum Change {
    Write { path: PathBuf, text: Vec<u8> },
    Remove { path: PathBuf },
}

/// The most changes one directory sync covers.
const BATCH: usize = 64;

impl<E: JournalEntry> Journal<E> {
    /// The journal in `dir`, created (mode 0700) when missing, with its writer thread.
    pub fn open(dir: impl Into<PathBuf>) -> Result<Self, JournalError> {
        let dir = dir.into();
        std::fs::DirBuilder::new()
            .recursive(true)
            .create(&dir)
            .map_err(|source| JournalError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(
            |source| JournalError::CreateDir {
                path: dir.clone(),
                source,
            },
        )?;
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let synced = dir.clone();
        let thread = std::thread::Builder::new()
            .name("vireo-journal".into())
            .spawn(move || write_batches(&synced, &rx))
            .map_err(|source| JournalError::CreateDir {
                path: dir.clone(),
                source,
            })?;
        Ok(Journal {
            dir,
            writer: Some(tx),
            thread: Some(thread),
            entry: std::marker::PhantomData,
        })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, instance: Uuid) -> PathBuf {
        self.dir.join(format!("{instance}.json"))
    }

    async fn commit(&self, change: Change) -> Result<(), JournalError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.writer
            .as_ref()
            .and_then(|w| w.send(Job { change, reply }).ok())
            .ok_or(JournalError::TaskLost)?;
        answer.await.unwrap_or(Err(JournalError::TaskLost))
    }

    /// Record an operation before it makes what only the entry would remember (a build:
    /// before its first port exists): written to a temporary file, synced, renamed into
    /// place, and the directory synced, so the entry survives a crash.
    pub async fn begin(&self, entry: &E) -> Result<(), JournalError> {
        let path = self.path(entry.instance());
        let text = serde_json::to_vec(entry).map_err(|source| JournalError::Parse {
            path: path.clone(),
            source,
        })?;
        self.commit(Change::Write { path, text }).await
    }

    /// The operation ended: drop its entry (none is fine).
    pub async fn end(&self, instance: Uuid) -> Result<(), JournalError> {
        self.commit(Change::Remove {
            path: self.path(instance),
        })
        .await
    }

    /// The entry of `instance`, if there is one.
    pub async fn read(&self, instance: Uuid) -> Result<Option<E>, JournalError> {
        let path = self.path(instance);
        blocking(move || match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|source| JournalError::Parse { path, source }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(JournalError::Read { path, source }),
        })
        .await
    }

    /// Every entry, by instance; an unreadable entry is returned as its error (and left in
    /// place for an operator), temporary files of an interrupted write are removed.
    pub async fn pending(&self) -> Result<Vec<Result<E, JournalError>>, JournalError> {
        let dir = self.dir.clone();
        blocking(move || {
            let read_dir = std::fs::read_dir(&dir).map_err(|source| JournalError::Read {
                path: dir.clone(),
                source,
            })?;
            let mut paths: Vec<PathBuf> = read_dir.flatten().map(|e| e.path()).collect();
            paths.sort();
            let mut out = Vec::new();
            for path in paths {
                let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if name.ends_with(".json.tmp") {
                    // Never renamed into place: the operation had not started.
                    let _ = std::fs::remove_file(&path);
                    continue;
                }
                if !name.ends_with(".json") {
                    continue;
                }
                out.push(
                    std::fs::read(&path)
                        .map_err(|source| JournalError::Read {
                            path: path.clone(),
                            source,
                        })
                        .and_then(|bytes| {
                            serde_json::from_slice(&bytes).map_err(|source| JournalError::Parse {
                                path: path.clone(),
                                source,
                            })
                        }),
                );
            }
            Ok(out)
        })
        .await
    }
}

impl<E> Drop for Journal<E> {
    fn drop(&mut self) {
        // The writer ends once its queue is closed and drained.
        drop(self.writer.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The writer thread: take what has queued up (at most [`BATCH`]), apply it, sync the
/// directory once, answer.
fn write_batches(dir: &Path, jobs: &std::sync::mpsc::Receiver<Job>) {
    while let Ok(first) = jobs.recv() {
        let mut batch = vec![first];
        while batch.len() < BATCH {
            match jobs.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let mut done: Vec<(Job, Result<(), JournalError>)> = batch
            .into_iter()
            .map(|job| {
                let result = apply(&job.change);
                (job, result)
            })
            .collect();
        // A removal need not be durable (an entry that comes back after a power loss finds
        // its domain, or nothing left to release): only new entries wait for the sync.
        let written = |(job, result): &(Job, Result<(), JournalError>)| {
            result.is_ok() && matches!(job.change, Change::Write { .. })
        };
        if done.iter().any(written) {
            if let Err(source) = std::fs::File::open(dir).and_then(|d| d.sync_all()) {
                // Nothing in the batch is known durable: every caller hears it.
                for (job, result) in &mut done {
                    if result.is_ok() && matches!(job.change, Change::Write { .. }) {
                        *result = Err(JournalError::Write {
                            path: change_path(&job.change).to_owned(),
                            source: std::io::Error::new(source.kind(), source.to_string()),
                        });
                    }
                }
            }
        }
        for (job, result) in done {
            let _ = job.reply.send(result);
        }
    }
}

fn change_path(change: &Change) -> &Path {
    match change {
        Change::Write { path, .. } | Change::Remove { path } => path,
    }
}

fn apply(change: &Change) -> Result<(), JournalError> {
    match change {
        Change::Write { path, text } => {
            let tmp = path.with_extension("json.tmp");
            let write = || -> std::io::Result<()> {
                let mut f = std::fs::File::create(&tmp)?;
                f.write_all(text)?;
                f.sync_all()?;
                std::fs::rename(&tmp, path)
            };
            write().map_err(|source| {
                let _ = std::fs::remove_file(&tmp);
                JournalError::Write {
                    path: path.clone(),
                    source,
                }
            })
        }
        Change::Remove { path } => match std::fs::remove_file(path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(JournalError::Remove {
                path: path.clone(),
                source,
            }),
        },
    }
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, JournalError> + Send + 'static,
) -> Result<T, JournalError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or(Err(JournalError::TaskLost))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(n: u128) -> BuildEntry {
        BuildEntry {
            instance: Uuid::from_u128(n),
            host: "h1".into(),
            user_ports: vec![Uuid::from_u128(100 + n)],
            allocated: true,
            build: Some(Uuid::from_u128(200 + n)),
        }
    }

    #[test]
    fn an_entry_written_before_builds_had_tokens_reads_as_an_allocating_build() {
        let old =
            r#"{"instance":"00000000-0000-0000-0000-000000000001","host":"h1","user_ports":[]}"#;
        let e: BuildEntry = serde_json::from_str(old).unwrap();
        assert!(e.allocated);
        assert_eq!(e.build, None);
    }

    #[tokio::test]
    async fn entries_survive_until_their_build_ends() {
        let d = tempfile::tempdir().unwrap();
        let j = BuildJournal::open(d.path().join("builds")).unwrap();
        j.begin(&entry(1)).await.unwrap();
        j.begin(&entry(2)).await.unwrap();
        // A reopened journal (a restarted agent) reads both back.
        let again = BuildJournal::open(j.dir()).unwrap();
        let pending: Vec<BuildEntry> = again
            .pending()
            .await
            .unwrap()
            .into_iter()
            .map(Result::unwrap)
            .collect();
        assert_eq!(pending, vec![entry(1), entry(2)]);
        again.end(Uuid::from_u128(1)).await.unwrap();
        again.end(Uuid::from_u128(1)).await.unwrap();
        let left: Vec<_> = again.pending().await.unwrap();
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].as_ref().unwrap(), &entry(2));
    }

    #[tokio::test]
    async fn a_live_migration_entry_is_read_back_and_rewritten_in_place() {
        let d = tempfile::tempdir().unwrap();
        let j = LiveMigrationJournal::open(d.path().join("live-migrations")).unwrap();
        let id = Uuid::from_u128(7);
        assert_eq!(j.read(id).await.unwrap(), None);
        let mut e = LiveMigrationEntry {
            instance: id,
            name: "vm".into(),
            metadata: "<vireo:instance/>".into(),
            copied_disks: None,
        };
        j.begin(&e).await.unwrap();
        e.copied_disks = Some(true);
        j.begin(&e).await.unwrap();
        assert_eq!(j.read(id).await.unwrap(), Some(e.clone()));
        assert_eq!(j.pending().await.unwrap().len(), 1);
        // An entry from before the field existed: the copy is unknown.
        let old =
            r#"{"instance":"00000000-0000-0000-0000-000000000007","name":"vm","metadata":""}"#;
        let parsed: LiveMigrationEntry = serde_json::from_str(old).unwrap();
        assert_eq!(parsed.copied_disks, None);
        j.end(id).await.unwrap();
        assert_eq!(j.read(id).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_torn_write_is_dropped_and_a_foreign_entry_reported() {
        let d = tempfile::tempdir().unwrap();
        let j = BuildJournal::open(d.path()).unwrap();
        std::fs::write(d.path().join("x.json.tmp"), b"{\"inst").unwrap();
        std::fs::write(d.path().join("y.json"), b"{\"instance\": 3}").unwrap();
        let pending = j.pending().await.unwrap();
        assert_eq!(pending.len(), 1);
        assert!(matches!(pending[0], Err(JournalError::Parse { .. })));
        assert!(!d.path().join("x.json.tmp").exists());
        assert!(d.path().join("y.json").exists(), "kept for an operator");
    }
}
