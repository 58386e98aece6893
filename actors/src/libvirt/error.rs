//! The libvirt layer's one error type, and the mapping from libvirt's `VIR_ERR_*` codes.
//!
//! Every variant names the failed operation (`what`: the helper or the caller's label, e.g.
//! `"start"`) and, when libvirt reported the failure, keeps libvirt's error as the `#[source]`
//! so its numeric code, origin domain and message survive ([`LibvirtError::code`],
//! [`LibvirtError::origin`], [`LibvirtError::message`]).

use std::time::Duration;

use virt::error::Error as VirtError;
use virt::sys;

/// What went wrong in a libvirt call.
#[derive(Debug, thiserror::Error)]
pub enum LibvirtError {
    /// `VIR_ERR_NO_DOMAIN`: no domain with that UUID (or name).
    #[error("{what}: no such domain")]
    NoDomain {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_OPERATION_INVALID`: not valid in the domain's current state (start a running
    /// domain, suspend a stopped one, ...).
    #[error("{what}: not valid in the current state")]
    OperationInvalid {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_NO_SUPPORT`, `VIR_ERR_OPERATION_UNSUPPORTED`, `VIR_ERR_ARGUMENT_UNSUPPORTED`,
    /// `VIR_ERR_CONFIG_UNSUPPORTED`, or a flag the driver rejects (see
    /// [`crate::libvirt::LibvirtHandle::start`]): the driver cannot do this.
    #[error("{what}: not supported by this libvirt driver")]
    Unsupported {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_XML_ERROR`, `VIR_ERR_XML_DETAIL`, `VIR_ERR_XML_INVALID_SCHEMA`: the XML is
    /// malformed or fails libvirt's schema.
    #[error("{what}: invalid XML")]
    InvalidXml {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_DOM_EXIST` (and `VIR_ERR_OPERATION_FAILED` raised by a name/UUID clash when
    /// defining): the object already exists.
    #[error("{what}: conflicts with an existing domain")]
    Conflict {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_DEVICE_MISSING`, or (from `detach_device_alias`) an internal error while the
    /// domain has no device with that alias: no such device.
    #[error("{what}: no such device")]
    NoDevice {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_INVALID_ARG`: libvirt rejected an argument.
    #[error("{what}: invalid argument")]
    InvalidArgument {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// `VIR_ERR_OPERATION_TIMEOUT`, `VIR_ERR_AGENT_UNRESPONSIVE`,
    /// `VIR_ERR_AGENT_COMMAND_TIMEOUT`: libvirt itself gave up waiting.
    #[error("{what}: libvirt timed out")]
    LibvirtTimeout {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// The caller's deadline passed before the call returned. The worker thread running it
    /// stays busy (and counted as in flight) until libvirt returns.
    #[error("{what}: no reply within {after:?}")]
    Timeout {
        /// The failed operation.
        what: &'static str,
        /// The deadline that passed.
        after: Duration,
    },
    /// The connection to libvirt is gone: the call failed because the connection died under it
    /// (`source` is libvirt's error), or the layer is reconnecting and failed it fast (`source`
    /// is `None`).
    #[error("{what}: connection to libvirt lost")]
    ConnectionLost {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error, when a libvirt call failed.
        #[source]
        source: Option<VirtError>,
    },
    /// Opening the connection failed.
    #[error("opening {uri}")]
    Connect {
        /// The URI.
        uri: String,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// Any other libvirt error.
    #[error("{what}: libvirt call failed")]
    Other {
        /// The failed operation.
        what: &'static str,
        /// libvirt's error.
        #[source]
        source: VirtError,
    },
    /// The closure run on the worker thread panicked; the worker survives.
    #[error("{what}: the libvirt call panicked")]
    Panicked {
        /// The failed operation.
        what: &'static str,
    },
    /// The worker threads are gone (the layer is shutting down).
    #[error("{what}: the libvirt layer is shut down")]
    ShutDown {
        /// The failed operation.
        what: &'static str,
    },
    /// The configuration is not usable.
    #[error("invalid libvirt config: {reason}")]
    InvalidConfig {
        /// What is wrong.
        reason: String,
    },
    /// libvirt's event loop could not be set up.
    #[error("libvirt event loop: {detail}")]
    EventLoop {
        /// What failed.
        detail: String,
    },
    /// A thread could not be started.
    #[error("starting thread {name}")]
    Spawn {
        /// The thread's name.
        name: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// A coarse class of libvirt error, from its `VIR_ERR_*` code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Class {
    NoDomain,
    OperationInvalid,
    Unsupported,
    InvalidXml,
    Conflict,
    NoDevice,
    InvalidArgument,
    LibvirtTimeout,
    ConnectionLost,
    Other,
}

/// The class of a raw `VIR_ERR_*` code.
pub(crate) fn class_of(code: u32) -> Class {
    match code {
        sys::VIR_ERR_NO_DOMAIN => Class::NoDomain,
        sys::VIR_ERR_OPERATION_INVALID => Class::OperationInvalid,
        sys::VIR_ERR_NO_SUPPORT
        | sys::VIR_ERR_OPERATION_UNSUPPORTED
        | sys::VIR_ERR_ARGUMENT_UNSUPPORTED
        | sys::VIR_ERR_CONFIG_UNSUPPORTED => Class::Unsupported,
        sys::VIR_ERR_XML_ERROR | sys::VIR_ERR_XML_DETAIL | sys::VIR_ERR_XML_INVALID_SCHEMA => {
            Class::InvalidXml
        }
        sys::VIR_ERR_DOM_EXIST => Class::Conflict,
        sys::VIR_ERR_DEVICE_MISSING => Class::NoDevice,
        sys::VIR_ERR_INVALID_ARG => Class::InvalidArgument,
        sys::VIR_ERR_OPERATION_TIMEOUT
        | sys::VIR_ERR_AGENT_UNRESPONSIVE
        | sys::VIR_ERR_AGENT_COMMAND_TIMEOUT => Class::LibvirtTimeout,
        sys::VIR_ERR_NO_CONNECT | sys::VIR_ERR_INVALID_CONN => Class::ConnectionLost,
        _ => Class::Other,
    }
}

impl LibvirtError {
    /// Maps libvirt's error for operation `what` by its code.
    pub fn from_virt(what: &'static str, source: VirtError) -> Self {
        match class_of(source.code().to_raw()) {
            Class::NoDomain => Self::NoDomain { what, source },
            Class::OperationInvalid => Self::OperationInvalid { what, source },
            Class::Unsupported => Self::Unsupported { what, source },
            Class::InvalidXml => Self::InvalidXml { what, source },
            Class::Conflict => Self::Conflict { what, source },
            Class::NoDevice => Self::NoDevice { what, source },
            Class::InvalidArgument => Self::InvalidArgument { what, source },
            Class::LibvirtTimeout => Self::LibvirtTimeout { what, source },
            Class::ConnectionLost => Self::ConnectionLost {
                what,
                source: Some(source),
            },
            Class::Other => Self::Other { what, source },
        }
    }

    /// The libvirt error behind this one, if libvirt reported it.
    pub fn libvirt(&self) -> Option<&VirtError> {
        match self {
            Self::NoDomain { source, .. }
            | Self::OperationInvalid { source, .. }
            | Self::Unsupported { source, .. }
            | Self::InvalidXml { source, .. }
            | Self::Conflict { source, .. }
            | Self::NoDevice { source, .. }
            | Self::InvalidArgument { source, .. }
            | Self::LibvirtTimeout { source, .. }
            | Self::Connect { source, .. }
            | Self::Other { source, .. } => Some(source),
            Self::ConnectionLost { source, .. } => source.as_ref(),
            Self::Timeout { .. }
            | Self::Panicked { .. }
            | Self::ShutDown { .. }
            | Self::InvalidConfig { .. }
            | Self::EventLoop { .. }
            | Self::Spawn { .. } => None,
        }
    }

    /// libvirt's numeric error code (`virErrorNumber`), if libvirt reported the error.
    pub fn code(&self) -> Option<u32> {
        self.libvirt().map(|e| e.code().to_raw())
    }

    /// libvirt's numeric error origin (`virErrorDomain`), if libvirt reported the error.
    pub fn origin(&self) -> Option<u32> {
        self.libvirt().map(|e| e.domain().to_raw())
    }

    /// libvirt's message, if libvirt reported the error.
    pub fn message(&self) -> Option<&str> {
        self.libvirt().map(VirtError::message)
    }

    /// The failed operation (for [`LibvirtError::Connect`]: `"open"`; for config and thread
    /// errors: `"init"`).
    pub fn what(&self) -> &'static str {
        match self {
            Self::NoDomain { what, .. }
            | Self::OperationInvalid { what, .. }
            | Self::Unsupported { what, .. }
            | Self::InvalidXml { what, .. }
            | Self::Conflict { what, .. }
            | Self::NoDevice { what, .. }
            | Self::InvalidArgument { what, .. }
            | Self::LibvirtTimeout { what, .. }
            | Self::Timeout { what, .. }
            | Self::ConnectionLost { what, .. }
            | Self::Other { what, .. }
            | Self::Panicked { what }
            | Self::ShutDown { what } => what,
            Self::Connect { .. } => "open",
            Self::InvalidConfig { .. } | Self::EventLoop { .. } | Self::Spawn { .. } => "init",
        }
    }

    /// True for [`LibvirtError::ConnectionLost`].
    pub fn is_connection_lost(&self) -> bool {
        matches!(self, Self::ConnectionLost { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_classes() {
        let cases = [
            (sys::VIR_ERR_NO_DOMAIN, Class::NoDomain),
            (sys::VIR_ERR_OPERATION_INVALID, Class::OperationInvalid),
            (sys::VIR_ERR_NO_SUPPORT, Class::Unsupported),
            (sys::VIR_ERR_OPERATION_UNSUPPORTED, Class::Unsupported),
            (sys::VIR_ERR_ARGUMENT_UNSUPPORTED, Class::Unsupported),
            (sys::VIR_ERR_CONFIG_UNSUPPORTED, Class::Unsupported),
            (sys::VIR_ERR_XML_ERROR, Class::InvalidXml),
            (sys::VIR_ERR_XML_DETAIL, Class::InvalidXml),
            (sys::VIR_ERR_XML_INVALID_SCHEMA, Class::InvalidXml),
            (sys::VIR_ERR_DOM_EXIST, Class::Conflict),
            (sys::VIR_ERR_DEVICE_MISSING, Class::NoDevice),
            (sys::VIR_ERR_INVALID_ARG, Class::InvalidArgument),
            (sys::VIR_ERR_OPERATION_TIMEOUT, Class::LibvirtTimeout),
            (sys::VIR_ERR_AGENT_UNRESPONSIVE, Class::LibvirtTimeout),
            (sys::VIR_ERR_NO_CONNECT, Class::ConnectionLost),
            (sys::VIR_ERR_INVALID_CONN, Class::ConnectionLost),
            (sys::VIR_ERR_INTERNAL_ERROR, Class::Other),
            (sys::VIR_ERR_OPERATION_FAILED, Class::Other),
            (9999, Class::Other),
        ];
        for (code, class) in cases {
            assert_eq!(class_of(code), class, "code {code}");
        }
    }
}
