//! The instance and host actors on libvirt's test driver with the embedded network service:
//! one operation at a time per instance (a second is refused with Busy, destroy cancels and
//! follows), instances in parallel, every request refused in every state that does not
//! accept it, libvirt events reaching the owning actor, power, suspend, interfaces.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod faults_support;

use std::time::{Duration, Instant};

use common::*;
use vireo::compute::{ComputeDriver, ComputeOps};
use vireo_actors::instance::{
    AdmissionError, Admitted, BootSource, DestroyArgs, Handover, InstanceError, LiveMigrateArgs,
    Migration, Operation, PowerState, RebootKind, ResizeArgs,
};
use vireo_actors::lifecycle::{accepts, InstanceState, Request};
use vireo_actors::network::{NetworkApi, PortUpdate};
use vireo_actors::predict::Timing;
use vireo_actors::vif::{PortId, Vif};

fn dealloc() -> DestroyArgs {
    DestroyArgs {
        deallocate_network: true,
    }
}

async fn state(h: &Host, id: uuid::Uuid) -> InstanceState {
    h.driver.show(id).await.unwrap().state
}

async fn eventually_state(h: &Host, id: uuid::Uuid, want: InstanceState) {
    eventually(Duration::from_secs(5), &format!("{want}"), || async {
        match h.driver.show(id).await {
            Ok(v) if v.state == want => Some(()),
            _ => None,
        }
    })
    .await
}

/// Make a running instance's guest one that restarts when asked to power off: redefine it so
/// and start it again.
async fn make_stubborn(h: &Host, id: uuid::Uuid) {
    let lv = h.driver.libvirt();
    h.driver.power_off(id, None).await.unwrap();
    let xml = lv.xml_desc(id, true).await.unwrap();
    assert!(xml.contains("<on_poweroff>destroy</on_poweroff>"), "{xml}");
    lv.define_xml(
        xml.replace(
            "<on_poweroff>destroy</on_poweroff>",
            "<on_poweroff>restart</on_poweroff>",
        ),
        false,
    )
    .await
    .unwrap();
    h.driver.power_on(id).await.unwrap();
}

// ----------------------------------------------------------------------------------------
// One operation at a time

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_request_while_an_operation_runs_is_busy() {
    // Every event arrives 1 s after its cause: a spawn waits about 1 s.
    let c = spec(&["h1"]).event_delay_ms(1000).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    let d = h1.driver.clone();
    let build = tokio::spawn(async move {
        d.spawn(id, spawn_args("vm-busy", vec![on(NET_NATIVE)]))
            .await
    });
    let view = at_phase(&h1.driver, id, "wait for events").await;
    assert_eq!(view.state, InstanceState::Building);
    let op = view.operation.unwrap();
    assert_eq!(op.request, "spawn");
    assert_eq!(op.waiting_for.len(), 1);
    for request in [
        Operation::PowerOff { timeout: None },
        Operation::Pause {},
        Operation::RebootHard {},
        Operation::CleanupForReschedule {},
    ] {
        let e = h1.driver.submit(id, request).await.unwrap_err();
        assert!(
            matches!(
                e,
                AdmissionError::Busy {
                    running: Request::Spawn
                }
            ),
            "{e}"
        );
        assert_eq!(e.code(), "busy");
    }
    // The spawn goes on undisturbed.
    let report = build.await.unwrap().unwrap();
    assert!(report.waits.iter().all(|w| w.complete));
    assert_eq!(state(h1, id).await, InstanceState::Running);
    h1.driver.pause(id).await.unwrap();
    h1.driver.destroy(id, dealloc()).await.unwrap();
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_is_answered_before_the_operation_runs_and_one_destroy_waits_at_a_time() {
    // Every event arrives 1 s after its cause: the spawn is still running when its ticket
    // comes back.
    let c = spec(&["h1"]).event_delay_ms(1000).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    let build = h1
        .driver
        .submit(
            id,
            Operation::Spawn(Box::new(spawn_args("vm-admit", vec![on(NET_NATIVE)]))),
        )
        .await
        .unwrap();
    assert_eq!(build.request(), Request::Spawn);
    let Admitted::Started(op_id) = build.admitted() else {
        panic!("{:?}", build.admitted());
    };
    let running = h1.driver.show(id).await.unwrap().operation.unwrap();
    assert_eq!(
        (running.op_id, running.request.as_str()),
        (op_id.0, "spawn")
    );

    build.finished().await.unwrap();

    // A destroy is admitted next to a running operation, behind it; a second one is refused.
    // The operation: a power-off of a guest that restarts when asked to stop, so it runs its
    // whole 2 s grace period (destroy cancels event waits; a power-off has none).
    make_stubborn(h1, id).await;
    let timeout = Some(Duration::from_secs(2));
    let power_off = h1.driver.submit(id, Operation::PowerOff { timeout });
    let power_off = power_off.await.unwrap();
    assert!(matches!(power_off.admitted(), Admitted::Started(_)));
    let destroy = h1.driver.submit(id, Operation::Destroy(dealloc()));
    let destroy = destroy.await.unwrap();
    assert_eq!(destroy.admitted(), Admitted::Queued);
    let again = h1.driver.submit(id, Operation::Destroy(dealloc()));
    assert_eq!(
        again.await.unwrap_err(),
        AdmissionError::Busy {
            running: Request::PowerOff
        }
    );
    power_off.finished().await.unwrap();
    destroy.finished().await.unwrap();
    // Nothing here now: a destroy is done at admission.
    let nothing = h1.driver.submit(id, Operation::Destroy(dealloc()));
    let nothing = nothing.await.unwrap();
    assert_eq!(nothing.admitted(), Admitted::NothingHere);
    nothing.finished().await.unwrap();
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detaching_a_port_the_instance_does_not_have_is_refused_at_admission() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, "vm-not-attached", vec![on(NET_NATIVE)])
        .await;
    let stranger = PortId(uuid());
    let e = h1
        .driver
        .submit(id, Operation::DetachInterface { port_id: stranger })
        .await
        .unwrap_err();
    assert_eq!(e, AdmissionError::NotAttached { port: stranger });
    assert_eq!(e.code(), "invalid");
    let view = h1.driver.show(id).await.unwrap();
    assert!(view.operation.is_none(), "nothing started");
    assert_eq!(view.vifs.len(), 1);
    assert_eq!(view.last_operation.unwrap().request, "spawn");
    h1.driver.destroy(id, dealloc()).await.unwrap();
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_during_a_build_cancels_its_wait_rolls_back_then_destroys() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    let (p, vif) = silent_port(&c, id, NET_NATIVE).await;
    let mut args = spawn_args("vm-cancel", vec![]);
    args.network =
        vireo_actors::instance::NetworkRequest::Allocated(vireo_actors::vif::NetworkInfo {
            vifs: vec![vif],
        });
    let d = h1.driver.clone();
    let build = tokio::spawn(async move { d.spawn(id, args).await });
    at_phase(&h1.driver, id, "wait for events").await;
    let t0 = Instant::now();
    let r = h1.driver.destroy(id, dealloc()).await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert_eq!(r.request, "destroy");
    let e = build.await.unwrap().unwrap_err();
    assert!(
        matches!(e, InstanceError::BuildFailed { .. }),
        "{}",
        chain(&e)
    );
    assert!(chain(&e).contains("cancelled"), "{}", chain(&e));
    assert!(matches!(
        h1.driver.show(id).await,
        Err(InstanceError::Refused(AdmissionError::NotFound(_)))
    ));
    assert_eq!(c.stats().await.cancelled, 1);
    c.assert_clean(&[p]).await;
    c.delete_ports(&[p]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_during_a_hard_reboot_cancels_it() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, "vm-reboot", vec![on(NET_NATIVE)]).await;
    let port = ports(&h1.driver.show(id).await.unwrap())[0];
    // Its agent loses the port: the reboot's plug-time event never comes.
    c.network
        .update_port(
            port,
            &PortUpdate {
                host_id: Some("elsewhere".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    let d = h1.driver.clone();
    let reboot = tokio::spawn(async move { d.reboot(id, RebootKind::Hard).await });
    at_phase(&h1.driver, id, "wait for events").await;
    h1.driver.destroy(id, dealloc()).await.unwrap();
    let e = reboot.await.unwrap().unwrap_err();
    assert!(chain(&e).contains("cancelled"), "{}", chain(&e));
    c.assert_clean(&[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_build_in_parallel() {
    const N: usize = 8;
    let c = spec(&["h1"]).event_delay_ms(400).start().await;
    let h1 = c.host("h1");
    // One build alone.
    let id = uuid();
    let t0 = Instant::now();
    h1.spawn_on(id, "vm-alone", vec![on(NET_NATIVE), on(NET_LB)])
        .await;
    let one = t0.elapsed();
    assert!(one >= Duration::from_millis(400), "{one:?}");
    h1.driver.destroy(id, dealloc()).await.unwrap();
    // N builds at once take about as long as one, not N times as long.
    let ids: Vec<_> = (0..N).map(|_| uuid()).collect();
    let t0 = Instant::now();
    let builds: Vec<_> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let d = h1.driver.clone();
            let id = *id;
            tokio::spawn(async move {
                d.spawn(
                    id,
                    spawn_args(&format!("vm-par-{i}"), vec![on(NET_NATIVE), on(NET_LB)]),
                )
                .await
            })
        })
        .collect();
    for b in builds {
        b.await.unwrap().unwrap();
    }
    let all = t0.elapsed();
    assert!(
        all < one * (N as u32) / 2,
        "{N} parallel builds took {all:?}, one took {one:?}"
    );
    let list = h1.driver.list().await;
    assert_eq!(list.len(), N);
    assert!(list.iter().all(|v| v.state == InstanceState::Running));
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(list.iter().map(|v| v.uuid).collect::<Vec<_>>(), sorted);
    for id in &ids {
        h1.driver.destroy(*id, dealloc()).await.unwrap();
    }
    c.assert_clean(&[]).await;
}

// ----------------------------------------------------------------------------------------
// Illegal requests

fn sample(req: Request, vif: &Vif, handover: &Handover) -> Operation {
    let migration = Migration {
        id: uuid(),
        source_host: "h1".into(),
        dest_host: "h2".into(),
    };
    let r = match req {
        Request::Spawn => Operation::Spawn(Box::new(spawn_args("vm-x", vec![]))),
        Request::Destroy => Operation::Destroy(DestroyArgs::default()),
        Request::PowerOff => Operation::PowerOff { timeout: None },
        Request::PowerOn => Operation::PowerOn {},
        Request::RebootSoft => Operation::RebootSoft {},
        Request::RebootHard => Operation::RebootHard {},
        Request::Pause => Operation::Pause {},
        Request::Unpause => Operation::Unpause {},
        Request::Suspend => Operation::Suspend {},
        Request::Resume => Operation::Resume {},
        Request::Resize => Operation::Resize(Box::new(ResizeArgs::of(
            &migration,
            flavor("m1.small", 2, 512),
        ))),
        Request::FinishResize => Operation::FinishResize {
            migration,
            handover: Box::new(handover.clone()),
            caller: None,
        },
        Request::ConfirmResize => Operation::ConfirmResize {},
        Request::ConfirmResizeSource => Operation::ConfirmResizeSource {
            remove_after: false,
        },
        Request::RevertResize => Operation::RevertResize {},
        Request::FinishRevertResize => Operation::FinishRevertResize { caller: None },
        Request::LiveMigrate => Operation::LiveMigrate(Box::new(LiveMigrateArgs::of(&migration))),
        Request::PreLiveMigration => Operation::PreLiveMigration {
            migration,
            handover: Box::new(handover.clone()),
            caller: None,
        },
        Request::PostLiveMigrationAtDestination => Operation::PostLiveMigrationAtDestination {
            migration,
            caller: None,
        },
        Request::RollbackLiveMigrationAtDestination => {
            Operation::RollbackLiveMigrationAtDestination {
                handover: Box::new(handover.clone()),
                do_cleanup: true,
                destroy_disks: true,
                migration_id: Some(migration.id),
                caller: None,
            }
        }
        Request::AttachInterface => Operation::AttachInterface {
            vif: Box::new(vif.clone()),
        },
        Request::DetachInterface => Operation::DetachInterface { port_id: vif.id },
        Request::PlugVifs => Operation::PlugVifs {},
        Request::UnplugVifs => Operation::UnplugVifs {},
        Request::CleanupForReschedule => Operation::CleanupForReschedule {},
        Request::Recover => Operation::Recover(Box::new(
            vireo_actors::instance::Interrupted::Marked(vireo_actors::instance::Marker {
                id: "1".into(),
                phase: "start".into(),
                started_at: 0,
                operation: vireo_actors::instance::InFlight::PowerOn,
            }),
        )),
    };
    assert_eq!(r.kind(), req);
    r
}

/// Every request `state` does not accept is refused with IllegalState and changes nothing.
async fn assert_refusals(h: &Host, id: uuid::Uuid, want: InstanceState, vif: &Vif, ho: &Handover) {
    assert_eq!(state(h, id).await, want);
    let domains = h.driver.libvirt().list_all().await.unwrap();
    let mut refused = 0;
    for req in Request::ALL {
        if accepts(want, req) {
            continue;
        }
        let e = h.driver.submit(id, sample(req, vif, ho)).await.unwrap_err();
        match &e {
            AdmissionError::IllegalState { state, request } => {
                assert_eq!((*state, *request), (want, req), "{e}");
                assert_eq!(e.code(), "illegal-state");
            }
            other => panic!("{req} in {want}: {other}"),
        }
        refused += 1;
    }
    assert!(refused > 0);
    assert_eq!(state(h, id).await, want, "state changed");
    assert_eq!(h.driver.libvirt().list_all().await.unwrap(), domains);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_is_refused_in_every_state_that_does_not_accept_it() {
    let c = spec(&["h1", "h2"]).start().await;
    let (h1, h2) = (c.host("h1"), c.host("h2"));
    // A VIF and a handover to build requests from (never used: every request is refused).
    let spare = c.user_port(NET_NATIVE).await;
    c.network
        .update_port(
            spare,
            &PortUpdate {
                host_id: Some("h1".into()),
                ..PortUpdate::default()
            },
        )
        .await
        .unwrap();
    let ni = network_info(&*c.network, &[spare]).await;
    let vif = ni.vifs[0].clone();
    let ho = Handover {
        name: "vm-ho".into(),
        flavor: flavor("m1.tiny", 1, 256),
        old_flavor: flavor("m1.tiny", 1, 256),
        boot: BootSource::None,
        storage: Default::default(),
        network_info: ni.to_value(),
        power_on: true,
    };
    let spawn = |name: &'static str| {
        let d = h1.driver.clone();
        async move {
            let id = uuid();
            d.spawn(id, spawn_args(name, vec![on(NET_NATIVE)]))
                .await
                .unwrap();
            id
        }
    };

    let running = spawn("vm-running").await;
    assert_refusals(h1, running, InstanceState::Running, &vif, &ho).await;
    let paused = spawn("vm-paused").await;
    h1.driver.pause(paused).await.unwrap();
    assert_refusals(h1, paused, InstanceState::Paused, &vif, &ho).await;
    let stopped = spawn("vm-stopped").await;
    h1.driver.power_off(stopped, None).await.unwrap();
    assert_refusals(h1, stopped, InstanceState::Stopped, &vif, &ho).await;
    let suspended = spawn("vm-suspended").await;
    h1.driver.suspend(suspended).await.unwrap();
    assert_refusals(h1, suspended, InstanceState::Suspended, &vif, &ho).await;
    let resized = spawn("vm-resized").await;
    h1.driver
        .resize(
            resized,
            ResizeArgs::of(
                &Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h2".into(),
                },
                flavor("m1.small", 2, 512),
            ),
        )
        .await
        .unwrap();
    assert_refusals(h1, resized, InstanceState::ResizeSource, &vif, &ho).await;
    assert_refusals(h2, resized, InstanceState::ResizeTarget, &vif, &ho).await;
    let incoming = uuid();
    let mut ho_in = ho.clone();
    ho_in.name = "vm-incoming".into();
    h2.driver
        .complete(
            incoming,
            Operation::PreLiveMigration {
                migration: Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h2".into(),
                },
                handover: Box::new(ho_in.clone()),
                caller: None,
            },
        )
        .await
        .unwrap();
    assert_refusals(h2, incoming, InstanceState::Incoming, &vif, &ho).await;
    // Error: the domain vanished behind vireo's back.
    let errored = spawn("vm-error").await;
    let lv = h1.driver.libvirt();
    lv.destroy(errored).await.unwrap();
    lv.undefine(errored).await.unwrap();
    eventually_state(h1, errored, InstanceState::Error).await;
    assert_refusals(h1, errored, InstanceState::Error, &vif, &ho).await;

    // Nothing here (never was, or destroyed): every request that does not create the
    // instance is NotFound, destroy is a no-op.
    for id in [uuid(), running] {
        if id == running {
            h1.driver.destroy(id, dealloc()).await.unwrap();
        }
        for req in Request::ALL {
            if matches!(
                req,
                Request::Spawn
                    | Request::FinishResize
                    | Request::PreLiveMigration
                    | Request::RollbackLiveMigrationAtDestination
            ) {
                continue;
            }
            let r = h1.driver.complete(id, sample(req, &vif, &ho)).await;
            if req == Request::Destroy {
                assert!(r.is_ok());
            } else {
                assert!(
                    matches!(r, Err(InstanceError::Refused(AdmissionError::NotFound(u))) if u == id),
                    "{req}: {r:?}"
                );
            }
        }
    }

    for id in [paused, stopped, suspended, resized, errored] {
        c.destroy_everywhere(id).await;
    }
    h2.driver
        .complete(
            incoming,
            Operation::RollbackLiveMigrationAtDestination {
                handover: Box::new(ho_in),
                do_cleanup: true,
                destroy_disks: true,
                migration_id: None,
                caller: None,
            },
        )
        .await
        .unwrap();
    c.network
        .update_port(
            spare,
            &vireo_actors::network::unbind_update(&c.port(spare).await),
        )
        .await
        .unwrap();
    c.assert_clean(&[spare]).await;
    c.delete_ports(&[spare]).await;
}

// ----------------------------------------------------------------------------------------
// libvirt events

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libvirt_events_reach_the_owning_actor() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let lv = h1.driver.libvirt();
    let (a, b) = (uuid(), uuid());
    for (id, name) in [(a, "vm-a"), (b, "vm-b")] {
        h1.spawn_on(id, name, vec![on(NET_HYBRID), on(NET_NATIVE)])
            .await;
    }
    let a_native = ports_by_network(&c, &h1.driver.show(a).await.unwrap()).await[NET_NATIVE];
    // A stopped behind vireo's back: A reconciles to stopped, B is untouched.
    lv.destroy(a).await.unwrap();
    eventually_state(h1, a, InstanceState::Stopped).await;
    assert_eq!(h1.driver.show(a).await.unwrap().power, PowerState::Shutoff);
    assert_eq!(state(h1, b).await, InstanceState::Running);
    // Its libvirt-made tap went with it: the port goes down, and power on waits for (and
    // gets) its event again.
    c.port_eventually(a_native, vireo_actors::network::PortStatus::Down)
        .await;
    let r = h1.driver.power_on(a).await.unwrap();
    assert_eq!(waited(&r, Timing::PlugTime), vec![a_native]);
    assert_eq!(state(h1, a).await, InstanceState::Running);
    // Stopped by vireo, started behind its back: running, its tap back.
    h1.driver.power_off(a, None).await.unwrap();
    lv.start(a, false).await.unwrap();
    eventually_state(h1, a, InstanceState::Running).await;
    c.port_eventually(a_native, vireo_actors::network::PortStatus::Active)
        .await;
    h1.driver.reboot(a, RebootKind::Hard).await.unwrap();
    // Paused and resumed behind vireo's back.
    lv.suspend(b).await.unwrap();
    eventually_state(h1, b, InstanceState::Paused).await;
    lv.resume(b).await.unwrap();
    eventually_state(h1, b, InstanceState::Running).await;

    // A quick stop and start is a reboot, not a stop: B never shows stopped.
    lv.destroy(b).await.unwrap();
    lv.start(b, false).await.unwrap();
    let until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < until {
        assert_eq!(state(h1, b).await, InstanceState::Running);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // A's domain removed entirely: A is in error with its devices and ports still held, and
    // destroy releases them.
    lv.destroy(a).await.unwrap();
    lv.undefine(a).await.unwrap();
    eventually_state(h1, a, InstanceState::Error).await;
    let view = h1.driver.show(a).await.unwrap();
    assert_eq!(view.power, PowerState::NoDomain);
    assert_eq!(view.vifs.len(), 2);
    for v in &view.vifs {
        assert!(h1.plugger.plugged().contains(&v.port));
    }
    c.destroy_everywhere(a).await;
    c.destroy_and_assert_clean(&[b], &[]).await;
}

// ----------------------------------------------------------------------------------------
// Power, suspend, interfaces

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reboots_and_power_on_wait_for_exactly_what_the_service_sends() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(
        id,
        "vm-reboots",
        vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)],
    )
    .await;
    let by = ports_by_network(&c, &h1.driver.show(id).await.unwrap()).await;
    let (na, lb) = (by[NET_NATIVE], by[NET_LB]);
    // Hard reboot, soft reboot (a graceful shutdown, then a start: Nova's) and power on
    // recreate the libvirt-made taps (native OVS, Linux bridge); the hybrid qvo stays:
    // exactly two events come, and exactly those are awaited.
    for step in ["reboot-hard", "reboot-soft", "power-on"] {
        if step == "power-on" {
            h1.driver.power_off(id, None).await.unwrap();
        }
        let t0 = Instant::now();
        let r = match step {
            "reboot-hard" => h1.driver.reboot(id, RebootKind::Hard).await.unwrap(),
            "reboot-soft" => h1.driver.reboot(id, RebootKind::Soft).await.unwrap(),
            _ => h1.driver.power_on(id).await.unwrap(),
        };
        let t1 = Instant::now();
        assert!(waited(&r, Timing::BindTime).is_empty(), "{step}: {r:#?}");
        assert_eq!(set(waited(&r, Timing::PlugTime)), set([na, lb]), "{step}");
        assert!(r.waits.iter().all(|w| w.complete), "{step}: {r:#?}");
        let sent = c.sink.plugged(id, t0, t1);
        assert_eq!(sent.len(), 2, "{step}: {sent:?}");
        assert_eq!(set(sent), set([na, lb]), "{step}");
        assert_eq!(state(h1, id).await, InstanceState::Running);
    }
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn suspend_resume_and_power_off_from_suspended() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, "vm-suspend", vec![on(NET_HYBRID), on(NET_NATIVE)])
        .await;
    let native = ports_by_network(&c, &h1.driver.show(id).await.unwrap()).await[NET_NATIVE];
    h1.driver.suspend(id).await.unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Suspended);
    // The libvirt-made tap went with the guest (the service hears of it from its watcher).
    c.port_eventually(native, vireo_actors::network::PortStatus::Down)
        .await;
    let r = h1.driver.resume(id).await.unwrap();
    assert_eq!(waited(&r, Timing::PlugTime), vec![native]);
    assert!(r.waits.iter().all(|w| w.complete));
    assert_eq!(state(h1, id).await, InstanceState::Running);
    // Power off a suspended guest: its saved image is dropped, it starts fresh.
    h1.driver.suspend(id).await.unwrap();
    h1.driver.power_off(id, None).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Stopped);
    h1.driver.power_on(id).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Running);
    c.destroy_and_assert_clean(&[id], &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_off_that_the_guest_ignores_ends_hard_after_the_timeout() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(id, "vm-stubborn", vec![on(NET_NATIVE)]).await;
    make_stubborn(h1, id).await;
    let t0 = Instant::now();
    let r = h1
        .driver
        .power_off(id, Some(Duration::from_millis(300)))
        .await
        .unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    let names: Vec<_> = r.steps.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"shutdown"), "{names:?}");
    assert!(names.contains(&"destroy"), "{names:?}");
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Stopped);
    assert_eq!(view.power, PowerState::Shutoff);
    c.destroy_and_assert_clean(&[id], &[]).await;
}

async fn has_alias(
    lv: &vireo_actors::libvirt::LibvirtHandle,
    id: uuid::Uuid,
    inactive: bool,
    port: PortId,
) -> bool {
    lv.xml_desc(id, inactive)
        .await
        .unwrap()
        .contains(&format!("ua-{port}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_and_detach_interfaces_running_and_stopped() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let lv = h1.driver.libvirt();
    let id = uuid();
    h1.spawn_on(id, "vm-nics", vec![on(NET_HYBRID)]).await;
    let extra = c.user_port(NET_NATIVE).await;
    let bind = |_p: PortId| PortUpdate {
        host_id: Some("h1".into()),
        device_id: Some(id.to_string()),
        device_owner: Some("compute:nova".into()),
        ..PortUpdate::default()
    };
    c.network.update_port(extra, &bind(extra)).await.unwrap();
    let vif = network_info(&*c.network, &[extra]).await.vifs.remove(0);

    // Running: plugged, attached, its plug-time event awaited.
    let r = h1.driver.attach_interface(id, vif.clone()).await.unwrap();
    assert_eq!(waited(&r, Timing::PlugTime), vec![extra]);
    assert!(r.waits.iter().all(|w| w.complete), "{r:#?}");
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.vifs.len(), 2);
    assert!(h1.plugger.plugged().contains(&extra));
    for inactive in [false, true] {
        assert!(has_alias(lv, id, inactive, extra).await);
    }
    // Twice: refused.
    let e = h1
        .driver
        .attach_interface(id, vif.clone())
        .await
        .unwrap_err();
    assert!(matches!(e, InstanceError::Invalid(_)), "{}", chain(&e));
    h1.driver.detach_interface(id, extra).await.unwrap();
    assert_eq!(h1.driver.show(id).await.unwrap().vifs.len(), 1);
    assert!(!h1.plugger.plugged().contains(&extra));
    for inactive in [false, true] {
        assert!(!has_alias(lv, id, inactive, extra).await);
    }

    // Stopped: into the definition, no wait (nothing is wired until it starts).
    h1.driver.power_off(id, None).await.unwrap();
    h1.driver.attach_interface(id, vif.clone()).await.unwrap();
    assert!(has_alias(lv, id, true, extra).await);
    let r = h1.driver.power_on(id).await.unwrap();
    assert!(waited(&r, Timing::PlugTime).contains(&extra), "{r:#?}");
    h1.driver.power_off(id, None).await.unwrap();
    h1.driver.detach_interface(id, extra).await.unwrap();
    assert!(!has_alias(lv, id, true, extra).await);
    h1.driver.power_on(id).await.unwrap();

    // A failed attach (the plug fails) leaves the instance as it was.
    h1.plugger
        .faults()
        .fail_once(vireo_actors::plug::PlugStep::OvsTransact, Some(extra));
    let e = h1
        .driver
        .attach_interface(id, vif.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(e, InstanceError::RolledBack { .. }),
        "{}",
        chain(&e)
    );
    // A failed attach (the port's event says failed) is detached and unplugged again.
    let (bad, bad_vif) = {
        let p = c.user_port(NET_LB).await;
        c.network.update_port(p, &bind(p)).await.unwrap();
        let v = network_info(&*c.network, &[p]).await.vifs.remove(0);
        c.network
            .update_port(
                p,
                &PortUpdate {
                    host_id: Some("elsewhere".into()),
                    ..PortUpdate::default()
                },
            )
            .await
            .unwrap();
        (p, v)
    };
    let d = h1.driver.clone();
    let attach = tokio::spawn(async move { d.attach_interface(id, bad_vif).await });
    at_phase(&h1.driver, id, "wait for events").await;
    c.network.set_port_error(bad).unwrap();
    let e = attach.await.unwrap().unwrap_err();
    assert!(chain(&e).contains("status failed"), "{}", chain(&e));
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(view.state, InstanceState::Running);
    assert_eq!(view.vifs.len(), 1);
    assert_eq!(h1.plugger.plugged().len(), 1);
    let xml = lv.xml_desc(id, false).await.unwrap();
    assert!(!xml.contains(&format!("ua-{extra}")) && !xml.contains(&format!("ua-{bad}")));

    // The caller releases the ports it failed to attach (as Nova does), then the instance
    // goes.
    for p in [extra, bad] {
        c.network
            .update_port(p, &vireo_actors::network::unbind_update(&c.port(p).await))
            .await
            .unwrap();
    }
    c.destroy_and_assert_clean(&[id], &[extra, bad]).await;
    c.delete_ports(&[extra, bad]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_during_a_build_rolls_it_back() {
    let c = spec(&["h1"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    let (p, vif) = silent_port(&c, id, NET_NATIVE).await;
    let mut args = spawn_args("vm-shutdown", vec![]);
    let created = c
        .network
        .allocate_for_instance(id, "h1", &[on(NET_HYBRID)])
        .await
        .unwrap();
    let mut vifs = created.vifs;
    let mut vif = vif;
    vif.index = 1;
    vifs.push(vif);
    args.network =
        vireo_actors::instance::NetworkRequest::Allocated(vireo_actors::vif::NetworkInfo { vifs });
    let d = h1.driver.clone();
    let build = tokio::spawn(async move { d.spawn(id, args).await });
    at_phase(&h1.driver, id, "wait for events").await;
    let t0 = Instant::now();
    h1.driver.shutdown(Duration::from_secs(5)).await;
    let e = build.await.unwrap().unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert!(
        matches!(e, InstanceError::BuildFailed { .. }),
        "{}",
        chain(&e)
    );
    // The agent is down: requests are refused.
    let e = h1.driver.show(id).await.unwrap_err();
    assert!(matches!(e, InstanceError::Unavailable), "{}", chain(&e));
    assert!(h1.driver.libvirt().list_all().await.unwrap().is_empty());
    assert!(h1.plugger.plugged().is_empty());
    c.assert_clean(&[p]).await;
    c.delete_ports(&[p]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_paths_from_paused_and_stopped() {
    let c = spec(&["h1", "h2"]).start().await;
    let h1 = c.host("h1");
    let id = uuid();
    h1.spawn_on(
        id,
        "vm-paths",
        vec![on(NET_HYBRID), on(NET_NATIVE), on(NET_LB)],
    )
    .await;
    // Paused → suspended → running.
    h1.driver.pause(id).await.unwrap();
    h1.driver.suspend(id).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Suspended);
    h1.driver.resume(id).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Running);
    // Paused → hard reboot → running.
    h1.driver.pause(id).await.unwrap();
    h1.driver.reboot(id, RebootKind::Hard).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Running);
    // Paused → failed live migration → paused again.
    h1.driver.pause(id).await.unwrap();
    let e = h1.driver.live_migrate(id, lm("h2")).await.unwrap_err();
    assert!(
        matches!(e, InstanceError::RolledBack { .. }),
        "{}",
        chain(&e)
    );
    assert_eq!(state(h1, id).await, InstanceState::Paused);
    // Paused → power off → stopped → hard reboot → running.
    h1.driver.power_off(id, None).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Stopped);
    h1.driver.reboot(id, RebootKind::Hard).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Running);
    // Stopped → same-host resize (stays off) → revert (still off).
    h1.driver.power_off(id, None).await.unwrap();
    let r = h1
        .driver
        .resize(
            id,
            ResizeArgs::of(
                &Migration {
                    id: uuid(),
                    source_host: "h1".into(),
                    dest_host: "h1".into(),
                },
                flavor("m1.small", 2, 512),
            ),
        )
        .await
        .unwrap();
    assert_eq!(waited(&r, Timing::PlugTime).len(), 2, "{r:#?}");
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(
        (view.state, view.power),
        (InstanceState::ResizeTarget, PowerState::Shutoff)
    );
    h1.driver.revert_resize(id).await.unwrap();
    let view = h1.driver.show(id).await.unwrap();
    assert_eq!(
        (view.state, view.power, view.flavor.as_deref()),
        (InstanceState::Stopped, PowerState::Shutoff, Some("m1.tiny"))
    );
    h1.driver.power_on(id).await.unwrap();
    assert_eq!(state(h1, id).await, InstanceState::Running);
    c.destroy_and_assert_clean(&[id], &[]).await;
}
