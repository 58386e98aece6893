//! OVS native plugging: the tap directly on the integration bridge.
//!
//! - libvirt-managed form: vireo ensures the bridge (with the configured datapath type);
//!   libvirt creates the tap and adds it as a port with the `iface-id` from
//!   `<virtualport type='openvswitch'>` when the domain starts.
//! - pre-created form: vireo creates the persistent tap (MTU, MAC, up) and adds it to the
//!   bridge in one OVSDB transaction with the Interface `external_ids` os-vif sets
//!   (`iface-id`, `iface-status=active`, `attached-mac`, `vm-uuid`) and `mtu_request`, so the
//!   port is wired before any domain exists.
//!
//! Unplug removes the OVS port (if libvirt left it, or vireo made it) and, pre-created, the tap.

use std::collections::BTreeMap;

use vireo_actors::plug::{
    static_attachment, Attachment, DomainForm, PlugContext, PlugError, PlugKind,
};
use vireo_actors::vif::Vif;

use super::{first_error, names, Run};

/// The Interface `external_ids` os-vif sets for a VIF.
pub fn external_ids(ctx: &PlugContext, vif: &Vif) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("iface-id".to_owned(), vif.id.to_string()),
        ("iface-status".to_owned(), "active".to_owned()),
        ("attached-mac".to_owned(), vif.address.to_string()),
        (
            "vm-uuid".to_owned(),
            ctx.instance_uuid.hyphenated().to_string(),
        ),
    ])
}

pub(crate) async fn plug(
    run: &mut Run<'_>,
    ctx: &PlugContext,
    vif: &Vif,
) -> Result<Attachment, PlugError> {
    let bridge = names::ovs_bridge(vif.id, vif.ovs_bridge())?;
    let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
    match ctx.form {
        DomainForm::PreCreated => {
            run.ensure_tap(vif, &tap).await?;
            run.ensure_ovs(ctx, vif, &bridge, Some(&tap)).await?;
        }
        DomainForm::LibvirtManaged => run.ensure_ovs(ctx, vif, &bridge, None).await?,
    }
    static_attachment(vif, PlugKind::OvsNative, ctx.form)
}

pub(crate) async fn unplug(run: &Run<'_>, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
    let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
    let mut results = vec![run.delete_ovs_port(&tap).await];
    if ctx.form == DomainForm::PreCreated {
        results.push(run.delete_tap(vif).await);
    }
    first_error(results)
}
