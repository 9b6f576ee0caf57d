//! `snowflake_health()`: one row per check, for dashboards and
//! `postgres_exporter`. The facts come from shared memory and the settings;
//! the decisions are `snowflake_core::health`'s.

use crate::claims;
use crate::settings;
use crate::shmem::LeaseMode;
use pgrx::prelude::*;
use snowflake_core::health::{self, Backfill, Facts, Lease, Problem, RegistryTable};
use std::sync::atomic::Ordering::Relaxed;

/// Each check: its name, `ok`/`warn`/`critical`, the value, the threshold
/// and what to do.
#[pg_extern(volatile, parallel_restricted)]
#[allow(clippy::type_complexity)]
fn snowflake_health() -> TableIterator<
    'static,
    (
        name!(name, String),
        name!(status, String),
        name!(value, String),
        name!(threshold, String),
        name!(action, String),
    ),
> {
    let header = claims::require_shared("snowflake_health");
    let layout = settings::layout();
    let now_ms = crate::clock::unix_ms();
    let lease = &header.lease;
    let leased = match lease.mode(Relaxed) {
        LeaseMode::Local => false,
        LeaseMode::Undecided | LeaseMode::Registry | LeaseMode::Citus => true,
    };
    let at = |ms: i64| (ms > 0).then_some(ms);
    let lease = leased.then(|| {
        let text = lease.problem.get();
        Lease {
            lease_time_ms: settings::lease_time_ms(),
            deadline_ms: at(lease.deadline_ms.load(Relaxed)),
            blocks_held: lease.blocks_held.load(Relaxed),
            unreachable_since_ms: at(lease.unreachable_since_ms.load(Relaxed)),
            // The problem names the registry: shown as SHOW shows
            // snowflake_id.registry (snowflake_config() hides it alike).
            problem: if text.is_empty() {
                Problem::None
            } else if settings::may_read_hidden_settings() {
                Problem::Shown(text)
            } else {
                Problem::Hidden
            },
        }
    });
    let (_, total, held) = claims::range_usage();
    // A holder uses at most snowflake_id.max_blocks blocks of the range.
    let capacity = if leased {
        let block = snowflake_core::lease::block_size(layout.max_worker_id());
        total.min(u64::from(settings::max_blocks()) * u64::from(block))
    } else {
        total
    };
    let backfill = settings::backfill_space().map(|space| Backfill {
        grants: header
            .backfill()
            .grants
            .iter()
            .map(|g| u64::from(g.load(Relaxed)))
            .max()
            .unwrap_or(0),
        capacity: u64::from(space.grants_per_bucket()),
    });
    let registry_table = if settings::registry_worker_enabled() {
        header.registry_table()
    } else {
        RegistryTable::Off
    };
    let facts = Facts {
        now_ms,
        years_left: layout.years_left(now_ms),
        warning_years: settings::layout_end_warning_years(),
        lease,
        worker_ids_total: capacity,
        worker_ids_held: held,
        floor_ms: header.floor_ms.load(Relaxed),
        max_drift_ms: settings::max_drift_ms(),
        floor_wait_ms: claims::FLOOR_WAIT_MS,
        backfill,
        registry_table,
        // SAFETY: a plain read of PostgreSQL's recovery state.
        in_recovery: unsafe { pg_sys::RecoveryInProgress() },
    };
    let rows: Vec<_> = health::checks(&facts)
        .into_iter()
        .map(|c| {
            (
                c.name.name().to_string(),
                c.status.name().to_string(),
                c.value,
                c.threshold,
                c.action.to_string(),
            )
        })
        .collect();
    TableIterator::new(rows)
}

extension_sql!(
    r#"
-- Like PostgreSQL's own monitoring functions: for pg_monitor (and
-- superusers); the lease problem's text is shown only to roles that may
-- read snowflake_id.registry.
REVOKE EXECUTE ON FUNCTION snowflake_health() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION snowflake_health() TO pg_monitor;
COMMENT ON FUNCTION snowflake_health() IS
  'One row per health check (layout, leases, registry, worker ids, reservation, backfill, registry table): status ok, warn or critical, the value, the threshold and what to do.';
"#,
    name = "snowflake_health_privileges",
    requires = [snowflake_health]
);
