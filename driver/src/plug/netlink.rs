//! Links through rtnetlink: lookup, Linux bridges, veth pairs, enslaving, MTU/MAC/up, delete,
//! SR-IOV VF settings through the PF (IFLA_VFINFO_LIST), and the link-change multicast
//! subscription the wiring watcher reads. No `ip` commands.

use std::fmt;
use std::io;

use futures::channel::mpsc::UnboundedReceiver;
use futures::TryStreamExt;
use rtnetlink::packet_core::{NetlinkMessage, NetlinkPayload};
use rtnetlink::packet_route::link::{
    BridgeStpState, LinkAttribute, LinkFlags, LinkInfo, LinkMessage, LinkVfInfo, VfInfo, VfInfoMac,
    VfInfoTrust, VfInfoVlan,
};
use rtnetlink::packet_route::RouteNetlinkMessage;
use rtnetlink::sys::SocketAddr;
use rtnetlink::{Handle, LinkBridge, LinkUnspec, LinkVeth, MulticastGroup};
use tokio::task::JoinHandle;

/// A failed netlink operation.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// Opening the netlink socket failed.
    #[error("open rtnetlink socket")]
    Open(#[source] io::Error),
    /// The kernel refused a request (errno in `source`).
    #[error("{op} {name}")]
    Kernel {
        /// What was asked.
        op: &'static str,
        /// The link.
        name: String,
        /// The kernel's answer.
        #[source]
        source: io::Error,
    },
    /// rtnetlink failed without a kernel errno.
    #[error("{op} {name}")]
    Request {
        /// What was asked.
        op: &'static str,
        /// The link.
        name: String,
        /// The error (boxed: it can hold a whole netlink message).
        #[source]
        source: Box<rtnetlink::Error>,
    },
    /// A link to act on does not exist.
    #[error("no link named {0}")]
    NoSuchLink(String),
}

impl NetlinkError {
    fn from_rt(op: &'static str, name: &str, e: rtnetlink::Error) -> Self {
        match e {
            rtnetlink::Error::NetlinkError(m) if m.raw_code() != 0 => NetlinkError::Kernel {
                op,
                name: name.to_owned(),
                source: io::Error::from_raw_os_error(m.raw_code().abs()),
            },
            e => NetlinkError::Request {
                op,
                name: name.to_owned(),
                source: Box::new(e),
            },
        }
    }

    /// The kernel's errno, when the kernel refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

fn errno_of(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) if m.raw_code() != 0 => Some(m.raw_code().abs()),
        _ => None,
    }
}

/// What vireo needs to know about a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// ifindex.
    pub index: u32,
    /// Name.
    pub name: String,
    /// `IFLA_INFO_KIND` (`bridge`, `veth`, `tun`, ...), when the link has one.
    pub kind: Option<String>,
    /// The bridge (or other controller) it is enslaved to.
    pub master: Option<u32>,
    /// MTU.
    pub mtu: Option<u32>,
    /// Administratively up.
    pub up: bool,
    /// MAC address.
    pub address: Option<[u8; 6]>,
}

impl Link {
    /// Read the fields vireo uses from a link message.
    pub fn from_message(m: &LinkMessage) -> Option<Link> {
        let mut name = None;
        let mut link = Link {
            index: m.header.index,
            name: String::new(),
            kind: None,
            master: None,
            mtu: None,
            up: m.header.flags.contains(LinkFlags::Up),
            address: None,
        };
        for a in &m.attributes {
            match a {
                LinkAttribute::IfName(n) => name = Some(n.clone()),
                LinkAttribute::Controller(i) => link.master = Some(*i),
                LinkAttribute::Mtu(v) => link.mtu = Some(*v),
                LinkAttribute::Address(a) => link.address = <[u8; 6]>::try_from(&a[..]).ok(),
                LinkAttribute::LinkInfo(infos) => {
                    for i in infos {
                        if let LinkInfo::Kind(k) = i {
                            link.kind = Some(k.to_string());
                        }
                    }
                }
                _ => {}
            }
        }
        link.name = name?;
        Some(link)
    }
}

/// A link event from the multicast subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkEvent {
    /// RTM_NEWLINK: created or changed.
    New(Link),
    /// RTM_DELLINK: gone.
    Del(Link),
}

/// A handle on the rtnetlink socket. Requests may run concurrently.
pub struct Netlink {
    handle: Handle,
    conn: JoinHandle<()>,
}

impl fmt::Debug for Netlink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Netlink").finish_non_exhaustive()
    }
}

impl Drop for Netlink {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl Netlink {
    /// Open the socket; its connection task runs on the current tokio runtime.
    pub fn open() -> Result<Self, NetlinkError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Open)?;
        Ok(Netlink {
            handle,
            conn: tokio::spawn(conn),
        })
    }

    /// The link named `name`, or `None`.
    pub async fn link(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        let mut req = self
            .handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute();
        match req.try_next().await {
            Ok(Some(m)) => Ok(Link::from_message(&m)),
            Ok(None) => Ok(None),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(NetlinkError::from_rt("look up", name, e)),
        }
    }

    /// The link with ifindex `index`, or `None`.
    pub async fn link_by_index(&self, index: u32) -> Result<Option<Link>, NetlinkError> {
        let mut req = self.handle.link().get().match_index(index).execute();
        match req.try_next().await {
            Ok(Some(m)) => Ok(Link::from_message(&m)),
            Ok(None) => Ok(None),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(NetlinkError::from_rt("look up", &index.to_string(), e)),
        }
    }

    /// Every link.
    pub async fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| NetlinkError::from_rt("dump", "links", e))?;
        Ok(msgs.iter().filter_map(Link::from_message).collect())
    }

    /// Create a Linux bridge the way os-vif does (STP off, forward delay 0), up, with `mtu`.
    /// `EEXIST` is an error: callers look the name up first.
    pub async fn create_bridge(&self, name: &str, mtu: Option<u32>) -> Result<(), NetlinkError> {
        let mut b = LinkBridge::new(name)
            .stp_state(BridgeStpState::Disabled)
            .forward_delay(0);
        if let Some(m) = mtu {
            b = b.mtu(m);
        }
        self.handle
            .link()
            .add(b.build())
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt("create bridge", name, e))
    }

    /// Create the veth pair `a`/`b` with `mtu` on both ends (both down).
    pub async fn create_veth(
        &self,
        a: &str,
        b: &str,
        mtu: Option<u32>,
    ) -> Result<(), NetlinkError> {
        let mut builder = LinkVeth::new(a, b);
        if let Some(m) = mtu {
            builder = builder.mtu(m);
        }
        let mut msg = builder.build();
        if let Some(m) = mtu {
            // The peer gets its own MTU attribute inside IFLA_INFO_DATA.
            for attr in &mut msg.attributes {
                if let LinkAttribute::LinkInfo(infos) = attr {
                    for i in infos {
                        if let LinkInfo::Data(rtnetlink::packet_route::link::InfoData::Veth(
                            rtnetlink::packet_route::link::InfoVeth::Peer(peer),
                        )) = i
                        {
                            peer.attributes.push(LinkAttribute::Mtu(m));
                        }
                    }
                }
            }
        }
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt("create veth", a, e))
    }

    /// Enslave link `index` (named `name`) to the bridge with ifindex `master`.
    pub async fn set_master(
        &self,
        name: &str,
        index: u32,
        master: u32,
    ) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .change(LinkUnspec::new_with_index(index).controller(master).build())
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt("set master of", name, e))
    }

    /// Set MTU and MAC (each when given) and bring the link up, in one request.
    pub async fn configure(
        &self,
        name: &str,
        index: u32,
        mtu: Option<u32>,
        mac: Option<[u8; 6]>,
    ) -> Result<(), NetlinkError> {
        let mut b = LinkUnspec::new_with_index(index).up();
        if let Some(m) = mtu {
            b = b.mtu(m);
        }
        if let Some(mac) = mac {
            b = b.address(mac.to_vec());
        }
        self.handle
            .link()
            .change(b.build())
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt("configure", name, e))
    }

    /// Delete the link named `name`. `Ok(false)` when it did not exist.
    pub async fn delete(&self, name: &str) -> Result<bool, NetlinkError> {
        let Some(link) = self.link(name).await? else {
            return Ok(false);
        };
        match self.handle.link().del(link.index).execute().await {
            Ok(()) => Ok(true),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(NetlinkError::from_rt("delete", name, e)),
        }
    }

    /// Links enslaved to the bridge with ifindex `master`.
    pub async fn ports_of(&self, master: u32) -> Result<Vec<Link>, NetlinkError> {
        Ok(self
            .links()
            .await?
            .into_iter()
            .filter(|l| l.master == Some(master))
            .collect())
    }

    /// Set VF `vf`'s MAC, VLAN (0 = none) and trust through the PF named `pf`, in one
    /// RTM_NEWLINK with IFLA_VFINFO_LIST (what `ip link set PF vf N mac .. vlan .. trust ..`
    /// sends).
    pub async fn set_vf(
        &self,
        pf: &str,
        vf: u32,
        mac: [u8; 6],
        vlan: u16,
        trust: bool,
    ) -> Result<(), NetlinkError> {
        let link = self
            .link(pf)
            .await?
            .ok_or_else(|| NetlinkError::NoSuchLink(pf.to_owned()))?;
        let msg = LinkUnspec::new_with_index(link.index)
            .append_extra_attribute(LinkAttribute::VfInfoList(vec![LinkVfInfo(vec![
                VfInfo::Mac(VfInfoMac::new(vf, &mac)),
                VfInfo::Vlan(VfInfoVlan::new(vf, u32::from(vlan), 0)),
                VfInfo::Trust(VfInfoTrust::new(vf, trust)),
            ])]))
            .build();
        self.handle
            .link()
            .change(msg)
            .execute()
            .await
            .map_err(|e| NetlinkError::from_rt("set VF of", pf, e))
    }
}

/// The link-change multicast subscription (RTNLGRP_LINK).
pub struct LinkMonitor {
    messages: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
    conn: JoinHandle<()>,
}

impl fmt::Debug for LinkMonitor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LinkMonitor").finish_non_exhaustive()
    }
}

impl Drop for LinkMonitor {
    fn drop(&mut self) {
        self.conn.abort();
    }
}

impl LinkMonitor {
    /// Subscribe; the connection task runs on the current tokio runtime.
    pub fn open() -> Result<Self, NetlinkError> {
        let (conn, _handle, messages) =
            rtnetlink::new_multicast_connection(&[MulticastGroup::Link])
                .map_err(NetlinkError::Open)?;
        Ok(LinkMonitor {
            messages,
            conn: tokio::spawn(conn),
        })
    }

    /// The next link event; `None` when the socket closed.
    pub async fn next(&mut self) -> Option<LinkEvent> {
        use futures::StreamExt;
        loop {
            let (msg, _) = self.messages.next().await?;
            let ev = match msg.payload {
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(m)) => {
                    Link::from_message(&m).map(LinkEvent::New)
                }
                NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(m)) => {
                    Link::from_message(&m).map(LinkEvent::Del)
                }
                _ => None,
            };
            if ev.is_some() {
                return ev;
            }
        }
    }
}

/// `IFLA_INFO_KIND` of a tap (the tun driver).
pub const KIND_TUN: &str = "tun";
/// `IFLA_INFO_KIND` of a Linux bridge.
pub const KIND_BRIDGE: &str = "bridge";
/// `IFLA_INFO_KIND` of a veth.
pub const KIND_VETH: &str = "veth";

#[cfg(test)]
mod tests {
    use super::*;
    use rtnetlink::packet_route::link::InfoKind;

    #[test]
    fn kind_names_match_the_kernel() {
        assert_eq!(InfoKind::Tun.to_string(), KIND_TUN);
        assert_eq!(InfoKind::Bridge.to_string(), KIND_BRIDGE);
        assert_eq!(InfoKind::Veth.to_string(), KIND_VETH);
    }
}
