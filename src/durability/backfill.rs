//! Backfill grants made durable: a grant (see `snowflake_core::backfill`)
//! is counted in shared memory, written to the state file and WAL-logged
//! (flushed) before the backend that takes it makes any ID with it, so no
//! restart, crash or promotion hands it out again. All under
//! `Header::reserve_lock`, the lock of the state file.

use crate::clock;
use crate::durability::{reservation, wal};
use crate::errors;
use crate::settings;
use crate::shmem::{self, Header};
use snowflake_core::backfill::{to_hand_out, Space};
use snowflake_core::backfill_ids;
use snowflake_core::promotion::WaitEnd;
use std::sync::atomic::Ordering::*;

/// Registers WAL replay of grants. Called from `_PG_init` while preloading.
pub fn init() {
    wal::init_backfill(replay);
}

/// Hands out the next grant of each of `buckets` whose counter is below
/// its limit (`limits`, `Space::grant_limit`), durably, in one write of the
/// state file and one WAL flush; `None` for the others. When the first
/// (the stretch asked for) is at its limit, none is handed out
/// (`snowflake_core::backfill::to_hand_out`): a refusal takes nothing.
/// Like the reservation, it takes the lock without waiting and otherwise
/// sleeps on the latch for 1 ms, so a cancel is served while another
/// backend fsyncs.
/// `standbys`: whether to wait for the synchronous standbys here; the
/// registry's grants for holders do not (each holder asks the registry
/// whether they are durable before it uses them, and is told `55000`).
pub fn grant(header: &Header, buckets: &[u32], limits: &[u32], standbys: bool) -> Vec<Option<u32>> {
    let grants = &header.backfill().grants;
    loop {
        if let Some(_guard) = header.try_reserve_lock() {
            let cells: Vec<_> = buckets.iter().map(|&b| grants.get(b as usize)).collect();
            let now: Vec<u32> = cells
                .iter()
                .map(|c| c.map_or(u32::MAX, |c| c.load(Acquire)))
                .collect();
            let hand_out = to_hand_out(&now, limits);
            let mut counts = Vec::with_capacity(buckets.len());
            let taken = buckets
                .iter()
                .zip(cells)
                .zip(now.iter().zip(hand_out))
                .map(|((&bucket, cell), (&grant, give))| {
                    let cell = cell.filter(|_| give)?;
                    cell.fetch_max(grant + 1, AcqRel);
                    counts.push((bucket, grant + 1));
                    Some(grant)
                })
                .collect();
            if !counts.is_empty() {
                persist(header, &counts, standbys);
            }
            return taken;
        }
        clock::wait_ms(1);
    }
}

/// Raises the grants of `bucket` to at least `grants`, durably: the
/// registry table carried them over (`pg_upgrade`, a restore), so they may
/// have been handed out by an earlier life of this server.
pub fn raise(header: &Header, bucket: u32, grants: u32) {
    raise_counted(header, &[(bucket, grants)], true);
}

/// [`raise`] for several `(bucket, grants)` at once, made durable in one
/// write (state file, WAL), waiting for the synchronous standbys only if
/// `standbys`: not for counts another server's counters hold too (a
/// registry raised to a holder's own counts, whose grants call is checked
/// for durability after; a holder counting the fleet's grants it used,
/// for its dumps).
pub fn raise_counted(header: &Header, counts: &[(u32, u32)], standbys: bool) {
    let cells = &header.backfill().grants;
    let below = |&(bucket, grants): &(u32, u32)| {
        cells
            .get(bucket as usize)
            .is_some_and(|c| c.load(Acquire) < grants)
    };
    if !counts.iter().any(below) {
        return;
    }
    let _guard = header.reserve_lock();
    let raised: Vec<(u32, u32)> = counts.iter().copied().filter(below).collect();
    for &(bucket, grants) in &raised {
        if let Some(cell) = cells.get(bucket as usize) {
            cell.fetch_max(grants, AcqRel);
        }
    }
    if !raised.is_empty() {
        persist(header, &raised, standbys);
    }
}

/// Makes counts just raised in shared memory durable: state file, then
/// WAL (flushed), then on the synchronous standbys where they are named
/// (as a reservation: a promoted one has every grant handed out). An
/// interrupted wait fails the call: the grants stay counted, so they are
/// lost, never handed out twice. The caller holds `reserve_lock`.
fn persist(header: &Header, counts: &[(u32, u32)], standbys: bool) {
    header.backfill().used.store(true, Release);
    header.backfill().changes.fetch_add(1, Relaxed);
    reservation::rewrite_state_file(header);
    if let Some(lsn) = wal::log_backfill_grants(counts) {
        if standbys && wal::wait_for_sync_standbys(lsn) == WaitEnd::Interrupted {
            errors::backfill_grant_not_replicated();
        }
    }
}

/// Raises this server's grants from a record of another life of it (the
/// registry table's row, carried by pg_upgrade or a restore): the stretch
/// starting at `start_ms` had `grants` grants numbered across the set-aside
/// ids `ids` (empty: unknown). Ids this server's setting does not continue
/// stop backfill (55000), as a changed setting does: their grants map to
/// other `(worker id, sequence)` pairs here.
pub fn raise_from_record(header: &Header, start_ms: i64, grants: i64, ids: &str) {
    let backfill = header.backfill();
    if ids.len() > 255 {
        // Not a list this server can record (nor one it set aside).
        backfill.ids_changed.store(true, Release);
    } else if !ids.is_empty() && ids != backfill.recorded_ids.get() {
        let (_, changed) = backfill_ids::to_record(
            ids,
            true,
            settings::backfill_space().map(Space::ids),
            settings::layout().max_worker_id(),
        );
        if changed {
            // The raised counters are numbered across `ids` from now on:
            // the state file records them, and backfill waits for a
            // setting that continues them.
            let _guard = header.reserve_lock();
            backfill.recorded_ids.set(ids);
            backfill.ids_changed.store(true, Release);
        }
    }
    let layout = settings::layout();
    let tick = layout.tick_at(start_ms);
    if (0..=layout.max_ticks()).contains(&tick) {
        let grants = u32::try_from(grants.max(0)).unwrap_or(u32::MAX);
        raise(header, Space::bucket_for(layout, tick), grants);
    }
}

/// Refuses backfill IDs at or before `unix_ms` from now on, durably: the
/// set-aside ids made live IDs up to then (before they were set aside).
pub fn raise_after(header: &Header, unix_ms: i64) {
    let backfill = header.backfill();
    if backfill.after_ms.load(Acquire) >= unix_ms {
        return;
    }
    let _guard = header.reserve_lock();
    if backfill.after_ms.fetch_max(unix_ms, AcqRel) < unix_ms {
        reservation::rewrite_state_file(header);
    }
}

/// The registry worker decided what the newly set-aside ids refuse: the
/// state file records the configured ids from now on.
pub fn adopt_set_aside_ids(header: &Header) {
    let backfill = header.backfill();
    if !backfill.newly_set_aside.load(Acquire) {
        return;
    }
    let _guard = header.reserve_lock();
    if !backfill.ids_changed.load(Acquire) {
        backfill.recorded_ids.set(&settings::backfill_ids_text());
    }
    backfill.newly_set_aside.store(false, Release);
    reservation::rewrite_state_file(header);
}

/// WAL replay of a primary's grant: raises the bucket's count in shared
/// memory and writes the state file at once. Unlike the reservation, whose
/// replayed records are written at the first one after a restartpoint
/// began (a clock that moved on covers the rest), a grant the file missed
/// would be handed out again by a standby that crashed after the
/// restartpoint and was then promoted; grants are rare, so each is
/// written.
fn replay(bucket: u32, grants: u32) {
    let Some(header) = shmem::header() else {
        return;
    };
    let backfill = header.backfill();
    if let Some(cell) = backfill.grants.get(bucket as usize) {
        backfill.used.store(true, Release);
        if cell.fetch_max(grants, AcqRel) < grants {
            backfill.replayed.store(true, Release);
            reservation::persist_replayed();
        }
    }
}
