//! Linux bridge plugging: ensure the bridge the VIF names (`network.bridge`, else
//! `brq<network id>`), up with STP off. libvirt attaches the tap
//! (`<interface type='bridge'>`); pre-created, vireo creates the tap and enslaves it.
//!
//! The bridge belongs to the network (every port of the network shares it, and Neutron's
//! agent adds the physical side), so unplug never deletes it, as os-vif does not; unplug
//! removes only the tap vireo created. The watcher follows the tap: wired while it is
//! enslaved to a bridge.

use vireo_actors::plug::{
    static_attachment, Attachment, DomainForm, PlugContext, PlugError, PlugKind, PlugStep,
};
use vireo_actors::vif::Vif;

use super::{names, Run};

pub(crate) async fn plug(
    run: &mut Run<'_>,
    ctx: &PlugContext,
    vif: &Vif,
) -> Result<Attachment, PlugError> {
    let attachment = static_attachment(vif, PlugKind::LinuxBridge, DomainForm::LibvirtManaged)?;
    let Attachment::Bridge { bridge, .. } = &attachment else {
        return Err(PlugError::Missing {
            port: vif.id,
            field: "network.bridge or network.id",
        });
    };
    let bridge = names::ifname(vif.id, bridge)?;
    let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
    run.p.wiring.register_bridge_tap(&tap, vif.id).await;
    let index = run.ensure_linux_bridge(&bridge, vif.network.mtu).await?;
    if ctx.form == DomainForm::PreCreated {
        run.ensure_tap(vif, &tap).await?;
        run.enslave(PlugStep::EnslaveTap, &tap, &bridge, index)
            .await?;
        run.p.wiring.resync_tap(&tap).await;
    }
    static_attachment(vif, PlugKind::LinuxBridge, ctx.form)
}

pub(crate) async fn unplug(run: &Run<'_>, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
    let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
    let result = if ctx.form == DomainForm::PreCreated {
        run.delete_tap(vif).await
    } else {
        Ok(())
    };
    if result.is_ok() {
        run.p.wiring.forget_bridge_tap(&tap);
    }
    result
}
