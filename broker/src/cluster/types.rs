//! openraft type configuration shared by every Raft group on a node (the
//! meta group and one group per quorum queue), and the command/reply
//! envelopes that go into the log.

use serde::{Deserialize, Serialize};

use crate::meta::command::{MetaCommand, MetaReply};
use crate::queue::types::{QueueCommand, QueueReply};

/// Node id in the cluster (u64, never reused for a wiped node).
pub type NodeId = u64;

/// Group id of the meta group; queue groups get fresh ids from 1 upward.
pub const META_GROUP: u64 = 0;

/// Who proposed an entry: the node and its boot epoch. A queue's effects
/// (deliveries, dead-letter publishes, timers) are carried out only by the
/// node that proposed the entry, in the same boot, so replayed entries and
/// entries of a former leader never act twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub node: NodeId,
    pub epoch: u32,
}

/// A log entry's payload: a command for the group's state machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum GroupCommand {
    Meta(MetaCommand),
    Queue {
        origin: Origin,
        cmd: QueueCommand,
    },
    /// A queue replica that openraft restored as leader from its persisted
    /// vote (a restart within its own term, so no blank entry of this boot
    /// follows) appends this; applying it re-issues the leader-only effects
    /// as a blank entry would ([`crate::queue::QueueHost`]): the deliveries
    /// in the outbox of the boot that went down were lost with it.
    LeaderRestored {
        origin: Origin,
    },
}

/// What applying a [`GroupCommand`] returned.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub enum GroupReply {
    /// Blank and membership entries, or a command sent to the wrong group.
    #[default]
    None,
    Meta(MetaReply),
    Queue(QueueReply),
}

impl GroupReply {
    /// A queue refused the proposal as out of its proposer's sequence
    /// (`QueueReply::OutOfSequence`): it must be resent.
    pub fn is_out_of_sequence(&self) -> bool {
        matches!(self, GroupReply::Queue(QueueReply::OutOfSequence))
    }
}

openraft::declare_raft_types!(
    /// Type configuration of all quorumq Raft groups.
    pub TypeConfig:
        D = GroupCommand,
        R = GroupReply,
        NodeId = NodeId,
        Node = openraft::BasicNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = crate::cluster::quiet_runtime::QuietRuntime,
);

/// A Raft group handle.
pub type Raft = openraft::Raft<TypeConfig>;
