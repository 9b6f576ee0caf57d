//! Every error the extension raises: one function each, with its SQLSTATE,
//! message, detail and hint, so wording stays consistent and testable.

use crate::generator::GenError;
use crate::layout::{format_unix_ms, Layout, PartError};
use pgrx::pg_sys;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::ffi::CString;

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

/// 22023: `snowflake_id.worker_ids` does not parse for this layout.
pub fn bad_worker_ids(detail: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.worker_ids\"".into(),
        Some(detail.into()),
        Some("Write the worker ids as a list of ids and ranges, e.g. 0-511 or 0-15,32-47.".into()),
    )
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
        Some("Check the system clock (NTP). If it is right, configure a layout with an earlier snowflake_id.epoch, more time bits or a coarser time unit (see the README on changing the layout).".into()),
    )
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
        GenError::LayoutExhausted { .. } => raise(
            PgSqlErrorCode::ERRCODE_DATETIME_FIELD_OVERFLOW,
            format!(
                "the time field of the snowflake ID layout ran out at {}",
                format_unix_ms(layout.end_unix_ms())
            ),
            None,
            Some("Configure a layout with more time bits, a coarser time unit or a later epoch (see the README on changing the layout).".into()),
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

/// Makes a check hook's failure of `snowflake_id.public_key` say what is
/// wrong without PostgreSQL's usual echo of the value (it is a secret).
pub fn public_key_check_failed(detail: &str) {
    let message =
        c"invalid value for parameter \"snowflake_id.public_key\" (the value is not shown)";
    let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
    let hint = c"Write one or more keys of exactly 32 hex digits, separated by commas; generate one with: openssl rand -hex 16";
    // SAFETY: the GUC_check_* strings are plain globals that PostgreSQL
    // reads after the check hook returns false; pstrdup copies our strings
    // into the current memory context, as PostgreSQL's macros do.
    unsafe {
        pg_sys::GUC_check_errmsg_string = pg_sys::pstrdup(message.as_ptr());
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(hint.as_ptr());
    }
}

/// Check hook message for `snowflake_id.registry`: never the value, which
/// may hold a password.
pub fn registry_check_failed(detail: &str) {
    let message =
        c"invalid value for parameter \"snowflake_id.registry\" (the value is not shown: it may hold a password)";
    let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
    let hint = c"Write a libpq key=value connection string or a postgresql:// URI (host, port, dbname, user, password, connect_timeout, ...).";
    // SAFETY: as in `public_key_check_failed`.
    unsafe {
        pg_sys::GUC_check_errmsg_string = pg_sys::pstrdup(message.as_ptr());
        pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
        pg_sys::GUC_check_errhint_string = pg_sys::pstrdup(hint.as_ptr());
    }
}

/// 22023 at start: a configured `snowflake_id.registry` that the lease
/// worker cannot use. Like `bad_setting`, but the value is not shown.
pub fn bad_registry_setting(origin: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.registry\" in the configuration (the value is not shown: it may hold a password)".into(),
        Some(format!("Set in {origin}: {problem}. The server would start without a usable registry, and every snowflake_nextval() would fail.")),
        Some("Write a libpq key=value connection string or a postgresql:// URI (host, port, dbname, user, password, connect_timeout, ...), and start the server again.".into()),
    )
}

/// 55000: public IDs need a key and none is set.
pub fn no_public_key(function: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        format!("{function}() needs a key, and snowflake_id.public_key is not set"),
        Some("Public IDs are IDs encrypted with a secret key, so that they reveal neither time, worker nor volume. If you did set a key, the server log says why it was refused.".into()),
        Some("As a superuser: ALTER SYSTEM SET snowflake_id.public_key = '<32 hex digits>'; SELECT pg_reload_conf(); Generate a key with openssl rand -hex 16 (or, with pgcrypto, SELECT encode(gen_random_bytes(16), 'hex')), and keep it with your backups: without it, tokens cannot be turned back into IDs.".into()),
    )
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

/// 22023 at start: a configured `snowflake_id.public_key` that is not a
/// list of keys. Like `bad_setting`, but the value is a secret: not shown.
pub fn bad_public_key_setting(origin: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.public_key\" in the configuration (the value is not shown)".into(),
        Some(format!("Set in {origin}: {problem}.")),
        Some("Write one or more keys of exactly 32 hex digits, separated by commas (generate one with: openssl rand -hex 16), and start the server again.".into()),
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

/// 55000: leases are in use and this server holds no usable worker id: the
/// registry is unreachable (for `unreachable_ms`), or no block was leased
/// within `waited_ms`.
pub fn no_lease(
    registry: &str,
    unreachable_ms: Option<i64>,
    deadline_ms: i64,
    problem: &str,
    waited_ms: i64,
) -> ! {
    let registry = if registry.is_empty() {
        "(not known yet)".to_string()
    } else {
        registry.to_string()
    };
    let (message, mut detail) = match unreachable_ms {
        Some(ms) => (
            format!(
                "snowflake_id: no worker id is leased: the registry {registry} has been unreachable for {} s",
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
                "snowflake_id: no worker id is leased from the registry {registry} after waiting {waited_ms} ms"
            ),
            "Every block this server may lease is held by other servers, or the lease worker has not leased one yet.".to_string(),
        ),
    };
    if !problem.is_empty() {
        detail.push_str(&format!(" Last problem: {problem}"));
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
/// when it has the citus extension.
pub fn fleet_unknown(problem: &str, citus_here: Option<String>) -> ! {
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
        Some(problem.to_string()),
        Some(hint),
    )
}

/// 55000: a hot standby of a fleet that leases worker ids makes no IDs.
pub fn no_lease_on_standby() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "snowflake_id: a standby makes no IDs when worker ids are leased from a registry".into(),
        Some("Leases are taken by the lease worker, which starts when the server is promoted.".into()),
        Some("Make IDs on the primary, or promote this server. To make IDs on a hot standby, give it its own snowflake_id.worker_ids and no snowflake_id.registry.".into()),
    )
}
