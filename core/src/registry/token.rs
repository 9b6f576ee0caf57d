//! The registry's tokens: a keyed hash (SipHash-1-3, 128 bits) of the
//! database it was signed in, an incarnation, a WAL position and a grant
//! count, followed by that database's OID, sent with every reply and
//! presented with every request. What a request says it saw is believed only with a
//! token that verifies (`begin`), so a role that may call the lease
//! functions cannot make the registry think it went back in time, or
//! forgot an incarnation it never had. The key lives in the registry's row
//! (`token_key`), which the lease role cannot read, and is kept from one
//! incarnation to the next. The key is the data directory's, so a copy of
//! the registry's database (and any registry database of the cluster)
//! signs under it too: the database a token names tells a grant made
//! there from one made here (`begin`).

use siphasher::sip128::{Hasher128, SipHasher13};
use std::hash::Hasher;

pub(super) fn key_of(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 {
        return None;
    }
    let mut key = [0u8; 16];
    for (i, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(key)
}

fn hash(key: &[u8; 16], database: u32, incarnation: &str, lsn: u64, grants: i64) -> String {
    let mut h = SipHasher13::new_with_key(key);
    h.write_u32(database);
    h.write(incarnation.as_bytes());
    h.write_u8(0xff);
    h.write_u64(lsn);
    h.write_i64(grants);
    format!("{:032x}{database:08x}", h.finish128().as_u128())
}

/// The token for `incarnation` at `lsn` with `grants`, signed in database
/// `database` under `key` (hex, 32 digits): 40 hex digits, the last 8 the
/// database; '' for a key that is not one (a row written before 0.8.0).
pub fn sign(key: &str, database: u32, incarnation: &str, lsn: u64, grants: i64) -> String {
    key_of(key).map_or_else(String::new, |k| {
        hash(&k, database, incarnation, lsn, grants)
    })
}

/// The database `token` was signed in, when it is the registry's for
/// `incarnation` at `lsn` with `grants` under `key`.
pub fn verify(key: &str, incarnation: &str, lsn: u64, grants: i64, token: &str) -> Option<u32> {
    let k = key_of(key)?;
    let named = token.get(32..).filter(|d| d.len() == 8)?;
    let database = u32::from_str_radix(named, 16).ok()?;
    let want = hash(&k, database, incarnation, lsn, grants);
    // Constant time: a role that may call the functions learns nothing
    // from how long a refusal took.
    (want.len() == token.len()
        && want
            .bytes()
            .zip(token.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0)
        .then_some(database)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f";

    #[test]
    fn a_token_verifies_only_for_what_it_was_signed_for_and_names_its_database() {
        let t = sign(KEY, 16_384, "inc", 0x16_0000_0010, 7);
        assert_eq!(t.len(), 40);
        assert_eq!(verify(KEY, "inc", 0x16_0000_0010, 7, &t), Some(16_384));
        assert_eq!(verify(KEY, "inc", 0x16_0000_0010, 8, &t), None);
        assert_eq!(verify(KEY, "inc", 0x16_0000_0011, 7, &t), None);
        assert_eq!(verify(KEY, "inc2", 0x16_0000_0010, 7, &t), None);
        let other = "ff0102030405060708090a0b0c0d0e0f";
        assert_eq!(verify(other, "inc", 0x16_0000_0010, 7, &t), None);
        assert_eq!(verify(KEY, "inc", 0x16_0000_0010, 7, ""), None);
        assert_eq!(verify("", "inc", 0x16_0000_0010, 7, &t), None);
        assert_eq!(sign("not a key", 1, "inc", 1, 0), "");
        // Another database named on the same hash, or none, does not verify.
        let forged = format!("{}{:08x}", &t[..32], 16_385);
        assert_eq!(verify(KEY, "inc", 0x16_0000_0010, 7, &forged), None);
        assert_eq!(verify(KEY, "inc", 0x16_0000_0010, 7, &t[..32]), None);
        assert_eq!(
            verify(KEY, "inc", 0x16_0000_0010, 7, &format!("{t}0")),
            None
        );
        assert_eq!(
            verify(
                KEY,
                "inc",
                0x16_0000_0010,
                7,
                &format!("{}+0004000", &t[..32])
            ),
            None
        );
    }
}
