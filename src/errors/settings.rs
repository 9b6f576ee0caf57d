//! Errors about the `snowflake_id.*` settings: at start (a value or name
//! PostgreSQL would ignore), and check hooks' failures, including those of
//! settings that may hold a secret, which never echo the value.

use super::raise;
use pgrx::pg_sys;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use std::ffi::{CStr, CString};

/// 22023: `snowflake_id.worker_ids` does not parse for this layout.
#[track_caller]
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
#[track_caller]
pub fn also_refused(settings: &[String]) {
    let report = pgrx::pg_sys::panic::ErrorReport::new(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        format!("snowflake_id also refuses {}", settings.join(", ")),
        "snowflake_id",
    )
    .set_hint(
        "The error that follows names the first problem; fix these settings too before starting the server again.",
    );
    report.report(PgLogLevel::WARNING);
}

/// 22023: the configuration gives a `snowflake_id.*` setting a value
/// PostgreSQL rejects (it would start on the default instead).
#[track_caller]
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
#[track_caller]
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

/// Sets the detail of a GUC check hook's failure.
#[track_caller]
pub fn guc_check_detail(detail: &str) {
    let detail = CString::new(detail.replace('\0', " ")).unwrap_or_default();
    // SAFETY: GUC_check_errdetail_string is a plain global that PostgreSQL
    // reads after the check hook returns false; pstrdup copies our string
    // into the current memory context as PostgreSQL's macro does.
    unsafe { pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr()) };
}

/// Why `snowflake_id.public_key` is refused, and what to do instead.
const PUBLIC_KEY_REMOVED_DETAIL: &str = "Since snowflake_id 0.4.0 the keys of public IDs are read from a file: PostgreSQL writes a changed setting's value to the server log and shows it to members of pg_read_all_settings.";

const PUBLIC_KEY_REMOVED_HINT: &str = "Write the keys into a file only the server's OS user can read (chmod 0600), set snowflake_id.public_key_file to its path, and remove snowflake_id.public_key (ALTER SYSTEM RESET snowflake_id.public_key, or from postgresql.conf).";

/// Sets the message, detail and hint of a check hook's failure of a
/// setting that may hold a secret, in place of PostgreSQL's usual message,
/// which would echo the value. Also keeps the statement that set it (an
/// `ALTER SYSTEM` with the value in its text) out of the log line of the
/// error that follows (`log_min_error_statement`).
#[track_caller]
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
#[track_caller]
pub fn public_key_removed_check_failed() {
    guc_check_failure(
        c"parameter \"snowflake_id.public_key\" is no longer supported (the value is not shown)",
        PUBLIC_KEY_REMOVED_DETAIL,
        PUBLIC_KEY_REMOVED_HINT,
    );
}

/// 22023 at start: the configuration sets the removed
/// `snowflake_id.public_key`. The value is not shown.
#[track_caller]
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
#[track_caller]
fn conninfo_secret_hint(keyword: &str) -> &'static str {
    match keyword {
        "sslpassword" => "Remove sslpassword and give the lease worker an unencrypted client key that only the server's OS user can read (sslkey=..., mode 0600).",
        _ => "Remove it from the connection string and put it into a passfile: ~/.pgpass of the server's OS user, or a file named with passfile=..., mode 0600 (hostname:port:database:username:password).",
    }
}

#[track_caller]
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
#[track_caller]
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
#[track_caller]
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
#[track_caller]
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
#[track_caller]
pub fn bad_registry_setting(origin: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid value for parameter \"snowflake_id.registry\" in the configuration (the value is not shown: it may hold a password)".into(),
        Some(format!("Set in {origin}: {problem}. The server would start without a usable registry, and every snowflake_nextval() would fail.")),
        Some("Write a libpq key=value connection string or a postgresql:// URI (host, port, dbname, user, sslmode, passfile, connect_timeout, ...), and start the server again.".into()),
    )
}
