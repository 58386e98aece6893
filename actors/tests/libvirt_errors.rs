//! libvirt errors reach callers as typed errors that keep libvirt's code, origin and message.
//! Every failure here is a real one from libvirt's test driver on a private `test:///`
//! connection.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test helpers outside #[test] fns

mod common;

use std::error::Error as _;

use common::{test_domain_xml, unique, TestNode};
use uuid::Uuid;
use vireo_actors::libvirt::{Affect, LibvirtError, Metadata};
use virt::sys;

#[tokio::test]
async fn a_missing_domain_is_no_domain_with_libvirts_code_and_message() {
    let node = TestNode::new();
    let lv = node.open().await;
    let missing = Uuid::new_v4();

    let err = lv.info(missing).await.unwrap_err();
    assert!(
        matches!(err, LibvirtError::NoDomain { what: "info", .. }),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_NO_DOMAIN));
    assert_eq!(err.origin(), Some(sys::VIR_FROM_TEST));
    assert_eq!(err.message(), Some("Domain not found"));
    assert_eq!(err.to_string(), "info: no such domain");
    assert!(err.source().is_some());

    for err in [
        lv.start(missing, false).await.unwrap_err(),
        lv.destroy(missing).await.unwrap_err(),
        lv.undefine(missing).await.unwrap_err(),
        lv.xml_desc(missing, true).await.unwrap_err(),
    ] {
        assert!(matches!(err, LibvirtError::NoDomain { .. }), "{err:?}");
    }
}

#[tokio::test]
async fn undefining_twice_gives_no_domain() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("twice");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    lv.undefine(uuid).await.unwrap();
    let err = lv.undefine(uuid).await.unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::NoDomain {
                what: "undefine",
                ..
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn malformed_and_schema_invalid_xml_are_invalid_xml() {
    let node = TestNode::new();
    let lv = node.open().await;

    let err = lv.define_xml("<domain", false).await.unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::InvalidXml {
                what: "define_xml",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_XML_DETAIL));

    let (name, uuid) = unique("schema");
    let extra = test_domain_xml(&name, uuid).replace("</domain>", "<bogus/></domain>");
    let err = lv.define_xml(extra.clone(), true).await.unwrap_err();
    assert!(matches!(err, LibvirtError::InvalidXml { .. }), "{err:?}");
    assert_eq!(err.code(), Some(sys::VIR_ERR_XML_INVALID_SCHEMA));
    assert!(
        err.message().is_some_and(|m| m.contains("bogus")),
        "{err:?}"
    );
    assert!(lv.list_all().await.unwrap().is_empty());

    // Without validation libvirt ignores the unknown element: the flag is what rejected it.
    let id = lv.define_xml(extra, false).await.unwrap();
    assert_eq!(id.uuid, uuid);
    assert_eq!(id.name, name);
}

#[tokio::test]
async fn a_name_clash_is_a_conflict() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("clash");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();

    let other = Uuid::new_v4();
    let err = lv
        .define_xml(test_domain_xml(&name, other), true)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::Conflict {
                what: "define_xml",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_OPERATION_FAILED));
    assert!(err.message().is_some_and(|m| m.contains(&name)), "{err:?}");

    let err = lv
        .create_xml(test_domain_xml(&name, other))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::Conflict {
                what: "create_xml",
                ..
            }
        ),
        "{err:?}"
    );

    // Redefining the same UUID is an update, not a clash.
    assert_eq!(
        lv.define_xml(test_domain_xml(&name, uuid), true)
            .await
            .unwrap()
            .uuid,
        uuid
    );
}

#[tokio::test]
async fn live_changes_to_a_stopped_domain_are_operation_invalid() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("stopped");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    let metadata = Metadata {
        xml: "<instance/>".into(),
        key: "vireo".into(),
        uri: "https://vireo.invalid/instance/1".into(),
    };

    let err = lv
        .set_metadata(uuid, metadata.clone(), Affect::Live)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::OperationInvalid {
                what: "set_metadata",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_OPERATION_INVALID));

    // The same change to the persistent config is fine.
    lv.set_metadata(uuid, metadata, Affect::Config)
        .await
        .unwrap();
}

#[tokio::test]
async fn driver_limits_are_unsupported() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("limits");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();

    // The test driver rejects START_PAUSED (as VIR_ERR_INVALID_ARG): the caller learns it
    // cannot start paused, and the domain did not start.
    let err = lv.start(uuid, true).await.unwrap_err();
    assert!(
        matches!(err, LibvirtError::Unsupported { what: "start", .. }),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_INVALID_ARG));
    assert!(!lv.is_active(uuid).await.unwrap());

    let err = lv
        .migrate(uuid, "test:///default".into(), 0, Default::default())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::Unsupported {
                what: "migrate",
                ..
            }
        ),
        "{err:?}"
    );

    let err = lv.abort_job(uuid).await.unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::Unsupported {
                what: "abort_job",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_NO_SUPPORT));
}

#[tokio::test]
async fn state_errors_the_test_driver_reports_as_internal_keep_their_code() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("running");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    let err = lv.suspend(uuid).await.unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::Other {
                what: "suspend",
                ..
            }
        ),
        "{err:?}"
    );
    lv.start(uuid, false).await.unwrap();

    // The test driver says "already running" with VIR_ERR_INTERNAL_ERROR (QEMU uses
    // VIR_ERR_OPERATION_INVALID): mapped by code, so it stays `Other`, code and message kept.
    let err = lv.start(uuid, false).await.unwrap_err();
    assert!(
        matches!(err, LibvirtError::Other { what: "start", .. }),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_INTERNAL_ERROR));
    assert!(
        err.message().is_some_and(|m| m.contains("already running")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_bad_argument_is_invalid_argument() {
    let node = TestNode::new();
    let lv = node.open().await;
    let (name, uuid) = unique("arg");
    lv.define_xml(test_domain_xml(&name, uuid), true)
        .await
        .unwrap();
    lv.start(uuid, false).await.unwrap();
    let err = lv
        .detach_device_alias(uuid, "net\0zero", Affect::Live)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LibvirtError::InvalidArgument {
                what: "detach_device_alias",
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.code(), Some(sys::VIR_ERR_INVALID_ARG));
}

#[tokio::test]
async fn the_escape_hatch_maps_errors_the_same_way() {
    let node = TestNode::new();
    let lv = node.open().await;
    let missing = Uuid::new_v4();
    let err = lv
        .call("lookup", move |conn| {
            conn.lookup_domain_by_uuid(missing).map(|_| ())
        })
        .await
        .unwrap_err();
    assert!(
        matches!(err, LibvirtError::NoDomain { what: "lookup", .. }),
        "{err:?}"
    );
    let hostname = lv.call("hostname", |conn| conn.hostname()).await.unwrap();
    assert!(!hostname.is_empty());
}
