//! What the client subcommands share: reaching the agent from [`ClientOpts`], running one
//! async call to completion, error lines, and plain-text tables.

use std::error::Error as _;
use std::future::Future;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use crate::agent::auth::{Token, TokenError};
use crate::client::{AgentClient, ClientError};
use crate::config::DEFAULT_API_TOKEN_FILE;

use super::{ClientOpts, EXIT_FAILED, EXIT_INVALID_INPUT};

/// The default agent URL.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8774";

/// Why a client subcommand failed.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The token file is unusable.
    #[error("token file")]
    Token(#[source] TokenError),
    /// An input file could not be read.
    #[error("cannot read {}", path.display())]
    ReadInput {
        /// The file (`-` is standard input).
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: io::Error,
    },
    /// An input is not valid.
    #[error("invalid input: {0}")]
    Input(String),
    /// The runtime could not be started.
    #[error("cannot start the runtime")]
    Runtime(#[source] io::Error),
    /// The agent refused the request or could not be reached.
    #[error("agent request failed")]
    Client(#[source] ClientError),
    /// An awaited operation ended failed.
    #[error("operation {0} failed")]
    OperationFailed(uuid::Uuid),
    /// Output could not be written.
    #[error("cannot write the output")]
    Write(#[source] io::Error),
}

impl RemoteError {
    /// Exit code: 2 for invalid input, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            RemoteError::Token(_) | RemoteError::ReadInput { .. } | RemoteError::Input(_) => {
                EXIT_INVALID_INPUT
            }
            _ => EXIT_FAILED,
        }
    }
}

impl From<ClientError> for RemoteError {
    fn from(e: ClientError) -> Self {
        RemoteError::Client(e)
    }
}

impl From<io::Error> for RemoteError {
    fn from(e: io::Error) -> Self {
        RemoteError::Write(e)
    }
}

/// A client from the options (and `VIREO_URL` / `VIREO_TOKEN_FILE`).
pub fn client(opts: &ClientOpts) -> Result<AgentClient, RemoteError> {
    let url = opts
        .url
        .clone()
        .or_else(|| std::env::var("VIREO_URL").ok())
        .unwrap_or_else(|| DEFAULT_URL.to_owned());
    let token_file = opts
        .token_file
        .clone()
        .or_else(|| std::env::var_os("VIREO_TOKEN_FILE").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_API_TOKEN_FILE));
    let token = Token::load("--token-file", &token_file).map_err(RemoteError::Token)?;
    let mut c = AgentClient::new(&url, &token)?;
    if let Some(h) = &opts.token_header {
        c = c.with_header(h)?;
    }
    Ok(c)
}

/// Run `fut` on a fresh single-threaded runtime.
pub fn block_on<T>(fut: impl Future<Output = Result<T, RemoteError>>) -> Result<T, RemoteError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(RemoteError::Runtime)?
        .block_on(fut)
}

/// Read a JSON input file (`-` = `stdin`).
pub fn read_json(path: &Path, stdin: &mut dyn Read) -> Result<serde_json::Value, RemoteError> {
    let mut text = String::new();
    let read = if path == Path::new("-") {
        stdin.read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(path).map(|t| text = t)
    };
    read.map_err(|source| RemoteError::ReadInput {
        path: path.to_owned(),
        source,
    })?;
    serde_json::from_str(&text)
        .map_err(|e| RemoteError::Input(format!("{}: not JSON: {e}", path.display())))
}

/// Write `err` as one line `vireo <cmd>: error: ...: source...` and return its exit code.
pub fn report(cmd: &str, err: &RemoteError, stderr: &mut dyn Write) -> u8 {
    let mut line = format!("vireo {cmd}: error: {err}");
    let mut source = err.source();
    while let Some(s) = source {
        line.push_str(": ");
        line.push_str(&s.to_string());
        source = s.source();
    }
    let _ = writeln!(stderr, "{line}");
    err.exit_code()
}

/// A plain table: a header row, then rows, columns padded to the widest cell.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, c) in cells.iter().enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(c);
            if i + 1 < cells.len() {
                let pad = widths[i].saturating_sub(c.chars().count());
                l.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_pad_columns() {
        let t = table(
            &["UUID", "STATE"],
            &[
                vec!["a".into(), "running".into()],
                vec!["bbbbbb".into(), "x".into()],
            ],
        );
        assert_eq!(t, "UUID    STATE\na       running\nbbbbbb  x\n");
    }
}
