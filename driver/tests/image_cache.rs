//! The image cache against real files and a real HTTP server on a local socket.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vireo::storage::{
    CacheConfig, CacheError, Checksum, ChecksumError, FetchError, ImageCache, ImageId,
    ImageIdError, ImageRequest, ImageSource,
};

/// 3 MiB and a bit: more than one read chunk.
fn image_bytes() -> Vec<u8> {
    (0..(3 << 20) + 4321).map(|i| (i * 7 % 251) as u8).collect()
}

// Reference digests come from coreutils (sha256sum, md5sum), independently of the cache's
// own hashing.
fn sha256_of(data: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x");
    std::fs::write(&f, data).unwrap();
    let out = std::process::Command::new("sha256sum")
        .arg(&f)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

fn md5_of(data: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("x");
    std::fs::write(&f, data).unwrap();
    let out = std::process::Command::new("md5sum")
        .arg(&f)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..32].to_owned()
}

fn cache(dir: &Path) -> Arc<ImageCache> {
    ImageCache::new(CacheConfig {
        read_timeout: Duration::from_secs(5),
        ..CacheConfig::in_state_dir(dir)
    })
    .unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn id(s: &str) -> ImageId {
    ImageId::new(s).unwrap()
}

fn from_file(image: &str, path: &Path, checksum: Option<Checksum>) -> ImageRequest {
    ImageRequest {
        id: id(image),
        source: ImageSource::File(path.to_owned()),
        checksum,
        token: None,
    }
}

#[tokio::test]
async fn a_file_image_is_fetched_once_checked_and_kept_read_only() {
    let state = tempfile::tempdir().unwrap();
    let src = state.path().join("cirros.img");
    let data = image_bytes();
    std::fs::write(&src, &data).unwrap();
    let c = cache(state.path());
    let sum = Checksum::parse(&format!("sha256:{}", sha256_of(&data))).unwrap();
    let req = from_file("cirros", &src, Some(sum));
    let base = c.fetch(&req).await.unwrap();
    assert_eq!(base, state.path().join("_base/cirros"));
    assert_eq!(std::fs::read(&base).unwrap(), data);
    let mode = std::fs::metadata(&base).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o444, "a base is read-only");
    assert_eq!(files(&state.path().join("_base")), ["cirros"]);
    // The second request is served from the cache: the source may be gone.
    std::fs::remove_file(&src).unwrap();
    assert_eq!(c.fetch(&req).await.unwrap(), base);
}

#[tokio::test]
async fn md5_checksums_and_bare_digests_are_understood() {
    let data = image_bytes();
    let md5 = md5_of(&data);
    assert_eq!(Checksum::parse(&md5).unwrap(), Checksum::Md5(md5.clone()));
    let sha = sha256_of(&data);
    assert_eq!(
        Checksum::parse(&sha.to_uppercase()).unwrap(),
        Checksum::Sha256(sha.clone())
    );
    let state = tempfile::tempdir().unwrap();
    let src = state.path().join("img");
    std::fs::write(&src, &data).unwrap();
    let c = cache(state.path());
    c.fetch(&from_file("glance-md5", &src, Some(Checksum::Md5(md5))))
        .await
        .unwrap();
    assert!(matches!(
        Checksum::parse("sha1:abcd"),
        Err(ChecksumError::Algorithm(a)) if a == "sha1"
    ));
    assert!(matches!(
        Checksum::parse("sha256:xyz"),
        Err(ChecksumError::Digest { want: 64, .. })
    ));
}

#[tokio::test]
async fn a_corrupt_image_is_refused_and_leaves_nothing() {
    let state = tempfile::tempdir().unwrap();
    let src = state.path().join("img");
    let data = image_bytes();
    std::fs::write(&src, &data).unwrap();
    let c = cache(state.path());
    // The checksum of other bytes.
    let wrong = Checksum::Sha256(sha256_of(b"something else"));
    let e = c
        .fetch(&from_file("corrupt", &src, Some(wrong.clone())))
        .await
        .unwrap_err();
    match &e {
        CacheError::Fetch { id, source, .. } => {
            assert_eq!(id.as_str(), "corrupt");
            match &**source {
                FetchError::ChecksumMismatch {
                    expected,
                    actual,
                    bytes,
                } => {
                    assert_eq!(expected, &wrong);
                    assert_eq!(actual, &sha256_of(&data));
                    assert_eq!(*bytes, data.len() as u64);
                }
                other => panic!("{other:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    assert!(files(&state.path().join("_base")).is_empty());
    // A missing source: the same, nothing left.
    let e = c
        .fetch(&from_file("missing", &state.path().join("nope"), None))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, CacheError::Fetch { source, .. } if matches!(**source, FetchError::ReadFile { .. })),
        "{e:?}"
    );
    assert!(files(&state.path().join("_base")).is_empty());
}

/// A one-route HTTP server: `GET /image` with `X-Auth-Token: secret` gets the body after a
/// pause (so concurrent requests overlap); anything else gets 401. Counts requests.
async fn serve(body: Vec<u8>) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let (h, body) = (hits.clone(), Arc::new(body));
    tokio::spawn(async move {
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (h, body) = (h.clone(), body.clone());
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = sock.read(&mut buf).await.unwrap();
                    if n == 0 {
                        return;
                    }
                    req.extend_from_slice(&buf[..n]);
                }
                h.fetch_add(1, Ordering::SeqCst);
                let req = String::from_utf8_lossy(&req).to_ascii_lowercase();
                let authorized = req.starts_with("get /image ")
                    && req.lines().any(|l| l.trim() == "x-auth-token: secret");
                if !authorized {
                    let _ = sock
                        .write_all(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .await;
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\ncontent-type: application/octet-stream\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = sock.write_all(head.as_bytes()).await;
                let _ = sock.write_all(&body).await;
            });
        }
    });
    (format!("http://{addr}/image"), hits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_for_one_http_image_share_one_fetch() {
    let data = image_bytes();
    let (url, hits) = serve(data.clone()).await;
    let state = tempfile::tempdir().unwrap();
    let c = cache(state.path());
    let req = ImageRequest {
        id: id("3f1e2d4c-0000-4000-8000-00000000abcd"),
        source: ImageSource::parse(&url).unwrap(),
        checksum: Some(Checksum::Sha256(sha256_of(&data))),
        token: Some("secret".into()),
    };
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (c, req) = (c.clone(), req.clone());
            tokio::spawn(async move { c.fetch(&req).await })
        })
        .collect();
    let mut paths = BTreeSet::new();
    for t in tasks {
        paths.insert(t.await.unwrap().unwrap());
    }
    assert_eq!(paths.len(), 1);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "one fetch for eight requests"
    );
    assert_eq!(std::fs::read(paths.first().unwrap()).unwrap(), data);
    // The token is never printed.
    assert!(!format!("{req:?}").contains("secret"));
}

#[tokio::test]
async fn an_http_error_is_reported_with_its_status_and_leaves_nothing() {
    let (url, hits) = serve(image_bytes()).await;
    let state = tempfile::tempdir().unwrap();
    let c = cache(state.path());
    let req = ImageRequest {
        id: id("img"),
        source: ImageSource::parse(&url).unwrap(),
        checksum: None,
        token: Some("wrong".into()),
    };
    let e = c.fetch(&req).await.unwrap_err();
    assert!(
        matches!(&e, CacheError::Fetch { source, .. } if matches!(**source, FetchError::Status { status: 401, .. })),
        "{e:?}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1);
    assert!(files(&state.path().join("_base")).is_empty());
    // Nothing listens: a connection error, nothing left either.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let req = ImageRequest {
        source: ImageSource::parse(&format!("http://{closed}/image")).unwrap(),
        ..req
    };
    let e = c.fetch(&req).await.unwrap_err();
    assert!(
        matches!(&e, CacheError::Fetch { source, .. } if matches!(**source, FetchError::Http { .. })),
        "{e:?}"
    );
    assert!(files(&state.path().join("_base")).is_empty());
}

fn age(path: &Path, by: Duration) {
    let f = std::fs::File::open(path).unwrap();
    f.set_modified(SystemTime::now() - by).unwrap();
}

#[tokio::test]
async fn unused_bases_age_out_but_not_while_an_instance_uses_them() {
    let state = tempfile::tempdir().unwrap();
    let src = state.path().join("img");
    std::fs::write(&src, b"tiny image").unwrap();
    let c = ImageCache::new(CacheConfig {
        remove_unused_after: Duration::from_secs(3600),
        ..CacheConfig::in_state_dir(state.path())
    })
    .unwrap();
    let (old, used, fresh) = (id("old"), id("used"), id("fresh"));
    for i in [&old, &used, &fresh] {
        c.fetch(&from_file(i.as_str(), &src, None)).await.unwrap();
    }
    age(&c.path(&old), Duration::from_secs(7200));
    age(&c.path(&used), Duration::from_secs(7200));
    // What a crashed fetch left.
    let base = state.path().join("_base");
    std::fs::write(base.join(".fetch-lost-abc"), b"partial").unwrap();
    let removed = c.evict(&BTreeSet::from([used.clone()])).unwrap();
    assert_eq!(removed, [old]);
    assert_eq!(files(&base), ["fresh", "used"]);
    // Using a base makes it young again.
    age(&c.path(&fresh), Duration::from_secs(7200));
    c.fetch(&from_file("fresh", &src, None)).await.unwrap();
    assert!(c.evict(&BTreeSet::new()).unwrap().contains(&used));
    assert_eq!(files(&base), ["fresh"]);
}

#[test]
fn image_ids_and_sources_are_validated() {
    assert_eq!(ImageId::new(""), Err(ImageIdError::Empty));
    assert!(matches!(
        ImageId::new("x".repeat(129)),
        Err(ImageIdError::TooLong { len: 129 })
    ));
    for bad in ["../etc", ".hidden", "a/b", "a b", "-x"] {
        assert!(
            matches!(ImageId::new(bad), Err(ImageIdError::Invalid { .. })),
            "{bad}"
        );
    }
    assert!(ImageId::new("cirros-0.6.2_x86.64").is_ok());
    assert_eq!(
        ImageSource::parse("/var/lib/images/a.qcow2").unwrap(),
        ImageSource::File("/var/lib/images/a.qcow2".into())
    );
    assert_eq!(
        ImageSource::parse("file:///var/lib/images/a.qcow2").unwrap(),
        ImageSource::File("/var/lib/images/a.qcow2".into())
    );
    assert!(matches!(
        ImageSource::parse("https://glance:9292/v2/images/x/file").unwrap(),
        ImageSource::Http(_)
    ));
    assert!(ImageSource::parse("relative/path").is_err());
    assert!(ImageSource::parse("ftp://host/x").is_err());
}
