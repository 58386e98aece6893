//! Which host paths a request may name.
//!
//! Kernels, initrds and disk images must resolve (symlinks followed) to a regular file inside
//! one of the configured image directories; the resolved path is what the driver gets. Console
//! logs are not an input: the driver writes them to `<state_dir>/instances/<uuid>/` (its
//! `console_dir`). Everything is checked before the driver is called.

use std::io;
use std::path::{Path, PathBuf};

/// Why a path was refused.
#[derive(Debug, thiserror::Error)]
pub enum PathError {
    /// Not absolute.
    #[error("{what} {}: not an absolute path", path.display())]
    NotAbsolute {
        /// Which input.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// The file could not be resolved.
    #[error("{what} {}: cannot be resolved", path.display())]
    Resolve {
        /// Which input.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Not a regular file.
    #[error("{what} {}: not a regular file", path.display())]
    NotAFile {
        /// Which input.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
    /// Outside every allowed directory.
    #[error("{what} {}: outside the allowed directories", path.display())]
    Outside {
        /// Which input.
        what: &'static str,
        /// The path.
        path: PathBuf,
    },
}

/// The directories requests may name.
#[derive(Debug, Clone)]
pub struct PathPolicy {
    instances_dir: PathBuf,
    image_dirs: Vec<PathBuf>,
}

impl PathPolicy {
    /// `instances_dir` must exist; image directories that do not exist are kept out (nothing
    /// can be taken from them). Both are canonicalized now.
    pub fn new(instances_dir: &Path, image_dirs: &[PathBuf]) -> io::Result<Self> {
        let instances_dir = instances_dir.canonicalize()?;
        let image_dirs = image_dirs
            .iter()
            .filter_map(|d| d.canonicalize().ok())
            .collect();
        Ok(PathPolicy {
            instances_dir,
            image_dirs,
        })
    }

    /// The canonical instances directory.
    pub fn instances_dir(&self) -> &Path {
        &self.instances_dir
    }

    /// The image directories that exist, canonical.
    pub fn image_dirs(&self) -> &[PathBuf] {
        &self.image_dirs
    }

    /// A kernel, initrd or disk image: the canonical path of a regular file inside an image
    /// directory.
    pub fn image(&self, what: &'static str, path: &Path) -> Result<PathBuf, PathError> {
        if !path.is_absolute() {
            return Err(PathError::NotAbsolute {
                what,
                path: path.to_owned(),
            });
        }
        let real = path.canonicalize().map_err(|source| PathError::Resolve {
            what,
            path: path.to_owned(),
            source,
        })?;
        if !self.image_dirs.iter().any(|d| real.starts_with(d)) {
            return Err(PathError::Outside {
                what,
                path: path.to_owned(),
            });
        }
        let meta = real.metadata().map_err(|source| PathError::Resolve {
            what,
            path: path.to_owned(),
            source,
        })?;
        if !meta.is_file() {
            return Err(PathError::NotAFile {
                what,
                path: path.to_owned(),
            });
        }
        Ok(real)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn setup() -> (tempfile::TempDir, PathPolicy) {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("instances")).unwrap();
        std::fs::create_dir_all(root.join("images/sub")).unwrap();
        std::fs::write(root.join("images/vmlinuz"), b"k").unwrap();
        std::fs::write(root.join("secret"), b"s").unwrap();
        symlink(root.join("secret"), root.join("images/escape")).unwrap();
        symlink(root.join("images/vmlinuz"), root.join("images/sub/alias")).unwrap();
        let p = PathPolicy::new(
            &root.join("instances"),
            &[root.join("images"), root.join("missing")],
        )
        .unwrap();
        (t, p)
    }

    #[test]
    fn images_must_resolve_inside_an_image_dir() {
        let (t, p) = setup();
        let root = t.path().canonicalize().unwrap();
        assert_eq!(p.image_dirs().len(), 1, "a missing dir is dropped");
        assert_eq!(
            p.image("kernel", &root.join("images/vmlinuz")).unwrap(),
            root.join("images/vmlinuz")
        );
        // A symlink inside the dir to a file inside is fine (resolved).
        assert_eq!(
            p.image("kernel", &root.join("images/sub/alias")).unwrap(),
            root.join("images/vmlinuz")
        );
        let err = |path: PathBuf| p.image("kernel", &path).unwrap_err();
        assert!(matches!(
            err(root.join("images/escape")),
            PathError::Outside { .. }
        ));
        assert!(matches!(
            err(root.join("images/../secret")),
            PathError::Outside { .. }
        ));
        assert!(matches!(
            err(root.join("secret")),
            PathError::Outside { .. }
        ));
        assert!(matches!(
            err(root.join("images/sub")),
            PathError::NotAFile { .. }
        ));
        assert!(matches!(
            err(root.join("images/nope")),
            PathError::Resolve { .. }
        ));
        assert!(matches!(
            err(PathBuf::from("images/vmlinuz")),
            PathError::NotAbsolute { .. }
        ));
    }
}
