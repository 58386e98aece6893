//! Tokens: loading them from files the agent trusts, and checking requests in constant time.
//!
//! - A token file must be a regular file that neither group nor others can read or write
//!   (`mode & 0o077 == 0`), holding one token of at least [`MIN_TOKEN_LEN`] visible ASCII
//!   characters (surrounding whitespace is ignored). Otherwise the agent refuses to start.
//! - A request carries its token in the configured header (default `X-Auth-Token`, what
//!   Neutron's Nova notifier sends) or as `Authorization: Bearer <token>`.
//! - The API accepts the API token. The external-events endpoint accepts the API token, the
//!   optional events token, and — only when `accept_noauth_events` is set, which the config
//!   allows on loopback listeners only — Neutron's no-auth placeholder `notused`.
//! - Comparisons take time independent of where the first difference is; tokens never appear
//!   in logs or in `Debug` output.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use actix_web::http::header::{HeaderMap, HeaderName, AUTHORIZATION};

use crate::config::MIN_TOKEN_LEN;

/// What Neutron's Nova notifier sends as a token with `[nova] auth_type = none`.
pub const NOAUTH_TOKEN: &str = "notused";

/// Why a token file was refused.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// The file could not be read.
    #[error("{key} {}: cannot read the token file", path.display())]
    Read {
        /// Config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// Group or others have access.
    #[error(
        "{key} {}: mode {mode:04o} lets group/others access the token; chmod 600 it",
        path.display()
    )]
    Permissions {
        /// Config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a regular file.
    #[error("{key} {}: not a regular file", path.display())]
    NotAFile {
        /// Config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// Too short, or holds characters a header cannot carry.
    #[error(
        "{key} {}: the token must be at least {MIN_TOKEN_LEN} visible ASCII characters",
        path.display()
    )]
    Malformed {
        /// Config key naming the file.
        key: &'static str,
        /// The file.
        path: PathBuf,
    },
}

impl TokenError {
    /// The config key naming the file.
    pub fn key(&self) -> &'static str {
        match self {
            TokenError::Read { key, .. }
            | TokenError::Permissions { key, .. }
            | TokenError::NotAFile { key, .. }
            | TokenError::Malformed { key, .. } => key,
        }
    }
}

/// A secret token. `Debug` prints `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(Box<[u8]>);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// Read the token file named by config key `key` (see the module docs for the rules).
    pub fn load(key: &'static str, path: &Path) -> Result<Token, TokenError> {
        let read_err = |source| TokenError::Read {
            key,
            path: path.to_owned(),
            source,
        };
        let meta = fs::metadata(path).map_err(read_err)?;
        if !meta.is_file() {
            return Err(TokenError::NotAFile {
                key,
                path: path.to_owned(),
            });
        }
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(TokenError::Permissions {
                key,
                path: path.to_owned(),
                mode,
            });
        }
        let bytes = fs::read(path).map_err(read_err)?;
        let text = bytes.trim_ascii();
        if text.len() < MIN_TOKEN_LEN || !text.iter().all(u8::is_ascii_graphic) {
            return Err(TokenError::Malformed {
                key,
                path: path.to_owned(),
            });
        }
        Ok(Token(text.into()))
    }

    /// A token from memory (tests, benchmarks).
    pub fn from_secret(secret: &str) -> Token {
        Token(secret.as_bytes().into())
    }

    /// The secret, for a client that must send it.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// Constant-time comparison with `given`.
    pub fn matches(&self, given: &[u8]) -> bool {
        ct_eq(&self.0, given)
    }
}

/// Compare two byte strings in time that depends only on their lengths, never on their
/// contents (no early exit at the first difference).
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = u64::from(a.len() != b.len());
    let n = a.len().max(b.len());
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= u64::from(x ^ y);
    }
    // Keep the optimizer from turning the loop into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

/// Which endpoint a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// The `/v1` API.
    Api,
    /// `POST /os-server-external-events`.
    Events,
    /// `GET /metrics`.
    Metrics,
}

impl Scope {
    /// Metric label.
    pub fn as_str(&self) -> &'static str {
        match self {
            Scope::Api => "api",
            Scope::Events => "events",
            Scope::Metrics => "metrics",
        }
    }
}

/// The tokens the agent accepts.
#[derive(Debug, Clone)]
pub struct Auth {
    header: HeaderName,
    api: Token,
    events: Option<Token>,
    metrics: Option<Token>,
    noauth_events: bool,
}

impl Auth {
    /// `header` carries the token; `api` is the API token; `events` an optional
    /// events-only token; `noauth_events` accepts Neutron's `notused` on the events endpoint.
    pub fn new(header: HeaderName, api: Token, events: Option<Token>, noauth_events: bool) -> Self {
        Auth {
            header,
            api,
            events,
            metrics: None,
            noauth_events,
        }
    }

    /// Also accept `metrics` on `GET /metrics` (and nowhere else): what a Prometheus server
    /// scrapes with, which cannot change an instance.
    pub fn with_metrics_token(mut self, metrics: Option<Token>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The header name.
    pub fn header(&self) -> &HeaderName {
        &self.header
    }

    /// True when `headers` carry a token accepted for `scope`. Every candidate is compared,
    /// so the time taken does not reveal which one matched.
    pub fn allows(&self, headers: &HeaderMap, scope: Scope) -> bool {
        let given = headers.get(&self.header).map(|v| v.as_bytes()).or_else(|| {
            headers
                .get(AUTHORIZATION)
                .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "))
        });
        let Some(given) = given else {
            return false;
        };
        let mut ok = self.api.matches(given);
        if scope == Scope::Metrics {
            if let Some(t) = &self.metrics {
                ok |= t.matches(given);
            }
        }
        if scope == Scope::Events {
            if let Some(t) = &self.events {
                ok |= t.matches(given);
            }
            if self.noauth_events {
                ok |= ct_eq(NOAUTH_TOKEN.as_bytes(), given);
            }
        }
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::HeaderValue;

    const SECRET: &str = "0123456789abcdef-api";

    fn write(dir: &Path, name: &str, body: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        fs::write(&p, body).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn ct_eq_is_equality() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(ct_eq(b"", b""));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
        assert!(!ct_eq(b"ab", b"abc"));
        assert!(!ct_eq(b"", b"a"));
        // A shorter input padded with what the other has must still differ.
        assert!(!ct_eq(b"ab\xff", b"ab"));
    }

    #[test]
    fn token_files_are_checked() {
        let d = tempfile::tempdir().unwrap();
        let ok = write(d.path(), "ok", &format!("  {SECRET}\n"), 0o600);
        let t = Token::load("api_token_file", &ok).unwrap();
        assert!(t.matches(SECRET.as_bytes()));
        assert_eq!(format!("{t:?}"), "Token(<redacted>)");
        assert!(Token::load("k", &write(d.path(), "ro", SECRET, 0o400)).is_ok());

        for mode in [0o644, 0o640, 0o604, 0o660, 0o620, 0o602] {
            let p = write(d.path(), &format!("m{mode:o}"), SECRET, mode);
            let e = Token::load("api_token_file", &p).unwrap_err();
            assert!(matches!(e, TokenError::Permissions { .. }), "{mode:o}: {e}");
            assert!(e.to_string().contains("api_token_file"), "{e}");
            assert!(!e.to_string().contains(SECRET));
        }
        let short = write(d.path(), "short", "tooshort", 0o600);
        assert!(matches!(
            Token::load("k", &short).unwrap_err(),
            TokenError::Malformed { .. }
        ));
        let spaced = write(d.path(), "spaced", "0123456789 abcdefgh", 0o600);
        assert!(matches!(
            Token::load("k", &spaced).unwrap_err(),
            TokenError::Malformed { .. }
        ));
        assert!(matches!(
            Token::load("k", d.path()).unwrap_err(),
            TokenError::NotAFile { .. }
        ));
        assert!(matches!(
            Token::load("k", &d.path().join("missing")).unwrap_err(),
            TokenError::Read { .. }
        ));
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn scopes_accept_their_tokens_only() {
        let auth = Auth::new(
            HeaderName::from_static("x-auth-token"),
            Token::from_secret(SECRET),
            Some(Token::from_secret("events-token-0123456")),
            false,
        );
        let api = headers(&[("X-Auth-Token", SECRET)]);
        assert!(auth.allows(&api, Scope::Api));
        assert!(auth.allows(&api, Scope::Events));
        let bearer = headers(&[("Authorization", &format!("Bearer {SECRET}"))]);
        assert!(auth.allows(&bearer, Scope::Api));
        let ev = headers(&[("X-Auth-Token", "events-token-0123456")]);
        assert!(auth.allows(&ev, Scope::Events));
        assert!(!auth.allows(&ev, Scope::Api), "events token is events-only");
        let noauth = headers(&[("X-Auth-Token", NOAUTH_TOKEN)]);
        assert!(
            !auth.allows(&noauth, Scope::Events),
            "notused refused by default"
        );
        assert!(!auth.allows(&headers(&[]), Scope::Api));
        assert!(!auth.allows(&headers(&[("X-Auth-Token", "wrong")]), Scope::Api));
        assert!(!auth.allows(&headers(&[("Authorization", SECRET)]), Scope::Api));

        let open = Auth::new(
            HeaderName::from_static("x-auth-token"),
            Token::from_secret(SECRET),
            None,
            true,
        );
        assert!(open.allows(&noauth, Scope::Events));
        assert!(
            !open.allows(&noauth, Scope::Api),
            "notused never opens the API"
        );
    }
}
