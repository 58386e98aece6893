//! Image ids and checksums: the validated names an image is cached and checked by.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Why a name is not an image id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageIdError {
    /// Empty.
    #[error("image id: empty")]
    Empty,
    /// Longer than 128 bytes.
    #[error("image id: {len} bytes, at most 128")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A character other than ASCII letters, digits, `-`, `_` and `.`, or a first character
    /// that is not a letter or digit (the id is a file name in the cache).
    #[error(
        "image id {id:?}: letters, digits, '-', '_' and '.' only, starting with a letter or digit"
    )]
    Invalid {
        /// The id.
        id: String,
    },
}

/// An image id: the name of its base file in the cache (a Glance image id is a UUID).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ImageId(String);

impl ImageId {
    /// `id`, if it is a valid image id.
    pub fn new(id: impl Into<String>) -> Result<ImageId, ImageIdError> {
        let id = id.into();
        if id.is_empty() {
            return Err(ImageIdError::Empty);
        }
        if id.len() > 128 {
            return Err(ImageIdError::TooLong { len: id.len() });
        }
        let first_ok = id.starts_with(|c: char| c.is_ascii_alphanumeric());
        let all_ok = id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
        if !first_ok || !all_ok {
            return Err(ImageIdError::Invalid { id });
        }
        Ok(ImageId(id))
    }

    /// The id.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for ImageId {
    type Error = ImageIdError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        ImageId::new(s)
    }
}

impl From<ImageId> for String {
    fn from(id: ImageId) -> String {
        id.0
    }
}

impl fmt::Display for ImageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Why a string is not a checksum.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChecksumError {
    /// An algorithm other than sha256 and md5.
    #[error("checksum: algorithm {0:?} is not sha256 or md5")]
    Algorithm(String),
    /// Not the digest length of the algorithm, or not hexadecimal.
    #[error("checksum: {algorithm} wants {want} hexadecimal digits, got {got:?}")]
    Digest {
        /// The algorithm.
        algorithm: &'static str,
        /// Digits it wants.
        want: usize,
        /// What was given.
        got: String,
    },
}

/// The checksum an image must have: `sha256:<hex>` (Glance's `os_hash_value` with
/// `os_hash_algo` sha256) or `md5:<hex>` (Glance's legacy `checksum`). A bare digest is taken
/// by its length (64 digits sha256, 32 md5).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum Checksum {
    /// sha256, lower-case hex.
    Sha256(String),
    /// md5, lower-case hex.
    Md5(String),
}

impl Checksum {
    /// Parse `sha256:<hex>`, `md5:<hex>` or a bare digest.
    pub fn parse(s: &str) -> Result<Checksum, ChecksumError> {
        let (algorithm, digest) = match s.split_once(':') {
            Some((a, d)) => (a.to_ascii_lowercase(), d),
            None if s.len() == 32 => ("md5".to_owned(), s),
            None => ("sha256".to_owned(), s),
        };
        let check = |algorithm: &'static str, want: usize| {
            if digest.len() == want && digest.chars().all(|c| c.is_ascii_hexdigit()) {
                Ok(digest.to_ascii_lowercase())
            } else {
                Err(ChecksumError::Digest {
                    algorithm,
                    want,
                    got: digest.to_owned(),
                })
            }
        };
        match algorithm.as_str() {
            "sha256" => Ok(Checksum::Sha256(check("sha256", 64)?)),
            "md5" => Ok(Checksum::Md5(check("md5", 32)?)),
            _ => Err(ChecksumError::Algorithm(algorithm)),
        }
    }

    pub fn algorithm(&self) -> &'static str {
        match self {
            Checksum::Sha256(_) => "sha256",
            Checksum::Md5(_) => "md5",
        }
    }

    pub fn digest(&self) -> &str {
        match self {
            Checksum::Sha256(d) | Checksum::Md5(d) => d,
        }
    }
}

impl TryFrom<String> for Checksum {
    type Error = ChecksumError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Checksum::parse(&s)
    }
}

impl From<Checksum> for String {
    fn from(c: Checksum) -> String {
        c.to_string()
    }
}

impl fmt::Display for Checksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm(), self.digest())
    }
}
