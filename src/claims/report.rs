//! The slots as rows of `snowflake_workers`.

use crate::settings;
use pgrx::pg_sys;
use snowflake_core::generator::unpack;
use std::sync::atomic::Ordering::Relaxed;

use super::require_shared;
/// One row of `snowflake_workers`.
pub struct WorkerRow {
    pub worker_id: u32,
    pub pid: Option<i32>,
    pub database_oid: Option<u32>,
    pub role_oid: Option<u32>,
    pub application_name: Option<String>,
    pub claimed_at: Option<i64>,
    pub released_at: Option<i64>,
    pub claims: u64,
    /// Sessions holding the id now.
    pub sessions: u32,
    /// Claims that shared the id because no id was free.
    pub shared_claims: u64,
    /// `None` (like `claimed_at` and `last_tick`) for a user without the
    /// privileges of the holder's role, superuser or pg_read_all_stats.
    pub ids_issued: Option<u64>,
    pub last_tick: Option<i64>,
    pub current_drift: i64,
    pub max_drift: i64,
    pub sequence_exhausted: u64,
    pub clock_backward: u64,
}

/// Every worker id that is held or was used since the server started.
pub fn worker_rows() -> Vec<WorkerRow> {
    let header = require_shared("snowflake_worker_status");
    let layout = settings::layout();
    let now_tick = layout.tick_at(crate::clock::unix_ms());
    // Like pg_stat_activity: anyone sees current holders; who held an id
    // before is for superusers and pg_read_all_stats members.
    // SAFETY: catalog lookups for the current user.
    let see_past = unsafe {
        pg_sys::superuser()
            || pg_sys::has_privs_of_role(
                pg_sys::GetUserId(),
                pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_STATS),
            )
    };
    let _guard = header.lock(false);
    let mut rows = Vec::new();
    for (id, slot) in header.slots().iter().enumerate() {
        let pid = slot.holder_pid.load(Relaxed);
        let sessions = slot.sessions.load(Relaxed);
        let claims = slot.claims.load(Relaxed);
        if sessions == 0 && claims == 0 {
            continue;
        }
        let held = sessions > 0;
        // The most recent claim: anyone sees it while its session holds
        // the id; once that session has left (even if others still share
        // the id), like any past claim, only the privileged.
        let named = (held && pid != 0) || see_past;
        // When and how much: for the holder's own role (and roles with its
        // privileges) too, as pg_stat_activity shows a session's query.
        let role = slot.holder_role.load(Relaxed);
        // SAFETY: a catalog lookup for the current user; an oid of a
        // dropped role is simply not a role the user has privileges of.
        let full = see_past
            || (named
                && unsafe {
                    pg_sys::has_privs_of_role(pg_sys::GetUserId(), pg_sys::Oid::from(role))
                });
        let (last_tick, _) = unpack(layout, slot.position.load(Relaxed));
        rows.push(WorkerRow {
            worker_id: id as u32,
            pid: (held && pid != 0).then_some(pid),
            database_oid: named.then(|| slot.holder_db.load(Relaxed)),
            role_oid: named.then_some(role),
            application_name: named.then(|| slot.application_name()),
            claimed_at: full.then(|| slot.claimed_at.load(Relaxed)),
            released_at: (!held && slot.release_order.load(Relaxed) > 0)
                .then(|| slot.released_at.load(Relaxed)),
            claims,
            sessions,
            shared_claims: slot.shared_claims.load(Relaxed),
            ids_issued: full.then(|| header.ids_issued(id)),
            last_tick: full.then_some(last_tick),
            current_drift: (last_tick - now_tick).max(0),
            max_drift: slot.max_drift.load(Relaxed),
            sequence_exhausted: slot.sequence_exhausted.load(Relaxed),
            clock_backward: slot.clock_backward.load(Relaxed),
        });
    }
    rows
}

/// How many ids of the configured range are held and free.
pub fn range_usage() -> (String, u64, u64) {
    let header = require_shared("snowflake_config");
    let (ranges, text) = settings::worker_ranges();
    let _guard = header.lock(false);
    let slots = header.slots();
    let held = ranges
        .iter()
        .filter(|&id| slots[id as usize].sessions.load(Relaxed) > 0)
        .count() as u64;
    (text, ranges.len(), held)
}
