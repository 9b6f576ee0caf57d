//! Citus: the coordinator of the cluster this node belongs to, read from
//! the metadata in `snowflake_id.registry_database`, and the worker
//! following it (a poll every second).

use super::host::set_all_limits;
use super::target::conninfo_quote;
use super::{Target, Worker};
use snowflake_core::holder::problems::Cause;

use crate::settings;
use crate::shmem::{LeaseMode, MODE_CITUS, NO_LEASE};
use crate::workers::{caught_message, caught_report};
use pgrx::bgworkers::BackgroundWorker;
use pgrx::prelude::*;
use pgrx::{PgSqlErrorCode, PgTryBuilder};
use std::sync::atomic::Ordering::{Relaxed, Release};

/// How often a Citus node looks at the cluster's metadata.
pub(super) const CITUS_POLL_MS: i64 = 1_000;

/// The longest the metadata read waits on a lock or runs.
const CITUS_READ_TIMEOUT_MS: i64 = 1_000;

impl Worker {
    /// Reads the Citus metadata and follows it: leases from the cluster's
    /// coordinator, or uses this server's own worker ids when it is in no
    /// cluster.
    pub(super) fn follow_citus(&mut self) {
        self.next_citus_mono = self.mono_ms() + CITUS_POLL_MS;
        // A node that has been part of a Citus cluster stays in Citus
        // mode when the metadata it reads says "no cluster": that is
        // what `stop_metadata_sync_to_node` leaves on a worker that
        // stays in the cluster, and local mode there would use worker
        // ids the coordinator leases to other nodes. It keeps leasing
        // from the coordinator it knew; a node that really left
        // removes citus from shared_preload_libraries.
        // The catalog read waits on locks no longer than the blocks in use
        // have left (a LOCK or VACUUM FULL of pg_dist_node must not keep
        // the worker from revoking them at their deadline), and at most a
        // second; a read given up is retried at the next poll.
        let left_ms = self
            .holder
            .in_use_deadline()
            .map_or(CITUS_READ_TIMEOUT_MS, |d| d.saturating_sub(self.mono_ms()))
            .clamp(10, CITUS_READ_TIMEOUT_MS);
        let found = match citus_target(left_ms) {
            CitusRead::Found(found) => found,
            // Not known now, but nothing says it changed: the mode and
            // the coordinator stay as they are until the next poll.
            CitusRead::GaveUp(why) => {
                self.set_problem(Cause::Citus, format!(
                    "Citus metadata could not be read within {left_ms} ms ({why}): retried every second; this server goes on as before meanwhile"
                ));
                return;
            }
        };
        let found = match (found, &self.file.target) {
            (Ok(None), Some(known)) if known.mode == MODE_CITUS => Err(format!(
                "Citus's metadata on this node lists no cluster any more (pg_dist_node is empty: stop_metadata_sync_to_node, or the node was removed), but this server was part of one: it keeps leasing worker ids from {} rather than using every worker id; if this node left the Citus cluster for good, remove citus from shared_preload_libraries and restart",
                known.display
            )),
            (found, _) => found,
        };
        match found {
            Ok(target) => {
                let logs = self.problems.citus_read(&self.display());
                self.report(logs);
                self.set_target(target)
            }
            Err(problem) => {
                // Which cluster this node is in is not known: no local
                // mode (a registry already found stays in use).
                if self.file.target.is_none() && self.header.lease.mode(Relaxed) == LeaseMode::Local
                {
                    set_all_limits(self.header, NO_LEASE);
                    self.header.lease.set_mode(LeaseMode::Undecided, Release);
                }
                self.set_problem(Cause::Citus, problem)
            }
        }
    }
}

/// What one read of the Citus metadata found.
enum CitusRead {
    /// The coordinator of the cluster (`None`: in no cluster), or why it
    /// cannot tell.
    Found(Result<Option<Target>, String>),
    /// The read waited on a lock, or ran, past its timeout.
    GaveUp(String),
}

/// The coordinator of the Citus cluster this node belongs to (from
/// `pg_dist_node`), `None` when it belongs to none, or why it cannot tell.
/// The read gives up after `timeout_ms` (a lock wait, or the statement):
/// the error is caught, the transaction aborted, and the poll retried.
fn citus_target(timeout_ms: i64) -> CitusRead {
    let database = settings::registry_database().unwrap_or_default();
    PgTryBuilder::new(|| {
        let found = BackgroundWorker::transaction(|| read_citus_metadata(timeout_ms))
            .map_err(|e| e.to_string());
        CitusRead::Found(coordinator_of(found, &database))
    })
    .catch_others(|e| {
        // SAFETY: back to a clean state after an error, as PostgreSQL's
        // own background processes do (and registry_worker).
        unsafe { pg_sys::AbortOutOfAnyTransaction() };
        match caught_report(&e).sql_error_code() {
            PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE | PgSqlErrorCode::ERRCODE_QUERY_CANCELED => {
                CitusRead::GaveUp(caught_message(&e))
            }
            _ => CitusRead::Found(Err(format!(
                "Citus metadata could not be read: {}",
                caught_message(&e)
            ))),
        }
    })
    .execute()
}

/// The metadata the coordinator is found from: whether citus is there,
/// then the primaries' count, the coordinator's host and port, and the
/// bootstrap superuser's name.
fn read_citus_metadata(
    timeout_ms: i64,
) -> Result<Option<(String, i32, i64, String)>, pgrx::spi::Error> {
    Spi::run(&format!(
        "SET LOCAL lock_timeout = {timeout_ms}; SET LOCAL statement_timeout = {timeout_ms}"
    ))?;
    {
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
    }
}

/// What the metadata read (`found`) says about this node's cluster.
fn coordinator_of(
    found: Result<Option<(String, i32, i64, String)>, String>,
    database: &str,
) -> Result<Option<Target>, String> {
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
                conninfo_quote(database),
                conninfo_quote(&user),
                settings::registry_options()
            ),
            display: format!("\"Citus coordinator {host}:{port} dbname={database}\""),
            mode: MODE_CITUS,
        })),
    }
}
