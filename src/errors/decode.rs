//! Errors of decoding and building IDs: a part or timestamp outside the
//! layout, and a time beyond PostgreSQL's timestamptz.

use super::raise;
use pgrx::PgSqlErrorCode;
use snowflake_core::layout::{format_unix_ms, Layout, PartError};

/// 22003: an ID or part that does not fit the layout.
#[track_caller]
pub fn part_out_of_range(err: PartError) -> ! {
    let hint = match err {
        PartError::Id { .. } => "IDs are non-negative bigints made by snowflake_nextval() with this layout; see snowflake_layout().",
        _ => "See snowflake_layout() for the range of each field.",
    };
    raise(
        PgSqlErrorCode::ERRCODE_NUMERIC_VALUE_OUT_OF_RANGE,
        format!("snowflake ID out of range: {err}"),
        None,
        Some(hint.into()),
    )
}

/// 22008: a timestamp outside the layout's time range.
#[track_caller]
pub fn timestamp_out_of_range(unix_ms: i64, layout: &Layout) -> ! {
    time_range_error(format_unix_ms(unix_ms), layout)
}

/// 22008: `infinity` or `-infinity`.
#[track_caller]
pub fn infinite_timestamp(positive: bool, layout: &Layout) -> ! {
    time_range_error(
        if positive { "infinity" } else { "-infinity" }.into(),
        layout,
    )
}

#[track_caller]
fn time_range_error(timestamp: String, layout: &Layout) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
        format!("timestamp {timestamp} is outside the range of snowflake IDs"),
        Some(format!(
            "This layout covers {} to {}.",
            format_unix_ms(layout.epoch_ms),
            format_unix_ms(layout.end_unix_ms())
        )),
        Some("Use a timestamp within the layout's range; see snowflake_layout().".into()),
    )
}

/// 22008: an ID whose time PostgreSQL's timestamptz cannot hold.
#[track_caller]
pub fn beyond_timestamp_range(unix_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
        format!(
            "the time of this snowflake ID ({unix_ms} ms after 1970) is beyond PostgreSQL's timestamp range"
        ),
        Some("The layout's time field reaches further than timestamptz can represent.".into()),
        Some("Use snowflake_decode() only on IDs within the range timestamptz covers, or configure a layout that ends earlier.".into()),
    )
}
