//! The API's errors: one enum, each variant with an HTTP status and a stable code, answered as
//! `{"error": {"code", "message"}}`.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use uuid::Uuid;

use super::microversion::{answer_headers, ApiVersion, VersionError};
use super::model::{ErrorBody, ErrorDetail, OpKind};
use super::paths::PathError;
use vireo_actors::instance::{AdmissionError, InstanceError};

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No token, or not the right one.
    #[error("missing or invalid token")]
    Unauthorized,
    /// The body exceeds the configured limit.
    #[error("request body larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body could not be read from the connection.
    #[error("could not read the request body")]
    ReadBody,
    /// The body is not JSON of the expected shape.
    #[error("invalid JSON body: {0}")]
    BadJson(String),
    /// A value in the request is not acceptable.
    #[error("{0}")]
    Invalid(String),
    /// A path in the request is not allowed.
    #[error("invalid path")]
    Path(#[source] PathError),
    /// No such instance.
    #[error("instance {0} not found")]
    InstanceNotFound(Uuid),
    /// No such operation (or it was forgotten: only the newest finished ones are kept).
    #[error("operation {0} not found")]
    OperationNotFound(Uuid),
    /// No such route.
    #[error("no such resource")]
    NoRoute,
    /// Another operation of the instance is in flight.
    #[error("instance {instance} is busy with {kind} operation {op}")]
    Busy {
        /// The instance.
        instance: Uuid,
        /// The operation in flight.
        op: Uuid,
        /// Its kind.
        kind: OpKind,
    },
    /// The request is not allowed in the instance's state.
    #[error("{kind} is not allowed while the instance is {state}")]
    IllegalState {
        /// The refused operation.
        kind: OpKind,
        /// The instance's state.
        state: String,
    },
    /// The instance already exists.
    #[error("instance {0} already exists")]
    Exists(Uuid),
    /// The agent is shutting down.
    #[error("the agent is shutting down")]
    ShuttingDown,
    /// A host half did not finish within `half_timeout` (it may still be running here).
    #[error("the request did not finish within {secs} s; it may still be running")]
    HalfTimeout {
        /// The bound.
        secs: u64,
    },
    /// The instance refused the operation (what the API could not say more precisely).
    #[error(transparent)]
    Refused(AdmissionError),
    /// The driver refused or failed a synchronous call.
    #[error("{}", vireo_actors::instance::error_chain(.0))]
    Driver(InstanceError),
    /// The host's resources could not be read.
    #[error("{}", vireo_actors::instance::error_chain(.0))]
    Host(crate::compute::HostError),
    /// An instance's console output could not be read.
    #[error("{}", vireo_actors::instance::error_chain(.0))]
    Console(crate::compute::ConsoleError),
    /// A shared-directory probe could not be written in the instances directory.
    #[error("{}", vireo_actors::instance::error_chain(.0))]
    Probe(vireo_actors::storage::StorageError),
}

impl From<crate::compute::ConsoleError> for ApiError {
    fn from(e: crate::compute::ConsoleError) -> Self {
        match e {
            // Not found, or the driver's own answer: said as for any instance request.
            crate::compute::ConsoleError::Instance(e) => ApiError::from(e),
            other => ApiError::Console(other),
        }
    }
}

impl ApiError {
    /// The stable code.
    pub fn code(&self) -> &str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::BodyTooLarge { .. } => "body-too-large",
            ApiError::ReadBody => "bad-request",
            ApiError::BadJson(_) => "bad-json",
            ApiError::Invalid(_) => "invalid",
            ApiError::Path(_) => "invalid-path",
            ApiError::InstanceNotFound(_) | ApiError::OperationNotFound(_) | ApiError::NoRoute => {
                "not-found"
            }
            ApiError::Busy { .. } => "busy",
            ApiError::IllegalState { .. } => "illegal-state",
            ApiError::Exists(_) => "exists",
            ApiError::ShuttingDown => "shutting-down",
            ApiError::HalfTimeout { .. } => "timed-out",
            ApiError::Refused(e) => e.code(),
            ApiError::Driver(e) => e.code(),
            ApiError::Host(crate::compute::HostError::Libvirt(_)) => "libvirt",
            ApiError::Host(_) => "internal",
            ApiError::Console(crate::compute::ConsoleError::NoConsoleLog) => "no-console-log",
            ApiError::Console(_) => "internal",
            ApiError::Probe(_) => "storage",
        }
    }

    /// The body.
    pub fn body(&self) -> ErrorBody {
        let message = match self {
            // Say which path and why, without the source's own text repeated elsewhere.
            ApiError::Path(e) => format!("invalid path: {e}"),
            other => other.to_string(),
        };
        ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message,
            },
        }
    }
}

/// The HTTP status of an admission refusal.
fn status_for_admission(e: &AdmissionError) -> StatusCode {
    match e {
        AdmissionError::Busy { .. } | AdmissionError::IllegalState { .. } => StatusCode::CONFLICT,
        AdmissionError::NotFound(_) => StatusCode::NOT_FOUND,
        AdmissionError::NotAttached { .. } | AdmissionError::CrossHost { .. } => {
            StatusCode::BAD_REQUEST
        }
        AdmissionError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The HTTP status of a driver error, from its type.
pub fn status_for_driver(e: &InstanceError) -> StatusCode {
    match e {
        InstanceError::Refused(a) => status_for_admission(a),
        InstanceError::Invalid(_) => StatusCode::BAD_REQUEST,
        InstanceError::Cancelled | InstanceError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        InstanceError::QueuedDestroy { cause } => status_for_driver(cause),
        InstanceError::Libvirt { .. }
        | InstanceError::DestinationXml { .. }
        | InstanceError::Plug { .. }
        | InstanceError::Network { .. }
        | InstanceError::Storage { .. }
        | InstanceError::Journal { .. }
        | InstanceError::MigrationAborted { .. }
        | InstanceError::DeviceNotReleased { .. }
        | InstanceError::EventWait { .. }
        | InstanceError::Predict(_)
        | InstanceError::VifConfig(_)
        | InstanceError::Record(_)
        | InstanceError::Peer { .. }
        | InstanceError::UnknownHost(_)
        | InstanceError::BuildFailed { .. }
        | InstanceError::RolledBack { .. }
        | InstanceError::RollbackFailed { .. }
        | InstanceError::UnexpectedTransition { .. } => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ReadBody
            | ApiError::BadJson(_)
            | ApiError::Invalid(_)
            | ApiError::Path(_) => StatusCode::BAD_REQUEST,
            ApiError::InstanceNotFound(_) | ApiError::OperationNotFound(_) | ApiError::NoRoute => {
                StatusCode::NOT_FOUND
            }
            ApiError::Busy { .. } | ApiError::IllegalState { .. } | ApiError::Exists(_) => {
                StatusCode::CONFLICT
            }
            ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::HalfTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Refused(e) => status_for_admission(e),
            ApiError::Driver(e) => status_for_driver(e),
            // The hypervisor cannot be read (libvirtd down, reconnecting): unavailable.
            ApiError::Host(crate::compute::HostError::Libvirt(_)) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Host(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ApiError::Console(crate::compute::ConsoleError::NoConsoleLog) => StatusCode::CONFLICT,
            ApiError::Console(_) | ApiError::Probe(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        if matches!(self, ApiError::Unauthorized) {
            resp.insert_header(("WWW-Authenticate", "Bearer"));
        }
        resp.json(self.body())
    }
}

/// An error of the Nova-compatible external-events endpoint, answered as Nova's API answers
/// one: `{"<faultName>": {"code": <status>, "message": "..."}}` (`badRequest`,
/// `itemNotFound`, `overLimit`, ...), with the microversion headers when the request's version
/// was known. The agent's own API keeps its `{"error": {"code", "message"}}`.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct NovaFault {
    status: StatusCode,
    message: String,
    version: Option<ApiVersion>,
}

impl NovaFault {
    /// `e`, answered at `version` (`None`: before the version was read).
    pub fn new(e: ApiError, version: Option<ApiVersion>) -> Self {
        let message = match &e {
            ApiError::BadJson(m) => format!("Invalid input: {m}"),
            other => other.body().error.message,
        };
        NovaFault {
            status: e.status_code(),
            message,
            version,
        }
    }

    /// The fault's name, as Nova's `Fault` names a status.
    pub fn name(status: StatusCode) -> &'static str {
        match status.as_u16() {
            400 => "badRequest",
            401 => "unauthorized",
            403 => "forbidden",
            404 => "itemNotFound",
            405 => "badMethod",
            409 => "conflictingRequest",
            413 | 429 => "overLimit",
            415 => "badMediaType",
            501 => "notImplemented",
            503 => "serviceUnavailable",
            _ => "computeFault",
        }
    }
}

impl From<VersionError> for NovaFault {
    fn from(e: VersionError) -> Self {
        let status = match e {
            VersionError::Format(_) => StatusCode::BAD_REQUEST,
            VersionError::Unsupported(_) => StatusCode::NOT_ACCEPTABLE,
        };
        NovaFault {
            status,
            message: e.to_string(),
            version: None,
        }
    }
}

impl ResponseError for NovaFault {
    fn status_code(&self) -> StatusCode {
        self.status
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status);
        if self.status == StatusCode::UNAUTHORIZED {
            resp.insert_header(("WWW-Authenticate", "Bearer"));
        }
        if let Some(v) = self.version {
            for h in answer_headers(v) {
                resp.append_header(h);
            }
        }
        let mut fault = serde_json::Map::new();
        fault.insert(
            Self::name(self.status).to_owned(),
            serde_json::json!({"code": self.status.as_u16(), "message": self.message}),
        );
        resp.json(serde_json::Value::Object(fault))
    }
}

impl From<InstanceError> for ApiError {
    fn from(e: InstanceError) -> Self {
        match e {
            InstanceError::Refused(AdmissionError::NotFound(uuid)) => {
                ApiError::InstanceNotFound(uuid)
            }
            InstanceError::Refused(e) => ApiError::Refused(e),
            other => ApiError::Driver(other),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vireo_actors::instance::InvalidOperation;
    use vireo_actors::lifecycle::{InstanceState, Request};

    #[test]
    fn driver_codes_map_to_statuses() {
        let u = Uuid::nil();
        let cases = [
            (
                AdmissionError::Busy {
                    running: Request::Spawn,
                }
                .into(),
                409,
            ),
            (
                AdmissionError::IllegalState {
                    state: InstanceState::Stopped,
                    request: Request::Pause,
                }
                .into(),
                409,
            ),
            (AdmissionError::NotFound(u).into(), 404),
            (AdmissionError::Unavailable.into(), 503),
            (AdmissionError::CrossHost { host: "h2".into() }.into(), 400),
            (
                InvalidOperation::NoResize {
                    request: Request::RevertResize,
                }
                .into(),
                400,
            ),
            (InstanceError::UnknownHost("h".into()), 500),
            (InstanceError::Unavailable, 503),
        ];
        for (e, status) in cases {
            let code = e.code().to_owned();
            let api = ApiError::from(e);
            assert_eq!(api.status_code().as_u16(), status, "{code}");
            assert_eq!(api.code(), code);
        }
    }
}
