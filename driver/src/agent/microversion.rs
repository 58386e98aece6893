//! Nova's compute API microversions, as far as the external-events endpoint needs them.
//!
//! A client names the version it speaks in `OpenStack-API-Version: compute X.Y` (several
//! services may share the header, comma separated) or the legacy
//! `X-OpenStack-Nova-API-Version: X.Y`; the standard header wins when it names `compute`.
//! No header means Nova's minimum, 2.1 (what Neutron's notifier asks for); `latest` means the
//! maximum. A version that is not `X.Y` is refused with 400, one outside
//! [`MIN`]..=[`MAX`] with 406, as Nova does. Every answer names the version it was served at
//! in both headers, plus `Vary` on both.
//!
//! [`MAX`] is 2.93: the last microversion that changed this API (`volume-reimaged`). Nova's
//! own maximum is higher, but no later version changed what the endpoint accepts; a client
//! asking for one is answered 406 here and should ask for 2.93 or `latest`.

use std::fmt;

use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};

/// `OpenStack-API-Version`.
pub const STANDARD_HEADER: &str = "openstack-api-version";
/// `X-OpenStack-Nova-API-Version`.
pub const LEGACY_HEADER: &str = "x-openstack-nova-api-version";
/// The service name in the standard header.
const SERVICE: &str = "compute";

/// A compute API microversion `major.minor`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiVersion {
    /// Always 2 for the versions served.
    pub major: u32,
    /// The microversion.
    pub minor: u32,
}

/// The lowest version served (Nova's `v2.1`).
pub const MIN: ApiVersion = ApiVersion::new(2, 1);
/// The highest version served (see the module docs).
pub const MAX: ApiVersion = ApiVersion::new(2, 93);

impl ApiVersion {
    /// `major.minor`.
    pub const fn new(major: u32, minor: u32) -> Self {
        ApiVersion { major, minor }
    }

    /// Parse `X.Y` as Nova does: no sign, no leading zero (other than a lone `0` minor).
    pub fn parse(s: &str) -> Option<Self> {
        let (major, minor) = s.split_once('.')?;
        let number = |p: &str, zero_ok: bool| -> Option<u32> {
            let valid = !p.is_empty()
                && p.bytes().all(|b| b.is_ascii_digit())
                && (!p.starts_with('0') || (zero_ok && p == "0"));
            if valid {
                p.parse().ok()
            } else {
                None
            }
        };
        Some(ApiVersion::new(number(major, false)?, number(minor, true)?))
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

/// Why a request's version header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// Not `X.Y` (400).
    #[error("API Version String {0} is of invalid format. Must be of format MajorNum.MinorNum.")]
    Format(String),
    /// Outside the served range (406).
    #[error(
        "Version {0} is not supported by the API. Minimum is {min} and maximum is {max}.",
        min = MIN,
        max = MAX
    )]
    Unsupported(ApiVersion),
}

/// Every value of header `name`, joined with `,` (as HTTP allows a list header to be split).
fn joined(headers: &HeaderMap, name: &str) -> Option<String> {
    let values: Vec<&str> = headers
        .get_all(name)
        .filter_map(|v| v.to_str().ok())
        .collect();
    (!values.is_empty()).then(|| values.join(","))
}

/// The compute entry of a standard header's value (`compute 2.1, placement 1.0`).
fn compute_entry(value: &str) -> Option<String> {
    value.split(',').find_map(|item| {
        let mut words = item.split_whitespace();
        let service = words.next()?;
        let version = words.next()?;
        (service.eq_ignore_ascii_case(SERVICE) && words.next().is_none())
            .then(|| version.to_owned())
    })
}

/// The version a request asks for (see the module docs).
pub fn requested(headers: &HeaderMap) -> Result<ApiVersion, VersionError> {
    let asked = joined(headers, STANDARD_HEADER)
        .and_then(|v| compute_entry(&v))
        .or_else(|| joined(headers, LEGACY_HEADER).map(|v| v.trim().to_owned()));
    let Some(asked) = asked else {
        return Ok(MIN);
    };
    if asked.eq_ignore_ascii_case("latest") {
        return Ok(MAX);
    }
    let v = ApiVersion::parse(&asked).ok_or(VersionError::Format(asked))?;
    if (MIN..=MAX).contains(&v) {
        Ok(v)
    } else {
        Err(VersionError::Unsupported(v))
    }
}

/// The headers of an answer served at `v`.
pub fn answer_headers(v: ApiVersion) -> [(HeaderName, HeaderValue); 4] {
    let value = |s: String| HeaderValue::from_str(&s).unwrap_or(HeaderValue::from_static("2.1"));
    [
        (
            HeaderName::from_static(STANDARD_HEADER),
            value(format!("{SERVICE} {v}")),
        ),
        (HeaderName::from_static(LEGACY_HEADER), value(v.to_string())),
        (
            HeaderName::from_static("vary"),
            HeaderValue::from_static("OpenStack-API-Version"),
        ),
        (
            HeaderName::from_static("vary"),
            HeaderValue::from_static("X-OpenStack-Nova-API-Version"),
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn versions_parse_as_nova_parses_them() {
        assert_eq!(ApiVersion::parse("2.1"), Some(ApiVersion::new(2, 1)));
        assert_eq!(ApiVersion::parse("2.93"), Some(ApiVersion::new(2, 93)));
        assert_eq!(ApiVersion::parse("2.0"), Some(ApiVersion::new(2, 0)));
        for bad in [
            "", "2", "2.", ".1", "02.1", "2.01", "2.1.1", "+2.1", "2.x", "2 .1",
        ] {
            assert_eq!(ApiVersion::parse(bad), None, "{bad:?}");
        }
        assert!(ApiVersion::new(2, 10) > ApiVersion::new(2, 9));
    }

    #[test]
    fn the_standard_header_wins_and_no_header_is_the_minimum() {
        assert_eq!(requested(&HeaderMap::new()), Ok(MIN));
        let h = headers(&[(LEGACY_HEADER, "2.51")]);
        assert_eq!(requested(&h), Ok(ApiVersion::new(2, 51)));
        let h = headers(&[
            (STANDARD_HEADER, "placement 1.10, compute 2.76"),
            (LEGACY_HEADER, "2.51"),
        ]);
        assert_eq!(requested(&h), Ok(ApiVersion::new(2, 76)));
        // Split over two header lines.
        let h = headers(&[
            (STANDARD_HEADER, "placement 1.10"),
            (STANDARD_HEADER, "Compute 2.82"),
        ]);
        assert_eq!(requested(&h), Ok(ApiVersion::new(2, 82)));
        // The standard header without compute: the legacy one counts.
        let h = headers(&[(STANDARD_HEADER, "placement 1.10"), (LEGACY_HEADER, "2.51")]);
        assert_eq!(requested(&h), Ok(ApiVersion::new(2, 51)));
        assert_eq!(
            requested(&headers(&[(STANDARD_HEADER, "compute latest")])),
            Ok(MAX)
        );
    }

    #[test]
    fn malformed_is_a_format_error_and_out_of_range_unsupported() {
        assert_eq!(
            requested(&headers(&[(LEGACY_HEADER, "two")])),
            Err(VersionError::Format("two".into()))
        );
        assert_eq!(
            requested(&headers(&[(LEGACY_HEADER, "2.0")])),
            Err(VersionError::Unsupported(ApiVersion::new(2, 0)))
        );
        assert_eq!(
            requested(&headers(&[(STANDARD_HEADER, "compute 2.94")])),
            Err(VersionError::Unsupported(ApiVersion::new(2, 94)))
        );
        assert_eq!(
            VersionError::Unsupported(ApiVersion::new(3, 0)).to_string(),
            "Version 3.0 is not supported by the API. Minimum is 2.1 and maximum is 2.93."
        );
    }

    #[test]
    fn answers_name_their_version_in_both_headers() {
        let h = answer_headers(ApiVersion::new(2, 51));
        assert_eq!(h[0].1, "compute 2.51");
        assert_eq!(h[1].1, "2.51");
        assert_eq!(h[2].0, "vary");
    }
}
