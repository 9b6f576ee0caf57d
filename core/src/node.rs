//! A node's identity over restarts and copies of its data directory, the
//! pure rules: which leases saved in the lease file a start may use
//! ([`saved_leases`]), what a saved block is worth at the start
//! ([`restore`]), and what to do when the registry refuses the node id's
//! lock ([`NodeClaim`]). No PostgreSQL calls: `lease_worker` reads the
//! facts (the lease file, the data directory, the settings, the restore
//! files) and acts on the decisions; `holder` then uses the blocks (see
//! "What the holder trusts" there).
//!
//! - A lease file written in another data directory was copied with it
//!   (pg_basebackup, a restored backup, a copied volume): the original may
//!   be running and issuing from the saved blocks, so nothing saved is
//!   used, not even the node id. This is known without the registry, so
//!   also while it is down.
//! - Saved leases from another registry than the one this start leases
//!   from are not used (the node id is kept).
//! - Saved leases from the same registry are taken back; each is used once
//!   the registry confirms it, and before that (while the registry is
//!   unreachable) only when this data directory provably saved them: it
//!   wrote the file, it did not start from a backup or as a standby, and
//!   every saved block had been confirmed.
//! - A node id whose lock a live session holds on the registry belongs to
//!   another running server (a copy, or the original of this one), unless
//!   that session is this worker's own earlier one, left behind by a
//!   network break: that one is ended first; otherwise the node takes a new
//!   id, once. Why it took one is said as known ([`Rename`]): a session it
//!   does not know holds the lock (another server), or its own earlier
//!   session does and could not be ended (a registry backend stopped or
//!   stuck: no other server is known to exist).

use serde::{Deserialize, Serialize};

/// What a lease worker read when it started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StartFacts<'a> {
    /// The data directory that wrote the lease file (device and inode), as
    /// the file says (`None`: no file, or one that does not say).
    pub saved_directory: Option<(u64, u64)>,
    /// This data directory's device and inode (`None`: unreadable).
    pub this_directory: Option<(u64, u64)>,
    /// The registry the saved leases came from (its key), if the file names one.
    pub saved_registry: Option<&'a str>,
    /// The Citus coordinator the file names (its key): a Citus node's
    /// registry until it reads the cluster's metadata.
    pub saved_citus_registry: Option<&'a str>,
    /// The registry of `snowflake_id.registry` (its key), when set.
    pub configured_registry: Option<&'a str>,
    /// The file says some saved block had not been confirmed by the
    /// registry since the start that saved it.
    pub unconfirmed: bool,
    /// The file says the start that saved it was from a backup and had not
    /// had its saved blocks confirmed yet.
    pub saved_from_backup: bool,
    /// This start is from a backup or as a standby (a restore file was there
    /// when the server started).
    pub started_from_backup: bool,
}

impl StartFacts<'_> {
    /// The file was written in another data directory.
    pub fn copied(&self) -> bool {
        self.saved_directory.is_some() && self.saved_directory != self.this_directory
    }

    /// The registry this start leases from (its key): the configured one,
    /// else the Citus coordinator the file names (not on a copy: nothing of
    /// its file is used). `None`: not known until the Citus metadata is read.
    pub fn registry_in_use(&self) -> Option<&str> {
        if self.copied() {
            return self.configured_registry;
        }
        self.configured_registry.or(self.saved_citus_registry)
    }
}

/// What a start does with the lease file it read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedLeases {
    /// The file was written in another data directory: this one is a copy.
    /// Nothing in it is used: not its leases, not its node id, not its
    /// Citus coordinator.
    Copy,
    /// The saved leases (if any) came from another registry than the one
    /// this start leases from, or that one is not known yet: they are not
    /// used. `from_backup`: this start, or the one that saved the file,
    /// is from a backup (for the log).
    OtherRegistry { from_backup: bool },
    /// The saved leases came from the registry this start leases from: the
    /// holder takes back their incarnation, WAL position and blocks.
    /// `from_backup`: a block, once confirmed, is used only above the
    /// registry's mark for it. `provable`: this data directory provably
    /// saved them, so they may be used while the registry is unreachable.
    SameRegistry { from_backup: bool, provable: bool },
}

impl SavedLeases {
    /// This start, or the one that saved the leases, is from a backup.
    pub fn from_backup(&self) -> bool {
        match *self {
            SavedLeases::Copy => false,
            SavedLeases::OtherRegistry { from_backup }
            | SavedLeases::SameRegistry { from_backup, .. } => from_backup,
        }
    }

    /// The saved leases may be used while the registry is unreachable.
    pub fn provable(&self) -> bool {
        matches!(self, SavedLeases::SameRegistry { provable: true, .. })
    }
}

/// The rule: what a start does with the lease file it read.
pub fn saved_leases(facts: &StartFacts) -> SavedLeases {
    if facts.copied() {
        return SavedLeases::Copy;
    }
    let from_backup = facts.started_from_backup || facts.saved_from_backup;
    let same_registry =
        facts.saved_registry.is_some() && facts.saved_registry == facts.registry_in_use();
    if !same_registry {
        return SavedLeases::OtherRegistry { from_backup };
    }
    SavedLeases::SameRegistry {
        from_backup,
        provable: !from_backup && !facts.unconfirmed && facts.saved_directory.is_some(),
    }
}

/// A block in the lease file.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct SavedBlock {
    pub block: u32,
    /// Every ID of the block is above this Unix ms.
    pub floor_ms: i64,
    /// The confirmed mark.
    pub high_ms: i64,
    /// The lease's deadline, by the wall clock of the server that saved it.
    pub deadline_unix_ms: i64,
}

/// A saved block as the holder takes it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Restored {
    pub block: u32,
    pub floor_ms: i64,
    pub high_ms: i64,
    /// The deadline on this start's monotonic clock.
    pub deadline_mono_ms: i64,
}

/// A saved block at a start (wall clock `now_wall_ms`, monotonic clock
/// `now_mono_ms`): `None` once its deadline passed. Its IDs start above
/// everything the last life of this data directory issued
/// (`restart_floor_ms`, the durable reservation), and so does the mark
/// recorded when it is given back: the floor it was leased with may be
/// days older than its newest ID.
pub fn restore(
    saved: &SavedBlock,
    now_wall_ms: i64,
    now_mono_ms: i64,
    restart_floor_ms: i64,
) -> Option<Restored> {
    if saved.deadline_unix_ms <= now_wall_ms {
        return None;
    }
    Some(Restored {
        block: saved.block,
        floor_ms: saved.floor_ms.max(restart_floor_ms),
        high_ms: saved.high_ms,
        deadline_mono_ms: now_mono_ms
            .saturating_add(saved.deadline_unix_ms.saturating_sub(now_wall_ms)),
    })
}

/// Taking the node id's session lock on the registry
/// (`snowflake_lease_hello`), one connection's worth: what to do each time
/// the registry says a live session holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeClaim {
    /// This worker's earlier session is still to be tried.
    lingering: bool,
    renamed: bool,
}

/// What became of this worker's earlier registry session when it tried to
/// end it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// It was there and ended (with it, its hold on the node id).
    Ended,
    /// It is no longer on the registry: it is not what holds the node id.
    Gone,
    /// It is still there and did not end (a stopped or stuck backend, a
    /// refused `pg_terminate_backend`), or whether it is could not be told
    /// (the call failed): it may be what holds the node id.
    NotEnded,
}

/// Why the node takes a new id: what is known of the session that holds
/// the old one's lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rename {
    /// A session this worker does not know holds it (it remembers no
    /// earlier session, or that one is gone or was ended): another running
    /// server has this node id, a copy of this data directory or its
    /// original.
    OtherServer,
    /// This worker's own earlier session may still hold it: it was still
    /// there (or could not be looked up) and did not end. No other server
    /// is known to have this node id; a new id is taken rather than wait
    /// for that session, and the old id's blocks go back to the registry
    /// when their lease and grace run out.
    OwnSessionNotEnded,
}

/// What to do after the node id's lock was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// This worker's earlier session held it and was ended: ask again.
    Retry,
    /// Take a new node id (forgetting every block) and ask again; why.
    Rename(Rename),
    /// Even a fresh node id was refused: give up on this connection.
    GiveUp,
}

impl NodeClaim {
    /// `lingering`: this worker remembers its own earlier session on the
    /// registry, which a network break may have left holding the lock.
    pub fn new(lingering: bool) -> NodeClaim {
        NodeClaim {
            lingering,
            renamed: false,
        }
    }

    /// The lock was refused. `end_lingering` ends this worker's earlier
    /// session and says what became of it; it is called at most once per
    /// claim, before any rename.
    pub fn refused(&mut self, end_lingering: impl FnOnce() -> Ending) -> Refused {
        let ending = std::mem::take(&mut self.lingering).then(end_lingering);
        if ending == Some(Ending::Ended) {
            return Refused::Retry;
        }
        if !self.renamed {
            self.renamed = true;
            return Refused::Rename(match ending {
                Some(Ending::NotEnded) => Rename::OwnSessionNotEnded,
                _ => Rename::OtherServer,
            });
        }
        Refused::GiveUp
    }
}

#[cfg(test)]
mod tests;
