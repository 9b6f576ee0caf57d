//! `snowflake_id.backfill_worker_ids`: the worker ids set aside for
//! backfill IDs (`snowflake_at()`), which live claims never take. A
//! postmaster setting: `load` reads it once into [`super::Config`].

use super::define::BACKFILL_WORKER_IDS;
use super::load::Refusal;
use super::worker_ids::check_ranges;
use pgrx::{pg_guard, pg_sys};
use snowflake_core::backfill::Space;
use snowflake_core::layout::Layout;
use snowflake_core::ranges::WorkerRanges;
use std::ffi::{c_char, c_void};

/// The set-aside ids under `layout` (`Ok(None)`: none), or why they cannot
/// be used: a list the state file cannot keep, or ids an explicit
/// `snowflake_id.worker_ids` also names. The check hook has refused text
/// that does not parse.
pub(super) fn space(layout: &Layout) -> Result<Option<Space>, Refusal> {
    let max = layout.max_worker_id();
    let space = super::define::text(&BACKFILL_WORKER_IDS)
        .and_then(|text| WorkerRanges::parse(&text, max).ok())
        .map(|ids| Space::new(layout, ids));
    let Some(space) = space else {
        return Ok(None);
    };
    // The state file and shared memory keep the list as text.
    if space.ids().to_string().len() > 255 {
        return Err(Refusal::BackfillIds(
            "the list, written as ranges, is longer than 255 characters: set aside ranges of consecutive ids".into(),
        ));
    }
    if let Some(Some(live)) = super::worker_ids::explicit(max) {
        if live.overlaps(space.ids()) {
            return Err(Refusal::BackfillOverlap {
                backfill: space.ids().to_string(),
                live: live.to_string(),
            });
        }
    }
    Ok(Some(space))
}

/// The ids set aside, as configured (empty: none).
pub fn backfill_ids_text() -> String {
    super::backfill_space().map_or_else(String::new, |s| s.ids().to_string())
}

/// Check hook: the text must parse for this layout.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_backfill_worker_ids(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    unsafe {
        check_ranges(
            "snowflake_id.backfill_worker_ids",
            newval,
            source,
            |_, _| None,
        )
    }
}

/// For `snowflake_id.worker_ids`' check hook: the problem with live ids
/// `ranges` (written explicitly) that name set-aside ids.
pub(super) fn check_live_ids_against_backfill(ranges: &WorkerRanges) -> Option<String> {
    let space = super::backfill_space()?;
    ranges.overlaps(space.ids()).then(|| {
        format!(
            "it names worker ids set aside for backfill by snowflake_id.backfill_worker_ids ({})",
            space.ids()
        )
    })
}
