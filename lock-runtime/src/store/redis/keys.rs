//! A lock's names in Redis: the key, its fencing counter, its release
//! channel and (fair mode) its queue.

/// `lock:{<escaped key>}`: the escaped key is the hash tag.
pub(super) fn lock_name(key: &str) -> Vec<u8> {
    let mut name = Vec::with_capacity(key.len() + 16);
    name.extend_from_slice(b"lock:{");
    // Copied a run at a time: most keys have nothing to escape.
    let mut rest = key.as_bytes();
    while let Some(at) = rest.iter().position(|b| matches!(b, b'%' | b'{' | b'}')) {
        name.extend_from_slice(&rest[..at]);
        name.extend_from_slice(match rest[at] {
            b'%' => b"%25",
            b'{' => b"%7B",
            _ => b"%7D",
        });
        rest = &rest[at + 1..];
    }
    name.extend_from_slice(rest);
    name.push(b'}');
    name
}

/// Another name of the same lock: its counter (`:fence`), its kind
/// (`:kind`), ... or its release channel ([`released_channel`]).
pub(super) fn suffixed(lock: &[u8], suffix: &[u8]) -> Vec<u8> {
    let mut name = Vec::with_capacity(lock.len() + suffix.len());
    name.extend_from_slice(lock);
    name.extend_from_slice(suffix);
    name
}

/// The channel a lock's releases are published on: `<lock>:released`.
/// `release_exclusive.lua` builds the same name from its key.
pub(super) fn released_channel(lock: &[u8]) -> Vec<u8> {
    suffixed(lock, b":released")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn braces_and_percent_are_escaped_so_keys_cannot_collide() {
        assert_eq!(lock_name("stock:7"), b"lock:{stock:7}");
        assert_eq!(lock_name("a}b{c%"), b"lock:{a%7Db%7Bc%25}");
        assert_eq!(lock_name("{}%x"), b"lock:{%7B%7D%25x}");
        assert_eq!(lock_name(""), b"lock:{}");
        // A key that spells another key's counter stays a different name.
        let counter = suffixed(&lock_name("k"), b":fence");
        assert_eq!(counter, b"lock:{k}:fence");
        assert_ne!(lock_name("k}:fence"), counter);
        assert_ne!(lock_name("%7D"), lock_name("}"));
    }
}
