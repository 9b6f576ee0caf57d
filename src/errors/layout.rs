//! Errors and the warning about the layout: settings that make no layout,
//! a layout that cannot make IDs now or runs out soon, and a layout that
//! differs from the recorded one (`snowflake_accept_layout()`).

use super::raise;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use snowflake_core::layout::format_unix_ms;

/// 22023: the layout settings do not make a valid layout.
#[track_caller]
pub fn invalid_layout(problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("invalid snowflake_id layout: {problem}"),
        None,
        Some("Fix snowflake_id.layout, snowflake_id.epoch, snowflake_id.time_unit_ms, snowflake_id.total_bits, snowflake_id.worker_bits or snowflake_id.sequence_bits in postgresql.conf and restart the server.".into()),
    )
}

/// 22023 at load: a drift shorter than one tick (but not 0).
#[track_caller]
pub fn tick_longer_than_drift(unit_ms: i64, max_drift_ms: i64, drift_can_cover: bool) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!(
            "snowflake_id.max_drift ({max_drift_ms} ms) is shorter than one tick of the layout ({unit_ms} ms)"
        ),
        Some("After every restart within a tick, no ID could be made until the next tick began: the IDs of the current tick are reserved, and the next tick is more lead than snowflake_id.max_drift allows.".into()),
        Some(if drift_can_cover {
            format!("Set snowflake_id.max_drift to at least {unit_ms} ms, or to 0 to wait for the next tick after a restart, and restart the server.")
        } else {
            "Set snowflake_id.max_drift to 0 (then the first ID after a restart within a tick is refused until the next tick), or use a time unit of at most 1h, and restart the server.".into()
        }),
    )
}

/// 55000: the clock is outside the range in which this layout may make
/// IDs (before the epoch, or within ten years of the layout's end).
#[track_caller]
pub fn layout_unusable_now(problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake IDs cannot be made now: {problem}"),
        Some("The decoders still work; only new IDs are refused.".into()),
        Some("Check the system clock (NTP). If it is right, configure a layout with an earlier snowflake_id.epoch, more time bits or a coarser time unit, restart, and as a superuser run SELECT snowflake_accept_layout(): new IDs then start above every ID issued before.".into()),
    )
}

/// WARNING at server start: the layout's time field runs out within
/// `snowflake_id.layout_end_warning` years.
#[track_caller]
pub fn layout_ends_soon(end: &str, years_left: f64, warn_years: u32) {
    pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_WARNING,
        if years_left > 0.0 {
            format!("the snowflake_id layout's time field runs out at {end}, in {years_left:.1} years")
        } else {
            format!("the snowflake_id layout's time field ran out at {end}: no ID can be made")
        },
        "snowflake_id",
    )
    .set_detail(format!(
        "snowflake_id.layout_end_warning is {warn_years} years. After that time no ID can be made."
    ))
    .set_hint(
        "Plan a new layout (a later snowflake_id.epoch, more time bits or a coarser time unit) and adopt it with SELECT snowflake_accept_layout() after a restart; set snowflake_id.layout_end_warning = 0 to silence this.",
    )
    .report(PgLogLevel::WARNING);
}

/// 55000: the server started with a layout other than the recorded one.
/// `differences` names each setting that differs, recorded vs current.
#[track_caller]
pub fn layout_changed(differences: &[String]) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "the snowflake ID layout differs from the one recorded when IDs were last made on this server".into(),
        Some(format!(
            "Changed: {}. A changed layout can repeat earlier IDs and changes how they decode. The recorded layout is in the data directory's snowflake_id.state file.",
            differences.join("; ")
        )),
        Some("Restore the previous snowflake_id.* layout settings and restart, or, as a superuser, run SELECT snowflake_accept_layout() to adopt the new layout: new IDs then start above every ID issued before.".into()),
    )
}

/// 22023: the new layout's IDs cannot be larger than the old ones (ever,
/// or before the Unix ms given).
#[track_caller]
pub fn layout_cannot_rise(not_until_ms: Option<i64>) -> ! {
    let detail = match not_until_ms {
        None => "Every ID of the new layout is smaller than IDs the recorded layout has already issued (for example moving to fewer total bits), so adopting it could repeat IDs.".to_string(),
        Some(ms) => format!(
            "IDs of the new layout only get above the IDs already issued at {}; until then no ID could be made.",
            format_unix_ms(ms)
        ),
    };
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "the new snowflake ID layout cannot make IDs above those already issued".into(),
        Some(detail),
        Some("Restore the previous layout settings and restart, or choose a layout whose IDs are larger for the same time: at least as many total bits, fewer worker and sequence bits, or an earlier snowflake_id.epoch.".into()),
    )
}
