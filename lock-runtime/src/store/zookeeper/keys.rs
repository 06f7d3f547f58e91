//! A lock key as one node name.

/// [`encode_onto`] into a new string.
#[cfg(test)]
pub(super) fn encode(key: &str) -> String {
    let mut name = String::new();
    encode_onto(&mut name, key);
    name
}

/// Appends `key` to `name` as one node name: every byte outside
/// `[A-Za-z0-9_.:-]`, and a leading `.`, as `%XX`; so `/`, `.`, `..` and
/// control characters cannot escape into another node.
pub(super) fn encode_onto(name: &mut String, key: &str) {
    const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
    for (i, byte) in key.bytes().enumerate() {
        let plain = byte.is_ascii_alphanumeric()
            || matches!(byte, b'_' | b':' | b'-')
            || (byte == b'.' && i > 0);
        if plain {
            name.push(char::from(byte));
        } else {
            name.push('%');
            name.push(char::from(DIGITS[usize::from(byte >> 4)]));
            name.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_become_one_node_name_each() {
        assert_eq!(encode("stock:7"), "stock:7");
        assert_eq!(encode("a/b"), "a%2Fb");
        assert_eq!(encode(".."), "%2E.");
        assert_eq!(encode("."), "%2E");
        assert_eq!(encode("x y%"), "x%20y%25");
        assert_eq!(encode("é"), "%C3%A9");
    }
}
