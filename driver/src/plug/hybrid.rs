//! OVS hybrid plugging (`ovs_hybrid_plug`), as os-vif does it: a per-VIF Linux bridge
//! `qbr<id>` (STP off, forward delay 0, IPv6 off), a veth pair `qvb<id>`/`qvo<id>` with the
//! network MTU, `qvb` in the bridge, `qvo` on the integration bridge with the os-vif Interface
//! `external_ids`. The tap attaches to `qbr`: libvirt does it (`<interface type='bridge'>`),
//! or, pre-created, vireo creates the tap and enslaves it. Unplug removes all of it.

use vireo_actors::plug::{
    static_attachment, Attachment, DomainForm, HostDevice, PlugContext, PlugError, PlugKind,
    PlugStep,
};
use vireo_actors::vif::Vif;

use super::netlink::{NetlinkError, KIND_BRIDGE, KIND_VETH};
use super::{first_error, names, Run};
use vireo_actors::plug::cause;

pub(crate) async fn plug(
    run: &mut Run<'_>,
    ctx: &PlugContext,
    vif: &Vif,
) -> Result<Attachment, PlugError> {
    let bridge = names::ovs_bridge(vif.id, vif.ovs_bridge())?;
    let qbr = names::owned(vif.id, &vif.qbr_name(), "qbr")?;
    let qvb = names::owned(vif.id, &vif.qvb_name(), "qvb")?;
    let qvo = names::owned(vif.id, &vif.qvo_name(), "qvo")?;
    let tap = names::owned(vif.id, &vif.tap_name(), "tap")?;
    let mtu = vif.network.mtu;

    let qbr_index = run.ensure_linux_bridge(&qbr, mtu).await?;
    ensure_veth(run, vif, &qvb, &qvo).await?;
    run.enslave(PlugStep::EnslaveVeth, &qvb, &qbr, qbr_index)
        .await?;
    run.ensure_ovs(ctx, vif, &bridge, Some(&qvo)).await?;
    if ctx.form == DomainForm::PreCreated {
        run.ensure_tap(vif, &tap).await?;
        run.enslave(PlugStep::EnslaveTap, &tap, &qbr, qbr_index)
            .await?;
    }
    static_attachment(vif, PlugKind::OvsHybrid, ctx.form)
}

/// CreateVeth: the qvb/qvo pair, both up with the network MTU. A lone `qvo` left by a
/// half-done unplug is removed first.
async fn ensure_veth(run: &mut Run<'_>, vif: &Vif, qvb: &str, qvo: &str) -> Result<(), PlugError> {
    run.step(PlugStep::CreateVeth)?;
    let nl = run.p.netlink.clone();
    let veth_err = |e: NetlinkError| PlugError::CreateVeth {
        port: vif.id,
        device: qvb.to_owned(),
        source: cause(e),
    };
    let mut b = nl.link(qvb).await.map_err(run.lookup_err(qvb))?;
    if let Some(l) = &b {
        if l.kind.as_deref() != Some(KIND_VETH) {
            return Err(PlugError::NameTaken {
                port: vif.id,
                device: qvb.to_owned(),
                found: l.kind.clone().unwrap_or_else(|| "device".into()),
                wanted: KIND_VETH,
            });
        }
    }
    let mut o = nl.link(qvo).await.map_err(run.lookup_err(qvo))?;
    if b.is_none() {
        if o.is_some() {
            nl.delete(qvo).await.map_err(veth_err)?;
        }
        nl.create_veth(qvb, qvo, vif.network.mtu)
            .await
            .map_err(veth_err)?;
        run.created.push(HostDevice::VethPair {
            bridge_end: qvb.to_owned(),
            ovs_end: qvo.to_owned(),
        });
        b = nl.link(qvb).await.map_err(run.lookup_err(qvb))?;
        o = nl.link(qvo).await.map_err(run.lookup_err(qvo))?;
    }
    for (name, link) in [(qvb, b), (qvo, o)] {
        let link = link.ok_or_else(|| veth_err(NetlinkError::NoSuchLink(name.to_owned())))?;
        nl.configure(name, link.index, vif.network.mtu, None)
            .await
            .map_err(|e| PlugError::ConfigureLink {
                port: vif.id,
                device: name.to_owned(),
                source: cause(e),
            })?;
    }
    Ok(())
}

pub(crate) async fn unplug(run: &Run<'_>, ctx: &PlugContext, vif: &Vif) -> Result<(), PlugError> {
    let qbr = names::owned(vif.id, &vif.qbr_name(), "qbr")?;
    let qvb = names::owned(vif.id, &vif.qvb_name(), "qvb")?;
    let qvo = names::owned(vif.id, &vif.qvo_name(), "qvo")?;
    let mut results = Vec::new();
    if ctx.form == DomainForm::PreCreated {
        results.push(run.delete_tap(vif).await);
    }
    results.push(run.delete_ovs_port(&qvo).await);
    // Deleting one end of a veth removes both; the second delete covers a lone end. A link
    // of another kind under one of these names is not vireo's (plug refuses it): left alone.
    results.push(
        run.delete_link_of_kind(PlugStep::DeleteVeth, &qvb, KIND_VETH)
            .await,
    );
    results.push(
        run.delete_link_of_kind(PlugStep::DeleteVeth, &qvo, KIND_VETH)
            .await,
    );
    results.push(
        run.delete_link_of_kind(PlugStep::DeleteLinuxBridge, &qbr, KIND_BRIDGE)
            .await,
    );
    first_error(results)
}
