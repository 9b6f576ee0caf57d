//! The registry's tokens: a keyed hash (SipHash-1-3, 128 bits) of an
//! incarnation and a WAL position, sent with every reply and presented
//! with every request. What a request says it saw is believed only with a
//! token that verifies (`begin`), so a role that may call the lease
//! functions cannot make the registry think it went back in time, or
//! forgot an incarnation it never had. The key lives in the registry's row
//! (`token_key`), which the lease role cannot read, and is kept from one
//! incarnation to the next.

use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

fn key_of(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 {
        return None;
    }
    let mut key = [0u8; 16];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

fn hash(key: &[u8; 16], incarnation: &str, lsn: u64, grants: i64) -> String {
    let mut h = SipHasher13::new_with_key(key);
    h.write(incarnation.as_bytes());
    h.write_u8(0xff);
    h.write_u64(lsn);
    h.write_i64(grants);
    format!("{:032x}", h.finish128().as_u128())
}

/// The token for `incarnation` at `lsn` with `grants` under `key` (hex,
/// 32 digits); '' for a key that is not one (a row written before 0.8.0).
pub fn sign(key: &str, incarnation: &str, lsn: u64, grants: i64) -> String {
    key_of(key).map_or_else(String::new, |k| hash(&k, incarnation, lsn, grants))
}

/// Whether `token` is the registry's for `incarnation` at `lsn` with
/// `grants`.
pub fn verify(key: &str, incarnation: &str, lsn: u64, grants: i64, token: &str) -> bool {
    key_of(key).is_some_and(|k| {
        let want = hash(&k, incarnation, lsn, grants);
        // Constant time: a role that may call the functions learns nothing
        // from how long a refusal took.
        want.len() == token.len()
            && want
                .bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f";

    #[test]
    fn a_token_verifies_only_for_its_triple_and_key() {
        let t = sign(KEY, "inc", 0x16_0000_0010, 7);
        assert_eq!(t.len(), 32);
        assert!(verify(KEY, "inc", 0x16_0000_0010, 7, &t));
        assert!(!verify(KEY, "inc", 0x16_0000_0010, 8, &t));
        assert!(!verify(KEY, "inc", 0x16_0000_0011, 7, &t));
        assert!(!verify(KEY, "inc2", 0x16_0000_0010, 7, &t));
        let other = "ff0102030405060708090a0b0c0d0e0f";
        assert!(!verify(other, "inc", 0x16_0000_0010, 7, &t));
        assert!(!verify(KEY, "inc", 0x16_0000_0010, 7, ""));
        assert!(!verify("", "inc", 0x16_0000_0010, 7, &t));
        assert_eq!(sign("not a key", "inc", 1, 0), "");
    }
}
