//! A lock's names in etcd: the range of its queue, and its entries' names.

use etcd_client::{GetOptions, SortOrder, SortTarget};

/// The start of `key`'s range: `prefix`, the key with `%` and NUL escaped
/// (so no key's range holds another key's entries), and a NUL.
pub(super) fn queue_start(prefix: &str, key: &str) -> Vec<u8> {
    let mut start = Vec::with_capacity(prefix.len() + key.len() + 1);
    start.extend_from_slice(prefix.as_bytes());
    for byte in key.bytes() {
        match byte {
            0 => start.extend_from_slice(b"%00"),
            b'%' => start.extend_from_slice(b"%25"),
            byte => start.push(byte),
        }
    }
    start.push(0);
    start
}

/// Which key a spare lease was last used for, as the pool notes it.
pub(super) fn used_for(queue: &[u8]) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(queue)
}

/// The end of the range that starts at `queue` (exclusive).
pub(super) fn queue_end(queue: &[u8]) -> Vec<u8> {
    let mut end = queue.to_vec();
    if let Some(last) = end.last_mut() {
        *last = 1;
    }
    end
}

/// The entry in `queue` of a lock on lease `lease`: named by the lease and
/// a digit that a hand-over flips, so that locks on a recycled lease reuse
/// the same two names. etcd keeps a deleted key in its index until the
/// history is compacted, and reads of a range visit every key it kept:
/// a fresh name per lock would slow each lock on a busy key down until
/// then.
pub(super) fn entry_for(queue: &[u8], lease: i64, second: bool) -> Vec<u8> {
    let mut entry = queue.to_vec();
    entry.extend_from_slice(format!("{lease:016x}").as_bytes());
    entry.push(if second { b'1' } else { b'0' });
    entry
}

/// The other name of `entry`'s lease (see [`entry_for`]).
pub(super) fn flipped(entry: &[u8]) -> Vec<u8> {
    let mut next = entry.to_vec();
    if let Some(last) = next.last_mut() {
        *last = if *last == b'0' { b'1' } else { b'0' };
    }
    next
}

/// Reads the entry of `queue` created first.
pub(super) fn first_of(queue: &[u8]) -> GetOptions {
    GetOptions::new()
        .with_range(queue_end(queue))
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_key_s_range_holds_another_key_s_entries() {
        let keys = ["k", "k\0x", "k%00x", "k%2500x", "k/x", "kx", ""];
        for a in keys {
            let (start, end) = (
                queue_start("locks/", a),
                queue_end(&queue_start("locks/", a)),
            );
            for b in keys.iter().filter(|b| **b != a) {
                let entry = entry_for(&queue_start("locks/", b), 7, false);
                assert!(
                    !(start <= entry && entry < end),
                    "{b:?}'s entry is in {a:?}'s range"
                );
            }
            let own = entry_for(&start, 7, false);
            assert!(start <= own && own < end);
            assert!(start <= flipped(&own) && flipped(&own) < end);
            assert_ne!(flipped(&own), own);
            assert_eq!(flipped(&flipped(&own)), own);
        }
    }
}
