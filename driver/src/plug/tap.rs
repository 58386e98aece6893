//! Persistent tap creation for the pre-created domain form.
//!
//! A tap cannot be created through rtnetlink (the kernel refuses `tun` in RTM_NEWLINK); it
//! needs the TUNSETIFF and TUNSETPERSIST ioctls on `/dev/net/tun`. vireo keeps `unsafe` out of
//! this crate, so the ioctls go through the `tun-rs` crate's safe API (it resolves alongside
//! virt's pinned libc and uses the same nix 0.31). The tap is created with `IFF_TAP |
//! IFF_NO_PI` (what `ip tuntap add mode tap` makes), made persistent, and the creating file
//! descriptor is closed, so libvirt can attach to it (`<target dev=... managed='no'/>`).
//! MTU, MAC and up state are set afterwards through netlink.

use std::io;

/// Why a tap could not be created.
#[derive(Debug, thiserror::Error)]
pub enum TapError {
    /// TUNSETIFF failed (no `/dev/net/tun`, no CAP_NET_ADMIN, name in use by a non-tap, ...).
    #[error("create tap {0}")]
    Create(String, #[source] io::Error),
    /// TUNSETPERSIST failed; the tap vanished with its descriptor.
    #[error("make tap {0} persistent")]
    Persist(String, #[source] io::Error),
    /// The blocking task running the ioctls died.
    #[error("tap creation task for {0} failed")]
    Task(String, #[source] tokio::task::JoinError),
}

/// Create the persistent tap `name`. Runs the ioctls on tokio's blocking pool.
pub async fn create_persistent_tap(name: &str) -> Result<(), TapError> {
    let owned = name.to_owned();
    tokio::task::spawn_blocking(move || create_blocking(&owned))
        .await
        .map_err(|e| TapError::Task(name.to_owned(), e))?
}

fn create_blocking(name: &str) -> Result<(), TapError> {
    let dev = tun_rs::DeviceBuilder::new()
        .name(name)
        .layer(tun_rs::Layer::L2)
        .inherit_enable_state()
        .build_sync()
        .map_err(|e| TapError::Create(name.to_owned(), e))?;
    dev.persist()
        .map_err(|e| TapError::Persist(name.to_owned(), e))?;
    // Dropping `dev` closes the descriptor; the persistent tap stays.
    drop(dev);
    Ok(())
}
