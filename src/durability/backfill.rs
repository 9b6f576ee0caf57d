//! Backfill grants made durable: a grant (see `snowflake_core::backfill`)
//! is counted in shared memory, written to the state file and WAL-logged
//! (flushed) before the backend that takes it makes any ID with it, so no
//! restart, crash or promotion hands it out again. All under
//! `Header::reserve_lock`, the lock of the state file.

use crate::clock;
use crate::durability::{reservation, wal};
use crate::shmem::{self, Header};
use std::sync::atomic::Ordering::*;

/// Registers WAL replay of grants. Called from `_PG_init` while preloading.
pub fn init() {
    wal::init_backfill(replay);
}

/// Hands out the next grant of `bucket`, durably; `None` when all
/// `capacity` grants of the bucket are handed out. Like the reservation,
/// it takes the lock without waiting and otherwise sleeps on the latch for
/// 1 ms, so a cancel is served while another backend fsyncs.
pub fn grant(header: &Header, bucket: u32, capacity: u32) -> Option<u32> {
    let cell = header.backfill().grants.get(bucket as usize)?;
    loop {
        if let Some(_guard) = header.try_reserve_lock() {
            let grant = cell.load(Acquire);
            if grant >= capacity {
                return None;
            }
            // Counted before it is written: should the write fail, the
            // grant is lost, never handed out twice.
            cell.store(grant + 1, Release);
            header.backfill().changes.fetch_add(1, Relaxed);
            reservation::rewrite_state_file(header);
            wal::log_backfill_grant(bucket, grant + 1);
            return Some(grant);
        }
        clock::wait_ms(1);
    }
}

/// Raises the grants of `bucket` to at least `grants`, durably: the
/// registry table carried them over (`pg_upgrade`, a restore), so they may
/// have been handed out by an earlier life of this server.
pub fn raise(header: &Header, bucket: u32, grants: u32) {
    let Some(cell) = header.backfill().grants.get(bucket as usize) else {
        return;
    };
    if cell.load(Acquire) >= grants {
        return;
    }
    let _guard = header.reserve_lock();
    if cell.fetch_max(grants, AcqRel) < grants {
        header.backfill().changes.fetch_add(1, Relaxed);
        reservation::rewrite_state_file(header);
        wal::log_backfill_grant(bucket, grants);
    }
}

/// WAL replay of a primary's grant: raises the bucket's count in shared
/// memory; the state file gets it with the next write of replayed state
/// (see `reservation`'s replay).
fn replay(bucket: u32, grants: u32) {
    let Some(header) = shmem::header() else {
        return;
    };
    let backfill = header.backfill();
    if let Some(cell) = backfill.grants.get(bucket as usize) {
        if cell.fetch_max(grants, AcqRel) < grants {
            backfill.replayed.store(true, Release);
        }
    }
    reservation::persist_at_restartpoint();
}
