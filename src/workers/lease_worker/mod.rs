//! The lease worker: the background worker that leases blocks of worker ids
//! for this server from the fleet's registry (`snowflake_id.registry`, or
//! the Citus coordinator). This file is glue: the holder's rules are the
//! state machine in `holder` (tested against a fake registry), the marks
//! and the safety argument in `lease`, the registry's side in `leases.sql`
//! (created with the extension), the design in docs/design/fleet-fencing.md.
//!
//! - It runs when `snowflake_id.registry` is set, or when Citus is
//!   preloaded (then it reads Citus's `pg_dist_node` in
//!   `snowflake_id.registry_database` every second: a node in a cluster
//!   leases from the coordinator, a node on its own uses its `worker_ids`;
//!   when that database has no citus extension, it makes no IDs and says
//!   why, never local mode with every worker id).
//! - It talks to the registry over an ordinary client connection, with
//!   timeouts, one call per renewal, committing synchronously. Backends
//!   never wait on the registry: they read the slots' limits.
//! - Each slot's `limit_tick` is the confirmed mark of its block (or
//!   `NO_LEASE`); activating or revoking a block happens under the slot
//!   table's lock and bumps the slots' `lease_epoch`, so a backend whose
//!   block changed hands moves to another id (see `claims`).
//! - Identity: a random node id in the file `snowflake_id.leases`, with
//!   the blocks held and their deadlines, the registry they came from and
//!   its incarnation, written durably at each change. After a restart the
//!   saved blocks are used once the registry confirms them; while it is
//!   unreachable, only when this data directory provably saved them (same
//!   directory, same registry, not started from a backup). A copy of the
//!   data directory finds its node id's session lock taken on the
//!   registry by the running original, takes a new id and leases afresh.
//!   The lock held by this worker's own earlier session, left behind on
//!   the registry by a network break, is not a copy's: the worker
//!   remembers that session (pid and start, in memory only) and ends it.
//! - Problems are logged once, when they start and when they end, and
//!   retried every renewal interval.
//!
//! Files: this one schedules (the main loop, `Worker::step`, targets and
//! the slots' limits); `connection` connects and introduces the node;
//! `registry` makes the protocol's calls; `host` applies the holder's
//! decisions to shared memory; `file` is the lease file; `citus` finds the
//! coordinator; `problems` reports.

mod citus;
mod connection;
mod file;
mod host;
mod problems;
mod registry;

use citus::citus_target;
use file::{
    data_directory_id, new_node_id, read_lease_file, registry_key, save_lease_file, FileContext,
    LeaseFile,
};
use host::ShmHost;
use problems::Problem;
use registry::PgRegistry;

use crate::clock;
use crate::durability::reservation;
use crate::settings;
use crate::shmem::{self, Header, MODE_CITUS, MODE_LOCAL, MODE_REGISTRY, NO_LEASE};
use crate::workers::registry_client::{self, Connection};
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use serde::{Deserialize, Serialize};
use snowflake_core::generator::{floor_word, unpack};
use snowflake_core::holder::{
    self, AcquireRequest, CallError, Durability, Event, Holder, Identity, Now, Registry,
    ReleaseReply, ReleaseRequest, RenewRequest, Replication, Reply,
};
use snowflake_core::layout::{format_unix_ms, Layout};
use snowflake_core::lease::{self, Timing, Usage};
use std::ffi::CStr;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::time::{Duration, Instant};

const NAME: &str = "snowflake_id lease";
const LEASE_FILE: &str = "snowflake_id.leases";
const LEASE_FILE_C: &CStr = c"snowflake_id.leases";
const LEASE_FILE_TMP: &CStr = c"snowflake_id.leases.tmp";
const LEASE_FILE_VERSION: u32 = 2;
/// How often a Citus node looks at the cluster's metadata.
const CITUS_POLL_MS: i64 = 1_000;
/// Files whose presence when the server starts means it starts from a
/// backup or as a standby: the lease file may be older than the leases.
const RESTORE_FILES: [&str; 3] = ["backup_label", "recovery.signal", "standby.signal"];

/// Set in the postmaster when it started with one of [`RESTORE_FILES`]
/// (inherited by the lease worker, which forks from it).
static STARTED_FROM_BACKUP: parking_lot::Mutex<bool> = parking_lot::const_mutex(false);

/// Registers the worker. Called from `_PG_init` while preloading, in the
/// postmaster, whose working directory is the data directory.
pub fn init() {
    if !settings::leases_enabled() {
        return;
    }
    let restored = RESTORE_FILES
        .iter()
        .any(|f| std::path::Path::new(f).exists());
    *STARTED_FROM_BACKUP.lock() = restored;
    BackgroundWorkerBuilder::new(NAME)
        .set_type(NAME)
        .set_library("snowflake_id")
        .set_function("snowflake_id_lease_main")
        .enable_spi_access()
        .set_start_time(BgWorkerStartTime::RecoveryFinished)
        .set_restart_time(Some(Duration::from_secs(5)))
        .load();
}

/// Where leases come from.
#[derive(Clone, PartialEq, Eq)]
struct Target {
    conninfo: String,
    /// For messages: no password.
    display: String,
    mode: u8,
}

struct Worker {
    header: &'static Header,
    layout: Layout,
    holder: Holder,
    file: FileContext,
    client: Option<PgRegistry>,
    next_connect_mono: i64,
    /// The pause before the next connection attempt: 250 ms after a
    /// working connection broke, doubling up to the renewal interval.
    connect_backoff_ms: i64,
    /// A connection attempt failed since the last success.
    unreachable: bool,
    /// The saved blocks may be used while the registry is unreachable:
    /// same data directory, same registry, not started from a backup.
    saved_provable: bool,
    next_citus_mono: i64,
    problem: Option<Problem>,
    /// This worker's last session on the registry: its backend pid and
    /// start (microseconds since 1970). After a network break that session
    /// can linger there (a half-open connection), still holding the node
    /// id's lock: the worker ends it rather than take it for a copy's.
    /// Kept in this process only, never in the lease file: a copy of the
    /// data directory must not end its original's session.
    registry_session: Option<(i32, i64)>,
    /// Which host of the registry's connection string the session (or the
    /// attempt in progress) is on, and which to try first next time.
    host_index: Option<usize>,
    next_host: usize,
    /// Whether the warning that PUBLIC may connect to the registry's
    /// database was given (once per worker).
    public_warned: bool,
}

#[pg_guard]
#[unsafe(no_mangle)]
pub extern "C-unwind" fn snowflake_id_lease_main(_arg: pg_sys::Datum) {
    BackgroundWorker::attach_signal_handlers(SignalWakeFlags::SIGHUP | SignalWakeFlags::SIGTERM);
    let citus = settings::registry().is_none();
    let database = if citus {
        settings::registry_database()
    } else {
        None
    };
    BackgroundWorker::connect_worker_to_spi(database.as_deref(), None);
    settings::pin_search_path();
    let Some(header) = shmem::header() else {
        return;
    };
    // SAFETY: MyLatch is this process's latch, valid while it runs; the
    // pointer is cleared below before the process exits normally, and a
    // crash resets shared memory.
    header
        .lease
        .latch
        .store(unsafe { pg_sys::MyLatch }, Release);
    let mut worker = Worker::new(header);
    if citus && database.is_none() {
        worker.set_problem(Problem::Citus(
            "Citus is preloaded but snowflake_id.registry_database is empty, so its metadata cannot be read: set snowflake_id.registry_database to the database where CREATE EXTENSION citus ran, or set snowflake_id.registry".into(),
        ));
    }
    loop {
        if BackgroundWorker::sighup_received() {
            // SAFETY: a plain call, as PostgreSQL's own processes make on SIGHUP.
            unsafe { pg_sys::ProcessConfigFile(pg_sys::GucContext::PGC_SIGHUP) };
        }
        worker.step(citus && database.is_some());
        let wait = worker.wait_ms();
        if registry_client::terminating()
            || !BackgroundWorker::wait_latch(Some(Duration::from_millis(wait as u64)))
        {
            break;
        }
    }
    header.lease.latch.store(std::ptr::null_mut(), Release);
}

impl Worker {
    fn new(header: &'static Header) -> Worker {
        let layout = *settings::layout();
        let data_directory = data_directory_id();
        let mut file = read_lease_file();
        let copied = file.data_directory.is_some() && file.data_directory != data_directory;
        if copied {
            // Detected without the registry, so also when it is down now:
            // the original may be running and issuing from these blocks.
            pgrx::log!(
                "snowflake_id lease: \"{LEASE_FILE}\" was written in another data directory (this one is a copy of it): this server takes a new node id and leases its own worker ids, none of its original's"
            );
            file = LeaseFile::default();
        }
        let node_id = if file.node_id.is_empty() {
            new_node_id()
        } else {
            file.node_id.clone()
        };
        header.lease.node_id.set(&node_id);
        let block_size = lease::block_size(layout.max_worker_id());
        let holder = Holder::new(Identity {
            node: node_id,
            name: node_name(),
            layout: layout_text(&layout),
            block_size,
            max_worker_id: layout.max_worker_id(),
        });
        let started = Instant::now();
        let mut worker = Worker {
            header,
            layout,
            holder,
            file: FileContext {
                data_directory,
                target: None,
                started,
                saved: String::new(),
            },
            client: None,
            next_connect_mono: 0,
            connect_backoff_ms: 0,
            unreachable: false,
            saved_provable: false,
            next_citus_mono: 0,
            problem: None,
            registry_session: None,
            host_index: None,
            next_host: 0,
            public_warned: false,
        };
        let target = if let Some(registry) = settings::registry() {
            Some(Target {
                display: redact(&registry),
                conninfo: registry,
                mode: MODE_REGISTRY,
            })
        } else {
            file.citus_registry
                .clone()
                .map(|(conninfo, display)| Target {
                    conninfo,
                    display,
                    mode: MODE_CITUS,
                })
        };
        // Without a known target, a Citus node waits for its first look at
        // the metadata (mode stays undecided: no IDs), never local mode.
        if target.is_some() {
            worker.set_target(target);
        }
        let from_backup = *STARTED_FROM_BACKUP.lock() || file.from_backup;
        let same_registry = file.registry.is_some()
            && file.registry
                == worker
                    .file
                    .target
                    .as_ref()
                    .map(|t| registry_key(&t.conninfo));
        if from_backup && !file.blocks.is_empty() {
            pgrx::log!(
                "snowflake_id lease: this server started from a backup or as a standby: the leases saved in \"{LEASE_FILE}\" are used only once the registry confirms them, above the registry's marks"
            );
        }
        if !same_registry && !file.blocks.is_empty() {
            pgrx::log!(
                "snowflake_id lease: the leases saved in \"{LEASE_FILE}\" came from another registry than {}: they are not used",
                worker.display()
            );
        }
        if same_registry {
            worker.saved_provable =
                !from_backup && !file.unconfirmed && file.data_directory.is_some();
            worker.holder.from_backup = from_backup;
            worker.holder.incarnation = file.incarnation.clone();
            worker.holder.lsn = holder::parse_lsn(&file.lsn).unwrap_or(0);
            // Saved by the last life of this data directory. Their IDs
            // start above everything that life issued (the durable
            // reservation), and so does the mark recorded when one is
            // given back: the floor it was leased with may be days older
            // than its newest ID.
            let now_wall = clock::unix_ms();
            let now_mono = worker.mono_ms();
            let restart_floor_ms = header.floor_ms.load(Acquire);
            for saved in &file.blocks {
                if saved.deadline_unix_ms > now_wall {
                    worker.holder.add_saved(
                        saved.block,
                        saved.floor_ms.max(restart_floor_ms),
                        saved.high_ms,
                        now_mono + (saved.deadline_unix_ms - now_wall),
                    );
                }
            }
        }
        worker.persist();
        worker
    }

    fn mono_ms(&self) -> i64 {
        self.file.started.elapsed().as_millis() as i64
    }

    fn timing(&self) -> Timing {
        Timing::new(settings::lease_time_ms())
    }

    /// How long to sleep: until the next renewal, deadline or poll.
    fn wait_ms(&self) -> i64 {
        let now = self.mono_ms();
        let mut wait = self.timing().renew_every_ms.min(CITUS_POLL_MS);
        for h in &self.holder.held {
            wait = wait.min(h.deadline_mono_ms - now);
        }
        wait.clamp(10, 5_000)
    }

    fn display(&self) -> String {
        self.file
            .target
            .as_ref()
            .map_or_else(String::new, |t| t.display.clone())
    }

    /// Switches to `target` (`None`: this server's own worker_ids).
    fn set_target(&mut self, target: Option<Target>) {
        if self.file.target == target
            && self.header.lease.mode.load(Relaxed) != shmem::MODE_UNDECIDED
        {
            return;
        }
        // Another registry: nothing held from the old one is used again.
        let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
        self.holder.forget_all(&mut host);
        self.client = None;
        self.registry_session = None;
        self.host_index = None;
        self.next_host = 0;
        self.next_connect_mono = 0;
        self.saved_provable = false;
        let lease = &self.header.lease;
        match &target {
            Some(t) => {
                lease.registry.set(&t.display);
                if lease.mode.load(Relaxed) == MODE_LOCAL {
                    set_all_limits(self.header, NO_LEASE);
                }
                lease.mode.store(t.mode, Release);
                pgrx::log!("snowflake_id lease: leasing worker ids from {}", t.display);
            }
            None => {
                lease.registry.set("");
                set_all_limits(self.header, i64::MAX);
                lease.mode.store(MODE_LOCAL, Release);
            }
        }
        self.file.target = target;
        self.persist();
    }

    fn step(&mut self, citus: bool) {
        if citus && self.mono_ms() >= self.next_citus_mono {
            self.next_citus_mono = self.mono_ms() + CITUS_POLL_MS;
            // A node that has been part of a Citus cluster stays in Citus
            // mode when the metadata it reads says "no cluster": that is
            // what `stop_metadata_sync_to_node` leaves on a worker that
            // stays in the cluster, and local mode there would use worker
            // ids the coordinator leases to other nodes. It keeps leasing
            // from the coordinator it knew; a node that really left
            // removes citus from shared_preload_libraries.
            let found = match (citus_target(), &self.file.target) {
                (Ok(None), Some(known)) if known.mode == MODE_CITUS => Err(format!(
                    "Citus's metadata on this node lists no cluster any more (pg_dist_node is empty: stop_metadata_sync_to_node, or the node was removed), but this server was part of one: it keeps leasing worker ids from {} rather than using every worker id; if this node left the Citus cluster for good, remove citus from shared_preload_libraries and restart",
                    known.display
                )),
                (found, _) => found,
            };
            match found {
                Ok(target) => {
                    if matches!(self.problem, Some(Problem::Citus(_))) {
                        self.clear_problem();
                    }
                    self.set_target(target)
                }
                Err(problem) => {
                    // Which cluster this node is in is not known: no local
                    // mode (a registry already found stays in use).
                    if self.file.target.is_none()
                        && self.header.lease.mode.load(Relaxed) == MODE_LOCAL
                    {
                        set_all_limits(self.header, NO_LEASE);
                        self.header.lease.mode.store(shmem::MODE_UNDECIDED, Release);
                    }
                    self.set_problem(Problem::Citus(problem))
                }
            }
        }
        if self.file.target.is_none() {
            return;
        }
        if self.client.is_none() && self.mono_ms() >= self.next_connect_mono {
            self.connect();
        }
        self.holder.trust_saved = self.saved_provable && self.unreachable;
        let usage = self.usage();
        let now = Now {
            mono_ms: self.mono_ms(),
            wall_ms: clock::unix_ms(),
            timing: self.timing(),
            max_drift_ms: settings::max_drift_ms(),
            max_blocks: settings::max_blocks(),
            replication: settings::lease_replication(),
        };
        let (ranges, _) = settings::worker_ranges();
        let allowed = lease::allowed_blocks(&ranges, self.holder.id.block_size);
        let result = {
            let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
            let registry = self.client.as_mut().map(|c| c as &mut dyn Registry);
            self.holder.step(now, &usage, &allowed, registry, &mut host)
        };
        self.report_events();
        match result {
            Ok(()) => {
                if matches!(self.problem, Some(Problem::Refused(_))) {
                    self.clear_problem();
                }
            }
            Err(CallError::Unreachable(problem)) => {
                let display = self.display();
                self.unreachable(format!("the registry {display} did not answer: {problem}"));
            }
            Err(CallError::Refused(problem)) => {
                let display = self.display();
                self.set_problem(Problem::Refused(format!(
                    "the registry {display} refused a call: {problem}"
                )));
            }
        }
        self.publish();
        self.persist();
    }

    /// How many ids of each held block this server may use, and how many
    /// have sessions.
    fn usage(&self) -> Vec<Usage> {
        let (ranges, _) = settings::worker_ranges();
        let slots = self.header.slots();
        let max = self.layout.max_worker_id();
        let size = self.holder.id.block_size;
        let mut out = Vec::with_capacity(self.holder.held.len());
        let _guard = self.header.lock(false);
        for h in &self.holder.held {
            let (first, last) = lease::block_ids(h.block, size, max);
            let mut u = Usage {
                block: h.block,
                ids: 0,
                busy: 0,
            };
            for id in (first..=last).filter(|id| ranges.contains(*id)) {
                u.ids += 1;
                if slots[id as usize].sessions.load(Relaxed) != 0 {
                    u.busy += 1;
                }
            }
            out.push(u);
        }
        out
    }

    /// Publishes what backends and `snowflake_config()` report.
    fn publish(&self) {
        let lease = &self.header.lease;
        let active: Vec<_> = self.holder.held.iter().filter(|h| h.active).collect();
        lease.blocks_held.store(active.len() as u32, Release);
        let now_mono = self.mono_ms();
        // With nothing held, the last deadline stays: messages say when
        // the leases ran out.
        if let Some(d) = active.iter().map(|h| h.deadline_mono_ms).min() {
            lease
                .deadline_ms
                .store(clock::unix_ms() + (d - now_mono), Release);
        }
    }

    fn persist(&mut self) {
        save_lease_file(&mut self.file, &self.holder);
    }
}

fn set_all_limits(header: &Header, limit: i64) {
    let _guard = header.lock(true);
    for slot in header.slots() {
        slot.set_lease(limit);
    }
    header.lease.changes.fetch_add(1, Relaxed);
}

/// This server's name in the registry: `cluster_name`, or host:port.
fn node_name() -> String {
    // SAFETY: reading PostgreSQL's GUC variables and the port number.
    let (cluster, port) = unsafe {
        let p = pg_sys::cluster_name;
        let cluster = if p.is_null() {
            String::new()
        } else {
            CStr::from_ptr(p).to_string_lossy().into_owned()
        };
        (cluster, pg_sys::PostPortNumber)
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

/// The layout as the registry compares it between servers.
fn layout_text(layout: &Layout) -> String {
    format!(
        "{} total bits, {} worker bits, {} sequence bits, {} ms per tick, epoch {}",
        layout.total_bits,
        layout.worker_bits,
        layout.sequence_bits,
        layout.unit_ms,
        format_unix_ms(layout.epoch_ms)
    )
}

/// A connection string without its password, for messages: its hosts,
/// ports and database as libpq reads them.
fn redact(conninfo: &str) -> String {
    match registry_client::parse_conninfo(conninfo) {
        Ok(options) => {
            let get = |key: &str| {
                options
                    .iter()
                    .find(|(k, v)| k == key && !v.is_empty())
                    .map(|(_, v)| v.clone())
            };
            format!(
                "\"host={} port={} dbname={}\"",
                get("host")
                    .or_else(|| get("hostaddr"))
                    .unwrap_or_else(|| "(default)".into()),
                get("port").unwrap_or_else(|| "5432".into()),
                get("dbname").unwrap_or_else(|| "(user name)".into())
            )
        }
        Err(_) => "(an invalid connection string)".into(),
    }
}

/// A value for a single-quoted libpq connection-string value.
fn conninfo_quote(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}
