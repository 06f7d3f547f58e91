//! Where a waiter stands in a queue a store keeps (etcd, ZooKeeper).

/// Where a waiter's node or entry stands in a store's queue, as the
/// waiter's watch knows it (ZooKeeper, etcd). None can join ahead of ours
/// (sequences and revisions only grow), so this stays true until one ahead
/// of ours goes, or ours does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Place {
    /// Read the queue to know.
    Unknown,
    /// First: every one ahead of ours was deleted, or a listing found ours
    /// first.
    Head,
    /// Behind one that is still there (its deletion is watched).
    Behind,
}
