//! The image cache: one read-only base file per image under `<state_dir>/_base/<image id>`.
//!
//! An image is fetched the first time an instance asks for it, from a local file or an HTTP(S)
//! URL (a Glance download URL takes the token in `X-Auth-Token`). It streams into a temporary
//! file in the cache directory while its sha256 or md5 is computed, so a corrupt or truncated
//! image is caught before anything can use it; only then is it made read-only and renamed to
//! its final name, so a base file that exists is always whole and checked. A failed fetch
//! leaves nothing behind: the temporary file is removed with the error. Concurrent requests
//! for one image share one fetch and its outcome.
//!
//! Each use of a base sets its modification time: that is the "last used" time eviction reads.
//! [`ImageCache::evict`] removes the bases not used for [`CacheConfig::remove_unused_after`]
//! (Nova's `remove_unused_original_minimum_age_seconds`, default one day) and not in the set
//! of images the caller's instances use; a fetch under way is never touched.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use futures::future::{BoxFuture, FutureExt, Shared};
use md5::Md5;

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use vireo_actors::storage::{Checksum, ChecksumError, ImageId, ImageIdError};

/// The prefix of a fetch's temporary file in the cache directory.
const TEMP_PREFIX: &str = ".fetch-";
/// Read and write unit of a fetch.
const CHUNK: usize = 1 << 20;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// A file on this host.
    File(PathBuf),
    /// An HTTP(S) URL.
    Http(reqwest::Url),
}

impl ImageSource {
    /// An absolute path, a `file://` URL or an `http(s)://` URL.
    pub fn parse(s: &str) -> Result<ImageSource, SourceError> {
        if s.starts_with('/') {
            return Ok(ImageSource::File(PathBuf::from(s)));
        }
        let url = reqwest::Url::parse(s).map_err(|source| SourceError::Url {
            source_text: s.to_owned(),
            source,
        })?;
        match url.scheme() {
            "http" | "https" => Ok(ImageSource::Http(url)),
            "file" => url
                .to_file_path()
                .map(ImageSource::File)
                .map_err(|()| SourceError::Unsupported(s.to_owned())),
            _ => Err(SourceError::Unsupported(s.to_owned())),
        }
    }
}

impl fmt::Display for ImageSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageSource::File(p) => write!(f, "{}", p.display()),
            ImageSource::Http(u) => write!(f, "{u}"),
        }
    }
}

/// Why a string is not an image source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Neither an absolute path nor a URL.
    #[error("image source {source_text:?}: not an absolute path or a URL")]
    Url {
        /// The text given.
        source_text: String,
        /// The URL parser's error.
        #[source]
        source: url::ParseError,
    },
    /// A URL of another scheme than http, https and file.
    #[error("image source {0:?}: only http, https and file URLs")]
    Unsupported(String),
}

/// One image an instance asks for.
#[derive(Clone)]
pub struct ImageRequest {
    /// Its id: the base file's name.
    pub id: ImageId,
    /// Where to fetch it from when the cache does not hold it.
    pub source: ImageSource,
    /// The checksum the fetched bytes must have (none: taken as they come).
    pub checksum: Option<Checksum>,
    /// Sent as `X-Auth-Token` with an HTTP fetch (a Glance token).
    pub token: Option<String>,
}

impl fmt::Debug for ImageRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageRequest")
            .field("id", &self.id)
            .field("source", &self.source)
            .field("checksum", &self.checksum)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The cache's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    /// The cache directory (`<state_dir>/_base`).
    pub dir: PathBuf,
    /// A base no instance uses is removed once it has not been used for this long.
    pub remove_unused_after: Duration,
    /// Connect timeout of an HTTP fetch.
    pub connect_timeout: Duration,
    /// An HTTP fetch that receives nothing for this long fails.
    pub read_timeout: Duration,
}

impl CacheConfig {
    /// The cache of `state_dir` with Nova's defaults: bases unused for a day go, 10 s to
    /// connect, 60 s of silence fails a fetch.
    pub fn in_state_dir(state_dir: &Path) -> CacheConfig {
        CacheConfig {
            dir: state_dir.join("_base"),
            remove_unused_after: Duration::from_secs(86_400),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(60),
        }
    }
}

/// Why one fetch failed (shared by every request that waited for it).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The temporary file could not be created in the cache directory.
    #[error("create a temporary file in {}", dir.display())]
    CreateTemp {
        /// The cache directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The source file could not be opened or read.
    #[error("read {}", path.display())]
    ReadFile {
        /// The source file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP request failed (connection, timeout, or the body broke off).
    #[error("GET {url}")]
    Http {
        /// The URL.
        url: reqwest::Url,
        /// The client's error.
        #[source]
        source: reqwest::Error,
    },
    /// The server answered with an error status.
    #[error("GET {url}: HTTP {status}")]
    Status {
        /// The URL.
        url: reqwest::Url,
        /// The status code.
        status: u16,
    },
    /// Writing the temporary file failed.
    #[error("write {}", path.display())]
    Write {
        /// The temporary file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes fetched do not have the checksum asked for.
    #[error("{bytes} bytes fetched have {algorithm} {actual}, want {expected}", algorithm = expected.algorithm())]
    ChecksumMismatch {
        /// The checksum asked for.
        expected: Checksum,
        /// The digest of what came.
        actual: String,
        /// How many bytes came.
        bytes: u64,
    },
    /// The checked file could not be made read-only or renamed into place.
    #[error("put the base in place at {}", path.display())]
    Install {
        /// The base's final path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// The cache's errors.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    /// The cache directory could not be created or read.
    #[error("image cache directory {}", path.display())]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP client could not be built.
    #[error("image cache HTTP client")]
    Client(#[source] reqwest::Error),
    /// Fetching an image failed; nothing of it is left in the cache.
    #[error("fetch image {id} from {from}")]
    Fetch {
        /// The image.
        id: ImageId,
        /// Its source.
        from: String,
        /// Why.
        #[source]
        source: Arc<FetchError>,
    },
    /// A base could not be removed.
    #[error("remove {}", path.display())]
    Remove {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

type Fetching = Shared<BoxFuture<'static, Result<PathBuf, Arc<FetchError>>>>;

/// The image cache of one host.
#[derive(Debug)]
pub struct ImageCache {
    config: CacheConfig,
    http: reqwest::Client,
    /// Fetches under way, by image id: a second request for one joins the first.
    fetching: Mutex<HashMap<ImageId, Fetching>>,
}

impl ImageCache {
    /// The cache in `config.dir`, created when missing, mode 0711: QEMU, another user under
    /// `qemu:///system`, opens a base (mode 0444) by path as an overlay's backing file, but
    /// nobody lists what the host caches.
    pub fn new(config: CacheConfig) -> Result<Arc<ImageCache>, CacheError> {
        let dir_error = |source| CacheError::Dir {
            path: config.dir.clone(),
            source,
        };
        std::fs::create_dir_all(&config.dir).map_err(dir_error)?;
        std::fs::set_permissions(&config.dir, std::fs::Permissions::from_mode(0o711))
            .map_err(dir_error)?;
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .read_timeout(config.read_timeout)
            .build()
            .map_err(CacheError::Client)?;
        Ok(Arc::new(ImageCache {
            config,
            http,
            fetching: Mutex::new(HashMap::new()),
        }))
    }

    /// The cache's settings.
    pub fn config(&self) -> &CacheConfig {
        &self.config
    }

    /// Where image `id`'s base is (or will be).
    pub fn path(&self, id: &ImageId) -> PathBuf {
        self.config.dir.join(id.as_str())
    }

    /// The base of `req.id`, fetched and checked first unless the cache holds it; marks it
    /// used now.
    pub async fn fetch(self: &Arc<Self>, req: &ImageRequest) -> Result<PathBuf, CacheError> {
        let path = self.path(&req.id);
        if touch(&path) {
            return Ok(path);
        }
        let (fetch, leader) = {
            let mut fetching = self.lock();
            match fetching.get(&req.id) {
                Some(f) => (f.clone(), false),
                None => {
                    let f = self.clone().download(req.clone()).boxed().shared();
                    fetching.insert(req.id.clone(), f.clone());
                    (f, true)
                }
            }
        };
        let result = fetch.await;
        if leader {
            self.lock().remove(&req.id);
        }
        result.map_err(|source| CacheError::Fetch {
            id: req.id.clone(),
            from: req.source.to_string(),
            source,
        })
    }

    /// Remove every base unused for [`CacheConfig::remove_unused_after`] whose image is not
    /// in `in_use`, and what a fetch interrupted by a crash left; returns the images removed.
    /// Nothing a fetch under way is writing is touched.
    pub fn evict(&self, in_use: &BTreeSet<ImageId>) -> Result<Vec<ImageId>, CacheError> {
        let dir = &self.config.dir;
        let entries = std::fs::read_dir(dir).map_err(|source| CacheError::Dir {
            path: dir.clone(),
            source,
        })?;
        let fetching: BTreeSet<ImageId> = self.lock().keys().cloned().collect();
        let now = SystemTime::now();
        let mut removed = Vec::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if name.starts_with(TEMP_PREFIX) {
                if fetching.is_empty() {
                    remove(&path)?;
                }
                continue;
            }
            let Ok(id) = ImageId::new(name) else {
                continue;
            };
            if in_use.contains(&id) || fetching.contains(&id) {
                continue;
            }
            let unused_for = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .unwrap_or_default();
            if unused_for >= self.config.remove_unused_after {
                remove(&path)?;
                tracing::info!(image = %id, unused_s = unused_for.as_secs(), "removed unused base");
                removed.push(id);
            }
        }
        Ok(removed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ImageId, Fetching>> {
        self.fetching
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn download(self: Arc<Self>, req: ImageRequest) -> Result<PathBuf, Arc<FetchError>> {
        let path = self.path(&req.id);
        // A fetch that finished between this request's look and its turn.
        if touch(&path) {
            return Ok(path);
        }
        let started = Instant::now();
        self.download_checked(&req, &path)
            .await
            .map(|bytes| {
                tracing::info!(image = %req.id, from = %req.source, bytes,
                    ms = started.elapsed().as_millis() as u64, "image cached");
                path
            })
            .map_err(|e| {
                tracing::warn!(image = %req.id, from = %req.source, error = %e, "image fetch failed");
                Arc::new(e)
            })
    }

    /// Stream the image into a temporary file, check it, install it; the temporary file
    /// goes with any error. Returns the byte count.
    async fn download_checked(&self, req: &ImageRequest, path: &Path) -> Result<u64, FetchError> {
        let dir = &self.config.dir;
        let temp = tempfile::Builder::new()
            .prefix(&format!("{TEMP_PREFIX}{}-", req.id))
            .tempfile_in(dir)
            .map_err(|source| FetchError::CreateTemp {
                dir: dir.clone(),
                source,
            })?;
        let (file, temp) = temp.into_parts();
        let mut out = Sink {
            file: tokio::fs::File::from_std(file),
            path: temp.to_path_buf(),
            hasher: Hasher::for_checksum(req.checksum.as_ref()),
            bytes: 0,
        };
        match &req.source {
            ImageSource::File(src) => {
                let read_error = |source| FetchError::ReadFile {
                    path: src.clone(),
                    source,
                };
                let mut input = tokio::fs::File::open(src).await.map_err(read_error)?;
                let mut buf = vec![0u8; CHUNK];
                loop {
                    let n = input.read(&mut buf).await.map_err(read_error)?;
                    if n == 0 {
                        break;
                    }
                    out.write(&buf[..n]).await?;
                }
            }
            ImageSource::Http(url) => {
                let http_error = |source| FetchError::Http {
                    url: url.clone(),
                    source,
                };
                let mut get = self.http.get(url.clone());
                if let Some(token) = &req.token {
                    get = get.header("X-Auth-Token", token);
                }
                let mut resp = get.send().await.map_err(http_error)?;
                if !resp.status().is_success() {
                    return Err(FetchError::Status {
                        url: url.clone(),
                        status: resp.status().as_u16(),
                    });
                }
                while let Some(chunk) = resp.chunk().await.map_err(http_error)? {
                    out.write(&chunk).await?;
                }
            }
        }
        let bytes = out.finish(req.checksum.as_ref()).await?;
        let install_error = |source| FetchError::Install {
            path: path.to_owned(),
            source,
        };
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o444))
            .map_err(install_error)?;
        temp.persist(path).map_err(|e| install_error(e.error))?;
        // The rename is durable once the directory is.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(install_error)?;
        Ok(bytes)
    }
}

/// Set `path`'s modification time to now (its last use); false when there is no such file.
fn touch(path: &Path) -> bool {
    match std::fs::File::open(path) {
        Ok(f) => {
            if let Err(e) = f.set_modified(SystemTime::now()) {
                tracing::warn!(path = %path.display(), error = %e, "cannot mark base used");
            }
            true
        }
        Err(_) => false,
    }
}

fn remove(path: &Path) -> Result<(), CacheError> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CacheError::Remove {
            path: path.to_owned(),
            source,
        }),
    }
}

enum Hasher {
    Sha256(Sha256),
    Md5(Md5),
    None,
}

impl Hasher {
    fn for_checksum(c: Option<&Checksum>) -> Hasher {
        match c {
            Some(Checksum::Sha256(_)) => Hasher::Sha256(Sha256::new()),
            Some(Checksum::Md5(_)) => Hasher::Md5(Md5::new()),
            None => Hasher::None,
        }
    }

    fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Sha256(h) => h.update(data),
            Hasher::Md5(h) => h.update(data),
            Hasher::None => {}
        }
    }

    fn hex(self) -> Option<String> {
        match self {
            Hasher::Sha256(h) => Some(format!("{:x}", h.finalize())),
            Hasher::Md5(h) => Some(format!("{:x}", h.finalize())),
            Hasher::None => None,
        }
    }
}

/// The temporary file a fetch writes, with the digest of what went in.
struct Sink {
    file: tokio::fs::File,
    path: PathBuf,
    hasher: Hasher,
    bytes: u64,
}

impl Sink {
    async fn write(&mut self, data: &[u8]) -> Result<(), FetchError> {
        self.hasher.update(data);
        self.bytes += data.len() as u64;
        self.file
            .write_all(data)
            .await
            .map_err(|source| FetchError::Write {
                path: self.path.clone(),
                source,
            })
    }

    /// Flush to disk and check what came against `expected`; returns the byte count.
    async fn finish(mut self, expected: Option<&Checksum>) -> Result<u64, FetchError> {
        let path = self.path.clone();
        let write_error = |source| FetchError::Write { path, source };
        self.file.flush().await.map_err(write_error.clone())?;
        self.file.sync_all().await.map_err(write_error)?;
        if let (Some(expected), Some(actual)) = (expected, self.hasher.hex()) {
            if actual != expected.digest() {
                return Err(FetchError::ChecksumMismatch {
                    expected: expected.clone(),
                    actual,
                    bytes: self.bytes,
                });
            }
        }
        Ok(self.bytes)
    }
}
