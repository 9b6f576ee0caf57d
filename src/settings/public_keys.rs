//! `snowflake_id.public_key_file`: the file holding the keys of public IDs
//! (`snowflake_core::public_id`, `key_file`), read when used and after each
//! reload; and the removed `snowflake_id.public_key`, refused without being
//! shown. The file's name is the only setting: no key is ever one.

use super::define::PUBLIC_KEY_FILE;
use super::load::Refusal;
use crate::errors;
use parking_lot::{const_mutex, Mutex};
use pgrx::{pg_guard, pg_sys};
use snowflake_core::key_file::KeyFileError;
use snowflake_core::public_id::Key;
use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};

/// This process's view of `snowflake_id.public_key_file`.
struct KeyFileState {
    /// Bumped by the assign hook whenever the setting is set in this
    /// process: a new name, or the same again on a reload.
    version: u64,
    /// Set in the postmaster once `load` has checked the key file: later
    /// calls of the assign hook there are reloads, which check the file
    /// again.
    postmaster_checks_reloads: bool,
}

static KEY_FILE_STATE: Mutex<KeyFileState> = const_mutex(KeyFileState {
    version: 0,
    postmaster_checks_reloads: false,
});

/// The keys of the file, or where it is and what is wrong with it.
type Keys = Result<Option<Vec<Key>>, (String, KeyFileError)>;

/// At start, in the postmaster: why the key file refuses the start, as an
/// unusable `ssl_key_file` does, if it does. From then on, the postmaster
/// checks it again on each reload (and only warns).
pub(super) fn check_at_start() -> Option<Refusal> {
    // SAFETY: a flag PostgreSQL sets before loading preload libraries.
    if unsafe { pg_sys::IsUnderPostmaster } {
        return None;
    }
    if let Err((path, err)) = public_keys() {
        return Some(Refusal::PublicKeyFile { path, err });
    }
    KEY_FILE_STATE.lock().postmaster_checks_reloads = true;
    None
}

/// At start: a configured `snowflake_id.public_key` (set in `origin`)
/// refuses the start, without echoing the value (PostgreSQL has only
/// warned).
pub(super) fn refuse_removed_public_key(text: &str, origin: &str) -> Option<Refusal> {
    (!text.trim().is_empty()).then(|| Refusal::PublicKeyRemoved {
        origin: origin.into(),
    })
}

/// The path of the key file named by `setting` (trimmed; relative to the
/// data directory), or `None` when it is empty.
fn key_file_path(setting: &str) -> Option<PathBuf> {
    let setting = setting.trim();
    if setting.is_empty() {
        return None;
    }
    let path = Path::new(setting);
    if path.is_absolute() {
        return Some(path.to_path_buf());
    }
    // SAFETY: DataDir is set (absolute) before preload libraries load and
    // stays valid for the life of the process; NULL-checked.
    let data_dir = unsafe {
        let dir = pg_sys::DataDir;
        (!dir.is_null()).then(|| CStr::from_ptr(dir).to_string_lossy().into_owned())
    };
    Some(match data_dir {
        Some(dir) => Path::new(&dir).join(path),
        None => path.to_path_buf(), // the process runs in the data directory
    })
}

/// Reads the keys of the file named by `setting`: `Ok(None)` when none is
/// named; on error, the file's path (for the message) and the problem.
fn read_public_keys(setting: &str) -> Keys {
    let Some(path) = key_file_path(setting) else {
        return Ok(None);
    };
    // SAFETY: a plain system call without arguments.
    let euid = unsafe { libc::geteuid() };
    snowflake_core::key_file::read_keys(&path, euid)
        .map(Some)
        .map_err(|err| (path.to_string_lossy().into_owned(), err))
}

/// The keys of `snowflake_id.public_key_file`, read from the file now:
/// `Ok(None)` when no file is named.
pub fn public_keys() -> Keys {
    let setting = PUBLIC_KEY_FILE
        .get()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    read_public_keys(&setting)
}

/// Changes when the keys in force may have changed: when this process sets
/// `snowflake_id.public_key_file` (a new name, or any reload with it in a
/// configuration file) or rereads the configuration files on SIGHUP
/// (`pg_conf_load_time()`). Two loads, no system call: cheap enough to
/// check on every call of a public-ID function.
pub fn public_key_stamp() -> (u64, i64) {
    // SAFETY: PostgreSQL sets PgReloadTime when this process (re)reads its
    // configuration; a plain read in the process's only thread.
    let reloaded = unsafe { pg_sys::PgReloadTime };
    (KEY_FILE_STATE.lock().version, reloaded)
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn assign_public_key_file(
    newval: *const c_char,
    _extra: *mut c_void,
) {
    let checks_reloads = {
        let mut state = KEY_FILE_STATE.lock();
        state.version += 1;
        state.postmaster_checks_reloads
    };
    // SAFETY: a flag PostgreSQL sets in every child of the postmaster.
    if !checks_reloads || unsafe { pg_sys::IsUnderPostmaster } {
        return;
    }
    // A reload in the postmaster: say now in the log when the file cannot
    // be used (the sessions fail when they need it), naming the file only.
    // SAFETY: PostgreSQL passes NULL or a NUL-terminated string.
    let setting = unsafe {
        if newval.is_null() {
            return;
        }
        CStr::from_ptr(newval).to_string_lossy().into_owned()
    };
    if let Err((path, err)) = read_public_keys(&setting) {
        errors::public_key_file_warning(&path, &err);
    }
}

/// Check hook of the removed `snowflake_id.public_key`: only empty passes.
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_public_key(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value,
    // which is NULL or a NUL-terminated string.
    let empty = unsafe {
        newval.is_null()
            || (*newval).is_null()
            || CStr::from_ptr(*newval)
                .to_bytes()
                .iter()
                .all(u8::is_ascii_whitespace)
    };
    if !empty {
        errors::public_key_removed_check_failed();
    }
    empty
}
