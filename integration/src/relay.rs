//! A TCP relay on host A's side of the link to host B: host B (its own network namespace)
//! reaches services that listen on A's loopback only — Neutron's API, and the events
//! endpoint's agent API for peer requests — through it. It accepts connections from one
//! address only (host B's) and runs for one scenario; dropping it closes the listener and
//! every relayed connection.

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::HarnessError;

/// A running relay.
#[derive(Debug)]
pub struct Relay {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Relay {
    /// Listen on `listen`, relay each connection from `allow` to `to`; others are closed.
    pub async fn start(
        listen: SocketAddr,
        to: SocketAddr,
        allow: IpAddr,
    ) -> Result<Relay, HarnessError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| HarnessError::Io {
                what: format!("relay: listen on {listen}"),
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| HarnessError::Io {
            what: "relay: local address".into(),
            source,
        })?;
        let task = tokio::spawn(async move {
            // Dropped with the task: aborts every relayed connection.
            let mut conns = JoinSet::new();
            loop {
                let Ok((mut inbound, peer)) = listener.accept().await else {
                    continue;
                };
                if peer.ip() != allow {
                    tracing::warn!(%peer, "relay: refused a connection");
                    continue;
                }
                conns.spawn(async move {
                    match TcpStream::connect(to).await {
                        Ok(mut out) => {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                        Err(e) => tracing::warn!(%to, error = %e, "relay: connect failed"),
                    }
                });
                while conns.try_join_next().is_some() {}
            }
        });
        Ok(Relay { addr, task })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.task.abort();
    }
}
