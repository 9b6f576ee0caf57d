//! `snowflake_id.backfill_worker_ids`: the worker ids set aside for
//! backfill IDs (`snowflake_at()`), which live claims never take.

use super::*;

static BACKFILL_WORKER_IDS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// The set-aside ids, parsed once per process when the setting is defined
/// (a postmaster setting): `None` when none are set aside.
static SPACE: OnceLock<Option<Space>> = OnceLock::new();

/// Defines the setting. Called by `init` after `snowflake_id.worker_ids`;
/// refuses (22023) a value that does not parse, and set-aside ids that an
/// explicit `snowflake_id.worker_ids` also names.
pub(super) fn define(context: GucContext) {
    *REJECTED_AT_LOAD.lock() = Some(Vec::new());
    // SAFETY: the check hook is a #[pg_guard] function with the signature
    // PostgreSQL expects, and it only reads the string it is given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.backfill_worker_ids",
            c"Worker ids set aside for snowflake_at() (backfill IDs), e.g. 1023 (empty: no backfill).",
            c"Live IDs never use them. No server of the fleet may use them for live IDs, and no \
              other server may set them aside too. Ids may be added at the end later, never \
              taken away.",
            &BACKFILL_WORKER_IDS,
            context,
            GucFlags::default(),
            Some(check_backfill_worker_ids),
            None,
            None,
        );
    }
    let rejected = take_rejected();
    *REJECTED_AT_LOAD.lock() = None;
    if let Some((_, problem)) = rejected {
        errors::bad_backfill_ids(&problem);
    }
    let layout = layout();
    let space = configured_text()
        .and_then(|text| WorkerRanges::parse(&text, layout.max_worker_id()).ok())
        .map(|ids| Space::new(layout, ids));
    if let Some(space) = &space {
        // The state file and shared memory keep the list as text.
        if space.ids().to_string().len() > 255 {
            errors::bad_backfill_ids(
                "the list, written as ranges, is longer than 255 characters: set aside ranges of consecutive ids",
            );
        }
    }
    if let (Some(space), Some(Some(live))) = (&space, explicit_worker_ids()) {
        if live.overlaps(space.ids()) {
            errors::backfill_ids_overlap(&space.ids().to_string(), &live.to_string());
        }
    }
    let _ = SPACE.set(space);
}

fn configured_text() -> Option<String> {
    BACKFILL_WORKER_IDS
        .get()
        .map(|s| s.to_string_lossy().trim().to_string())
        .filter(|s| !s.is_empty())
}

/// `snowflake_id.worker_ids` when it names ids (`Some(None)` when it does
/// not parse; `None` when it is empty: every id but the set-aside ones).
fn explicit_worker_ids() -> Option<Option<WorkerRanges>> {
    let text = WORKER_IDS.get()?;
    let text = text.to_string_lossy().trim().to_string();
    if text.is_empty() {
        return None;
    }
    Some(WorkerRanges::parse(&text, layout().max_worker_id()).ok())
}

/// The backfill space, or `None` when no ids are set aside.
pub fn backfill_space() -> Option<&'static Space> {
    SPACE.get().and_then(Option::as_ref)
}

/// The ids set aside, as configured (empty: none).
pub fn backfill_ids_text() -> String {
    backfill_space().map_or_else(String::new, |s| s.ids().to_string())
}

/// Which set-aside ids the state file records from now on, and whether the
/// configured ones break the recorded ones: grants numbered under the
/// recorded ids keep their `(worker id, sequence)` only while the
/// configured ids start with them. `had_grants`: the state file holds
/// grants (without any, the configured ids are adopted as they are).
pub fn backfill_ids_to_record(recorded: &str, had_grants: bool) -> (String, bool) {
    let configured = backfill_ids_text();
    if !had_grants || recorded.is_empty() {
        return (configured, false);
    }
    let max = layout().max_worker_id();
    let continues = match (
        WorkerRanges::parse(recorded, max),
        backfill_space().map(Space::ids),
    ) {
        (Ok(old), Some(new)) => {
            new.len() >= old.len() && old.iter().zip(new.iter()).all(|(a, b)| a == b)
        }
        _ => false,
    };
    if continues {
        (configured, false)
    } else {
        (recorded.to_string(), true)
    }
}

/// Whether the configured set-aside ids include ids not in `recorded` (the
/// state file's list).
pub fn backfill_ids_new_since(recorded: &str) -> bool {
    let Some(space) = backfill_space() else {
        return false;
    };
    match WorkerRanges::parse(recorded, layout().max_worker_id()) {
        Ok(old) if !recorded.trim().is_empty() => space.ids().iter().any(|id| !old.contains(id)),
        _ => true,
    }
}

/// Check hook: the text must parse for this layout.
#[pg_guard]
unsafe extern "C-unwind" fn check_backfill_worker_ids(
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
    let space = backfill_space()?;
    ranges.overlaps(space.ids()).then(|| {
        format!(
            "it names worker ids set aside for backfill by snowflake_id.backfill_worker_ids ({})",
            space.ids()
        )
    })
}
