//! The registry's token key, kept in the data directory
//! (`snowflake_id.key`) so that `DROP EXTENSION` does not take it: tokens
//! a registry issued before its extension was made again, or before a
//! snapshot of it was restored in place, still verify
//! (`snowflake_core::registry::begin`). A base backup (a standby) copies
//! it with the data directory; `pg_dump` does not (a dump restored
//! elsewhere starts with a key of its own).
//!
//! Made only when the registry's row is made (`CREATE EXTENSION`, the row
//! deleted): lease calls, which hold the registry's lock, and the
//! extension script, run one at a time. Read, never made, for a node's
//! lock keys ([`read`]).

use crate::errors;
use pgrx::pg_sys;
use std::ffi::CStr;

const KEY_FILE: &str = "snowflake_id.key";
const KEY_FILE_C: &CStr = c"snowflake_id.key";
const KEY_FILE_TMP: &CStr = c"snowflake_id.key.tmp";

/// The data directory's key when it is there and readable as one.
pub fn read() -> Option<String> {
    let text = std::fs::read_to_string(KEY_FILE).ok()?;
    let key = text.trim();
    (key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| key.to_ascii_lowercase())
}

/// The data directory's key (32 hex digits), and whether it was there
/// before this call; made (random, written durably) when missing.
pub fn key() -> (String, bool) {
    match std::fs::read_to_string(KEY_FILE) {
        Ok(text) => {
            let key = text.trim();
            if key.len() == 32 && key.bytes().all(|b| b.is_ascii_hexdigit()) {
                return (key.to_ascii_lowercase(), true);
            }
            errors::registry_key_file_unreadable(KEY_FILE)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => errors::registry_key_file("read", KEY_FILE, e),
    }
    let mut bytes = [0u8; 16];
    // SAFETY: fills the buffer we own, of the length given.
    if !unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) } {
        errors::registry_key_file(
            "make",
            KEY_FILE,
            std::io::Error::other("no strong random numbers"),
        );
    }
    let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    super::reservation::write_durably(KEY_FILE_TMP, KEY_FILE_C, &key);
    (key, false)
}
