//! WAL-logging of the reservation, through a custom WAL resource manager
//! (PostgreSQL 15+), so that it reaches physical standbys and crash
//! recovery: a standby promoted after its primary died starts every worker
//! id above what the primary reserved, even when its clock is behind.
//!
//! A leaf: it knows the record format and PostgreSQL's WAL calls, nothing of
//! shared memory or the state file. `reservation` registers what replay does
//! with a record ([`init`]).
//!
//! One record type: "reserve", carrying the Unix millisecond up to which the
//! primary may have issued IDs. Logical decoding ignores the records.
//!
//! The resource manager id is [`RMGR_ID`], in the range PostgreSQL sets
//! aside for extensions. Servers that replay this WAL (standbys, crash
//! recovery) must preload snowflake_id, as they must anyway.

use pgrx::pg_sys;
use std::ffi::{c_char, CStr};

/// Our custom resource manager id (128..=255 are for extensions).
pub const RMGR_ID: u8 = 173;
const RMGR_NAME: &CStr = c"snowflake_id";
const XLOG_SNOWFLAKE_RESERVE: u8 = 0x00;

/// What replay does with a reservation record's Unix ms (`on_redo`), and
/// when it stops (`on_redo_end`: at the end of recovery, and when the startup
/// process exits, a standby shutting down). Written once by `init`.
struct Callbacks {
    on_redo: Option<fn(i64)>,
    on_redo_end: Option<fn()>,
}

static CALLBACKS: parking_lot::RwLock<Callbacks> = parking_lot::const_rwlock(Callbacks {
    on_redo: None,
    on_redo_end: None,
});

/// Registers the resource manager. `on_redo` receives each replayed
/// reservation; `on_redo_end` runs when replay ends (end of recovery or
/// exit of the startup process). Called from `_PG_init` while preloading.
pub fn init(on_redo: fn(i64), on_redo_end: fn()) {
    let rmgr = Box::leak(Box::new(pg_sys::RmgrData {
        rm_name: RMGR_NAME.as_ptr(),
        rm_redo: Some(redo),
        rm_desc: Some(desc),
        rm_identify: Some(identify),
        rm_startup: Some(redo_startup),
        rm_cleanup: Some(redo_cleanup),
        ..Default::default()
    }));
    *CALLBACKS.write() = Callbacks {
        on_redo: Some(on_redo),
        on_redo_end: Some(on_redo_end),
    };
    // SAFETY: called while loading shared_preload_libraries, as PostgreSQL
    // requires; the RmgrData lives for the life of the process.
    unsafe { pg_sys::RegisterCustomRmgr(RMGR_ID, rmgr) };
}

/// The redo pointer of the newest checkpoint or restartpoint: it moves when
/// a restartpoint begins on a standby.
pub fn redo_pointer() -> u64 {
    // SAFETY: reads a value in shared memory under its spinlock.
    unsafe { pg_sys::GetRedoRecPtr() }
}

fn redo_end() {
    let on_end = CALLBACKS.read().on_redo_end;
    if let Some(on_end) = on_end {
        on_end();
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn redo_startup() {
    // SAFETY: registering a #[pg_guard] callback with no argument, in the
    // startup process, which runs redo.
    unsafe { pg_sys::before_shmem_exit(Some(redo_exit), pg_sys::Datum::from(0)) };
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn redo_exit(_code: std::ffi::c_int, _arg: pg_sys::Datum) {
    redo_end();
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn redo_cleanup() {
    redo_end();
}

/// Writes and flushes a reservation record. Does nothing during recovery
/// (a hot standby making IDs with its own range cannot write WAL).
pub fn log_reservation(until_ms: i64) {
    // SAFETY: plain calls into the WAL machinery with a record of our own
    // resource manager; the data pointer is valid for the call.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            return;
        }
        let data = until_ms.to_le_bytes();
        pg_sys::XLogBeginInsert();
        // The pointer and length types differ between versions (char * and
        // int on 15, const char * and uint32 on 16-17, const void * on 18).
        pg_sys::XLogRegisterData(data.as_ptr() as _, data.len() as _);
        let lsn = pg_sys::XLogInsert(RMGR_ID, XLOG_SNOWFLAKE_RESERVE);
        pg_sys::XLogFlush(lsn);
    }
}

/// The reservation a record carries.
///
/// # Safety
/// `record` must be a decoded record of our resource manager.
unsafe fn record_until(record: *mut pg_sys::XLogReaderState) -> Option<i64> {
    // SAFETY: per the contract, `record` and its decoded record are valid.
    unsafe {
        let decoded = (*record).record;
        if decoded.is_null() || (*decoded).main_data_len as usize != 8 {
            return None;
        }
        let bytes = std::slice::from_raw_parts((*decoded).main_data as *const u8, 8);
        Some(i64::from_le_bytes(bytes.try_into().ok()?))
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn redo(record: *mut pg_sys::XLogReaderState) {
    // Like PostgreSQL's own resource managers: an unknown record type means
    // WAL this build cannot replay correctly, so stop.
    // SAFETY: PostgreSQL calls redo with a decoded record.
    let info = unsafe {
        let decoded = (*record).record;
        if decoded.is_null() {
            0
        } else {
            (*decoded).header.xl_info & !(pg_sys::XLR_INFO_MASK as u8)
        }
    };
    if info != XLOG_SNOWFLAKE_RESERVE {
        pgrx::ereport!(
            pgrx::PgLogLevel::PANIC,
            pgrx::PgSqlErrorCode::ERRCODE_INTERNAL_ERROR,
            format!("snowflake_id redo: unknown op code {info}")
        );
    }
    // SAFETY: PostgreSQL calls redo with a record of our resource manager.
    let Some(until_ms) = (unsafe { record_until(record) }) else {
        pgrx::error!("malformed snowflake_id reservation record in WAL");
    };
    let on_redo = CALLBACKS.read().on_redo;
    if let Some(on_redo) = on_redo {
        on_redo(until_ms);
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn desc(buf: pg_sys::StringInfo, record: *mut pg_sys::XLogReaderState) {
    // SAFETY: PostgreSQL passes a valid StringInfo and a record of ours.
    unsafe {
        if let Some(until_ms) = record_until(record) {
            let text = std::ffi::CString::new(format!(
                "reserved until {}",
                snowflake_core::layout::format_unix_ms(until_ms)
            ))
            .unwrap_or_default();
            pg_sys::appendStringInfoString(buf, text.as_ptr());
        }
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn identify(_info: u8) -> *const c_char {
    c"RESERVE".as_ptr()
}
