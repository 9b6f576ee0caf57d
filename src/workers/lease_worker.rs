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
    self, AcquireRequest, CallError, Event, Holder, Identity, Now, Registry, ReleaseReply,
    ReleaseRequest, RenewRequest, Reply,
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

/// `snowflake_id.leases`: this data directory's node id and its leases.
#[derive(Serialize, Deserialize, Default)]
struct LeaseFile {
    version: u32,
    node_id: String,
    #[serde(default)]
    blocks: Vec<SavedBlock>,
    /// The data directory that wrote the file (device and inode number,
    /// [`data_directory_id`]). A file read in another directory was copied
    /// with it (pg_basebackup, a restored backup, a copied volume): its
    /// leases are the original's and are not used.
    #[serde(default)]
    data_directory: Option<(u64, u64)>,
    /// On a Citus node, the registry it found in Citus's metadata
    /// (connection string and display; no password): the one used after
    /// a restart until the metadata can be read, so that the saved leases
    /// stay usable, also while the coordinator is down.
    #[serde(default)]
    citus_registry: Option<(String, String)>,
    /// The registry the blocks came from (as displayed: host, port,
    /// database), its incarnation and the highest WAL position seen.
    #[serde(default)]
    registry: Option<String>,
    #[serde(default)]
    incarnation: String,
    #[serde(default)]
    lsn: String,
    /// Some saved block was not confirmed by the registry since this
    /// server started (it started from a backup, or the registry has been
    /// unreachable since): not provably this directory's at the next start.
    #[serde(default)]
    unconfirmed: bool,
    /// This server started from a backup and has not had its saved
    /// blocks confirmed yet.
    #[serde(default)]
    from_backup: bool,
}

#[derive(Serialize, Deserialize, Clone, Copy)]
struct SavedBlock {
    block: u32,
    floor_ms: i64,
    high_ms: i64,
    deadline_unix_ms: i64,
}

/// Where leases come from.
#[derive(Clone, PartialEq, Eq)]
struct Target {
    conninfo: String,
    /// For messages: no password.
    display: String,
    mode: u8,
}

/// What the lease file needs besides the holder's state.
struct FileContext {
    data_directory: Option<(u64, u64)>,
    target: Option<Target>,
    started: Instant,
    /// The last text written, to skip unchanged writes.
    saved: String,
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
    problem: Option<String>,
    /// This worker's last session on the registry: its backend pid and
    /// start (microseconds since 1970). After a network break that session
    /// can linger there (a half-open connection), still holding the node
    /// id's lock: the worker ends it rather than take it for a copy's.
    /// Kept in this process only, never in the lease file: a copy of the
    /// data directory must not end its original's session.
    registry_session: Option<(i32, i64)>,
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
        worker.set_problem(
            "Citus is preloaded but snowflake_id.registry_database is empty, so its metadata cannot be read: set snowflake_id.registry_database to the database where CREATE EXTENSION citus ran, or set snowflake_id.registry".into(),
        );
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

    fn set_problem(&mut self, problem: String) {
        if self.problem.as_deref() != Some(problem.as_str()) {
            pgrx::warning!("snowflake_id lease: {problem}");
        }
        self.header.lease.problem.set(&problem);
        self.problem = Some(problem);
    }

    fn clear_problem(&mut self) {
        if self.problem.take().is_some() {
            pgrx::log!(
                "snowflake_id lease: the registry {} is reachable again",
                self.display()
            );
        }
        self.header.lease.problem.set("");
    }

    fn display(&self) -> String {
        self.file
            .target
            .as_ref()
            .map_or_else(String::new, |t| t.display.clone())
    }

    fn unreachable(&mut self, problem: String) {
        let lease = &self.header.lease;
        if lease.unreachable_since_ms.load(Relaxed) == 0 {
            lease.unreachable_since_ms.store(clock::unix_ms(), Release);
        }
        self.client = None;
        self.unreachable = true;
        let most = self.timing().renew_every_ms.max(1_000);
        self.connect_backoff_ms = (self.connect_backoff_ms * 2).clamp(250, most);
        self.next_connect_mono = self.mono_ms() + self.connect_backoff_ms;
        self.set_problem(problem);
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
            match citus_target() {
                Ok(target) => {
                    if self
                        .problem
                        .as_deref()
                        .is_some_and(|p| p.starts_with("Citus"))
                    {
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
                    self.set_problem(problem)
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
                if self
                    .problem
                    .as_deref()
                    .is_some_and(|p| p.starts_with("the registry") && p.contains("refused"))
                {
                    self.clear_problem();
                }
            }
            Err(CallError::Unreachable(problem)) => {
                let display = self.display();
                self.unreachable(format!("the registry {display} did not answer: {problem}"));
            }
            Err(CallError::Refused(problem)) => {
                let display = self.display();
                self.set_problem(format!("the registry {display} refused a call: {problem}"));
            }
        }
        self.publish();
        self.persist();
    }

    /// Logs what the holder did.
    fn report_events(&mut self) {
        let display = self.display();
        for event in std::mem::take(&mut self.holder.events) {
            match event {
                Event::Leased { block, floor_ms } => {
                    let floor = if floor_ms > 0 {
                        format!("its IDs start above {}", format_unix_ms(floor_ms))
                    } else {
                        "never used before".to_string()
                    };
                    pgrx::log!("snowflake_id lease: leased block {block} from {display}; {floor}");
                }
                Event::Expired { block } => pgrx::log!(
                    "snowflake_id lease: the lease of block {block} ran out before a renewal; its worker ids are no longer used here"
                ),
                Event::Lost { block } => pgrx::log!(
                    "snowflake_id lease: block {block} is no longer leased to this server (its lease expired at the registry, or the registry did not confirm it); its worker ids are no longer used here"
                ),
                Event::Released { block } => {
                    pgrx::log!("snowflake_id lease: gave idle block {block} back")
                }
                Event::NewIncarnation { old, new } if !old.is_empty() => pgrx::log!(
                    "snowflake_id lease: the registry {display} began a new incarnation ({new}, was {old}): it may have forgotten grants (a failover, a restore, an emptied lease table); this server re-asserts the blocks it holds"
                ),
                Event::NewIncarnation { .. } => {}
                Event::Rollback { seen, reply } => self.set_problem(format!(
                    "the registry {display} answered from WAL position {reply}, below {seen} seen before: it went back in time; its answer is not used"
                )),
                Event::Fenced { until_ms } => self.set_problem(format!(
                    "the registry {display} is fenced until {} (a new incarnation after it may have forgotten grants): it leases no block anew until then",
                    format_unix_ms(until_ms)
                )),
                Event::Refused(text) => {
                    self.set_problem(format!("the registry {display} refused a call: {text}"))
                }
                Event::NoFreeBlock => self.set_problem(format!(
                    "the registry {display} has no free block of worker ids for this server (snowflake_id.worker_ids limits which it may lease)"
                )),
            }
        }
    }

    /// Connects, introduces this node and finds the extension's schema.
    fn connect(&mut self) {
        let Some(target) = self.file.target.clone() else {
            return;
        };
        // Names resolve in pg_catalog only: the session may be a
        // superuser's, and other roles may create objects on the
        // registry's default search_path. Grants are durable before the
        // holder uses them, whatever the registry's default.
        let options = "-c statement_timeout=10s -c lock_timeout=5s -c search_path=pg_catalog,pg_temp -c synchronous_commit=on";
        let mut client = match Connection::connect(&target.conninfo, "snowflake_id lease", options)
        {
            Ok(client) => client,
            Err(e) => {
                self.unreachable(format!(
                    "could not connect to {}: {}",
                    target.display,
                    call_error_text(&e)
                ));
                return;
            }
        };
        let found = client.query(
            "SELECT quote_ident(n.nspname), \
                    to_regprocedure(quote_ident(n.nspname) || '.snowflake_lease_begin(jsonb)') IS NOT NULL, \
                    has_database_privilege('public', current_database(), 'CONNECT') \
               FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace \
              WHERE e.extname = 'snowflake_id'",
            &[],
        );
        let schema: String = match found.map(|rows| rows.into_iter().next()) {
            Ok(Some(row)) if row.get(1).cloned().flatten().as_deref() == Some("t") => {
                if row.get(2).cloned().flatten().as_deref() == Some("t") && !self.public_warned {
                    self.public_warned = true;
                    pgrx::warning!(
                        "snowflake_id lease: every role may connect to the registry database at {}: any role that can log in there sees this server's lock keys in pg_locks and can take them, holding up its leases",
                        target.display
                    );
                }
                row.into_iter().next().flatten().unwrap_or_default()
            }
            Ok(Some(_)) => {
                self.unreachable(format!(
                    "the snowflake_id extension at {} predates this server's (0.4.0 fences leases): run ALTER EXTENSION snowflake_id UPDATE there",
                    target.display
                ));
                return;
            }
            Ok(None) => {
                self.unreachable(format!(
                    "{} has no snowflake_id extension: run CREATE EXTENSION snowflake_id in that database",
                    target.display
                ));
                return;
            }
            Err(e) => {
                self.unreachable(format!("{}: {}", target.display, call_error_text(&e)));
                return;
            }
        };
        // The node id's session lock: taken by a live session means a copy
        // of this data directory (or its original) is running, unless that
        // session is this worker's own earlier one, left behind by a broken
        // connection.
        let mut lingering = self.registry_session.take();
        let mut renamed = false;
        loop {
            let node = self.holder.id.node.clone();
            let hello = client.value(
                &format!("SELECT {schema}.snowflake_lease_hello($1)"),
                &[&node],
            );
            match hello {
                Ok(Some(t)) if t == "t" => break,
                Ok(_) if lingering.is_some_and(|old| self.end_lingering(&mut client, old)) => {
                    lingering = None;
                }
                Ok(_) if !renamed => {
                    lingering = None;
                    renamed = true;
                    let old = std::mem::replace(&mut self.holder.id.node, new_node_id());
                    pgrx::log!(
                        "snowflake_id lease: node id {old} is in use by another running server (this data directory is a copy of it, or it of this one): this server is now node {} and leases its own worker ids",
                        self.holder.id.node
                    );
                    self.header.lease.node_id.set(&self.holder.id.node);
                    let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
                    self.holder.forget_all(&mut host);
                    self.saved_provable = false;
                    self.persist();
                }
                Ok(_) => {
                    self.unreachable("the registry refused a fresh node id".into());
                    return;
                }
                Err(e) => {
                    self.unreachable(format!("{}: {}", target.display, call_error_text(&e)));
                    return;
                }
            }
        }
        let session = client.query(
            "SELECT pg_backend_pid()::text, \
                    (SELECT (extract(epoch FROM backend_start) * 1000000)::int8::text \
                       FROM pg_stat_activity WHERE pid = pg_backend_pid())",
            &[],
        );
        match session {
            Ok(rows) => {
                self.registry_session = rows.into_iter().next().and_then(|row| {
                    let pid = row.first().cloned().flatten()?.parse().ok()?;
                    let start = row.get(1).cloned().flatten()?.parse().ok()?;
                    Some((pid, start))
                });
            }
            Err(e) => {
                self.unreachable(format!("{}: {}", target.display, call_error_text(&e)));
                return;
            }
        }
        self.client = Some(PgRegistry { client, schema });
        self.connect_backoff_ms = 0;
        self.unreachable = false;
        self.header.lease.unreachable_since_ms.store(0, Release);
        self.clear_problem();
        // Renew at once: confirms the leases held before a restart or an
        // outage, and drops those handed to another server since.
        self.holder.reconnected();
    }

    /// Ends `old`, this worker's earlier registry session, if it is still
    /// there (same pid and start, so not a reused pid): true when it ended,
    /// and with it its hold on the node id and the blocks' locks.
    fn end_lingering(&mut self, client: &mut Connection, old: (i32, i64)) -> bool {
        let ended = client.value(
            "SELECT coalesce(bool_or(pg_terminate_backend(pid, 5000)), false) \
               FROM pg_stat_activity \
              WHERE pid = $1::int AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2::int8",
            &[&old.0.to_string(), &old.1.to_string()],
        );
        match ended {
            Ok(Some(t)) if t == "t" => {
                pgrx::log!(
                    "snowflake_id lease: ended this server's earlier session on {} (pid {}), left behind by a broken connection, to take back node id {}",
                    self.display(),
                    old.0,
                    self.holder.id.node
                );
                true
            }
            Ok(_) => false,
            Err(e) => {
                pgrx::log!(
                    "snowflake_id lease: could not end this server's earlier session on {} (pid {}): {}",
                    self.display(),
                    old.0,
                    call_error_text(&e)
                );
                false
            }
        }
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

/// Saves the node id and the leases, when they changed.
fn save_lease_file(ctx: &mut FileContext, holder: &Holder) {
    let now_mono = ctx.started.elapsed().as_millis() as i64;
    let now_wall = clock::unix_ms();
    let file = LeaseFile {
        version: LEASE_FILE_VERSION,
        node_id: holder.id.node.clone(),
        data_directory: ctx.data_directory,
        citus_registry: ctx
            .target
            .as_ref()
            .filter(|t| t.mode == MODE_CITUS)
            .map(|t| (t.conninfo.clone(), t.display.clone())),
        registry: ctx.target.as_ref().map(|t| registry_key(&t.conninfo)),
        unconfirmed: holder.held.iter().any(|h| !h.confirmed),
        from_backup: holder.from_backup && holder.held.iter().any(|h| !h.confirmed),
        incarnation: holder.incarnation.clone(),
        lsn: holder::format_lsn(holder.lsn),
        blocks: holder
            .held
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

/// The slots of this server, as the holder changes them.
struct ShmHost<'a> {
    header: &'static Header,
    layout: &'a Layout,
    file: &'a mut FileContext,
}

impl<'a> ShmHost<'a> {
    fn new(header: &'static Header, layout: &'a Layout, file: &'a mut FileContext) -> ShmHost<'a> {
        ShmHost {
            header,
            layout,
            file,
        }
    }

    fn block_slots(&self, block: u32) -> &'static [shmem::Slot] {
        let size = lease::block_size(self.layout.max_worker_id());
        let (first, last) = lease::block_ids(block, size, self.layout.max_worker_id());
        &self.header.slots()[first as usize..=last as usize]
    }
}

impl holder::Host for ShmHost<'_> {
    fn activate(&mut self, block: u32, floor_ms: i64, high_ms: i64) {
        let floor = floor_word(self.layout, self.layout.tick_at(floor_ms));
        let limit = self.layout.tick_at(high_ms);
        let slots = self.block_slots(block);
        let _guard = self.header.lock(true);
        for slot in slots {
            // Above every ID of the block's earlier holders, also for a
            // session still on it from an earlier lease (the position only
            // grows; sharers' compare-and-swap starts from the new value).
            slot.position.fetch_max(floor, Relaxed);
            slot.set_lease(limit);
        }
        self.header.lease.changes.fetch_add(1, Relaxed);
    }

    fn raise(&mut self, block: u32, high_ms: i64) {
        let limit = self.layout.tick_at(high_ms);
        for slot in self.block_slots(block) {
            slot.limit_tick.fetch_max(limit, AcqRel);
        }
    }

    fn revoke(&mut self, block: u32) {
        let slots = self.block_slots(block);
        let _guard = self.header.lock(true);
        for slot in slots {
            slot.set_lease(NO_LEASE);
        }
        self.header.lease.changes.fetch_add(1, Relaxed);
    }

    fn stop_if_idle(&mut self, block: u32) -> Option<Option<i64>> {
        let slots = self.block_slots(block);
        let newest = {
            let _guard = self.header.lock(true);
            if slots.iter().any(|s| s.sessions.load(Relaxed) != 0) {
                return None;
            }
            for slot in slots {
                slot.set_lease(NO_LEASE);
            }
            self.header.lease.changes.fetch_add(1, Relaxed);
            slots
                .iter()
                .map(|s| unpack(self.layout, s.position.load(Relaxed)).0)
                .max()
        };
        Some(
            newest
                .filter(|&t| t >= 0)
                .map(|t| self.layout.tick_start_unix_ms(t)),
        )
    }

    fn save(&mut self, holder: &Holder) {
        save_lease_file(self.file, holder);
    }
}

/// The registry over a client session that took the node's lock.
struct PgRegistry {
    client: Connection,
    /// The extension's schema on the registry, quoted.
    schema: String,
}

impl PgRegistry {
    fn call<T: for<'de> Deserialize<'de>>(
        &mut self,
        function: &str,
        req: &impl Serialize,
    ) -> Result<T, CallError> {
        let body = serde_json::to_string(req)
            .map_err(|e| CallError::Refused(format!("request not encoded: {e}")))?;
        let sql = format!("SELECT {}.{function}($1::jsonb)::text", self.schema);
        let text = self
            .client
            .value(&sql, &[&body])?
            .ok_or_else(|| CallError::Refused(format!("{function} answered nothing")))?;
        serde_json::from_str(&text).map_err(|e| {
            CallError::Refused(format!(
                "{function} answered what this server cannot read: {e}"
            ))
        })
    }
}

impl Registry for PgRegistry {
    fn acquire(&mut self, req: &AcquireRequest) -> Result<Reply, CallError> {
        self.call("snowflake_lease_acquire", req)
    }
    fn renew(&mut self, req: &RenewRequest) -> Result<Reply, CallError> {
        self.call("snowflake_lease_renew", req)
    }
    fn release(&mut self, req: &ReleaseRequest) -> Result<ReleaseReply, CallError> {
        self.call("snowflake_lease_release", req)
    }
}

/// The registry's identity in the lease file: a hash of its whole
/// connection string (two services or two hosts' strings differ even when
/// they display alike; the hash keeps a password out of the file).
fn registry_key(conninfo: &str) -> String {
    use std::hash::Hasher;
    let mut h = siphasher::sip::SipHasher13::new_with_keys(0x736e_6f77, 0x666c_616b);
    h.write(conninfo.as_bytes());
    format!("{:016x}", h.finish())
}

/// A call's error as text.
fn call_error_text(e: &CallError) -> String {
    match e {
        CallError::Unreachable(text) | CallError::Refused(text) => text.clone(),
    }
}

fn read_lease_file() -> LeaseFile {
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
fn data_directory_id() -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(".").ok().map(|m| (m.dev(), m.ino()))
}

/// 32 random hex digits.
fn new_node_id() -> String {
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

/// The coordinator of the Citus cluster this node belongs to (from
/// `pg_dist_node`), `None` when it belongs to none, or why it cannot tell.
fn citus_target() -> Result<Option<Target>, String> {
    let database = settings::registry_database().unwrap_or_default();
    let found = BackgroundWorker::transaction(|| {
        Spi::connect(
            |client| -> Result<Option<(String, i32, i64, String)>, pgrx::spi::Error> {
                let has_citus = !client
                    .select(
                        "SELECT 1 FROM pg_extension WHERE extname = 'citus'",
                        None,
                        &[],
                    )?
                    .is_empty();
                if !has_citus {
                    return Ok(None);
                }
                let rows = client.select(
                "SELECT (SELECT count(*) FROM pg_dist_node WHERE noderole = 'primary'), \
                        c.nodename::text, c.nodeport, (SELECT rolname::text FROM pg_roles WHERE oid = 10) \
                   FROM (SELECT 1) one \
                   LEFT JOIN LATERAL (SELECT nodename, nodeport FROM pg_dist_node \
                                       WHERE groupid = 0 AND noderole = 'primary' LIMIT 1) c ON true",
                None,
                &[],
            )?;
                let Some(row) = rows.into_iter().next() else {
                    return Ok(None);
                };
                let count: i64 = row.get(1)?.unwrap_or(0);
                let host: Option<String> = row.get(2)?;
                let port: Option<i32> = row.get(3)?;
                let user: String = row.get(4)?.unwrap_or_else(|| "postgres".into());
                Ok(Some((
                    host.unwrap_or_default(),
                    port.unwrap_or(0),
                    count,
                    user,
                )))
            },
        )
    });
    match found {
        Err(e) => Err(format!("Citus metadata could not be read: {e}")),
        // Citus is preloaded: never every worker id, unchecked.
        Ok(None) => Err(format!(
            "Citus is preloaded but database \"{database}\" (snowflake_id.registry_database) has no citus extension, so this server cannot tell which cluster it belongs to: set snowflake_id.registry_database to the database where CREATE EXTENSION citus ran, or set snowflake_id.registry"
        )),
        Ok(Some((_, _, 0, _))) => Ok(None),
        Ok(Some((host, _, _, _))) if host.is_empty() => Err(
            "Citus metadata has nodes but no coordinator: run SELECT citus_set_coordinator_host('<host>', <port>) on the coordinator, or set snowflake_id.registry"
                .into(),
        ),
        Ok(Some((host, port, _, user))) => Ok(Some(Target {
            // snowflake_id.registry_options last: its user, TLS and
            // passfile settings win.
            conninfo: format!(
                "host='{}' port={port} dbname='{}' user='{}' {}",
                conninfo_quote(&host),
                conninfo_quote(&database),
                conninfo_quote(&user),
                settings::registry_options()
            ),
            display: format!("\"Citus coordinator {host}:{port} dbname={database}\""),
            mode: MODE_CITUS,
        })),
    }
}
