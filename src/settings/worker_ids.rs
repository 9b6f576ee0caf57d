//! `snowflake_id.worker_ids`: the worker ids this server may claim (a
//! sighup setting: a change applies to claims made after the reload), and
//! the check every worker-id list setting shares.

use super::define::WORKER_IDS;
use super::load::{hook_layout, reject};
use crate::errors;
use pgrx::{pg_guard, pg_sys};
use snowflake_core::ranges::WorkerRanges;
use std::ffi::{c_char, c_void};

/// The ids this server may claim now (`snowflake_id.worker_ids`, without the
/// ids set aside for backfill), and the setting's text. The check hook has
/// already accepted the text.
pub fn worker_ranges() -> (WorkerRanges, String) {
    let text = WORKER_IDS.get();
    let text = text
        .as_deref()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match WorkerRanges::parse(&text, super::layout().max_worker_id()) {
        // Live claims never take the ids set aside for backfill.
        Ok(ranges) => match super::backfill_space() {
            Some(space) => (ranges.without(space.ids()), text),
            None => (ranges, text),
        },
        Err(detail) => errors::bad_worker_ids(&detail.to_string()),
    }
}

/// `snowflake_id.worker_ids` when it names ids (`Some(None)` when it does
/// not parse; `None` when it is empty: every id but the set-aside ones).
pub(super) fn explicit(max_worker_id: u32) -> Option<Option<WorkerRanges>> {
    let text = super::define::text(&WORKER_IDS)?;
    Some(WorkerRanges::parse(&text, max_worker_id).ok())
}

/// Check hook of `snowflake_id.worker_ids`: rejects text that does not
/// parse or names ids outside the layout, with PostgreSQL's usual
/// "invalid value for parameter" error (or log line, on reload), and ids
/// set aside for backfill.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_worker_ids(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    unsafe {
        check_ranges("snowflake_id.worker_ids", newval, source, |text, ranges| {
            if text.trim().is_empty() {
                None
            } else {
                super::backfill::check_live_ids_against_backfill(ranges)
            }
        })
    }
}

/// The body of the check hooks of the worker-id list settings: the
/// candidate must parse for this layout, and `more` may find a problem with
/// the ranges (the detail of the rejection).
///
/// # Safety
/// `newval` is the check hook's candidate pointer.
pub(super) unsafe fn check_ranges(
    name: &'static str,
    newval: *mut *mut c_char,
    source: pg_sys::GucSource::Type,
    more: impl Fn(&str, &WorkerRanges) -> Option<String>,
) -> bool {
    // SAFETY: as the caller promises.
    let Some(text) = (unsafe { super::candidate(newval) }) else {
        return true;
    };
    let Some(layout) = hook_layout() else {
        return true;
    };
    match WorkerRanges::parse(&text, layout.max_worker_id()) {
        Ok(ranges) => match more(&text, &ranges) {
            None => true,
            Some(detail) => reject(name, &text, &detail, source),
        },
        Err(detail) => reject(name, &text, &detail.to_string(), source),
    }
}
