//! Errors about the data directory's `snowflake_id.state` file (it cannot
//! be read or written, cannot be understood, or is of a newer format) and
//! the registry's `snowflake_id.key`.

use super::raise;
use pgrx::PgSqlErrorCode;

/// 54000-class problems writing the state file.
#[track_caller]
pub fn state_file(action: &str, path: &str, err: std::io::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!("could not {action} snowflake_id state file \"{path}\": {err}"),
        Some("The state file records how far ahead IDs are reserved, so that no ID repeats after a restart.".into()),
        Some("Check the permissions and free space of the data directory.".into()),
    )
}

/// XX001: the state file exists but cannot be understood.
#[track_caller]
pub fn state_file_unreadable(path: &str, problem: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("snowflake_id state file \"{path}\" is unreadable: {problem}"),
        Some("It records how far IDs were reserved and the layout that made them; without it IDs made before this start could be repeated.".into()),
        Some("Restore the file from a backup of the data directory. Only if you know the clock has not gone back since the last ID was made, move the file away to start from the current time.".into()),
    )
}

/// XX001: the state file was written by a newer build of snowflake_id, in a
/// format this build does not know.
#[track_caller]
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

/// 58030: the registry's token key file cannot be read or written.
#[track_caller]
pub fn registry_key_file(action: &str, path: &str, err: std::io::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!("could not {action} snowflake_id registry key file \"{path}\": {err}"),
        Some("The key signs the tokens the registry gives its holders; it is kept in the data directory so that DROP EXTENSION leaves it.".into()),
        Some("Check the permissions and free space of the data directory.".into()),
    )
}

/// XX001: the registry's token key file exists but holds no key.
#[track_caller]
pub fn registry_key_file_unreadable(path: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("snowflake_id registry key file \"{path}\" holds no key (32 hex digits)"),
        Some("The key signs the tokens the registry gives its holders; with another key the registry cannot tell that it was restored to an earlier state.".into()),
        Some("Restore the file from a backup of this data directory (or a standby's copy). If there is none, move it away: a new key is made, and the registry's next new incarnation is fenced once.".into()),
    )
}

/// 58030: the registry's candidates file cannot be read or written.
#[track_caller]
pub fn registry_candidates_file(action: &str, path: &str, err: std::io::Error) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_IO_ERROR,
        format!("could not {action} snowflake_id registry candidates file \"{path}\": {err}"),
        Some("The file keeps the registry's last failover candidates' row, so that a row made anew after DROP EXTENSION names them again.".into()),
        Some("Check the permissions and free space of the data directory.".into()),
    )
}

/// XX001: the registry's candidates file exists but holds no row.
#[track_caller]
pub fn registry_candidates_file_unreadable(path: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_DATA_CORRUPTED,
        format!("snowflake_id registry candidates file \"{path}\" holds no candidates' row"),
        Some("A standby that received the row it held may prove a promotion by it: a row made anew without it could let that standby lose grants.".into()),
        Some("Restore the file from a backup of this data directory. If there is none, move it away once every standby that was a failover candidate is streaming or has been rebuilt; the row made anew then names every standby that may be synchronous for 30 s.".into()),
    )
}
