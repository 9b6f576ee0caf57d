//! The registry worker's part in backfill (see `sql::backfill`): each pass,
//! in the registry worker's transaction (search_path: pg_catalog, then the
//! extension's schema),
//! - copies the grants of shared memory into `snowflake_backfill_grants`,
//!   so that pg_upgrade carries them (a dump reads shared memory itself:
//!   `snowflake_backfill_dump()`);
//! - raises shared memory from the table's rows: at start after pg_upgrade,
//!   and after a restore whose triggers did not run (`--disable-triggers`;
//!   `snowflake_at()` reads its own database's rows before a grant too);
//!   rows numbered across set-aside ids that the setting does not continue
//!   stop backfill (55000);
//! - refuses backfill times at or before the live IDs the set-aside ids
//!   made before they were set aside, as `snowflake_worker_registry` shows
//!   them (and before this start, for ids set aside since the last).
//!
//! Backfill is refused until a pass has succeeded (`history_read`).

use crate::durability::backfill;
use crate::settings;
use crate::shmem::Header;
use pgrx::prelude::*;
use snowflake_core::backfill::Space;
use snowflake_core::ranges::WorkerRanges;
use std::sync::atomic::Ordering::{Acquire, Release};

/// Copies the grants into the table, only ever raising them.
const UPSERT_GRANTS: &str = r#"
INSERT INTO snowflake_backfill_grants AS g (starts_at, grants, worker_ids, updated_at)
SELECT b.starts_at, b.grants, b.worker_ids, now() FROM snowflake_backfill() b
ON CONFLICT (starts_at) DO UPDATE
   SET grants = EXCLUDED.grants, worker_ids = EXCLUDED.worker_ids, updated_at = now()
 WHERE g.grants < EXCLUDED.grants
"#;

/// One pass; `Err` with the problem when the tables cannot be read or
/// written (the caller logs it and tries again). `Ok(false)`: the
/// database's extension predates backfill (no table), or this library's
/// `snowflake_backfill()` (an update not yet run).
pub fn pass(header: &Header) -> Result<bool, pgrx::spi::Error> {
    // snowflake_backfill() of this library's version: until ALTER
    // EXTENSION UPDATE, an older declaration raises (and backfill stays
    // refused: no pass has succeeded).
    let has_table = Spi::get_one::<bool>(
        "SELECT to_regclass('snowflake_backfill_grants') IS NOT NULL \
            AND EXISTS (SELECT 1 FROM pg_catalog.pg_proc \
                         WHERE oid = to_regprocedure('snowflake_backfill()') \
                           AND prosrc = 'snowflake_backfill_stretches_wrapper')",
    )?
    .unwrap_or(false);
    if !has_table {
        return Ok(false);
    }
    // The table's rows first (a restore's may name other ids), then this
    // server's grants into it.
    let rows = Spi::connect(|client| {
        let table = client.select(
            "SELECT (extract(epoch FROM starts_at) * 1000)::int8, grants, worker_ids \
               FROM snowflake_backfill_grants",
            None,
            &[],
        )?;
        let mut rows = Vec::new();
        for row in table {
            let (Some(start), Some(n)) = (row.get::<i64>(1)?, row.get::<i64>(2)?) else {
                continue;
            };
            rows.push((start, n, row.get::<String>(3)?.unwrap_or_default()));
        }
        Ok::<_, pgrx::spi::Error>(rows)
    })?;
    apply_grants(header, &rows);
    Spi::run(UPSERT_GRANTS)?;
    if let Some(space) = settings::backfill_space() {
        refuse_up_to_live_ids(header, space)?;
        backfill::adopt_set_aside_ids(header);
    }
    header.backfill().history_read.store(true, Release);
    Ok(true)
}

/// Raises shared memory from the table's rows `(start ms, grants, ids)`.
fn apply_grants(header: &Header, rows: &[(i64, i64, String)]) {
    for (start_ms, n, ids) in rows {
        backfill::raise_from_record(header, *start_ms, *n, ids);
    }
}

/// The time of the newest live ID any of `ids` made, as the registry table
/// recorded it (`None`: none did).
fn last_live_id_ms(ids: &WorkerRanges) -> Result<Option<i64>, pgrx::spi::Error> {
    Spi::get_one::<i64>(&format!(
        "SELECT (extract(epoch FROM max(high_water)) * 1000)::int8 \
           FROM snowflake_worker_registry WHERE {}",
        id_condition(ids)
    ))
}

/// A condition on `worker_id` for the ids (numbers only, from a parsed
/// setting: no quoting needed).
fn id_condition(ids: &WorkerRanges) -> String {
    ids.ranges()
        .iter()
        .map(|(lo, hi)| format!("worker_id BETWEEN {lo} AND {hi}"))
        .collect::<Vec<_>>()
        .join(" OR ")
}

/// Refuses backfill times up to the live IDs the set-aside ids made: up
/// to the end of the newest one's tick; and, when ids were set aside since
/// the state file was last written, up to this start's floor (above every
/// ID made before; the table lags the last second before a crash) if one
/// of the new ids has a row (it was claimed), or the table has no row at
/// all while the server made IDs (no registry was kept: their history is
/// unknown).
fn refuse_up_to_live_ids(header: &Header, space: &Space) -> Result<(), pgrx::spi::Error> {
    let layout = settings::layout();
    let mut bound = i64::MIN;
    if let Some(last_ms) = last_live_id_ms(space.ids())? {
        bound = layout
            .tick_start_unix_ms(layout.tick_at(last_ms))
            .saturating_add(layout.unit_ms - 1);
    }
    let backfill = header.backfill();
    if backfill.newly_set_aside.load(Acquire) {
        let before = WorkerRanges::parse(&backfill.recorded_ids.get(), layout.max_worker_id())
            .ok()
            .filter(|_| !backfill.recorded_ids.get().trim().is_empty());
        let new_ids = match before {
            Some(before) => space.ids().without(&before),
            None => space.ids().clone(),
        };
        let claimed = !new_ids.is_empty()
            && Spi::get_one::<bool>(&format!(
                "SELECT count(*) > 0 FROM snowflake_worker_registry WHERE {}",
                id_condition(&new_ids)
            ))?
            .unwrap_or(true);
        let unknown = Spi::get_one::<bool>("SELECT count(*) = 0 FROM snowflake_worker_registry")?
            .unwrap_or(true);
        if claimed || unknown {
            bound = bound.max(backfill.floor_at_start_ms.load(Acquire));
        }
    }
    if bound > i64::MIN {
        backfill::raise_after(header, bound);
    }
    Ok(())
}
