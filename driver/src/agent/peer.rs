//! Agent-to-agent peering: the other compute hosts as this host's flows and this agent's
//! events endpoint reach them, over their agents' HTTP API.
//!
//! - [`HttpPeer`] is another host as a [`PeerHost`]: the cross-host steps of resize,
//!   confirm, revert and live migration (and its rollback) become
//!   `POST /v1/peer/instances/{uuid}` on that host's agent, which runs them synchronously
//!   and answers the state and report, or its error with the instance error's stable code.
//!   Every failure is typed: the peer's error as [`InstanceError::Remote`] with its code
//!   (`not-found` as [`AdmissionError::NotFound`], which the confirm flow treats as "already
//!   clean"), a timeout or a connection failure as `Remote` with code `unavailable`, an
//!   answer that is not the agent's format as `Remote` with code `bad-answer`.
//! - [`EventForwarder`] forwards external events this agent cannot place to every peer: one
//!   POST per peer with all of them, concurrently, each bounded by a short timeout, marked
//!   with [`FORWARDED_HEADER`] so that the receiver never forwards them again.
//!
//! [`PeerLink`] is one `[[peers]]` entry with its token loaded.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;
use tracing::{debug, info_span, warn, Instrument};
use uuid::Uuid;
use vireo_actors::instance::{
    error_chain, AdmissionError, InstanceError, InstanceReply, InvalidOperation, Operation,
    PeerHost, Peers,
};

use super::auth::Token;
use super::microversion::ApiVersion;
use super::view;
use crate::client::{AgentClient, ClientError, FORWARDED_HEADER};
use vireo_actors::lifecycle::Caller;

/// Code of a peer that could not be reached or did not answer in time.
pub const CODE_UNAVAILABLE: &str = "unavailable";
/// Code of a peer whose answer is not the agent's format.
pub const CODE_BAD_ANSWER: &str = "bad-answer";

/// Why a peer could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// Its HTTP client could not be built.
    #[error("peers {name}: cannot set up its client")]
    Client {
        /// The peer.
        name: String,
        /// Why (boxed: the client's error is large).
        #[source]
        source: Box<ClientError>,
    },
}

fn setup_error(name: &str) -> impl FnOnce(ClientError) -> PeerError + '_ {
    move |e| PeerError::Client {
        name: name.to_owned(),
        source: Box::new(e),
    }
}

/// One configured peer (a `[[peers]]` entry with its token loaded).
#[derive(Debug, Clone)]
pub struct PeerLink {
    /// Its host name.
    pub name: String,
    /// Its agent's base URL.
    pub url: String,
    /// Its API token.
    pub token: Token,
    /// The libvirt URI to live-migrate to it.
    pub migration_uri: Option<String>,
    /// Bound on one peer request.
    pub timeout: Duration,
}

impl PeerLink {
    /// A client of the peer's agent sending its token as `Authorization: Bearer`.
    pub fn client(&self) -> Result<AgentClient, ClientError> {
        AgentClient::new(&self.url, &self.token)?.bearer()
    }
}

/// Another compute host reached through its agent's peer endpoint.
#[derive(Debug)]
pub struct HttpPeer {
    name: String,
    migration_uri: Option<String>,
    client: AgentClient,
    timeout: Duration,
}

impl HttpPeer {
    /// The peer of `link` (its own HTTP client: the flows run on the driver's actor thread).
    pub fn new(link: &PeerLink) -> Result<HttpPeer, ClientError> {
        Ok(HttpPeer {
            name: link.name.clone(),
            migration_uri: link.migration_uri.clone(),
            client: link.client()?,
            timeout: link.timeout,
        })
    }

    /// Bound on one request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn remote(&self, code: &str, message: String) -> InstanceError {
        InstanceError::Remote {
            host: self.name.clone(),
            code: code.to_owned(),
            message,
        }
    }

    fn map_error(&self, instance: Uuid, e: ClientError) -> InstanceError {
        match e {
            // The peer holds nothing of the instance: the same answer as in-process, so the
            // flows that tolerate it (confirm: the source is clean already) do so here too.
            ClientError::Api { code, .. } if code == "not-found" => {
                AdmissionError::NotFound(instance).into()
            }
            ClientError::Api { code, message, .. } => self.remote(&code, message),
            e @ ClientError::Send { .. } => self.remote(CODE_UNAVAILABLE, error_chain(&e)),
            e => self.remote(CODE_BAD_ANSWER, error_chain(&e)),
        }
    }
}

#[async_trait]
impl PeerHost for HttpPeer {
    fn name(&self) -> &str {
        &self.name
    }

    fn migration_uri(&self) -> Option<String> {
        self.migration_uri.clone()
    }

    async fn request(
        &self,
        instance: Uuid,
        request: Operation,
    ) -> Result<InstanceReply, InstanceError> {
        let kind = request.kind();
        if kind.caller() != Caller::Peer {
            return Err(InvalidOperation::NotPeerRequest { request: kind }.into());
        }
        let span = info_span!("peer_request", instance = %instance, host = %self.name,
                              request = kind.as_str());
        async move {
            debug!("sending");
            let reply = self
                .client
                .peer_request(instance, &request, self.timeout)
                .await
                .map_err(|e| self.map_error(instance, e))?;
            let report = view::op_report(&reply.report)
                .map_err(|e| self.remote(CODE_BAD_ANSWER, format!("report: {e}")))?;
            Ok(InstanceReply::Done {
                state: reply.state,
                report,
            })
        }
        .instrument(span)
        .await
    }
}

/// A directory of hosts holding every configured peer as an [`HttpPeer`] (the driver adds
/// this host itself, in-process).
pub fn directory(links: &[PeerLink]) -> Result<Arc<Peers>, PeerError> {
    let peers = Peers::new();
    for l in links {
        let p = HttpPeer::new(l).map_err(setup_error(&l.name))?;
        peers.insert(Arc::new(p));
    }
    Ok(peers)
}

/// What one peer answered a forwarded POST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ForwardAnswer {
    /// Nova's per-event codes, in the order sent.
    Codes(Vec<u16>),
    /// It answered, but with an error or something unusable: counted as no answer.
    Failed(String),
}

/// Forwards external events to every peer (see the module docs).
#[derive(Debug, Clone)]
pub struct EventForwarder {
    peers: Vec<(String, AgentClient)>,
    timeout: Duration,
}

impl EventForwarder {
    /// A forwarder to `links`, each POST bounded by `timeout`. Its clients are its own (it
    /// runs on the HTTP workers).
    pub fn new(links: &[PeerLink], timeout: Duration) -> Result<Self, PeerError> {
        let peers = links
            .iter()
            .map(|l| {
                l.client()
                    .map(|c| (l.name.clone(), c))
                    .map_err(setup_error(&l.name))
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(EventForwarder { peers, timeout })
    }

    /// No peer to forward to.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// The peers' names.
    pub fn names(&self) -> Vec<&str> {
        self.peers.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// POST `events` (each as received) to every peer concurrently; one answer per peer, in
    /// configuration order.
    pub async fn forward(
        &self,
        events: &[Value],
        version: ApiVersion,
    ) -> Vec<(String, ForwardAnswer)> {
        let body = serde_json::to_vec(&serde_json::json!({ "events": events })).unwrap_or_default();
        let n = events.len();
        let posts = self.peers.iter().map(|(name, client)| {
            let body = body.clone();
            async move {
                let answer = match client.forward_events(body, version, self.timeout).await {
                    Ok(r) if r.events.len() == n => {
                        ForwardAnswer::Codes(r.events.iter().map(|e| e.code).collect())
                    }
                    Ok(r) => {
                        ForwardAnswer::Failed(format!("answered {} events for {n}", r.events.len()))
                    }
                    // An agent from before 207 for "none accepted": Nova's old "No instances
                    // found for any event".
                    Err(ClientError::Api {
                        status: 404, code, ..
                    }) if code == "not-found" => ForwardAnswer::Codes(vec![404; n]),
                    Err(e) => ForwardAnswer::Failed(error_chain(&e)),
                };
                if let ForwardAnswer::Failed(why) = &answer {
                    warn!(peer = %name, error = %why, events = n, "forwarding events failed");
                }
                (name.clone(), answer)
            }
        });
        futures::future::join_all(posts).await
    }
}

/// How good a per-event code is for the sender: 200 (accepted) beats 400 (a host that has
/// the instance could not use the event) beats 422 (a host knew it, it left) beats 404
/// (nobody knows it).
pub fn code_rank(code: u16) -> u8 {
    match code {
        200 => 4,
        400 => 3,
        422 => 2,
        404 => 1,
        _ => 0,
    }
}

/// The better of two per-event codes (see [`code_rank`]).
pub fn best_code(a: u16, b: u16) -> u16 {
    if code_rank(b) > code_rank(a) {
        b
    } else {
        a
    }
}

/// The header a forwarded request carries, as the server reads it.
pub fn is_forwarded(headers: &actix_web::http::header::HeaderMap) -> bool {
    headers.contains_key(FORWARDED_HEADER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_actors::lifecycle::Request;

    #[test]
    fn best_code_prefers_acceptance_then_ownership() {
        assert_eq!(best_code(404, 200), 200);
        assert_eq!(best_code(200, 404), 200);
        assert_eq!(best_code(404, 422), 422);
        assert_eq!(best_code(422, 400), 400);
        assert_eq!(best_code(400, 404), 400);
        assert_eq!(best_code(404, 404), 404);
        for c in [200, 400, 404, 422] {
            assert_eq!(best_code(c, 500), c, "an unknown code never wins");
        }
    }

    fn link(url: &str) -> PeerLink {
        PeerLink {
            name: "h2".into(),
            url: url.into(),
            token: Token::from_secret("peer-token-0123456789"),
            migration_uri: Some("qemu+tcp://h2/system".into()),
            timeout: Duration::from_secs(5),
        }
    }

    #[test]
    fn a_peer_is_its_link() {
        let p = HttpPeer::new(&link("http://127.0.0.1:1")).unwrap();
        assert_eq!(PeerHost::name(&p), "h2");
        assert_eq!(p.migration_uri().as_deref(), Some("qemu+tcp://h2/system"));
        assert_eq!(p.timeout(), Duration::from_secs(5));
        assert!(matches!(
            HttpPeer::new(&link("ftp://x")).unwrap_err(),
            ClientError::Url(_)
        ));
        let dir = directory(&[link("http://127.0.0.1:1")]).unwrap();
        assert_eq!(dir.names(), ["h2"]);
    }

    #[actix_rt::test]
    async fn non_peer_requests_are_refused_before_anything_is_sent() {
        // Port 1 on loopback: nothing listens; a request that were sent would fail with
        // `unavailable`, not `invalid`.
        let p = HttpPeer::new(&link("http://127.0.0.1:1")).unwrap();
        for r in [
            Operation::PowerOn {},
            Operation::ConfirmResize {},
            Operation::RevertResize {},
            Operation::CleanupForReschedule {},
        ] {
            let kind = r.kind();
            let e = p.request(Uuid::new_v4(), r).await.unwrap_err();
            assert!(matches!(e, InstanceError::Invalid(_)), "{kind}: {e}");
            assert!(e.to_string().contains(kind.as_str()), "{e}");
        }
        let e = p
            .request(Uuid::new_v4(), Operation::ConfirmResizeSource {})
            .await
            .unwrap_err();
        assert!(
            matches!(&e, InstanceError::Remote { host, code, .. }
                     if host == "h2" && code == CODE_UNAVAILABLE),
            "{e:?}"
        );
        assert_eq!(e.code(), CODE_UNAVAILABLE);
        assert_eq!(
            Request::ConfirmResizeSource.as_str(),
            "confirm-resize-source"
        );
    }
}
