//! Typed domain operations on [`LibvirtHandle`], each one worker call that looks the domain up
//! by UUID (no libvirt object outlives a call).

use std::sync::atomic::Ordering;

use tracing::instrument;
use uuid::Uuid;
use virt::connect::Connect;
use virt::domain::{Domain, MigrateParameters};
use virt::error::Error as VirtError;
use virt::sys;

use super::error::{class_of, Class, LibvirtError};
use super::ffi;
use super::handle::LibvirtHandle;
use super::types::{
    Affect, DomainId, DomainInfo, DomainState, DomainSummary, JobProgress, Metadata, NodeFacts,
};

/// How [`LibvirtHandle::start_paused`] started the domain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PausedStart {
    /// With `VIR_DOMAIN_START_PAUSED`: no guest instruction ran.
    Paused,
    /// The driver has no `START_PAUSED`: started, then suspended at once.
    StartedThenSuspended,
}

/// `VIR_DOMAIN_METADATA_ELEMENT`.
const METADATA_ELEMENT: i32 = sys::VIR_DOMAIN_METADATA_ELEMENT as i32;

/// Flag sets tried in order by [`LibvirtHandle::undefine`]: drivers reject flags they do not
/// know with `VIR_ERR_INVALID_ARG` (the test driver knows only the first two).
const UNDEFINE_FLAG_SETS: [u32; 3] = [
    sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE
        | sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA
        | sys::VIR_DOMAIN_UNDEFINE_CHECKPOINTS_METADATA
        | sys::VIR_DOMAIN_UNDEFINE_NVRAM,
    sys::VIR_DOMAIN_UNDEFINE_MANAGED_SAVE | sys::VIR_DOMAIN_UNDEFINE_SNAPSHOTS_METADATA,
    0,
];

fn lookup(conn: &Connect, uuid: Uuid) -> Result<Domain, VirtError> {
    conn.lookup_domain_by_uuid(uuid)
}

/// True unless the domain is shut off or crashed (what [`LibvirtHandle::destroy_if_running`]
/// has to stop: running, paused, suspended to memory, or a state libvirt cannot name).
fn runs(dom: &Domain) -> Result<bool, VirtError> {
    let state = DomainState::from_virt(dom.info()?.state);
    Ok(!matches!(
        state,
        DomainState::Shutoff | DomainState::Crashed
    ))
}

fn is_class(error: &VirtError, class: Class) -> bool {
    class_of(error.code().to_raw()) == class
}

fn domain_id(dom: &Domain) -> Result<DomainId, VirtError> {
    Ok(DomainId {
        uuid: dom.uuid()?,
        name: dom.name()?,
    })
}

/// True when a device with `alias` is in any definition `affect` covers.
fn alias_present(dom: &Domain, alias: &str, affect: Affect) -> Result<bool, VirtError> {
    let element = format!("<alias name='{alias}'/>");
    let xml_flags: &[u32] = match affect {
        Affect::Current | Affect::Live => &[0],
        Affect::Config => &[sys::VIR_DOMAIN_XML_INACTIVE],
        Affect::LiveAndConfig => &[0, sys::VIR_DOMAIN_XML_INACTIVE],
    };
    for flags in xml_flags {
        if dom.xml_desc(*flags)?.contains(&element) {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Every domain on `conn` (domains that vanish while listing are left out).
pub(crate) fn list_domains(conn: &Connect) -> Result<Vec<DomainSummary>, VirtError> {
    let mut out = Vec::new();
    for dom in conn.list_all_domains(0)? {
        let summary = (|| {
            let info = dom.info()?;
            Ok::<_, VirtError>(DomainSummary {
                uuid: dom.uuid()?,
                name: dom.name()?,
                active: dom.is_active()?,
                state: DomainState::from_virt(info.state),
            })
        })();
        match summary {
            Ok(summary) => out.push(summary),
            Err(e) if is_class(&e, Class::NoDomain) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Maps an error of `define`/`create`: libvirt reports a name or UUID clash as
/// `VIR_ERR_DOM_EXIST` or as `VIR_ERR_OPERATION_FAILED` "domain '..' already exists with uuid
/// ..". The latter is told apart by its (untranslated, C-locale) message; under another locale
/// it stays [`LibvirtError::Other`] with code and message kept.
fn map_define(what: &'static str, error: VirtError) -> LibvirtError {
    if error.code().to_raw() == sys::VIR_ERR_OPERATION_FAILED && error.message().contains("already")
    {
        return LibvirtError::Conflict {
            what,
            source: error,
        };
    }
    LibvirtError::from_virt(what, error)
}

impl LibvirtHandle {
    /// Defines (or redefines) a persistent domain; with `validate`, libvirt checks the XML
    /// against its schema (`VIR_DOMAIN_DEFINE_VALIDATE`).
    #[instrument(level = "debug", skip_all, fields(validate))]
    pub async fn define_xml(
        &self,
        xml: impl Into<String>,
        validate: bool,
    ) -> Result<DomainId, LibvirtError> {
        let xml = xml.into();
        let flags = if validate {
            sys::VIR_DOMAIN_DEFINE_VALIDATE
        } else {
            0
        };
        self.submit(
            "define_xml",
            self.config().call_timeout(),
            move |conn| {
                // In-process drivers had their schema tables built when the connection
                // opened (`schema::prime`), so validating defines may run concurrently.
                let dom = conn.define_domain_xml_flags(&xml, flags);
                domain_id(&dom?)
            },
            map_define,
        )
        .await
    }

    /// Creates and starts a transient domain (`virDomainCreateXML`).
    #[instrument(level = "debug", skip_all)]
    pub async fn create_xml(&self, xml: impl Into<String>) -> Result<DomainId, LibvirtError> {
        let xml = xml.into();
        self.submit(
            "create_xml",
            self.config().call_timeout(),
            move |conn| {
                let dom = conn.create_domain_xml(&xml, 0)?;
                domain_id(&dom)
            },
            map_define,
        )
        .await
    }

    /// Undefines a domain, removing its managed-save image, snapshot and checkpoint metadata
    /// and NVRAM too (falling back to fewer flags on drivers that reject some).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn undefine(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("undefine", move |conn| {
            let dom = lookup(conn, uuid)?;
            let mut result = Ok(());
            for flags in UNDEFINE_FLAG_SETS {
                result = dom.undefine_flags(flags);
                match &result {
                    Err(e) if is_class(e, Class::InvalidArgument) => continue,
                    _ => break,
                }
            }
            result
        })
        .await
    }

    /// Starts a defined domain; with `paused`, its CPUs stay stopped
    /// (`VIR_DOMAIN_START_PAUSED`). A driver that cannot start paused (it rejects the flag with
    /// `VIR_ERR_INVALID_ARG`, e.g. the test driver, or reports no support) gives
    /// [`LibvirtError::Unsupported`], so the caller can choose its fallback.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn start(&self, uuid: Uuid, paused: bool) -> Result<(), LibvirtError> {
        let flags = if paused {
            sys::VIR_DOMAIN_START_PAUSED
        } else {
            0
        };
        self.submit(
            "start",
            self.config().call_timeout(),
            move |conn| lookup(conn, uuid)?.create_with_flags(flags),
            move |what, error| {
                if paused && is_class(&error, Class::InvalidArgument) {
                    LibvirtError::Unsupported {
                        what,
                        source: error,
                    }
                } else {
                    LibvirtError::from_virt(what, error)
                }
            },
        )
        .await
    }

    /// Starts the domain paused (`VIR_DOMAIN_START_PAUSED`). A driver that refuses the flag
    /// (libvirt's test driver) gets a start and an immediate suspend in the same worker call,
    /// and is remembered, so later paused starts on this handle do not fail a call first.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn start_paused(&self, uuid: Uuid) -> Result<PausedStart, LibvirtError> {
        let refused = self.start_paused_refused().load(Ordering::Relaxed);
        let outcome = self
            .call("start", move |conn| {
                let dom = lookup(conn, uuid)?;
                if !refused {
                    match dom.create_with_flags(sys::VIR_DOMAIN_START_PAUSED) {
                        Ok(_) => return Ok(PausedStart::Paused),
                        Err(e) if is_class(&e, Class::InvalidArgument) => {}
                        Err(e) => return Err(e),
                    }
                }
                dom.create_with_flags(0)?;
                dom.suspend()?;
                Ok(PausedStart::StartedThenSuspended)
            })
            .await?;
        if outcome == PausedStart::StartedThenSuspended {
            self.start_paused_refused().store(true, Ordering::Relaxed);
        }
        Ok(outcome)
    }

    /// Stops the domain at once (`virDomainDestroy`) if it runs, in one worker call: `false`
    /// when there was nothing to stop (no such domain, shut off, crashed) or it stopped by
    /// itself while being destroyed.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn destroy_if_running(&self, uuid: Uuid) -> Result<bool, LibvirtError> {
        self.call("destroy", move |conn| {
            let dom = match lookup(conn, uuid) {
                Err(e) if is_class(&e, Class::NoDomain) => return Ok(false),
                other => other?,
            };
            if !runs(&dom)? {
                return Ok(false);
            }
            match dom.destroy() {
                Ok(()) => Ok(true),
                // It may have stopped by itself in between.
                Err(e) => match runs(&dom) {
                    Ok(false) => Ok(true),
                    Err(gone) if is_class(&gone, Class::NoDomain) => Ok(true),
                    _ => Err(e),
                },
            }
        })
        .await
    }

    /// Stops a domain at once (`virDomainDestroy`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn destroy(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("destroy", move |conn| lookup(conn, uuid)?.destroy())
            .await
    }

    /// Asks the guest to shut down (`virDomainShutdown`); returns when the request is sent.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn shutdown(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("shutdown", move |conn| lookup(conn, uuid)?.shutdown())
            .await
    }

    /// Asks the guest to reboot (`virDomainReboot`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn reboot(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("reboot", move |conn| lookup(conn, uuid)?.reboot(0))
            .await
    }

    /// Saves the guest's memory to libvirt's managed-save image and stops it
    /// (`virDomainManagedSave`); the next start restores it.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn managed_save(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("managed-save", move |conn| {
            lookup(conn, uuid)?.managed_save(0)
        })
        .await
    }

    /// Drops the managed-save image, if there is one (`virDomainManagedSaveRemove`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn managed_save_remove(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("managed-save-remove", move |conn| {
            let d = lookup(conn, uuid)?;
            if d.has_managed_save(0)? {
                d.managed_save_remove(0)?;
            }
            Ok(())
        })
        .await
    }

    /// Resets the domain like a reset button (`virDomainReset`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn reset(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("reset", move |conn| lookup(conn, uuid)?.reset())
            .await
    }

    /// Pauses the domain's CPUs (`virDomainSuspend`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn suspend(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("suspend", move |conn| lookup(conn, uuid)?.suspend())
            .await
    }

    /// Resumes a paused domain (`virDomainResume`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn resume(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("resume", move |conn| lookup(conn, uuid)?.resume())
            .await
    }

    /// State, memory, vCPUs and CPU time (`virDomainGetInfo`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn info(&self, uuid: Uuid) -> Result<DomainInfo, LibvirtError> {
        self.call("info", move |conn| {
            lookup(conn, uuid)?.info().map(DomainInfo::from)
        })
        .await
    }

    /// True when the domain runs or is paused (`virDomainIsActive`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn is_active(&self, uuid: Uuid) -> Result<bool, LibvirtError> {
        self.call("is_active", move |conn| lookup(conn, uuid)?.is_active())
            .await
    }

    /// The domain's XML; with `inactive`, the persistent definition rather than the live one.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn xml_desc(&self, uuid: Uuid, inactive: bool) -> Result<String, LibvirtError> {
        let flags = if inactive {
            sys::VIR_DOMAIN_XML_INACTIVE
        } else {
            0
        };
        self.call("xml_desc", move |conn| lookup(conn, uuid)?.xml_desc(flags))
            .await
    }

    /// The running domain's XML as a migration's destination is given it
    /// (`VIR_DOMAIN_XML_MIGRATABLE`: without what only this host's libvirt adds).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn migratable_xml(&self, uuid: Uuid) -> Result<String, LibvirtError> {
        self.call("xml_desc", move |conn| {
            lookup(conn, uuid)?.xml_desc(sys::VIR_DOMAIN_XML_MIGRATABLE)
        })
        .await
    }

    /// The host: hypervisor, CPUs, memory (what Nova's resource tracker asks a driver).
    #[instrument(level = "debug", skip(self))]
    pub async fn node_facts(&self) -> Result<NodeFacts, LibvirtError> {
        self.call("node_info", |conn| {
            let node = conn.node_info()?;
            Ok(NodeFacts {
                hypervisor_type: conn.driver_type()?,
                hypervisor_version: u64::from(conn.hyp_version()?),
                hostname: conn.hostname()?,
                cpu_model: node.model,
                cpu_mhz: node.mhz,
                cpus: node.cpus,
                topology: [node.nodes, node.sockets, node.cores, node.threads],
                memory_kib: node.memory,
            })
        })
        .await
    }

    /// Every domain, active or not.
    #[instrument(level = "debug", skip(self))]
    pub async fn list_all(&self) -> Result<Vec<DomainSummary>, LibvirtError> {
        self.call("list_all", list_domains).await
    }

    /// Stores `metadata` as a metadata element of the domain (replacing the element with the
    /// same namespace URI).
    #[instrument(level = "debug", skip(self, metadata), fields(%uuid, uri = %metadata.uri))]
    pub async fn set_metadata(
        &self,
        uuid: Uuid,
        metadata: Metadata,
        affect: Affect,
    ) -> Result<(), LibvirtError> {
        self.call("set_metadata", move |conn| {
            lookup(conn, uuid)?.set_metadata(
                METADATA_ELEMENT,
                Some(&metadata.xml),
                Some(&metadata.key),
                Some(&metadata.uri),
                affect.flags(),
            )
        })
        .await
    }

    /// Writes the metadata element to the persistent definition, and to the live domain too
    /// when it runs (`virDomainIsActive`, then `virDomainSetMetadata`, in one worker call).
    #[instrument(level = "debug", skip(self, metadata), fields(%uuid))]
    pub async fn save_metadata(&self, uuid: Uuid, metadata: Metadata) -> Result<(), LibvirtError> {
        self.call("set_metadata", move |conn| {
            let dom = lookup(conn, uuid)?;
            let affect = if dom.is_active()? {
                Affect::LiveAndConfig
            } else {
                Affect::Config
            };
            dom.set_metadata(
                METADATA_ELEMENT,
                Some(&metadata.xml),
                Some(&metadata.key),
                Some(&metadata.uri),
                affect.flags(),
            )
        })
        .await
    }

    /// Removes the metadata element with namespace `uri` (no error if there is none).
    #[instrument(level = "debug", skip(self, uri), fields(%uuid))]
    pub async fn remove_metadata(
        &self,
        uuid: Uuid,
        uri: impl Into<String>,
        affect: Affect,
    ) -> Result<(), LibvirtError> {
        let uri = uri.into();
        self.call("remove_metadata", move |conn| {
            lookup(conn, uuid)?.set_metadata(
                METADATA_ELEMENT,
                None,
                None,
                Some(&uri),
                affect.flags(),
            )
        })
        .await
    }

    /// The metadata element with namespace `uri`, or `None` when the domain has none.
    #[instrument(level = "debug", skip(self, uri), fields(%uuid))]
    pub async fn get_metadata(
        &self,
        uuid: Uuid,
        uri: impl Into<String>,
        affect: Affect,
    ) -> Result<Option<String>, LibvirtError> {
        let uri = uri.into();
        self.call("get_metadata", move |conn| {
            match lookup(conn, uuid)?.metadata(METADATA_ELEMENT, Some(&uri), affect.flags()) {
                Ok(xml) => Ok(Some(xml)),
                Err(e) if e.code().to_raw() == sys::VIR_ERR_NO_DOMAIN_METADATA => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await
    }

    /// Attaches a device described by `xml` (`virDomainAttachDeviceFlags`).
    #[instrument(level = "debug", skip(self, xml), fields(%uuid))]
    pub async fn attach_device(
        &self,
        uuid: Uuid,
        xml: impl Into<String>,
        affect: Affect,
    ) -> Result<(), LibvirtError> {
        let xml = xml.into();
        self.call("attach_device", move |conn| {
            lookup(conn, uuid)?.attach_device_flags(&xml, affect.flags())
        })
        .await
    }

    /// Starts detaching the device with `alias` (`virDomainDetachDeviceAlias`). For a live
    /// domain the removal finishes when [`super::LibvirtEvent::DeviceRemoved`] arrives.
    ///
    /// No device with that alias in the definitions `affect` covers gives
    /// [`LibvirtError::NoDevice`]. (QEMU and the test driver report that as
    /// `VIR_ERR_INTERNAL_ERROR`; the layer then reads the domain XML to tell it apart from other
    /// internal errors.)
    #[instrument(level = "debug", skip(self, alias), fields(%uuid))]
    pub async fn detach_device_alias(
        &self,
        uuid: Uuid,
        alias: impl Into<String>,
        affect: Affect,
    ) -> Result<(), LibvirtError> {
        let alias = alias.into();
        let what = "detach_device_alias";
        self.call(what, move |conn| {
            let dom = lookup(conn, uuid)?;
            match ffi::detach_device_alias(&dom, &alias, affect.flags()) {
                Ok(()) => Ok(Ok(())),
                Err(e)
                    if e.code().to_raw() == sys::VIR_ERR_INTERNAL_ERROR
                        && !alias_present(&dom, &alias, affect)? =>
                {
                    Ok(Err(LibvirtError::NoDevice { what, source: e }))
                }
                Err(e) => Err(e),
            }
        })
        .await?
    }

    /// True while the running domain's live definition still has a device with `alias` (a
    /// detach of a live device finishes when the guest released it).
    #[instrument(level = "debug", skip(self, alias), fields(%uuid))]
    pub async fn has_live_device(
        &self,
        uuid: Uuid,
        alias: impl Into<String>,
    ) -> Result<bool, LibvirtError> {
        let alias = alias.into();
        self.call("has_live_device", move |conn| {
            alias_present(&lookup(conn, uuid)?, &alias, Affect::Live)
        })
        .await
    }

    /// Migrates the domain peer-to-peer to `dest_uri` (`virDomainMigrateToURI3`; `flags` are
    /// `VIR_MIGRATE_*`, `VIR_MIGRATE_PEER2PEER` is added). Uses `migrate_timeout_ms`; a driver
    /// without migration (the test driver) gives [`LibvirtError::Unsupported`].
    #[instrument(level = "debug", skip(self, params), fields(%uuid, %dest_uri))]
    pub async fn migrate(
        &self,
        uuid: Uuid,
        dest_uri: String,
        flags: u32,
        params: MigrateParameters,
    ) -> Result<(), LibvirtError> {
        let flags = flags | sys::VIR_MIGRATE_PEER2PEER;
        self.call_with_timeout("migrate", self.config().migrate_timeout(), move |conn| {
            lookup(conn, uuid)?.migrate_to_uri3(Some(&dest_uri), params, flags)
        })
        .await
    }

    /// The domain's current job's progress (`virDomainGetJobInfo`).
    ///
    /// Not `virDomainGetJobStats` through `virt` 0.5: its `Domain::job_stats` makes a `Vec`
    /// of libvirt's parameter array with `Vec::from_raw_parts`, which is undefined behaviour
    /// when libvirt returns no parameters (a null array: a job that just ended or was aborted)
    /// and aborted the process in a debug build (CI, a live migration aborted by its timeout).
    /// The job info holds every figure vireo shows: data, memory and disk (file) totals and
    /// what remains.
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn job_progress(&self, uuid: Uuid) -> Result<JobProgress, LibvirtError> {
        self.call("job_info", move |conn| {
            let s = lookup(conn, uuid)?.job_info()?;
            Ok(JobProgress {
                active: s.r#type != sys::VIR_DOMAIN_JOB_NONE as i32,
                data_total: s.data_total,
                data_remaining: s.data_remaining,
                mem_total: s.mem_total,
                mem_remaining: s.mem_remaining,
                disk_total: s.disk_total,
                disk_remaining: s.disk_remaining,
            })
        })
        .await
    }

    /// Aborts the domain's current job, e.g. a migration (`virDomainAbortJob`).
    #[instrument(level = "debug", skip(self), fields(%uuid))]
    pub async fn abort_job(&self, uuid: Uuid) -> Result<(), LibvirtError> {
        self.call("abort_job", move |conn| {
            ffi::abort_job(&lookup(conn, uuid)?)
        })
        .await
    }
}
