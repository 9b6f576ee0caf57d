//! The layout settings (`layout`, `epoch`, `time_unit_ms`, `total_bits`,
//! `worker_bits`, `sequence_bits`) and the time settings that depend on the
//! layout (`max_drift`, `layout_end_warning`): the rule that makes a
//! [`Layout`] of them, their check and show hooks, and their getters.

use super::define::{
    EPOCH, LAYOUT_END_WARNING, MAX_DRIFT_LIMIT_MS, MAX_DRIFT_MS, PRESET, SEQUENCE_BITS,
    STANDBY_CLOCK_SKEW_MS, TIME_UNIT_MS, TOTAL_BITS, WORKER_BITS,
};
use super::load::{hook_layout, loaded, reject};
use crate::errors;
use pgrx::guc::GucSetting;
use pgrx::{pg_guard, pg_sys, PostgresGucEnum};
use snowflake_core::layout::{self, Layout, PRESETS};
use std::ffi::{c_char, c_void, CString};
use std::sync::OnceLock;

/// `snowflake_id.layout`: the preset the individual layout settings start from.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Preset {
    #[name = c"classic"]
    Classic,
    #[name = c"sonyflake"]
    Sonyflake,
    #[name = c"js53"]
    Js53,
    #[name = c"pgedge"]
    Pgedge,
}

impl Preset {
    fn values(self) -> layout::Preset {
        PRESETS[self as usize]
    }
}

/// "Take the value from the preset", for the numeric layout settings.
pub(super) const FROM_PRESET: i32 = -1;

/// The layout the settings make, or why they make none.
pub(super) fn compute() -> Result<Layout, String> {
    let preset = PRESET.get().values();
    let pick = value_or_preset;
    let epoch_text = EPOCH.get();
    let epoch_text = epoch_text
        .as_deref()
        .and_then(|s| s.to_str().ok())
        .unwrap_or("");
    let epoch_ms = match epoch_text.trim() {
        "" => preset.epoch_ms,
        text => layout::parse_epoch(text).map_err(|e| format!("snowflake_id.epoch: {e}"))?,
    };
    Layout::from_settings(
        epoch_ms,
        pick(&TIME_UNIT_MS, preset.unit_ms),
        pick(&TOTAL_BITS, preset.total_bits.into()) as u32,
        pick(&WORKER_BITS, preset.worker_bits.into()) as u32,
        pick(&SEQUENCE_BITS, preset.sequence_bits.into()) as u32,
    )
    .map_err(|e| e.to_string())
}

/// The preset's name, for reports.
pub fn preset_name() -> &'static str {
    PRESET.get().values().name
}

/// `snowflake_id.max_drift` in milliseconds.
///
/// Read by every call that goes through the position (and by the assign
/// hook), so without `GucSetting::get`'s thread check (a thread-local
/// lookup): this extension starts no threads, and only PostgreSQL's GUC
/// machinery writes the variable, on this same thread.
#[inline(always)]
pub fn max_drift_ms() -> i64 {
    // SAFETY: the pointer is to the setting's own static storage, valid
    // for the life of the process; a backend is single-threaded and the
    // only writer is PostgreSQL's GUC code on this thread, never during
    // this read.
    i64::from(unsafe { MAX_DRIFT_MS.as_ptr().read() })
}

/// `snowflake_id.standby_clock_skew` in milliseconds.
pub fn standby_clock_skew_ms() -> i64 {
    i64::from(STANDBY_CLOCK_SKEW_MS.get())
}

/// Whether some `snowflake_id.max_drift` covers one tick of `unit_ms`.
pub fn drift_can_cover(unit_ms: i64) -> bool {
    unit_ms <= i64::from(MAX_DRIFT_LIMIT_MS)
}

/// A drift shorter than a tick (but not 0) would stop every restart within
/// a tick until the next tick began (the reservation is above the IDs of
/// the current tick, and the next tick is more lead than allowed): the
/// drift in force, when it is one.
pub(super) fn drift_shorter_than_tick(layout: &Layout) -> Option<i64> {
    let drift = max_drift_ms();
    (drift > 0 && drift < layout.unit_ms).then_some(drift)
}

/// `snowflake_id.layout_end_warning`, in years (0: never warn).
pub fn layout_end_warning_years() -> u32 {
    u32::try_from(LAYOUT_END_WARNING.get()).unwrap_or(0)
}

/// Warns in the log when the layout's time field runs out within
/// `snowflake_id.layout_end_warning` years. Called at server start.
pub fn warn_if_layout_ends_soon() {
    let layout = super::layout();
    let now = crate::clock::unix_ms();
    let years = layout_end_warning_years();
    if layout.ended(now) || layout.ends_within(now, years) {
        errors::layout_ends_soon(
            &layout::format_unix_ms(layout.end_unix_ms()),
            layout.years_left(now),
            years,
        );
    }
}

/// The values a layout or time setting accepts, for the error that refuses
/// a bad one (`None`: not one of these).
pub(super) fn accepted_values(name: &str, max_worker_id: u32) -> Option<String> {
    Some(match name {
        "snowflake_id.layout" => "classic, sonyflake, js53 or pgedge".into(),
        "snowflake_id.epoch" => {
            "a UTC date (2024-01-01), a UTC date and time (2024-01-01 12:00:00), Unix milliseconds, \
             or empty (from snowflake_id.layout)"
                .into()
        }
        "snowflake_id.time_unit_ms" => "-1 (from snowflake_id.layout) or 1 to 86400000".into(),
        "snowflake_id.total_bits" => "-1 (from snowflake_id.layout) or 2 to 63".into(),
        "snowflake_id.worker_bits" => format!(
            "-1 (from snowflake_id.layout) or 0 to {}",
            layout::MAX_WORKER_BITS
        ),
        "snowflake_id.sequence_bits" => format!(
            "-1 (from snowflake_id.layout) or 1 to {}",
            layout::MAX_SEQUENCE_BITS
        ),
        "snowflake_id.worker_ids" => format!(
            "ids and ranges from 0 to {max_worker_id}, e.g. 0-511 or 0-15,32-47 (empty: all)"
        ),
        "snowflake_id.max_drift" | "snowflake_id.standby_clock_skew" => {
            format!("0 to {MAX_DRIFT_LIMIT_MS} milliseconds, or with a unit: 500ms, 2s, 1min, 1h")
        }
        _ => return None,
    })
}

/// A layout setting's value: its own, or the preset's when it is -1.
fn value_or_preset(setting: &GucSetting<i32>, preset_value: i64) -> i64 {
    match setting.get() {
        FROM_PRESET => preset_value,
        v => i64::from(v),
    }
}

/// The value in use of a layout setting: its own, or the preset's when it
/// is -1, as a string in the current memory context (PostgreSQL copies it).
fn show_layout_setting(setting: &GucSetting<i32>, preset_value: i64) -> *const c_char {
    let value = value_or_preset(setting, preset_value);
    // Digits and a sign only: no NUL inside, so the CString always builds.
    let text = CString::new(value.to_string()).unwrap_or_default();
    // SAFETY: copies a NUL-terminated string into the current memory
    // context, where PostgreSQL expects a show hook's result.
    unsafe { pg_sys::pstrdup(text.as_ptr()) }
}

/// SHOW of `snowflake_id.epoch`: its own value, or the preset's epoch
/// (as a date) when it is empty.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn show_epoch() -> *const c_char {
    let own = EPOCH.get();
    let own = own.as_deref().and_then(|s| s.to_str().ok()).unwrap_or("");
    let shown = match own.trim() {
        "" => {
            let formatted = layout::format_unix_ms(PRESET.get().values().epoch_ms);
            // A preset's epoch is a whole day: its date alone.
            formatted
                .strip_suffix(" 00:00:00.000Z")
                .unwrap_or(&formatted)
                .to_string()
        }
        _ => own.to_string(),
    };
    // Checked text or a formatted date: no NUL inside.
    let text = CString::new(shown).unwrap_or_default();
    // SAFETY: copies a NUL-terminated string into the current memory
    // context, where PostgreSQL expects a show hook's result.
    unsafe { pg_sys::pstrdup(text.as_ptr()) }
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn show_time_unit() -> *const c_char {
    show_layout_setting(&TIME_UNIT_MS, PRESET.get().values().unit_ms)
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn show_total_bits() -> *const c_char {
    show_layout_setting(&TOTAL_BITS, PRESET.get().values().total_bits.into())
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn show_worker_bits() -> *const c_char {
    show_layout_setting(&WORKER_BITS, PRESET.get().values().worker_bits.into())
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn show_sequence_bits() -> *const c_char {
    show_layout_setting(&SEQUENCE_BITS, PRESET.get().values().sequence_bits.into())
}

/// Check hook of `snowflake_id.epoch`: the text must parse (the layout as a
/// whole is checked when the library loads).
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_epoch(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let text = unsafe { super::candidate(newval) }.unwrap_or_default();
    // Not compared with the clock: a clock set before the epoch must not
    // stop the server; snowflake_nextval() refuses instead. Empty: the
    // preset's epoch.
    if text.trim().is_empty() {
        return true;
    }
    match layout::parse_epoch(&text) {
        Ok(_) => true,
        Err(detail) => reject("snowflake_id.epoch", &text, &detail.to_string(), source),
    }
}

/// An int layout setting must be -1 (from the preset) or at least `min`.
fn check_at_least(
    name: &'static str,
    value: i32,
    min: i32,
    source: pg_sys::GucSource::Type,
) -> bool {
    if value == FROM_PRESET || value >= min {
        return true;
    }
    let detail = format!("Use -1 (take it from snowflake_id.layout) or a value of at least {min}.");
    reject(name, &value.to_string(), &detail, source)
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_time_unit_ms(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    check_at_least("snowflake_id.time_unit_ms", unsafe { *newval }, 1, source)
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_total_bits(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    check_at_least("snowflake_id.total_bits", unsafe { *newval }, 2, source)
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_sequence_bits(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    check_at_least("snowflake_id.sequence_bits", unsafe { *newval }, 1, source)
}

/// What to do in this process when `snowflake_id.max_drift` changes, set
/// once by [`super::load`]: `claims` closes its held window, which admits
/// clock readings by the bound it was opened with, so that the hot path
/// need not read the setting for every ID.
static ON_MAX_DRIFT_CHANGE: OnceLock<fn()> = OnceLock::new();

/// Sets [`ON_MAX_DRIFT_CHANGE`] (the first call only).
pub(super) fn on_max_drift_change(f: fn()) {
    let _ = ON_MAX_DRIFT_CHANGE.set(f);
}

/// Assign hook of `snowflake_id.max_drift`: runs in every process that
/// takes a new value (a reload reaches a backend between statements),
/// before the value is stored; nothing makes an ID in between.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn assign_max_drift(newval: i32, _extra: *mut c_void) {
    if i64::from(newval) != max_drift_ms() {
        if let Some(f) = ON_MAX_DRIFT_CHANGE.get() {
            f();
        }
    }
}

/// Check hook of `snowflake_id.max_drift`: 0, or at least one tick of the
/// layout in use. While the library loads, `load` checks instead, naming
/// both settings.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_max_drift(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let value = unsafe { *newval };
    // The built-in default is always accepted: PostgreSQL sets it in every
    // parallel worker before it restores the leader's value, and fails the
    // worker when a check hook refuses it. At start, `load` checks the
    // value in force (the default included).
    if source == pg_sys::GucSource::PGC_S_DEFAULT || !loaded() {
        return true;
    }
    match hook_layout() {
        Some(layout) if value > 0 && i64::from(value) < layout.unit_ms => reject(
            "snowflake_id.max_drift",
            &value.to_string(),
            &format!(
                "it must be 0 or at least one tick of the layout ({} ms)",
                layout.unit_ms
            ),
            source,
        ),
        _ => true,
    }
}
