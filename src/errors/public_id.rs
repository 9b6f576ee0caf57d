//! Errors of public IDs: no key, the key file (missing, permissions, owner,
//! content; also as a reload's WARNING), and a token that is not a public ID.

use super::raise;
use pgrx::{PgLogLevel, PgSqlErrorCode};
use snowflake_core::key_file::KeyFileError;

/// 55000: public IDs need a key and none is set.
#[track_caller]
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
#[track_caller]
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
#[track_caller]
pub fn public_key_file(path: Option<&str>, err: &KeyFileError) -> ! {
    let (code, message, detail, hint) = key_file_parts(path, err);
    raise(code, message, detail, Some(hint))
}

/// A WARNING about the key file, for the postmaster's reload: the server
/// runs on, and public IDs fail until the file is fixed.
#[track_caller]
pub fn public_key_file_warning(path: &str, err: &KeyFileError) {
    let (code, message, detail, hint) = key_file_parts(Some(path), err);
    let mut report = pgrx::pg_sys::panic::ErrorReport::new(code, message, "snowflake_id");
    if let Some(detail) = detail {
        report = report.set_detail(detail);
    }
    report.set_hint(hint).report(PgLogLevel::WARNING);
}

/// 22P02: a token that is not a public ID of this server.
#[track_caller]
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
