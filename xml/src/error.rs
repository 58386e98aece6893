//! The one error type of the crate: everything that can go wrong building, parsing or
//! rewriting domain XML.

use crate::types::ValueError;

/// Why a document could not be written, parsed or rewritten.
#[derive(Debug, thiserror::Error)]
pub enum XmlError {
    /// The text is not well-formed XML.
    #[error("malformed XML")]
    Syntax(#[source] quick_xml::Error),
    /// The XML does not have the shape of the element being parsed.
    #[error("XML does not match the expected element structure")]
    Decode(#[source] quick_xml::DeError),
    /// The document's root element is not the one asked for.
    #[error("expected a <{expected}> element, found <{found}>")]
    WrongRoot {
        /// Element asked for.
        expected: &'static str,
        /// Element found (empty when the document has none).
        found: String,
    },
    /// A value failed validation (bad MAC, UUID, PCI address, empty name, ...).
    #[error("{field}: invalid value")]
    Invalid {
        /// Where: an element/attribute path such as `devices/interface[1]/mac/@address`.
        field: String,
        /// What was wrong.
        #[source]
        source: ValueError,
    },
    /// A required element or attribute is absent.
    #[error("{field}: missing")]
    Missing {
        /// Where.
        field: String,
    },
    /// A value vireo does not model (an interface type, a bus, a unit, ...).
    #[error("{field}: unsupported value {value:?}")]
    Unsupported {
        /// Where.
        field: String,
        /// The value found.
        value: String,
    },
    /// A number that does not parse or is out of its range.
    #[error("{field}: not a number in range: {value:?}")]
    Number {
        /// Where.
        field: String,
        /// The value found.
        value: String,
    },
    /// A character XML 1.0 cannot carry (control characters, U+FFFE, U+FFFF).
    #[error("<{element}>{}: character {ch:?} cannot be written in XML", attribute.map(|a| format!(" @{a}")).unwrap_or_default())]
    InvalidChar {
        /// Element being written.
        element: &'static str,
        /// Attribute being written, if the character was in one.
        attribute: Option<&'static str>,
        /// The character.
        ch: char,
    },
    /// JSON stored in the metadata could not be written or read.
    #[error("metadata {field}: invalid JSON")]
    Json {
        /// Which metadata element.
        field: &'static str,
        /// The JSON error.
        #[source]
        source: serde_json::Error,
    },
    /// A rewrite selected no element.
    #[error("no {what} matches {selector}")]
    NotFound {
        /// What was looked for (`interface`).
        what: &'static str,
        /// The selector, as text.
        selector: String,
    },
    /// A rewrite selected more than one element where it needs exactly one.
    #[error("more than one {what} matches {selector}")]
    Ambiguous {
        /// What was looked for.
        what: &'static str,
        /// The selector, as text.
        selector: String,
    },
}

impl XmlError {
    pub(crate) fn invalid(field: impl Into<String>, source: ValueError) -> Self {
        XmlError::Invalid {
            field: field.into(),
            source,
        }
    }

    pub(crate) fn missing(field: impl Into<String>) -> Self {
        XmlError::Missing {
            field: field.into(),
        }
    }

    pub(crate) fn unsupported(field: impl Into<String>, value: &str) -> Self {
        XmlError::Unsupported {
            field: field.into(),
            value: value.to_owned(),
        }
    }

    pub(crate) fn number(field: impl Into<String>, value: &str) -> Self {
        XmlError::Number {
            field: field.into(),
            value: value.to_owned(),
        }
    }
}

impl From<quick_xml::DeError> for XmlError {
    fn from(e: quick_xml::DeError) -> Self {
        XmlError::Decode(e)
    }
}

impl From<quick_xml::Error> for XmlError {
    fn from(e: quick_xml::Error) -> Self {
        XmlError::Syntax(e)
    }
}
