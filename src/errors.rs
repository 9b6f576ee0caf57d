//! Every error the extension raises: one function each, with its SQLSTATE,
//! message, detail and hint, so wording stays consistent and testable.

use pgrx::pg_sys;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use snowflake_core::generator::GenError;
use snowflake_core::key_file::KeyFileError;
use snowflake_core::layout::{format_unix_ms, Layout, PartError};
use std::ffi::{CStr, CString};

fn raise(code: PgSqlErrorCode, message: String, detail: Option<String>, hint: Option<String>) -> ! {
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(code, message, "snowflake_id");
    if let Some(detail) = detail {
        report = report.set_detail(detail);
    }
    if let Some(hint) = hint {
        report = report.set_hint(hint);
    }
    report.report(PgLogLevel::ERROR);
    unreachable!("ereport(ERROR) returned")
}

/// 55000: the library was loaded on demand instead of preloaded.
pub fn not_preloaded(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("snowflake_id must be loaded via \"shared_preload_libraries\" to use {function}()"),
        Some("Generator state and worker claims live in shared memory, which can only be set up when the server starts.".into()),
        Some("Add snowflake_id to shared_preload_libraries in postgresql.conf and restart the server.".into()),
    )
}

/// 22023: the layout settings do not make a valid layout.
pub fn invalid_layout(problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("invalid snowflake_id layout: {problem}"),
        None,
        Some("Fix snowflake_id.layout, snowflake_id.epoch, snowflake_id.time_unit_ms, snowflake_id.total_bits, snowflake_id.worker_bits or snowflake_id.sequence_bits in postgresql.conf and restart the server.".into()),
    )
}

/// 22023 at load: a drift shorter than one tick (but not 0).
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

/// 22023: `snowflake_id.worker_ids` does not parse for this layout.
pub fn bad_worker_ids(detail: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.worker_ids\"".into(),
        Some(detail.into()),
        Some("Write the worker ids as a list of ids and ranges, e.g. 0-511 or 0-15,32-47.".into()),
    )
}

/// WARNING at load, before the ERROR that names the first problem: the
/// other settings refused too (names and where they were set, no values).
pub fn also_refused(settings: &[String]) {
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snowflake_id also refuses {}", settings.join(", ")),
        "snowflake_id",
    );
    report = report.set_hint(
        "The error that follows names the first problem; fix these settings too before starting the server again.",
    );
    report.report(PgLogLevel::WARNING);
}

/// 22023: the configuration gives a `snowflake_id.*` setting a value
/// PostgreSQL rejects (it would start on the default instead).
pub fn bad_setting(name: &str, value: &str, origin: &str, accepted: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("invalid value for parameter \"{name}\" in the configuration: \"{value}\""),
        Some(format!(
            "Set in {origin}. Accepted values: {accepted}. PostgreSQL would start with the default instead, so this server would make IDs another way than configured."
        )),
        Some(format!("Fix {name} (postgresql.conf, or ALTER SYSTEM) and start the server again.")),
    )
}

/// 42704: the configuration sets a `snowflake_id.*` name that does not exist.
pub fn unknown_setting(name: &str, origin: &str, known: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_UNDEFINED_OBJECT,
        format!("unrecognized configuration parameter \"{name}\""),
        Some(format!(
            "Set in {origin}. PostgreSQL would ignore it, so this server would run without the setting meant."
        )),
        Some(format!(
            "Correct or remove it and start the server again. The snowflake_id settings are: {known}."
        )),
    )
}

/// 55000: the clock is outside the range in which this layout may make
/// IDs (before the epoch, or within ten years of the layout's end).
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

/// Sets the detail of a GUC check hook's failure.
pub fn guc_check_detail(detail: &str) {
    let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
    // SAFETY: GUC_check_errdetail_string is a plain global that PostgreSQL
    // reads after the check hook returns false; pstrdup copies our string
    // into the current memory context as PostgreSQL's macro does.
    unsafe { pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr()) };
}

/// 22003: an ID or part that does not fit the layout.
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

/// 22023: a batch size outside 1..max.
pub fn bad_batch_size(n: i32, max: i32) -> ! {
    let hint = if n < 1 {
        "Ask for at least 1 ID."
    } else {
        "Ask for fewer IDs per call and call again."
    };
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snowflake_nextvals() batch size {n} is out of range"),
        Some(format!("A batch holds 1 to {max} IDs.")),
        Some(hint.into()),
    )
}

/// 22008: a timestamp outside the layout's time range.
pub fn timestamp_out_of_range(unix_ms: i64, layout: &Layout) -> ! {
    time_range_error(format_unix_ms(unix_ms), layout)
}

/// 22008: `infinity` or `-infinity`.
pub fn infinite_timestamp(positive: bool, layout: &Layout) -> ! {
    time_range_error(
        if positive { "infinity" } else { "-infinity" }.into(),
        layout,
    )
}

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

/// The generator could not make an ID now.
pub fn generator(err: GenError, layout: &Layout, max_drift_ms: i64) -> ! {
    match err {
        GenError::ClockBehind { behind, .. } => raise(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "system clock is {} ms behind the last snowflake ID issued by this worker",
                behind * layout.unit_ms
            ),
            Some(format!(
                "snowflake_id.max_drift is {max_drift_ms} ms; issuing more IDs now would either repeat earlier IDs or run further ahead of the clock."
            )),
            Some("Fix the system clock (check NTP), wait until it catches up, or raise snowflake_id.max_drift and reload.".into()),
        ),
        GenError::Interrupted => internal("snowflake_id: an interrupted clock wait was reported as an error"),
        GenError::LayoutExhausted { .. } => raise(
            PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
            format!(
                "the time field of the snowflake ID layout ran out at {}",
                format_unix_ms(layout.end_unix_ms())
            ),
            None,
            Some("Configure a layout with more time bits, a coarser time unit or a later epoch, restart, and as a superuser run SELECT snowflake_accept_layout(): new IDs then start above every ID issued before.".into()),
        ),
    }
}

/// 55000: the server started with a layout other than the recorded one.
/// `differences` names each setting that differs, recorded vs current.
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

/// 42501: a function reserved for superusers.
pub fn superuser_only(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        format!("permission denied for function {function}"),
        Some("Only superusers may change how snowflake IDs are made.".into()),
        Some("Ask a superuser to run it.".into()),
    )
}

/// 22023: the new layout's IDs cannot be larger than the old ones (ever,
/// or before the Unix ms given).
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

/// 53400: no worker id of this server's range can be claimed, not even
/// shared. A held id is shared when none is free, so this happens only when
/// the claim lock of every id is held in a conflicting mode by code other
/// than this extension (SQL's advisory-lock functions cannot take it).
pub fn workers_exhausted(ranges: &str, count: u64, held: u64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!(
            "no snowflake worker id of this server can be claimed ({count} in its range, {held} held)"
        ),
        Some(format!(
            "snowflake_id.worker_ids = '{ranges}'. A held worker id is shared when none is free; the claim lock of every id (pg_locks: locktype advisory, database 0, classid 1397641047, objsubid 3) is held in a mode that excludes sharing, which only code outside snowflake_id can do."
        )),
        Some("Find the sessions holding those locks in pg_locks and end them, or widen snowflake_id.worker_ids.".into()),
    )
}

/// 54000-class problems writing the state file.
pub fn state_file(action: &str, path: &str, err: std::io::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!("could not {action} snowflake_id state file \"{path}\": {err}"),
        Some("The state file records how far ahead IDs are reserved, so that no ID repeats after a restart.".into()),
        Some("Check the permissions and free space of the data directory.".into()),
    )
}

/// XX001: the state file exists but cannot be understood.
pub fn state_file_unreadable(path: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("snowflake_id state file \"{path}\" is unreadable: {problem}"),
        Some("It records how far IDs were reserved and the layout that made them; without it IDs made before this start could be repeated.".into()),
        Some("Restore the file from a backup of the data directory. Only if you know the clock has not gone back since the last ID was made, move the file away to start from the current time.".into()),
    )
}

/// 22008: an ID whose time PostgreSQL's timestamptz cannot hold.
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

/// 53200: an allocation failed.
pub fn out_of_memory(bytes: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OUT_OF_MEMORY,
        "out of memory".into(),
        Some(format!("Failed on request of size {bytes}.")),
        None,
    )
}

/// XX000: a bug.
pub fn internal(message: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
        message.into(),
        None,
        Some("Please report this as a bug in snowflake_id.".into()),
    )
}

/// 55000: a claim that has issued nothing starts above the reservation
/// floor (IDs of an earlier life of this data directory), and the clock is
/// further behind it than max_drift plus a short wait.
pub fn behind_floor(floor_ms: i64, behind_ms: i64, max_drift_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "system clock is {behind_ms} ms behind the snowflake IDs reserved before this server's last restart, crash or promotion"
        ),
        Some(format!(
            "IDs up to {} may already have been issued (snowflake_id.state, or WAL replayed from a primary); new IDs start above them so that none repeats. snowflake_id.max_drift is {max_drift_ms} ms.",
            format_unix_ms(floor_ms)
        )),
        Some(format!(
            "Check the system clock (NTP): it is behind the time of IDs made before. Otherwise wait until {}, or raise snowflake_id.max_drift and reload.",
            format_unix_ms(floor_ms)
        )),
    )
}

/// 55000: IDs of the current tick may have been issued (before this
/// server's last restart), and `max_drift = 0` allows no lead: the next
/// tick (at `next`, Unix ms) must begin.
pub fn floor_in_this_tick(
    next: i64,
    layout: &Layout,
    max_drift_ms: i64,
    drift_can_cover: bool,
) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "no snowflake ID can be made before the next tick begins at {}",
            format_unix_ms(next)
        ),
        Some(format!(
            "IDs of the current tick (the layout's tick is {} ms) may have been issued already (before this server's last restart, crash or promotion, or as the registry's high-water mark says), and snowflake_id.max_drift is {max_drift_ms} ms, so no ID may be ahead of the clock.",
            layout.unit_ms
        )),
        Some(if drift_can_cover {
            format!("Set snowflake_id.max_drift to at least {} ms and reload (one tick of lead is then allowed), or wait for the next tick.", layout.unit_ms)
        } else {
            "Wait for the next tick, or use a time unit of at most 1h (snowflake_id.max_drift can then cover one tick).".into()
        }),
    )
}

/// 55000: this worker's last ID is ahead of the clock by borrowed ticks
/// (sequence used up) and max_drift is now smaller than that lead.
pub fn borrowed_lead(ahead_ms: i64, max_drift_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "the last snowflake ID issued by this worker is {ahead_ms} ms ahead of the system clock, more than snowflake_id.max_drift ({max_drift_ms} ms)"
        ),
        Some("The clock did not go back: the IDs ran ahead of it by borrowing ticks when the per-tick sequence was used up, under a larger snowflake_id.max_drift than the one in force now.".into()),
        Some(format!(
            "Wait about {} ms for the clock to catch up, or raise snowflake_id.max_drift and reload. The clock needs no fixing.",
            ahead_ms - max_drift_ms
        )),
    )
}

/// 55000: the clock is behind the newest ID of this server (another
/// backend's) by more than max_drift.
pub fn behind_server(behind_ms: i64, max_drift_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "system clock is {behind_ms} ms behind the newest snowflake ID issued on this server"
        ),
        Some(format!(
            "No new ID is stamped below the server's newest ID time. snowflake_id.max_drift is {max_drift_ms} ms."
        )),
        Some("Fix the system clock (check NTP), wait until it catches up, or raise snowflake_id.max_drift and reload.".into()),
    )
}

/// XX001: the state file was written by a newer build of snowflake_id, in a
/// format this build does not know.
pub fn state_file_too_new(path: &str, version: u32, known: u32) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!(
            "snowflake_id state file \"{path}\" has format version {version}, newer than this build reads (up to {known})"
        ),
        Some("It was written by a newer snowflake_id; reading it with this build could misread how far IDs were reserved.".into()),
        Some("Install the newer snowflake_id build that wrote it, or restore the file from a backup made with this build.".into()),
    )
}

/// 55000: the registry worker has not read the registry table's
/// high-water marks yet, so a first claim cannot know the floor.
pub fn registry_not_read(waited_ms: i64) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "the snowflake_id registry worker has not read the registry's high-water marks after {waited_ms} ms"
        ),
        Some("After pg_upgrade or a restore, the snowflake_worker_registry table of snowflake_id.registry_database may be the only record of IDs made before; no ID is made until they are in force.".into()),
        Some("Check the server log for \"snowflake_id registry\" messages (a missing database, no free background worker slot). To run without the registry, set snowflake_id.registry_database = '' and restart.".into()),
    )
}

/// Why `snowflake_id.public_key` is refused, and what to do instead.
const PUBLIC_KEY_REMOVED_DETAIL: &str = "Since snowflake_id 0.4.0 the keys of public IDs are read from a file: PostgreSQL writes a changed setting's value to the server log and shows it to members of pg_read_all_settings.";
const PUBLIC_KEY_REMOVED_HINT: &str = "Write the keys into a file only the server's OS user can read (chmod 0600), set snowflake_id.public_key_file to its path, and remove snowflake_id.public_key (ALTER SYSTEM RESET snowflake_id.public_key, or from postgresql.conf).";

/// Sets the message, detail and hint of a check hook's failure of a
/// setting that may hold a secret, in place of PostgreSQL's usual message,
/// which would echo the value. Also keeps the statement that set it (an
/// `ALTER SYSTEM` with the value in its text) out of the log line of the
/// error that follows (`log_min_error_statement`).
fn guc_check_failure(message: &CStr, detail: &str, hint: &str) {
    let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
    let hint = CString::new(hint.replace('\0', " ")).unwrap_or_default();
    // SAFETY: the GUC_check_* strings are plain globals that PostgreSQL
    // reads after the check hook returns false; pstrdup copies our strings
    // into the current memory context, as PostgreSQL's macros do.
    // debug_query_string is only read to log the statement with an error
    // report (and by extensions for the same purpose); PostgreSQL sets it
    // again for the next statement and clears it after an error.
    unsafe {
        pg_sys::GUC_check_errmsg_string = pg_sys::pstrdup(message.as_ptr());
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(hint.as_ptr());
        pg_sys::debug_query_string = std::ptr::null();
    }
}

/// Check hook failure of the removed `snowflake_id.public_key` (any value
/// but empty), without PostgreSQL's echo of the value (a key).
pub fn public_key_removed_check_failed() {
    guc_check_failure(
        c"parameter \"snowflake_id.public_key\" is no longer supported (the value is not shown)",
        PUBLIC_KEY_REMOVED_DETAIL,
        PUBLIC_KEY_REMOVED_HINT,
    );
}

/// 22023 at start: the configuration sets the removed
/// `snowflake_id.public_key`. The value is not shown.
pub fn public_key_removed_setting(origin: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "parameter \"snowflake_id.public_key\" is no longer supported (the value is not shown)"
            .into(),
        Some(format!("Set in {origin}. {PUBLIC_KEY_REMOVED_DETAIL}")),
        Some(format!(
            "{PUBLIC_KEY_REMOVED_HINT} Then start the server again."
        )),
    )
}

/// What to do about a secret (`password`, `sslpassword`) in a connection
/// string setting.
fn conninfo_secret_hint(keyword: &str) -> &'static str {
    match keyword {
        "sslpassword" => "Remove sslpassword and give the lease worker an unencrypted client key that only the server's OS user can read (sslkey=..., mode 0600).",
        _ => "Remove it from the connection string and put it into a passfile: ~/.pgpass of the server's OS user, or a file named with passfile=..., mode 0600 (hostname:port:database:username:password).",
    }
}

fn conninfo_secret_detail(keyword: &str) -> String {
    let what = match keyword {
        "sslpassword" => "sslpassword (the passphrase of the client key)",
        _ => "a password",
    };
    format!("The connection string holds {what}. A setting's value is readable by members of pg_read_all_settings and may be written to the server log.")
}

/// Check hook failure of a connection string setting (`snowflake_id.registry`,
/// `snowflake_id.registry_options`) holding a password (`keyword`): refused
/// without echoing the value.
pub fn conninfo_secret_check_failed(setting: &str, keyword: &str) {
    let message = CString::new(format!(
        "invalid value for parameter \"{setting}\" (the value is not shown: it holds a password)"
    ))
    .unwrap_or_default();
    guc_check_failure(
        &message,
        &conninfo_secret_detail(keyword),
        conninfo_secret_hint(keyword),
    );
}

/// 22023 at start: a configured connection string setting that holds a
/// password (`keyword`). The value is not shown.
pub fn conninfo_secret_setting(setting: &str, origin: &str, keyword: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("invalid value for parameter \"{setting}\" in the configuration (the value is not shown: it holds a password)"),
        Some(format!("Set in {origin}. {}", conninfo_secret_detail(keyword))),
        Some(format!("{} Then start the server again.", conninfo_secret_hint(keyword))),
    )
}

/// Check hook message for `snowflake_id.registry`: never the value, which
/// may hold a password.
pub fn registry_check_failed(detail: &str) {
    let message =
        c"invalid value for parameter \"snowflake_id.registry\" (the value is not shown: it may hold a password)";
    guc_check_failure(
        message,
        detail,
        "Write a libpq key=value connection string or a postgresql:// URI (host, port, dbname, user, sslmode, passfile, connect_timeout, ...).",
    );
}

/// 22023 at start: a configured `snowflake_id.registry` that the lease
/// worker cannot use. Like `bad_setting`, but the value is not shown.
pub fn bad_registry_setting(origin: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.registry\" in the configuration (the value is not shown: it may hold a password)".into(),
        Some(format!("Set in {origin}: {problem}. The server would start without a usable registry, and every snowflake_nextval() would fail.")),
        Some("Write a libpq key=value connection string or a postgresql:// URI (host, port, dbname, user, sslmode, passfile, connect_timeout, ...), and start the server again.".into()),
    )
}

/// 55000: public IDs need a key and none is set.
pub fn no_public_key(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}() needs a key, and snowflake_id.public_key_file is not set"),
        Some("Public IDs are IDs encrypted with a secret key, so that they reveal neither time, worker nor volume.".into()),
        Some("As the server's OS user, write a key (openssl rand -hex 16 makes one) into a file only that user can read (chmod 0600); as a superuser, set snowflake_id.public_key_file to its path and reload. Keep the key with your backups: without it, tokens cannot be turned back into IDs.".into()),
    )
}

/// The parts of an error about the file of `snowflake_id.public_key_file`.
/// `path`: the file's name, or `None` for a role that may not read the
/// setting. Never any of the file's text.
fn key_file_parts(
    path: Option<&str>,
    err: &KeyFileError,
) -> (PgSqlErrorCode, String, Option<String>, String) {
    let file = match path {
        Some(path) => format!("public key file \"{path}\""),
        None => "the file of snowflake_id.public_key_file".to_string(),
    };
    let permissions = "Make it owned by the server's OS user with mode 0600 (chown postgres FILE; chmod 0600 FILE), then reload.";
    let (code, message, detail, hint) = match err {
        KeyFileError::Missing(_) => (
            PgSqlErrorCode::ERRCODE_UNDEFINED_FILE,
            format!("could not open {file}: {err}"),
            None,
            "Create the file, or correct snowflake_id.public_key_file (a relative path is relative to the data directory), then reload.".to_string(),
        ),
        KeyFileError::Denied(_) => (
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("could not open {file}: {err}"),
            None,
            format!("The server's OS user must be able to read the file and to search every directory above it. {permissions}"),
        ),
        KeyFileError::Io(_) => (
            PgSqlErrorCode::ERRCODE_IO_ERROR,
            format!("could not read {file}: {err}"),
            None,
            "Check the file and the file system holding it.".to_string(),
        ),
        KeyFileError::Owner { uid } => (
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("{file} must be owned by the database server's OS user or root"),
            Some(format!("It is owned by uid {uid}.")),
            permissions.to_string(),
        ),
        KeyFileError::Mode { mode } => (
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            format!("{file} has group or world access"),
            Some(format!(
                "It has mode {:04o}. The file must have permissions u=rw (0600) or less if owned by the database server's OS user, or u=rw,g=r (0640) or less if owned by root.",
                mode & 0o7777
            )),
            permissions.to_string(),
        ),
        KeyFileError::NotFile => (
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{file} is not a regular file"),
            None,
            "Set snowflake_id.public_key_file to the path of a file holding the keys, then reload.".to_string(),
        ),
        KeyFileError::Content(problem) => (
            PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
            format!("{file} does not hold valid keys: {problem}"),
            Some("The file's text is not shown.".to_string()),
            "Write one or more keys of exactly 32 hex digits, one a line or separated by commas (openssl rand -hex 16 makes one); the first makes tokens, all of them read tokens. Then reload.".to_string(),
        ),
    };
    let detail = match (path, detail) {
        (Some(_), detail) => detail,
        (None, detail) => Some(
            detail.map_or(String::new(), |d| format!("{d} "))
                + "The file's name is shown to superusers and members of pg_read_all_settings.",
        ),
    };
    (code, message, detail, hint)
}

/// The keys of public IDs cannot be read from their file: 58P01 (missing),
/// 42501 (permissions, owner), 22023 (content, not a file) or 58030.
pub fn public_key_file(path: Option<&str>, err: &KeyFileError) -> ! {
    let (code, message, detail, hint) = key_file_parts(path, err);
    raise(code, message, detail, Some(hint))
}

/// A WARNING about the key file, for the postmaster's reload: the server
/// runs on, and public IDs fail until the file is fixed.
pub fn public_key_file_warning(path: &str, err: &KeyFileError) {
    let (code, message, detail, hint) = key_file_parts(Some(path), err);
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(code, message, "snowflake_id");
    if let Some(detail) = detail {
        report = report.set_detail(detail);
    }
    report.set_hint(hint).report(PgLogLevel::WARNING);
}

/// 22P02: a token that is not a public ID of this server.
pub fn bad_public_id(token: &str, problem: &str, len: usize) -> ! {
    let shown: String = token.chars().take(40).collect();
    let more = if token.chars().count() > 40 {
        "..."
    } else {
        ""
    };
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_TEXT_REPRESENTATION,
        format!("invalid public ID \"{shown}{more}\""),
        Some(format!("The token is not a public ID: {problem}.")),
        Some(format!("A public ID is {len} characters of Crockford base32, exactly as snowflake_to_public() returned it.")),
    )
}

/// 55000: a function of an older version of the extension's SQL objects,
/// whose C code the installed library no longer has.
pub fn old_extension_version(function: &str, version: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}() of snowflake_id {version} is not supported by the installed library"),
        Some("The snowflake_id library was upgraded, but this database still has the SQL objects of the older version.".into()),
        Some("Run ALTER EXTENSION snowflake_id UPDATE in this database.".into()),
    )
}

/// What replaces the registry's address, and the lease worker's last
/// problem (which may name it), for a role that may not read it.
const REGISTRY_HIDDEN: &str =
    "(address hidden: shown to superusers and members of pg_read_all_settings)";

/// 55000: leases are in use and this server holds no usable worker id: the
/// registry is unreachable (for `unreachable_ms`), or no block was leased
/// within `waited_ms`. `shown`: whether the role may read the registry's
/// address (`settings::may_read_hidden_settings`); else neither it nor the
/// problem is in the error.
pub fn no_lease(
    registry: &str,
    unreachable_ms: Option<i64>,
    deadline_ms: i64,
    problem: &str,
    waited_ms: i64,
    shown: bool,
) -> ! {
    let registry = if !shown {
        REGISTRY_HIDDEN.to_string()
    } else if registry.is_empty() {
        "(not known yet)".to_string()
    } else {
        registry.to_string()
    };
    let (message, mut detail) = match unreachable_ms {
        Some(ms) => (
            format!(
                "no worker id is leased: the registry {registry} has been unreachable for {} s",
                ms / 1000
            ),
            if deadline_ms > 0 {
                format!(
                    "This server's leases ran out at {}.",
                    format_unix_ms(deadline_ms)
                )
            } else {
                "This server holds no lease from it.".to_string()
            },
        ),
        None => (
            format!(
                "no worker id is leased from the registry {registry} after waiting {waited_ms} ms"
            ),
            "Every block this server may lease is held by other servers, or the lease worker has not leased one yet.".to_string(),
        ),
    };
    if !problem.is_empty() {
        if shown {
            detail.push_str(&format!(" Last problem: {problem}"));
        } else {
            detail.push_str(" The lease worker's last problem is in this server's log and in this error as a superuser or a member of pg_read_all_settings sees it.");
        }
    }
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        message,
        Some(detail),
        Some("Check that the registry server is running and reachable from this server with the connection string in snowflake_id.registry (or the Citus coordinator), and look for \"snowflake_id lease\" in this server's log. IDs resume by themselves once a lease is granted.".into()),
    )
}

/// 55000: Citus is preloaded and the lease worker cannot tell which
/// cluster this server belongs to (see `lease_worker`): no IDs rather
/// than every worker id unchecked. `citus_here`: this session's database,
/// when it has the citus extension. `shown`: as for [`no_lease`] (the
/// problem may name the coordinator).
pub fn fleet_unknown(problem: &str, citus_here: Option<String>, shown: bool) -> ! {
    let hint = match citus_here {
        Some(db) => format!(
            "This database ({db}) has the citus extension: set snowflake_id.registry_database = '{}' in postgresql.conf and reload, or set snowflake_id.registry.",
            db.replace('\'', "''")
        ),
        None => "Set snowflake_id.registry_database to the database where CREATE EXTENSION citus ran and reload, or set snowflake_id.registry to the fleet's registry.".into(),
    };
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "no worker id can be leased: this server cannot tell which Citus cluster it belongs to"
            .into(),
        Some(if shown {
            problem.to_string()
        } else {
            "The reason may name servers of the fleet: it is in this server's log, and in this error as a superuser or a member of pg_read_all_settings sees it.".to_string()
        }),
        Some(hint),
    )
}

/// 55000: a hot standby of a fleet that leases worker ids makes no IDs.
pub fn no_lease_on_standby() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "a standby makes no IDs when worker ids are leased from a registry".into(),
        Some("Leases are taken by the lease worker, which starts when the server is promoted.".into()),
        Some("Make IDs on the primary, or promote this server. To make IDs on a hot standby, give it its own snowflake_id.worker_ids and no snowflake_id.registry.".into()),
    )
}

/// 22023: `snowflake_id.backfill_worker_ids` does not parse for this layout.
pub fn bad_backfill_ids(detail: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.backfill_worker_ids\"".into(),
        Some(detail.into()),
        Some("Write the set-aside worker ids as a list of ids and ranges, e.g. 1023 or 1020-1023, and restart the server.".into()),
    )
}

/// 22023 at start: ids set aside for backfill are also live ids.
pub fn backfill_ids_overlap(backfill: &str, live: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snowflake_id.backfill_worker_ids ({backfill}) and snowflake_id.worker_ids ({live}) overlap"),
        Some("A backfill ID could then equal a live ID of the same time.".into()),
        Some("Take the set-aside ids out of snowflake_id.worker_ids (or leave it empty: every id but the set-aside ones), and restart the server.".into()),
    )
}

/// 55000: no worker ids are set aside for backfill.
pub fn backfill_off() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "no worker ids are set aside for backfill IDs".into(),
        Some("snowflake_at() makes IDs for past times from worker ids that live IDs never use, so that they cannot equal any other ID.".into()),
        Some("Set snowflake_id.backfill_worker_ids to worker ids no server uses for live IDs and no other server sets aside (e.g. the highest: '1023' under the classic layout), and restart the server.".into()),
    )
}

/// 55000: backfill while this server's worker ids are leased.
pub fn backfill_with_leases() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "snowflake_at() cannot make IDs while this server leases its worker ids".into(),
        Some("The registry may lease the ids set aside here to another server of the fleet, whose live IDs could then equal backfill IDs.".into()),
        Some("Make backfill IDs on a server that uses hand-set snowflake_id.worker_ids (no snowflake_id.registry, no Citus), with snowflake_id.backfill_worker_ids that no server of the fleet uses.".into()),
    )
}

/// 55000: backfill on a hot standby.
pub fn backfill_on_standby() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "snowflake_at() cannot make IDs during recovery".into(),
        Some("Backfill grants are made durable in WAL, which a standby cannot write; its primary hands out the same grants.".into()),
        Some("Call snowflake_at() on the primary.".into()),
    )
}

/// 55000: the set-aside ids no longer continue the ones grants were made
/// for.
pub fn backfill_ids_changed(recorded: &str, configured: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!(
            "snowflake_id.backfill_worker_ids ({}) does not start with the ids backfill IDs were made from ({recorded})",
            if configured.is_empty() { "empty" } else { configured }
        ),
        Some("Backfill grants are numbered across the set-aside ids in order; with other ids, a new grant could repeat an old one's worker id and sequence.".into()),
        Some(format!("Set snowflake_id.backfill_worker_ids back to {recorded} (ids may be added at the end) and restart the server.")),
    )
}

/// 22008: a time no backfill ID can have.
pub fn backfill_time(problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
        format!("no backfill ID can be made for this time: {problem}"),
        None,
        Some("Backfill times must be within the layout's time range (snowflake_layout()), after any layout change of this server, and no further ahead of the clock than snowflake_id.max_drift.".into()),
    )
}

/// 54000: every grant of a bucket is handed out.
pub fn backfill_bucket_full(start: &str, end: &str, grants: u32) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        format!("the backfill space for times from {start} to {end} is used up"),
        Some(format!("All {grants} grants of that stretch of time were handed out: each backend takes one per stretch for each run of increasing times, and a new one when a time repeats or goes back.")),
        Some("Add worker ids that no server ever used for live IDs at the end of snowflake_id.backfill_worker_ids and restart the server; order the rows by time when backfilling (ORDER BY the time column) to use fewer grants.".into()),
    )
}

/// 55000: backfill without the registry tables read.
pub fn backfill_needs_registry(database: Option<&str>) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        match database {
            None => "snowflake_at() needs the registry worker, and snowflake_id.registry_database is empty".into(),
            Some(db) => format!("the snowflake_id registry worker has not read the registry tables of database \"{db}\" yet"),
        },
        Some("Backfill reads snowflake_worker_registry (whether the set-aside worker ids made live IDs) and snowflake_backfill_grants (grants carried by pg_upgrade or a restore) before its first ID.".into()),
        Some("Set snowflake_id.registry_database to a database with CREATE EXTENSION snowflake_id (default postgres) and restart; run ALTER EXTENSION snowflake_id UPDATE there if it is older than 0.6.0; the log's snowflake_id registry lines say more.".into()),
    )
}
