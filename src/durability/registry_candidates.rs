//! The last failover candidates' row the registry wrote, kept in the data
//! directory (`snowflake_id.candidates.<database OID>`: each registry
//! database has its own row) so that `DROP EXTENSION` does not take it: a
//! standby that received that row may prove a promotion by it
//! until its `valid_until`, so the row made anew names its members again
//! (`snowflake_core::registry::durable::made_anew`).
//!
//! Written (durably, before the row's commit) by every durability check
//! that changes the row, under the row's lock (`snowflake_lease_durable`);
//! read when the row is made anew. A file the registry cannot read is an
//! error, not a fresh start: without it a cut-off candidate could prove a
//! promotion that lost grants.

use crate::errors;
use snowflake_core::registry::durable::CandidatesRow;
use std::ffi::CString;

/// This database's file: another registry database in the same cluster
/// (another fleet) writes a row of its own, which must not stand for
/// this one's.
fn file() -> String {
    format!(
        "snowflake_id.candidates.{}",
        crate::sql::leases::this_database()
    )
}

/// The row last written here, if any.
pub fn kept() -> Option<CandidatesRow> {
    let file = file();
    match std::fs::read_to_string(&file) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(row) => Some(row),
            Err(_) => errors::registry_candidates_file_unreadable(&file),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => errors::registry_candidates_file("read", &file, e),
    }
}

/// Keeps `row`, durably.
pub fn keep(row: &CandidatesRow) {
    let file = file();
    let text = match serde_json::to_string(row) {
        Ok(t) => t,
        Err(e) => errors::registry_candidates_file("encode", &file, std::io::Error::other(e)),
    };
    // A name of this backend's own: a row made anew by hand is written
    // without the row's lock.
    let names = (
        CString::new(format!("{file}.{}.tmp", std::process::id())),
        CString::new(file.as_str()),
    );
    let (Ok(tmp), Ok(name)) = names else {
        errors::registry_candidates_file("name", &file, std::io::Error::other("a NUL in the name"))
    };
    super::reservation::write_durably(&tmp, &name, &text);
}
