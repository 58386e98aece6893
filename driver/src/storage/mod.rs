//! Instance storage on one host.
//!
//! - [`cache`]: the image cache under `<state_dir>/_base/`: each image fetched once by its id
//!   (a local file or an HTTP(S) URL such as a Glance download URL), checked against its
//!   checksum while it streams, then renamed into place read-only; unused bases age out.
//! - [`disks`]: each instance's disks under `<state_dir>/instances/<uuid>/` (the root disk an
//!   overlay on its base, ephemeral, swap, config drive): the real
//!   [`vireo_actors::storage::InstanceStorage`].
//!
//! Why a cache of its own and not libvirt's storage API: fetching and checking an image is
//! plain I/O on the host (libvirt's volume upload would only relay the same bytes through
//! libvirtd), and the cache must work the same whichever libvirt connection the host uses,
//! including the in-process test driver of the embedded default, which has no storage of
//! its own.

pub mod cache;
pub mod disks;

pub use cache::{
    CacheConfig, CacheError, Checksum, ChecksumError, FetchError, ImageCache, ImageId,
    ImageIdError, ImageRequest, ImageSource, SourceError,
};
pub use disks::{HostStorage, StorageConfig};
