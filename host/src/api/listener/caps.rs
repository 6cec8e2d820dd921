//! The connection caps: how many connections the server holds, per client
//! address, and the health-only reserve for those over a cap.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use tokio_util::sync::CancellationToken;

use super::watch::Activity;
use super::{ConnectionLimits, HEALTH_RESERVE, should_log};

/// Connections held, under one lock taken once per accept and per close.
pub(super) struct Caps {
    pub(super) limits: ConnectionLimits,
    pub(super) held: parking_lot::Mutex<Held>,
}

#[derive(Default)]
pub(super) struct Held {
    pub(super) total: usize,
    pub(super) per_client: HashMap<IpAddr, usize>,
    /// Reserve connections, oldest first.
    pub(super) reserve: VecDeque<ReserveEntry>,
    pub(super) next_id: u64,
}

pub(super) struct ReserveEntry {
    pub(super) id: u64,
    pub(super) activity: Arc<Activity>,
    pub(super) evict: CancellationToken,
}

pub(super) enum Admission {
    /// Under both caps.
    Served(Slot),
    /// Over a cap, in the reserve; the token is cancelled to evict it.
    Reserve(Slot, CancellationToken),
    /// Over a cap with the reserve full of requests being answered.
    Refused,
}

/// A connection's place, given back when dropped.
pub(super) struct Slot {
    pub(super) caps: Arc<Caps>,
    pub(super) kind: SlotKind,
}

pub(super) enum SlotKind {
    Counted(IpAddr),
    Reserve(u64),
}

impl Caps {
    pub(super) fn new(limits: ConnectionLimits) -> Caps {
        Caps { limits, held: Default::default() }
    }

    pub(super) fn admit(self: &Arc<Self>, peer: SocketAddr, activity: &Arc<Activity>) -> Admission {
        let client = client_key(peer.ip());
        let mut held = self.held.lock();
        let of_client = held.per_client.get(&client).copied().unwrap_or(0);
        if held.total < self.limits.max_connections && of_client < self.limits.max_per_ip {
            held.total += 1;
            *held.per_client.entry(client).or_insert(0) += 1;
            return Admission::Served(Slot { caps: self.clone(), kind: SlotKind::Counted(client) });
        }
        static LAST_WARNED: AtomicU64 = AtomicU64::new(0);
        if should_log(&LAST_WARNED) {
            let cap = if held.total >= self.limits.max_connections { "max_connections" } else { "max_connections_per_ip" };
            tracing::warn!(client = %client, connections = held.total, cap, "connection cap reached: new connections get health checks only (logged at most every 10 s)");
        }
        if held.reserve.len() >= HEALTH_RESERVE {
            // The oldest connection still waiting for its headers makes room.
            let Some(oldest) = held.reserve.iter().position(|e| e.activity.waiting_for_headers()) else { return Admission::Refused };
            if let Some(entry) = held.reserve.remove(oldest) {
                entry.evict.cancel();
            }
        }
        let id = held.next_id;
        held.next_id += 1;
        let evict = CancellationToken::new();
        held.reserve.push_back(ReserveEntry { id, activity: activity.clone(), evict: evict.clone() });
        Admission::Reserve(Slot { caps: self.clone(), kind: SlotKind::Reserve(id) }, evict)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut held = self.caps.held.lock();
        match self.kind {
            SlotKind::Counted(client) => {
                held.total -= 1;
                if let Some(n) = held.per_client.get_mut(&client) {
                    *n -= 1;
                    if *n == 0 {
                        held.per_client.remove(&client);
                    }
                }
            }
            SlotKind::Reserve(id) => {
                if let Some(at) = held.reserve.iter().position(|e| e.id == id) {
                    held.reserve.remove(at);
                }
            }
        }
    }
}

/// The address a per-client cap counts: IPv4 as is (also when mapped into
/// IPv6), IPv6 by its /64 network (what one subscriber is usually given).
pub(super) fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}
