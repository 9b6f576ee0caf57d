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
//!   never wait on the registry: they read the slots' limits. No wait on
//!   the registry lasts past the earliest deadline of the blocks in use
//!   (`registry_client`), so the worker revokes a block at its deadline
//!   also while the registry stalls.
//! - Each slot's `limit_tick` is the confirmed mark of its block (or
//!   `NO_LEASE`), its `stop_ms` the block's deadline on this server's
//!   clock, which sessions check themselves (they stop there also while
//!   this worker is stopped); activating or revoking a block happens under the slot
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
//! Files, one concern each (`impl Worker` is spread over them, one block
//! per file): this one holds the worker's state and schedules (the main
//! loop, `Worker::step`); `start` builds the worker at its start (identity,
//! the saved leases, by `snowflake_core::node`); `target` is where leases
//! come from and switching it; `connection` connects and introduces the
//! node; `registry` makes the protocol's calls; `host` is shared memory
//! (the holder's decisions applied to the slots, the usage read, the
//! lease state published); `file` is the lease file; `citus` finds and
//! follows the coordinator; `problems` reports.

mod citus;
mod connection;
mod file;
mod host;
mod problems;
mod registry;
mod start;

pub(crate) use start::node_name;
pub(crate) use target::redact;
mod target;

use file::FileContext;
use host::ShmHost;
use registry::PgRegistry;

use crate::clock;
use crate::settings;
use crate::shmem::{self, Header};
use crate::workers::registry_client;
use pgrx::bgworkers::{
    BackgroundWorker, BackgroundWorkerBuilder, BgWorkerStartTime, SignalWakeFlags,
};
use pgrx::prelude::*;
use snowflake_core::holder::problems::{Cause, Problems};
use snowflake_core::holder::{CallError, Holder, Now, Registry};
use snowflake_core::layout::Layout;
use snowflake_core::lease::{self, Timing};
use std::sync::atomic::Ordering::Release;
use std::time::Duration;

const NAME: &str = "snowflake_id lease";

/// Registers the worker. Called from `_PG_init` while preloading, in the
/// postmaster, whose working directory is the data directory.
pub fn init() {
    if !settings::leases_enabled() {
        return;
    }
    start::note_restore_files();
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
    /// The saved blocks may be used while the registry is unreachable:
    /// same data directory, same registry, not started from a backup.
    saved_provable: bool,
    next_citus_mono: i64,
    /// What keeps it from leasing, since when the registry has not
    /// answered, the pause before the next connection attempt.
    problems: Problems,
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
    crate::workers::pin_search_path();
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
            Cause::Citus,
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

/// The schedule: one step per wake-up, and how long to sleep after it.
impl Worker {
    fn mono_ms(&self) -> i64 {
        self.file.started.elapsed().as_millis() as i64
    }

    fn timing(&self) -> Timing {
        Timing::new(settings::lease_time_ms())
    }

    /// How long to sleep: until the next renewal, deadline or poll.
    fn wait_ms(&self) -> i64 {
        let now = self.mono_ms();
        let mut wait = self.timing().renew_every_ms.min(citus::CITUS_POLL_MS);
        for h in self.holder.held() {
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

    fn step(&mut self, citus: bool) {
        // Blocks whose deadline came are revoked first, before anything
        // here may wait (the Citus metadata read, the registry).
        self.expire_due();
        if citus && self.mono_ms() >= self.next_citus_mono {
            self.follow_citus();
        }
        if self.file.target.is_none() {
            return;
        }
        // Blocks whose deadline came are revoked before any wait on the
        // registry (a connection attempt is bounded by the deadlines of
        // the blocks still in use, see registry_client).
        self.expire_due();
        if self.client.is_none() && self.problems.may_connect(self.mono_ms()) {
            self.connect();
        }
        self.holder
            .trust_saved(self.saved_provable && self.problems.unreachable());
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
        let allowed = lease::allowed_blocks(&ranges, self.holder.id().block_size);
        let round = {
            let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
            let registry = self.client.as_mut().map(|c| c as &mut dyn Registry);
            self.holder.step(now, &usage, &allowed, registry, &mut host)
        };
        // A call given up at a block's deadline: revoke it now.
        self.expire_due();
        self.report_events();
        let logs = self.problems.round(&round, &self.display(), self.at());
        if let Some(e) = round.error.as_ref().filter(|e| e.drops_session()) {
            self.drop_session(matches!(e, CallError::NoAnswer { .. }));
        }
        self.report(logs);
        self.publish();
        self.persist();
    }

    /// Revokes the blocks whose deadline came, by the monotonic clock.
    fn expire_due(&mut self) {
        let now = self.mono_ms();
        let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
        self.holder.expire_due(now, &mut host);
    }

    fn persist(&mut self) {
        file::save_lease_file(&mut self.file, &self.holder);
    }
}
