//! The lease worker at its start: this server's identity (node id, name,
//! layout) and the leases saved before the restart. What the saved leases
//! are worth (a copied data directory, a start from a backup, another
//! registry) is the rule `snowflake_core::node::saved_leases`; this file
//! reads its inputs and acts on its decision.

use super::file::{data_directory_id, new_node_id, read_lease_file, registry_key, LeaseFile};
use super::file::{FileContext, LEASE_FILE};
use super::target::configured_target;
use super::{Target, Worker};

use crate::shmem::{Header, MODE_CITUS};
use crate::{clock, settings};
use snowflake_core::holder::problems::Problems;
use snowflake_core::holder::{Holder, Identity, Seen};
use snowflake_core::lease;
use snowflake_core::node::{self, SavedLeases, StartFacts};
use std::ffi::CStr;
use std::sync::atomic::Ordering::Acquire;
use std::time::Instant;

/// Files whose presence when the server starts means it starts from a
/// backup or as a standby: the lease file may be older than the leases.
const RESTORE_FILES: [&str; 3] = ["backup_label", "recovery.signal", "standby.signal"];

/// Set in the postmaster when it started with one of [`RESTORE_FILES`]
/// (inherited by the lease worker, which forks from it).
static STARTED_FROM_BACKUP: parking_lot::Mutex<bool> = parking_lot::const_mutex(false);

/// Notes whether the server starts from a backup or as a standby. Called
/// in the postmaster, whose working directory is the data directory.
pub(super) fn note_restore_files() {
    let restored = RESTORE_FILES
        .iter()
        .any(|f| std::path::Path::new(f).exists());
    *STARTED_FROM_BACKUP.lock() = restored;
}

impl Worker {
    /// The worker at its start: reads the lease file, this data directory
    /// and the settings, asks the rule what the saved leases are worth,
    /// and acts on it.
    pub(super) fn new(header: &'static Header) -> Worker {
        let data_directory = data_directory_id();
        let mut file = read_lease_file();
        let configured = configured_target();
        let decision = saved_leases(&file, data_directory, configured.as_ref());
        if decision == SavedLeases::Copy {
            // Detected without the registry, so also when it is down now:
            // the original may be running and issuing from these blocks.
            pgrx::log!(
                "snowflake_id lease: \"{LEASE_FILE}\" was written in another data directory (this one is a copy of it): this server takes a new node id and leases its own worker ids, none of its original's"
            );
            file = LeaseFile::default();
        }
        let mut worker = Worker::fresh(header, data_directory, &file.node_id);
        let target = configured.or_else(|| {
            file.citus_registry
                .clone()
                .map(|(conninfo, display)| Target {
                    conninfo,
                    display,
                    mode: MODE_CITUS,
                })
        });
        // Without a known target, a Citus node waits for its first look at
        // the metadata (mode stays undecided: no IDs), never local mode.
        if target.is_some() {
            worker.set_target(target);
        }
        if decision.from_backup() && !file.blocks.is_empty() {
            pgrx::log!(
                "snowflake_id lease: this server started from a backup or as a standby: the leases saved in \"{LEASE_FILE}\" are used only once the registry confirms them, above the registry's marks"
            );
        }
        match decision {
            SavedLeases::SameRegistry {
                from_backup,
                provable,
            } => worker.take_back(&file, from_backup, provable),
            _ if !file.blocks.is_empty() => pgrx::log!(
                "snowflake_id lease: the leases saved in \"{LEASE_FILE}\" came from another registry than {}: they are not used",
                worker.display()
            ),
            _ => {}
        }
        worker.persist();
        worker
    }

    /// A worker with nothing held, as node `node_id` (a new one if empty).
    fn fresh(header: &'static Header, data_directory: Option<(u64, u64)>, node_id: &str) -> Worker {
        let layout = *settings::layout();
        let node_id = if node_id.is_empty() {
            new_node_id()
        } else {
            node_id.to_string()
        };
        header.lease.node_id.set(&node_id);
        let holder = Holder::new(Identity {
            node: node_id,
            name: node_name(),
            layout: snowflake_core::lease::layout_text(&layout),
            block_size: lease::block_size(layout.max_worker_id()),
            max_worker_id: layout.max_worker_id(),
        });
        Worker {
            header,
            layout,
            holder,
            file: FileContext {
                data_directory,
                target: None,
                started: Instant::now(),
                saved: String::new(),
            },
            client: None,
            saved_provable: false,
            next_citus_mono: 0,
            problems: Problems::default(),
            registry_session: None,
            host_index: None,
            next_host: 0,
            public_warned: false,
        }
    }

    /// Takes back the leases the last life of this data directory saved,
    /// from the registry in use: its incarnation, WAL position and the
    /// blocks whose deadline has not passed (see [`node::restore`]).
    fn take_back(&mut self, file: &LeaseFile, from_backup: bool, provable: bool) {
        self.saved_provable = provable;
        self.holder.resume(
            &Seen {
                incarnation: file.incarnation.clone(),
                lsn: file.lsn.clone(),
                grants: file.grants,
                token: file.token.clone(),
                // Not in the lease file: a restart presents the
                // incarnations it sees from then on.
                earlier: Vec::new(),
            },
            from_backup,
        );
        let now_wall = clock::unix_ms();
        let now_mono = self.mono_ms();
        let restart_floor_ms = self.header.floor_ms.load(Acquire);
        for saved in &file.blocks {
            if let Some(r) = node::restore(saved, now_wall, now_mono, restart_floor_ms) {
                self.holder
                    .add_saved(r.block, r.floor_ms, r.high_ms, r.deadline_mono_ms);
            }
        }
    }
}

/// The rule over what was read: the lease file, this data directory, the
/// configured registry and whether the server started from a backup.
fn saved_leases(
    file: &LeaseFile,
    data_directory: Option<(u64, u64)>,
    configured: Option<&Target>,
) -> SavedLeases {
    let saved_citus = file.citus_registry.as_ref().map(|(c, _)| registry_key(c));
    let configured = configured.map(|t| registry_key(&t.conninfo));
    node::saved_leases(&StartFacts {
        saved_directory: file.data_directory,
        this_directory: data_directory,
        saved_registry: file.registry.as_deref(),
        saved_citus_registry: saved_citus.as_deref(),
        configured_registry: configured.as_deref(),
        unconfirmed: file.unconfirmed,
        saved_from_backup: file.from_backup,
        started_from_backup: *STARTED_FROM_BACKUP.lock(),
    })
}

/// This server's name in the registry: `cluster_name`, or host:port.
pub(crate) fn node_name() -> String {
    // SAFETY: reading PostgreSQL's GUC variables and the port number.
    let (cluster, port) = unsafe {
        let p = pgrx::pg_sys::cluster_name;
        let cluster = if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        (cluster, pgrx::pg_sys::PostPortNumber)
    };
    if !cluster.is_empty() {
        return cluster;
    }
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let host = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        "localhost".into()
    };
    format!("{host}:{port}")
}
