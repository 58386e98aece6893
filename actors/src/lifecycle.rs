//! The instance lifecycle as a pure state machine.
//!
//! An [`InstanceState`] is what one host's instance actor knows about its instance: stable
//! states (running, stopped, ...) and the transient states a multi-step operation passes
//! through (building, migrating, ...). [`valid_transition`] is the whole rule book: the actor
//! refuses to move along any other edge, and a test walks every from/to pair.
//!
//! [`Request`] is every operation a caller can ask of an instance; [`accepts`] says in which
//! states each is legal. A request that is illegal in the current state is refused with a typed
//! error before anything is touched.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Where an instance is in its life on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    /// Not (yet) on this host: the actor exists, the domain does not.
    Absent,
    /// Spawn in progress: defined, VIFs being plugged, waiting for events.
    Building,
    /// Domain running.
    Running,
    /// Domain paused (vCPUs stopped, memory kept).
    Paused,
    /// Domain saved to disk (managed save) or suspended.
    Suspended,
    /// Domain defined and shut off.
    Stopped,
    /// Source side of a live migration in progress.
    Migrating,
    /// Destination side of a live migration: devices pre-wired, domain arriving.
    Incoming,
    /// Source side of a resize or cold migration: powered off, kept until confirm or revert.
    ResizeSource,
    /// Destination side of a resize: finished here, waiting for confirm or revert.
    ResizeTarget,
    /// Something failed and could not be rolled back; only destroy, hard reboot or power
    /// off/on are accepted.
    Error,
    /// Destroyed, departed to another host, or released for a reschedule. Terminal.
    Gone,
}

impl InstanceState {
    /// Every state.
    pub const ALL: [InstanceState; 12] = [
        InstanceState::Absent,
        InstanceState::Building,
        InstanceState::Running,
        InstanceState::Paused,
        InstanceState::Suspended,
        InstanceState::Stopped,
        InstanceState::Migrating,
        InstanceState::Incoming,
        InstanceState::ResizeSource,
        InstanceState::ResizeTarget,
        InstanceState::Error,
        InstanceState::Gone,
    ];

    /// The kebab-case name used in the API and the domain metadata.
    pub fn as_str(&self) -> &'static str {
        match self {
            InstanceState::Absent => "absent",
            InstanceState::Building => "building",
            InstanceState::Running => "running",
            InstanceState::Paused => "paused",
            InstanceState::Suspended => "suspended",
            InstanceState::Stopped => "stopped",
            InstanceState::Migrating => "migrating",
            InstanceState::Incoming => "incoming",
            InstanceState::ResizeSource => "resize-source",
            InstanceState::ResizeTarget => "resize-target",
            InstanceState::Error => "error",
            InstanceState::Gone => "gone",
        }
    }

    /// States in which a domain exists on this host.
    pub fn has_domain(&self) -> bool {
        !matches!(self, InstanceState::Absent | InstanceState::Gone)
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether the lifecycle may move from `from` to `to`.
///
/// Staying in the same state is valid for the stable states an operation can leave unchanged
/// (a reboot keeps `Running`; a failed power-on keeps `Stopped`).
pub fn valid_transition(from: InstanceState, to: InstanceState) -> bool {
    use InstanceState::*;
    match (from, to) {
        // Terminal.
        (Gone, _) => false,
        // Anything that exists may be destroyed or fail.
        (_, Gone) => true,
        (Absent, Error) => false,
        (_, Error) => true,
        // Arrivals.
        (Absent, Building | Incoming | ResizeTarget) => true,
        // A resize Nova runs finishes on the destination as an ordinary instance: Nova's
        // confirm never asks the destination, and its revert destroys it.
        (Absent, Running | Stopped) => true,
        (Building, Running | Paused | Stopped) => true,
        (Incoming, Running | Paused) => true,
        // Power and pause.
        (Running, Running | Stopped | Paused | Suspended) => true,
        (Paused, Paused | Running | Stopped | Suspended) => true,
        (Suspended, Suspended | Running | Stopped) => true,
        (Stopped, Stopped | Running) => true,
        // Resize / cold migration, source side (same host: straight to the target state).
        (Running | Stopped, ResizeSource | ResizeTarget) => true,
        (ResizeSource, Running | Stopped) => true,
        // Resize, destination side: confirm keeps the domain here.
        (ResizeTarget, Running | Stopped) => true,
        // Live migration, source side: rollback returns to the prior state.
        (Running | Paused, Migrating) => true,
        (Migrating, Running | Paused) => true,
        // Recovery from error.
        (Error, Running | Stopped) => true,
        _ => false,
    }
}

/// Every operation a caller can ask of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Request {
    /// Build and start the instance here.
    Spawn,
    /// Destroy the domain, unplug, undefine. Idempotent.
    Destroy,
    /// Graceful shutdown with a timeout, then hard.
    PowerOff,
    /// Start a stopped instance.
    PowerOn,
    /// ACPI reboot.
    RebootSoft,
    /// Destroy and recreate the domain.
    RebootHard,
    /// Pause vCPUs.
    Pause,
    /// Resume vCPUs.
    Unpause,
    /// Save to disk.
    Suspend,
    /// Restore from disk.
    Resume,
    /// Start a resize or cold migration on the source (same host: the whole resize).
    Resize,
    /// Destination: create the resized instance here.
    FinishResize,
    /// Destination (where the resized instance runs): confirm the resize.
    ConfirmResize,
    /// Source: the resize was confirmed, remove the old instance here.
    ConfirmResizeSource,
    /// Destination (where the resized instance runs): revert the resize.
    RevertResize,
    /// Source: the resize is reverted, bring the instance back here.
    FinishRevertResize,
    /// Source: live-migrate to another host.
    LiveMigrate,
    /// Destination: prepare devices before a live migration.
    PreLiveMigration,
    /// Destination: the migration succeeded; take over.
    PostLiveMigrationAtDestination,
    /// Destination: the migration failed; remove what was prepared.
    RollbackLiveMigrationAtDestination,
    /// Hot-plug an interface.
    AttachInterface,
    /// Hot-unplug an interface.
    DetachInterface,
    /// Make sure the host side of every VIF is plugged (Nova's `plug_vifs`).
    PlugVifs,
    /// Remove the host side of every VIF (Nova's `unplug_vifs`).
    UnplugVifs,
    /// Release networking after a failed build so the build can be rescheduled.
    CleanupForReschedule,
    /// Finish or roll back an operation that was in flight when the agent stopped (internal:
    /// issued by recovery at start-up, never by a caller).
    Recover,
}

/// Who may ask for a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A compute agent's user: the agent API's create, delete and actions.
    Api,
    /// What orchestrates a move between hosts and asks each host for its half of it (Nova's
    /// compute manager through the driver package: the agent's host-half endpoint; in one
    /// process, the source host's own flow).
    Orchestrator,
    /// The driver itself (recovery at start-up).
    Driver,
}

impl Request {
    /// Who may ask for it.
    pub fn caller(&self) -> Caller {
        match self {
            Request::FinishResize
            | Request::ConfirmResizeSource
            | Request::FinishRevertResize
            | Request::PreLiveMigration
            | Request::PostLiveMigrationAtDestination
            | Request::RollbackLiveMigrationAtDestination => Caller::Orchestrator,
            Request::Recover => Caller::Driver,
            Request::Spawn
            | Request::Destroy
            | Request::PowerOff
            | Request::PowerOn
            | Request::RebootSoft
            | Request::RebootHard
            | Request::Pause
            | Request::Unpause
            | Request::Suspend
            | Request::Resume
            | Request::Resize
            | Request::ConfirmResize
            | Request::RevertResize
            | Request::LiveMigrate
            | Request::AttachInterface
            | Request::DetachInterface
            | Request::PlugVifs
            | Request::UnplugVifs
            | Request::CleanupForReschedule => Caller::Api,
        }
    }

    /// Every request.
    pub const ALL: [Request; 26] = [
        Request::Spawn,
        Request::Destroy,
        Request::PowerOff,
        Request::PowerOn,
        Request::RebootSoft,
        Request::RebootHard,
        Request::Pause,
        Request::Unpause,
        Request::Suspend,
        Request::Resume,
        Request::Resize,
        Request::FinishResize,
        Request::ConfirmResize,
        Request::ConfirmResizeSource,
        Request::RevertResize,
        Request::FinishRevertResize,
        Request::LiveMigrate,
        Request::PreLiveMigration,
        Request::PostLiveMigrationAtDestination,
        Request::RollbackLiveMigrationAtDestination,
        Request::AttachInterface,
        Request::DetachInterface,
        Request::PlugVifs,
        Request::UnplugVifs,
        Request::CleanupForReschedule,
        Request::Recover,
    ];

    /// The kebab-case name.
    pub fn as_str(&self) -> &'static str {
        match self {
            Request::Spawn => "spawn",
            Request::Destroy => "destroy",
            Request::PowerOff => "power-off",
            Request::PowerOn => "power-on",
            Request::RebootSoft => "reboot-soft",
            Request::RebootHard => "reboot-hard",
            Request::Pause => "pause",
            Request::Unpause => "unpause",
            Request::Suspend => "suspend",
            Request::Resume => "resume",
            Request::Resize => "resize",
            Request::FinishResize => "finish-resize",
            Request::ConfirmResize => "confirm-resize",
            Request::ConfirmResizeSource => "confirm-resize-source",
            Request::RevertResize => "revert-resize",
            Request::FinishRevertResize => "finish-revert-resize",
            Request::LiveMigrate => "live-migrate",
            Request::PreLiveMigration => "pre-live-migration",
            Request::PostLiveMigrationAtDestination => "post-live-migration-at-destination",
            Request::RollbackLiveMigrationAtDestination => "rollback-live-migration-at-destination",
            Request::AttachInterface => "attach-interface",
            Request::PlugVifs => "plug-vifs",
            Request::UnplugVifs => "unplug-vifs",
            Request::DetachInterface => "detach-interface",
            Request::CleanupForReschedule => "cleanup-for-reschedule",
            Request::Recover => "recover",
        }
    }

    /// The states a successful run of this request can end in, from `from`.
    pub fn targets(&self, from: InstanceState) -> &'static [InstanceState] {
        use InstanceState::*;
        match self {
            // Stopped: a build asked not to power on.
            Request::Spawn => &[Running, Stopped],
            Request::Destroy | Request::CleanupForReschedule => &[Gone],
            Request::PowerOff => &[Stopped],
            Request::PowerOn | Request::RebootSoft | Request::RebootHard => &[Running],
            Request::Pause => &[Paused],
            Request::Unpause | Request::Resume => &[Running],
            Request::Suspend => &[Suspended],
            Request::Resize => &[ResizeSource, ResizeTarget],
            Request::FinishResize => &[ResizeTarget, Running, Stopped],
            Request::ConfirmResize | Request::FinishRevertResize => &[Running, Stopped],
            Request::ConfirmResizeSource => &[Gone],
            Request::RevertResize => &[Gone, Running, Stopped],
            Request::LiveMigrate => &[Gone],
            Request::PreLiveMigration => &[Incoming],
            Request::PostLiveMigrationAtDestination => &[Running, Paused],
            Request::RollbackLiveMigrationAtDestination => &[Gone],
            // Recovery ends wherever libvirt says the domain is (or rolled back to Gone).
            Request::Recover => &[],
            Request::AttachInterface | Request::DetachInterface => match from {
                Running => &[Running],
                Paused => &[Paused],
                _ => &[Stopped],
            },
            // The guest's state is not theirs to change.
            Request::PlugVifs | Request::UnplugVifs => match from {
                Running => &[Running],
                Paused => &[Paused],
                Suspended => &[Suspended],
                _ => &[Stopped],
            },
        }
    }
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An operation ended where the lifecycle does not let it (a bug in its flow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{request} from {from} ended in {to}, which the lifecycle does not allow")]
pub struct UnexpectedTransition {
    /// The request.
    pub request: Request,
    /// The state it started in.
    pub from: InstanceState,
    /// The state it ended in.
    pub to: InstanceState,
}

/// Checks where an operation ended, before the actor takes that state. A success must end in
/// one of the request's [`Request::targets`] for its start state (recovery, which has none:
/// anywhere the lifecycle reaches). A failure may end where it started, or anywhere the
/// lifecycle reaches from there, directly or through the transient state the operation showed
/// while it ran (`via`: building, migrating, ...). Removing what a gone instance left behind
/// stays gone.
pub fn check_end(
    request: Request,
    from: InstanceState,
    via: InstanceState,
    to: InstanceState,
    succeeded: bool,
) -> Result<(), UnexpectedTransition> {
    let reachable = to == from
        || valid_transition(from, to)
        || (via != from && valid_transition(from, via) && valid_transition(via, to))
        || (from == InstanceState::Gone && to == InstanceState::Gone);
    let ok = match (succeeded, request) {
        (true, Request::Recover) => reachable,
        (true, _) => request.targets(from).contains(&to),
        (false, _) => reachable,
    };
    if ok {
        Ok(())
    } else {
        Err(UnexpectedTransition { request, from, to })
    }
}

/// Whether `request` may start while the instance is in `state`.
pub fn accepts(state: InstanceState, request: Request) -> bool {
    use InstanceState::*;
    use Request::*;
    match request {
        Spawn | FinishResize | PreLiveMigration => state == Absent,
        // Destroy is always accepted (idempotent), even when nothing is here.
        Destroy => true,
        CleanupForReschedule => matches!(state, Absent | Building | Error),
        PowerOff => matches!(state, Running | Paused | Suspended | Error | Stopped),
        PowerOn => matches!(state, Stopped | Error),
        RebootSoft => state == Running,
        RebootHard => matches!(state, Running | Paused | Stopped | Error),
        Pause => state == Running,
        Unpause => state == Paused,
        Suspend => matches!(state, Running | Paused),
        Resume => state == Suspended,
        Resize => matches!(state, Running | Stopped),
        ConfirmResizeSource | FinishRevertResize => state == ResizeSource,
        ConfirmResize | RevertResize => state == ResizeTarget,
        LiveMigrate => matches!(state, Running | Paused),
        PostLiveMigrationAtDestination => state == Incoming,
        // The destination may have lost its record (agent restart): roll back from Absent too.
        RollbackLiveMigrationAtDestination => matches!(state, Absent | Incoming),
        AttachInterface | DetachInterface => matches!(state, Running | Paused | Stopped),
        PlugVifs | UnplugVifs => matches!(state, Running | Paused | Suspended | Stopped),
        // Not while a build or a live migration is under way: their own flows finish or roll
        // them back (recovery releases an interrupted build with the reschedule clean-up).
        Recover => state.has_domain() && !matches!(state, Building | Migrating),
    }
}

#[cfg(test)]
mod tests {
    use super::InstanceState::*;
    use super::*;

    /// The full table, written out independently of `valid_transition`'s match arms.
    fn expected(from: InstanceState, to: InstanceState) -> bool {
        let allowed: &[InstanceState] = match from {
            // Running, Stopped: a resize Nova runs, finished on its destination.
            Absent => &[Building, Incoming, ResizeTarget, Running, Stopped, Gone],
            Building => &[Running, Paused, Stopped, Error, Gone],
            Running => &[
                Running,
                Stopped,
                Paused,
                Suspended,
                ResizeSource,
                ResizeTarget,
                Migrating,
                Error,
                Gone,
            ],
            Paused => &[Paused, Running, Stopped, Suspended, Migrating, Error, Gone],
            Suspended => &[Suspended, Running, Stopped, Error, Gone],
            Stopped => &[Stopped, Running, ResizeSource, ResizeTarget, Error, Gone],
            Migrating => &[Running, Paused, Error, Gone],
            Incoming => &[Running, Paused, Error, Gone],
            ResizeSource => &[Running, Stopped, Error, Gone],
            ResizeTarget => &[Running, Stopped, Error, Gone],
            Error => &[Running, Stopped, Error, Gone],
            Gone => &[],
        };
        allowed.contains(&to)
    }

    #[test]
    fn every_from_to_pair() {
        for from in InstanceState::ALL {
            for to in InstanceState::ALL {
                assert_eq!(
                    valid_transition(from, to),
                    expected(from, to),
                    "{from} -> {to}"
                );
            }
        }
    }

    #[test]
    fn every_request_target_is_a_valid_transition_from_every_accepting_state() {
        for state in InstanceState::ALL {
            for req in Request::ALL {
                if !accepts(state, req) || state == Gone {
                    continue;
                }
                for &target in req.targets(state) {
                    // A spawn passes through Building on its way.
                    let ok = if (state, req) == (Absent, Request::Spawn) {
                        valid_transition(Absent, Building) && valid_transition(Building, target)
                    } else {
                        valid_transition(state, target)
                    };
                    assert!(ok, "{req} from {state} to {target}");
                }
            }
        }
    }

    #[test]
    fn check_end_takes_every_target_and_refuses_what_the_lifecycle_does_not_allow() {
        for from in InstanceState::ALL {
            for req in Request::ALL {
                if !accepts(from, req) {
                    continue;
                }
                let via = if req == Request::Spawn {
                    Building
                } else {
                    from
                };
                for to in InstanceState::ALL {
                    let success = check_end(req, from, via, to, true);
                    if req == Request::Recover {
                        assert_eq!(
                            success.is_ok(),
                            to == from || valid_transition(from, to),
                            "{req} from {from} to {to}"
                        );
                    } else {
                        assert_eq!(
                            success.is_ok(),
                            req.targets(from).contains(&to),
                            "{req} from {from} to {to}"
                        );
                    }
                    if let Err(e) = success {
                        assert_eq!((e.request, e.from, e.to), (req, from, to));
                    }
                }
            }
        }
        // A success outside the targets, even along a valid transition, is refused.
        let e = check_end(Request::Pause, Running, Running, Stopped, true).unwrap_err();
        assert_eq!(e.to, Stopped);
        // A failure may stay, roll back or fail; not jump where the lifecycle never goes.
        assert!(check_end(Request::PowerOn, Stopped, Stopped, Stopped, false).is_ok());
        assert!(check_end(Request::PowerOn, Stopped, Stopped, Error, false).is_ok());
        assert!(check_end(Request::Spawn, Absent, Building, Gone, false).is_ok());
        assert!(check_end(Request::PowerOn, Stopped, Stopped, Incoming, false).is_err());
        assert!(check_end(Request::LiveMigrate, Running, Migrating, Running, false).is_ok());
        assert!(check_end(Request::Destroy, Gone, Gone, Gone, false).is_ok());
    }

    #[test]
    fn illegal_requests_per_state() {
        // Spot the rules an operator relies on.
        assert!(!accepts(Stopped, Request::Pause));
        assert!(!accepts(Building, Request::RebootHard));
        assert!(!accepts(Migrating, Request::Resize));
        assert!(!accepts(ResizeTarget, Request::LiveMigrate));
        assert!(!accepts(Running, Request::Spawn));
        assert!(accepts(Gone, Request::Destroy), "destroy is idempotent");
        // Nothing but destroy is accepted once gone.
        for req in Request::ALL {
            assert_eq!(accepts(Gone, req), req == Request::Destroy, "{req}");
        }
        // Transient states accept nothing but destroy (and their own completions).
        for req in Request::ALL {
            if accepts(Migrating, req) {
                assert!(
                    matches!(req, Request::Destroy | Request::Recover),
                    "{req} in migrating"
                );
            }
            if accepts(Building, req) {
                assert!(
                    matches!(
                        req,
                        Request::Destroy | Request::CleanupForReschedule | Request::Recover
                    ),
                    "{req}"
                );
            }
        }
    }
}
