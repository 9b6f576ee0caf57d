//! Which worker id a claim takes, and the waits before it can take one:
//! for the lease worker's first blocks, and for the registry table to be
//! read. The policy is described at the top of `claims/mod.rs`.

use crate::errors;
use crate::settings;
use crate::shmem::{self, Header, LeaseMode, Slot};
use pgrx::pg_sys;
use snowflake_core::generator::{floor_word, unpack, GeneratorState};
use snowflake_core::layout::Layout;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use super::locks::{register_exit_callback, try_advisory_lock};
use super::{Claim, HELD};

/// Claims a worker id whose IDs will all be above tick `above` (and above
/// every floor), waiting for the lease worker when leases are in use and
/// no leased id is usable yet.
pub(super) fn claim_worker(header: &'static Header, above: i64) -> Claim {
    require_usable_time();
    if header.layout_changed.load(Acquire) {
        errors::layout_changed(&header.recorded_layout.differences(settings::layout()));
    }
    if header.registry_pending.load(Acquire) {
        wait_for_registry(header);
    }
    // Before anything is held, so that an error here cannot leak a slot.
    register_exit_callback();
    let mut waited_ms = 0;
    loop {
        if let Some(claim) = try_claim(header, above) {
            return claim;
        }
        wait_for_lease(header, &mut waited_ms);
    }
}

/// How long a claim waits for the lease worker to lease a usable block, in
/// ms, unless it already knows the registry is unreachable.
const LEASE_WAIT_MS: i64 = 30_000;
/// How long it waits when the registry is known to be unreachable.
const UNREACHABLE_WAIT_MS: i64 = 2_000;

/// No leased id is usable: wakes the lease worker and waits a little, or
/// raises 55000 naming the registry once waiting cannot help.
#[cold]
fn wait_for_lease(header: &Header, waited_ms: &mut i64) {
    // SAFETY: a plain read of PostgreSQL's recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::no_lease_on_standby();
    }
    let lease = &header.lease;
    let latch = lease.latch.load(Acquire);
    if !latch.is_null() {
        // SAFETY: the lease worker's process latch, in shared memory; it
        // clears the pointer before it exits, and setting a latch its
        // next owner did not expect only wakes that process once.
        unsafe { pg_sys::SetLatch(latch) };
    }
    let unreachable_since = lease.unreachable_since_ms.load(Acquire);
    let decided = lease.mode(Acquire) != LeaseMode::Undecided;
    // Known unreachable with nothing held: fail soon, not after 30 s (but
    // not at once either: the worker may be reconnecting this moment).
    let give_up = *waited_ms >= LEASE_WAIT_MS
        || (decided
            && unreachable_since != 0
            && lease.blocks_held.load(Acquire) == 0
            && *waited_ms >= UNREACHABLE_WAIT_MS);
    if !decided && *waited_ms >= UNREACHABLE_WAIT_MS {
        let problem = lease.problem.get();
        if !problem.is_empty() {
            errors::fleet_unknown(
                &problem,
                current_database_has_citus(),
                settings::may_read_hidden_settings(),
            );
        }
    }
    if give_up {
        errors::no_lease(
            &lease.registry.get(),
            (unreachable_since != 0).then(|| crate::clock::unix_ms() - unreachable_since),
            lease.deadline_ms.load(Acquire),
            &lease.problem.get(),
            *waited_ms,
            settings::may_read_hidden_settings(),
        );
    }
    crate::clock::wait_ms(10);
    *waited_ms += 10;
}

/// Whether this session's database has the citus extension (for the hint
/// of [`errors::fleet_unknown`]; on the error path only).
#[cold]
fn current_database_has_citus() -> Option<String> {
    // SAFETY: a syscache lookup by name, missing_ok; and the name of this
    // session's database, valid while it runs (NULL-checked).
    unsafe {
        let oid = pg_sys::get_extension_oid(c"citus".as_ptr(), true);
        if oid == pg_sys::InvalidOid {
            return None;
        }
        let name = pg_sys::get_database_name(pg_sys::MyDatabaseId);
        (!name.is_null()).then(|| {
            std::ffi::CStr::from_ptr(name)
                .to_string_lossy()
                .into_owned()
        })
    }
}

/// One attempt at a claim; `None` when leases are in use and no leased id
/// is usable now.
fn try_claim(header: &'static Header, above: i64) -> Option<Claim> {
    let layout = settings::layout();
    let (ranges, text) = live_ranges(header, layout);
    let slots = header.slots();
    let _guard = header.lock(true);
    let (worker_id, shared) = match pick_worker(slots, &ranges, layout) {
        Some(pick) => pick,
        None if header.lease.mode(Acquire) != LeaseMode::Local => return None,
        None => {
            let held = ranges
                .iter()
                .filter(|&id| slots[id as usize].sessions.load(Relaxed) > 0)
                .count() as u64;
            errors::workers_exhausted(&text, ranges.len(), held)
        }
    };
    let slot = &slots[worker_id as usize];
    // SAFETY: reading backend-global identifiers and the clock.
    let (pid, db, role, now) = unsafe {
        (
            pg_sys::MyProcPid,
            pg_sys::MyDatabaseId,
            pg_sys::GetSessionUserId(),
            pg_sys::GetCurrentTimestamp(),
        )
    };
    slot.sessions.fetch_add(1, Relaxed);
    if shared {
        slot.shared_claims.fetch_add(1, Relaxed);
    }
    slot.holder_pid.store(pid, Relaxed);
    slot.holder_db.store(db.to_u32(), Relaxed);
    slot.holder_role.store(role.to_u32(), Relaxed);
    slot.claimed_at.store(now, Relaxed);
    slot.claims.fetch_add(1, Relaxed);
    // SAFETY: application_name is PostgreSQL's GUC variable: NULL or a
    // NUL-terminated string.
    let app = unsafe {
        let p = pg_sys::application_name;
        if p.is_null() {
            &[][..]
        } else {
            std::ffi::CStr::from_ptr(p).to_bytes()
        }
    };
    slot.set_application_name(&app[..app.len().min(shmem::APPLICATION_NAME_LEN - 1)]);
    let holder = header.my_holder();
    if let Some(holder) = holder {
        holder.ids_issued.store(0, Relaxed);
        holder.worker_id.store(worker_id, Relaxed);
        holder.pid.store(pid, Relaxed);
    }
    header.changes.fetch_add(1, Relaxed);
    HELD.set(Some((worker_id, slot)));
    let layout = settings::layout();
    // Start above every ID an earlier life of this data directory may have
    // issued (restart, crash, promotion, layout change). The position only
    // grows, so this is a fetch_max even while sharers issue IDs.
    let floor_ms = header.floor_ms.load(Acquire);
    let floor = floor_word(layout, layout.tick_at(floor_ms));
    slot.position.fetch_max(floor, Relaxed);
    // Above this backend's own last ID when it moved from another id (the
    // lease's floor is already in the position: see `lease_worker`).
    let own = floor_word(layout, above.max(-1));
    let word = slot.position.fetch_max(own, Relaxed).max(own).max(floor);
    let mut state = GeneratorState::new(layout);
    state.set_word(layout, word);
    Some(Claim {
        worker_id,
        slot,
        holder,
        backward_at_issue: state.clock_backward,
        published: state,
        state,
        // Whether anything above the floor was issued on this id is decided
        // at a refusal (`Claim::refused`: the shared position still at the
        // floor's tick), so an earlier claimant that only raised the
        // position to it, or a sharer that issued since, count as they
        // should. Not for a floor at or below a never-used id's position
        // (no state file, a floor before the epoch).
        fresh_floor: (floor > GeneratorState::new(layout).word(layout)).then_some(floor_ms),
        epoch: slot.lease_epoch.load(Relaxed),
        held: 0,
        id_base: 0,
        layout,
    })
}

/// The ids live claims may take: `snowflake_id.worker_ids` without the ids
/// set aside for backfill, and without the ids the state file records
/// grants for when the setting no longer sets them aside (backfill IDs of
/// times up to `max_drift` ahead of the clock were made with them).
fn live_ranges(header: &Header, layout: &Layout) -> (snowflake_core::ranges::WorkerRanges, String) {
    let (ranges, text) = settings::worker_ranges();
    if !header.backfill().ids_changed.load(Acquire) {
        return (ranges, text);
    }
    let recorded = header.backfill().recorded_ids.get();
    match snowflake_core::ranges::WorkerRanges::parse(&recorded, layout.max_worker_id()) {
        Ok(used) => (ranges.without(&used), text),
        Err(_) => (ranges, text),
    }
}

/// The worker id a claim takes, and whether it is shared: the free id
/// released longest ago, else the held id with the fewest sessions (ties:
/// claimed least recently, then the lowest id). `None` only when the claim
/// lock of every id is held in a conflicting mode (SQL cannot take it).
/// Called with the slot table's lock held exclusive.
fn pick_worker(
    slots: &[Slot],
    ranges: &snowflake_core::ranges::WorkerRanges,
    layout: &Layout,
) -> Option<(u32, bool)> {
    // The ids this server may use now: the one place to filter candidates.
    // With leases, only ids of a leased block below its lease's limit,
    // before its stop.
    let now_ms = crate::clock::unix_ms();
    let usable = |id: &u32| {
        let slot = &slots[*id as usize];
        let (tick, _) = unpack(layout, slot.position.load(Relaxed));
        tick < slot.limit_tick.load(Relaxed) && now_ms < slot.stop_ms.load(Relaxed)
    };
    let candidates = || ranges.iter().filter(usable);
    // Free ids first, the least recently released first; then held ids,
    // the fewest sessions first, then the least recently claimed.
    let order = |id: &u32| {
        let slot = &slots[*id as usize];
        match slot.sessions.load(Relaxed) {
            0 => (false, slot.release_order.load(Relaxed), 0, *id),
            n => (true, u64::from(n), slot.claimed_at.load(Relaxed), *id),
        }
    };
    // The best id in one pass. A holder releases its advisory lock before
    // it leaves the slot, sharers take it in ShareLock mode, and SQL cannot
    // take this key, so its lock is free to take; the sort of all ids is
    // only a fallback should some other C code hold one.
    let best = candidates().min_by_key(order)?;
    let pick = if try_advisory_lock(best) {
        best
    } else {
        let mut all: Vec<u32> = candidates().filter(|&id| id != best).collect();
        all.sort_unstable_by_key(order);
        all.into_iter().find(|&id| try_advisory_lock(id))?
    };
    Some((pick, slots[pick as usize].sessions.load(Relaxed) > 0))
}

/// How long a first claim after startup waits for the registry worker to
/// read the registry table's high-water marks, in ms. The worker reads them
/// within a second of startup on an idle server.
const REGISTRY_WAIT_MS: i64 = 30_000;

/// Waits until the registry worker has put the high-water marks of the
/// registry table in force (after `pg_upgrade` or a restore they may be the
/// only record of IDs made before). A hot standby does not wait: its worker
/// starts only at promotion, and replayed WAL gives it the primary's floor.
#[cold]
pub(super) fn wait_for_registry(header: &Header) {
    let read = crate::clock::poll_until(REGISTRY_WAIT_MS, || {
        // SAFETY: a plain read of PostgreSQL's recovery state.
        !header.registry_pending.load(Acquire) || unsafe { pg_sys::RecoveryInProgress() }
    });
    if !read {
        errors::registry_not_read(REGISTRY_WAIT_MS);
    }
}

/// Refuses to claim (55000) while the clock is outside the layout's usable
/// time: before the epoch, or after the time field ran out. Checked for each
/// claim rather than at start, so that a clock set wrong never stops the
/// server; once a claim is made, the generator's own clock rules apply.
fn require_usable_time() {
    if let Some(problem) = settings::layout().time_problem(crate::clock::unix_ms()) {
        errors::layout_unusable_now(&problem.to_string())
    }
}
