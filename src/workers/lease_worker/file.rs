//! The lease file (`snowflake_id.leases` in the data directory): this
//! data directory's node id and its leases, written through PostgreSQL's
//! file APIs with a format version; and what proves a copy of the
//! directory is one.

use super::Target;

use crate::clock;
use crate::durability::reservation;
use crate::shmem::MODE_CITUS;
use pgrx::pg_sys;
use serde::{Deserialize, Serialize};
use snowflake_core::holder::Holder;
use snowflake_core::node::SavedBlock;
use std::ffi::CStr;
use std::time::Instant;

pub(super) const LEASE_FILE: &str = "snowflake_id.leases";
const LEASE_FILE_C: &CStr = c"snowflake_id.leases";
const LEASE_FILE_TMP: &CStr = c"snowflake_id.leases.tmp";
const LEASE_FILE_VERSION: u32 = 2;

/// `snowflake_id.leases`: this data directory's node id and its leases.
#[derive(Serialize, Deserialize, Default)]
pub(super) struct LeaseFile {
    pub(super) version: u32,
    pub(super) node_id: String,
    #[serde(default)]
    pub(super) blocks: Vec<SavedBlock>,
    /// The data directory that wrote the file (device and inode number,
    /// [`data_directory_id`]). A file read in another directory was copied
    /// with it (pg_basebackup, a restored backup, a copied volume): its
    /// leases are the original's and are not used.
    #[serde(default)]
    pub(super) data_directory: Option<(u64, u64)>,
    /// On a Citus node, the registry it found in Citus's metadata
    /// (connection string and display; no password): the one used after
    /// a restart until the metadata can be read, so that the saved leases
    /// stay usable, also while the coordinator is down.
    #[serde(default)]
    pub(super) citus_registry: Option<(String, String)>,
    /// The registry the blocks came from (as displayed: host, port,
    /// database), its incarnation and the highest WAL position seen.
    #[serde(default)]
    pub(super) registry: Option<String>,
    #[serde(default)]
    pub(super) incarnation: String,
    #[serde(default)]
    pub(super) lsn: String,
    /// The registry's token for the incarnation and position
    /// (`snowflake_core::protocol::ReplyHead::token`).
    #[serde(default)]
    pub(super) token: String,
    #[serde(default)]
    pub(super) grants: i64,
    /// Some saved block was not confirmed by the registry since this
    /// server started (it started from a backup, or the registry has been
    /// unreachable since): not provably this directory's at the next start.
    #[serde(default)]
    pub(super) unconfirmed: bool,
    /// This server started from a backup and has not had its saved
    /// blocks confirmed yet.
    #[serde(default)]
    pub(super) from_backup: bool,
}

/// What the lease file needs besides the holder's state.
pub(super) struct FileContext {
    pub(super) data_directory: Option<(u64, u64)>,
    pub(super) target: Option<Target>,
    pub(super) started: Instant,
    /// The last text written, to skip unchanged writes.
    pub(super) saved: String,
}

/// Saves the node id and the leases, when they changed.
pub(super) fn save_lease_file(ctx: &mut FileContext, holder: &Holder) {
    let now_mono = ctx.started.elapsed().as_millis() as i64;
    let now_wall = clock::unix_ms();
    let seen = holder.seen();
    let file = LeaseFile {
        version: LEASE_FILE_VERSION,
        node_id: holder.id().node.clone(),
        data_directory: ctx.data_directory,
        citus_registry: ctx
            .target
            .as_ref()
            .filter(|t| t.mode == MODE_CITUS)
            .map(|t| (t.conninfo.clone(), t.display.clone())),
        registry: ctx.target.as_ref().map(|t| registry_key(&t.conninfo)),
        unconfirmed: holder.held().iter().any(|h| !h.confirmed),
        from_backup: holder.from_backup_unconfirmed(),
        incarnation: seen.incarnation,
        lsn: seen.lsn,
        token: seen.token,
        grants: seen.grants,
        blocks: holder
            .held()
            .iter()
            .map(|h| SavedBlock {
                block: h.block,
                floor_ms: h.floor_ms,
                high_ms: h.high_ms,
                deadline_unix_ms: now_wall + (h.deadline_mono_ms - now_mono),
            })
            .collect(),
    };
    // Unchanged leases (deadlines aside) are not written again.
    let mut key = format!(
        "{} {:?} {} {} {} {}",
        file.node_id, file.registry, file.incarnation, file.lsn, file.unconfirmed, file.from_backup
    );
    for b in &file.blocks {
        key.push_str(&format!(" {}:{}:{}", b.block, b.high_ms, b.floor_ms));
    }
    if key == ctx.saved {
        return;
    }
    let Ok(text) = serde_json::to_string(&file) else {
        return;
    };
    reservation::write_durably(LEASE_FILE_TMP, LEASE_FILE_C, &text);
    ctx.saved = key;
}

/// The registry's identity in the lease file: a hash of its whole
/// connection string (two services or two hosts' strings differ even when
/// they display alike; the hash keeps a password out of the file).
pub(super) fn registry_key(conninfo: &str) -> String {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x736e_6f77, 0x666c_616b);
    h.write(conninfo.as_bytes());
    format!("{:016x}", h.finish())
}

pub(super) fn read_lease_file() -> LeaseFile {
    match std::fs::read_to_string(LEASE_FILE) {
        Ok(text) => match serde_json::from_str::<LeaseFile>(&text) {
            Ok(file) if file.version <= LEASE_FILE_VERSION => file,
            _ => {
                pgrx::warning!(
                    "snowflake_id lease: \"{LEASE_FILE}\" is unreadable or from a newer version; this server takes a new node id and leases afresh"
                );
                LeaseFile::default()
            }
        },
        Err(_) => LeaseFile::default(),
    }
}

/// The data directory's device and inode numbers (the working directory
/// of every PostgreSQL process): what a copy of it does not share.
pub(super) fn data_directory_id() -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(".").ok().map(|m| (m.dev(), m.ino()))
}

/// 32 random hex digits.
pub(super) fn new_node_id() -> String {
    let mut bytes = [0u8; 16];
    // SAFETY: fills the buffer we own, of the length given.
    let ok = unsafe { pg_sys::pg_strong_random(bytes.as_mut_ptr().cast(), bytes.len()) };
    if !ok {
        // Not secret, only unique: the time and pid are a fallback.
        let seed = (clock::unix_ms() as u128) << 32 | u128::from(std::process::id());
        bytes = seed.to_le_bytes();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
