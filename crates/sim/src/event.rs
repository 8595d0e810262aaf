//! The simulator's event kinds. Small and `Copy`: packets travel as slab ids.

use crate::net::{NodeId, PktId, PortId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ev {
    /// A port finished serialising its packet in service.
    TxDone(PortId),
    /// A packet reaches a node (switch or host).
    Arrive(NodeId, PktId),
    /// A TCP retransmission timer fires (stale if the generation moved on).
    Rto { conn: u32, gen: u32 },
    /// Time slice `n` ends: every sender has a fragment for it.
    SliceEnd(u64),
    /// A sender transmits its fragment of a slice (delayed transmission).
    Transmit { sender: u32, frag: u32 },
}
