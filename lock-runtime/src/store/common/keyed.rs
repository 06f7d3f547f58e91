//! Keys hashed once per lock.
//!
//! A lock looks its key up in a map several times (the local queue when it
//! joins and leaves; the memory store when it acquires and releases). A
//! [`HashedKey`] carries its hash, computed once with the map's randomly
//! seeded [`RandomState`] (foldhash's: keys chosen by a client cannot be
//! made to collide without the seed), and a [`KeyMap`] uses that hash as
//! it is.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

use foldhash::fast::RandomState;

/// A key and its hash under one map's [`KeyHashing`].
#[derive(Clone, Debug)]
pub(crate) struct HashedKey {
    hash: u64,
    key: Arc<str>,
}

impl HashedKey {
    /// The key.
    pub(crate) fn key(&self) -> &Arc<str> {
        &self.key
    }
}

impl PartialEq for HashedKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.key == other.key
    }
}

impl Eq for HashedKey {}

impl Hash for HashedKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// How one map's keys are hashed: foldhash with a seed drawn for the map.
#[derive(Clone, Debug, Default)]
pub(crate) struct KeyHashing(RandomState);

impl KeyHashing {
    /// `key` with its hash.
    pub(crate) fn key(&self, key: Arc<str>) -> HashedKey {
        HashedKey {
            hash: self.0.hash_one(&*key),
            key,
        }
    }

    /// `key` with its hash, to look it up without a copy of it: a
    /// [`KeyMap`] finds it with `map.get(probe.as_dyn())`.
    pub(crate) fn probe<'a>(&self, key: &'a str) -> KeyProbe<'a> {
        KeyProbe {
            hash: self.0.hash_one(key),
            key,
        }
    }
}

/// A borrowed key and its hash under one map's [`KeyHashing`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyProbe<'a> {
    hash: u64,
    key: &'a str,
}

impl<'a> KeyProbe<'a> {
    /// The probe as a map compares it with its keys.
    pub(crate) fn as_dyn(&self) -> &(dyn Keyed + 'a) {
        self
    }

    /// The key owned as `key` (the probe's text, shared), with the hash
    /// already computed.
    pub(crate) fn with_owned(self, key: Arc<str>) -> HashedKey {
        debug_assert_eq!(&*key, self.key);
        HashedKey {
            hash: self.hash,
            key,
        }
    }

    /// The key owned, with the hash already computed.
    pub(crate) fn to_owned_key(self) -> HashedKey {
        HashedKey {
            hash: self.hash,
            key: self.key.into(),
        }
    }
}

/// What a [`KeyMap`] compares, owned ([`HashedKey`]) or borrowed
/// ([`KeyProbe`]): a lookup by a borrowed key finds the owned one equal
/// to it, as `HashMap<String, _>` finds `&str`.
pub(crate) trait Keyed {
    fn carried_hash(&self) -> u64;
    fn text(&self) -> &str;
}

impl Keyed for HashedKey {
    fn carried_hash(&self) -> u64 {
        self.hash
    }

    fn text(&self) -> &str {
        &self.key
    }
}

impl Keyed for KeyProbe<'_> {
    fn carried_hash(&self) -> u64 {
        self.hash
    }

    fn text(&self) -> &str {
        self.key
    }
}

impl<'a> Borrow<dyn Keyed + 'a> for HashedKey {
    fn borrow(&self) -> &(dyn Keyed + 'a) {
        self
    }
}

/// As [`HashedKey`] hashes: the carried hash.
impl Hash for dyn Keyed + '_ {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.carried_hash());
    }
}

/// As [`HashedKey`] compares: the hash, then the text.
impl PartialEq for dyn Keyed + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.carried_hash() == other.carried_hash() && self.text() == other.text()
    }
}

impl Eq for dyn Keyed + '_ {}

/// A map by [`HashedKey`]: looks keys up by the hash they carry.
pub(crate) type KeyMap<V> = HashMap<HashedKey, V, CarriedHash>;

/// Builds hashers that return the hash a [`HashedKey`] carries.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct CarriedHash;

impl BuildHasher for CarriedHash {
    type Hasher = Carried;

    fn build_hasher(&self) -> Carried {
        Carried(0)
    }
}

/// The hash a [`HashedKey`] wrote.
#[derive(Debug)]
pub(crate) struct Carried(u64);

impl Hasher for Carried {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `HashedKey`s are hashed here, and they write one u64; mix
        // anything else in rather than lose it.
        for &byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }

    fn write_u64(&mut self, hash: u64) {
        self.0 = hash;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A map of `stock:7` (7) and `stock:8` (8), and its hashing.
    fn two_keys() -> (KeyHashing, KeyMap<u32>) {
        let hashing = KeyHashing::default();
        let mut map: KeyMap<u32> = KeyMap::default();
        map.insert(hashing.key("stock:7".into()), 7);
        map.insert(hashing.key("stock:8".into()), 8);
        (hashing, map)
    }

    #[test]
    fn a_key_is_found_by_the_hash_it_carries_and_only_by_its_own() {
        let (hashing, mut map) = two_keys();
        assert_eq!(map.get(&hashing.key("stock:7".into())), Some(&7));
        assert_eq!(map.remove(&hashing.key("stock:8".into())), Some(8));
        assert_eq!(map.get(&hashing.key("stock:8".into())), None);
        // Two maps draw different keys, so a key's hash differs between
        // them (with overwhelming probability).
        let other = KeyHashing::default();
        let a = hashing.key("stock:7".into());
        let b = other.key("stock:7".into());
        assert_ne!(a.hash, b.hash);
        assert_ne!(a, b);
    }

    #[test]
    fn a_borrowed_key_finds_the_owned_one_equal_to_it_and_only_that() {
        let (hashing, map) = two_keys();
        assert_eq!(map.get(hashing.probe("stock:7").as_dyn()), Some(&7));
        assert_eq!(map.get(hashing.probe("stock:8").as_dyn()), Some(&8));
        assert_eq!(map.get(hashing.probe("stock:9").as_dyn()), None);
        // Owned from a probe, the key hashes as if made from the text.
        let owned = hashing.probe("stock:9").to_owned_key();
        assert_eq!(owned, hashing.key("stock:9".into()));
        // Another map's hashing does not find it.
        let other = KeyHashing::default();
        assert_eq!(map.get(other.probe("stock:7").as_dyn()), None);
    }
}
