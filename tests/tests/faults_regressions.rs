//! Regression tests for the bugs the fault matrix found (docs/FAULTS.md, "Bugs found"): each
//! is the smallest scenario that failed before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use vireo::compute::ComputeDriver;
use vireo_actors::instance::{DestroyArgs, InstanceError, LiveMigrateArgs, Migration};
use vireo_actors::lifecycle::{InstanceState, Request};
use vireo_actors::network::{BindingStatus, NetworkApi, PortRequest};

/// A live migration whose rollback cannot reach the network service leaves `migrating_to`
/// and the destination's inactive binding on the ports. Destroy with deallocation must take
/// them off a user-supplied port (which is unbound, not deleted), or they outlive the
/// instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_removes_what_a_failed_migration_rollback_left_on_a_user_port() {
    let c = spec(&["h1", "h2"]).start().await;
    let h1 = c.host("h1");
    let user = c.user_port(NET_NATIVE).await;
    let id = uuid();
    h1.driver
        .spawn(
            id,
            spawn_args(
                "vm-reg-lm",
                vec![on(NET_HYBRID), PortRequest::Port { port_id: user }],
            ),
        )
        .await
        .unwrap();
    // The migration fails (the test driver cannot migrate); the service goes down when the
    // rollback clears migrating_to.
    h1.net
        .fail_with(NetCall::SetupNetworks, 1, NetFailure::Down);
    let e = h1
        .driver
        .live_migrate(
            id,
            LiveMigrateArgs {
                migration: Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h2".into(),
                },
                shared_block_storage: false,
                shared_instance_path: false,
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            e,
            InstanceError::RollbackFailed {
                request: Request::LiveMigrate,
                ..
            }
        ),
        "{}",
        chain(&e)
    );
    assert_eq!(
        h1.driver.show(id).await.unwrap().state,
        InstanceState::Error
    );
    h1.net.set_down(false);
    let port = c.port(user).await;
    assert_eq!(port.migrating_to(), Some("h2"), "{port:?}");
    let bindings = c.network.show_bindings(user).await.unwrap();
    assert!(
        bindings
            .iter()
            .any(|b| b.host == "h2" && b.status == BindingStatus::Inactive),
        "{bindings:?}"
    );

    // The service is back; the instance goes.
    h1.driver
        .destroy(
            id,
            DestroyArgs {
                deallocate_network: true,
            },
        )
        .await
        .unwrap();
    let port = c.port(user).await;
    assert_eq!(port.migrating_to(), None, "{port:?}");
    assert_no_inactive_binding(&c, user).await;
    c.assert_clean(&[user]).await;
    c.delete_ports(&[user]).await;
}
