//! WAL-logging of the reservation, through a custom WAL resource manager
//! (PostgreSQL 15+), so that it reaches physical standbys and crash
//! recovery: a standby promoted after its primary died starts every worker
//! id above what the primary reserved, even when its clock is behind.
//!
//! A leaf: it knows the record format and PostgreSQL's WAL calls, nothing of
//! shared memory or the state file. `reservation` registers what replay does
//! with a record ([`init`]).
//!
//! Two record types: "reserve", carrying the Unix millisecond up to which the
//! primary may have issued IDs, and "backfill grant", carrying a bucket and
//! the number of grants handed out in it (`durability::backfill`). Logical
//! decoding ignores the records.
//!
//! The resource manager id is [`RMGR_ID`], in the range PostgreSQL sets
//! aside for extensions. Servers that replay this WAL (standbys, crash
//! recovery) must preload snowflake_id, as they must anyway.

use pgrx::pg_sys;
use snowflake_core::promotion::{self, RecoveryEnd, ReservationWait, SyncCommit, WaitEnd};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Our custom resource manager id (128..=255 are for extensions).
pub const RMGR_ID: u8 = 173;
const RMGR_NAME: &CStr = c"snowflake_id";
const XLOG_SNOWFLAKE_RESERVE: u8 = 0x00;
const XLOG_SNOWFLAKE_BACKFILL: u8 = 0x10;

/// What replay does with a reservation record's Unix ms (`on_redo`), and
/// when it stops (`on_redo_end`: at the end of recovery, and when the startup
/// process exits, a standby shutting down). Written once by `init`.
struct Callbacks {
    on_redo: Option<fn(i64)>,
    on_recovery_end: Option<fn(RecoveryEnd)>,
    on_redo_end: Option<fn()>,
    on_backfill: Option<fn(u32, u32)>,
}

static CALLBACKS: parking_lot::RwLock<Callbacks> = parking_lot::const_rwlock(Callbacks {
    on_redo: None,
    on_recovery_end: None,
    on_redo_end: None,
    on_backfill: None,
});

/// Registers the resource manager. `on_redo` receives each replayed
/// reservation; `on_recovery_end` runs when recovery ends (not when a
/// standby shuts down), told how; then `on_redo_end` runs when replay ends
/// (end of recovery or exit of the startup process). Called from
/// `_PG_init` while preloading.
pub fn init(on_redo: fn(i64), on_recovery_end: fn(RecoveryEnd), on_redo_end: fn()) {
    let rmgr = Box::leak(Box::new(pg_sys::RmgrData {
        rm_name: RMGR_NAME.as_ptr(),
        rm_redo: Some(redo),
        rm_desc: Some(desc),
        rm_identify: Some(identify),
        rm_startup: Some(redo_startup),
        rm_cleanup: Some(redo_cleanup),
        ..Default::default()
    }));
    let mut callbacks = CALLBACKS.write();
    callbacks.on_redo = Some(on_redo);
    callbacks.on_recovery_end = Some(on_recovery_end);
    callbacks.on_redo_end = Some(on_redo_end);
    drop(callbacks);
    // SAFETY: called while loading shared_preload_libraries, as PostgreSQL
    // requires; the RmgrData lives for the life of the process.
    unsafe { pg_sys::RegisterCustomRmgr(RMGR_ID, rmgr) };
}

/// Registers what replay does with a backfill grant record (bucket,
/// grants). Called from `_PG_init` while preloading, before [`init`].
pub fn init_backfill(on_backfill: fn(u32, u32)) {
    CALLBACKS.write().on_backfill = Some(on_backfill);
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

/// The end of recovery (PostgreSQL calls every resource manager's cleanup
/// once redo is done, before the server accepts writes; not when a standby
/// shuts down).
#[pgrx::pg_guard]
unsafe extern "C-unwind" fn redo_cleanup() {
    // SAFETY: a plain read of a flag the startup process set when it read
    // the signal files, before redo began.
    let end = if unsafe { pg_sys::ArchiveRecoveryRequested } {
        RecoveryEnd::Archive
    } else {
        RecoveryEnd::Crash
    };
    let on_recovery_end = CALLBACKS.read().on_recovery_end;
    if let Some(on_recovery_end) = on_recovery_end {
        on_recovery_end(end);
    }
    redo_end();
}

/// Writes and flushes a reservation record; returns its end, or `None`
/// during recovery (a hot standby making IDs with its own range cannot
/// write WAL).
pub fn log_reservation(until_ms: i64) -> Option<u64> {
    log(XLOG_SNOWFLAKE_RESERVE, until_ms.to_le_bytes())
}

extern "C-unwind" {
    /// PostgreSQL's assign hook of `synchronous_commit` (syncrep.c, in
    /// every supported version): sets the mode `SyncRepWaitForLSN` waits in.
    fn assign_synchronous_commit(newval: c_int, extra: *mut c_void);
}

/// This session's `synchronous_commit` raised to `on` until dropped, so
/// that `SyncRepWaitForLSN` waits for the standbys' flush whatever the
/// session asked for its own commits.
struct SyncCommitRaised(c_int);

impl SyncCommitRaised {
    fn raise() -> Self {
        // SAFETY: the GUC variable and its assign hook, on this backend's
        // thread; restored in `drop`, also when an error unwinds.
        unsafe {
            let old = pg_sys::synchronous_commit;
            let on = pg_sys::SyncCommitLevel::SYNCHRONOUS_COMMIT_REMOTE_FLUSH as c_int;
            pg_sys::synchronous_commit = on;
            assign_synchronous_commit(on, std::ptr::null_mut());
            SyncCommitRaised(old)
        }
    }
}

impl Drop for SyncCommitRaised {
    fn drop(&mut self) {
        // SAFETY: as in `raise`.
        unsafe {
            pg_sys::synchronous_commit = self.0;
            assign_synchronous_commit(self.0, std::ptr::null_mut());
        }
    }
}

/// Waits until the synchronous standbys `synchronous_standby_names` names
/// have flushed the WAL up to `lsn` (a reservation record's end), as a
/// commit waits: a cancel, `statement_timeout` or termination ends the wait
/// (`WaitEnd::Interrupted`: PostgreSQL logs a WARNING; the caller must not
/// use the reservation). No wait where none is named (`NotRequired`). The
/// caller holds an LWLock, so interrupts are held off, as
/// `SyncRepWaitForLSN` requires.
pub fn wait_for_sync_standbys(lsn: u64) -> WaitEnd {
    // SAFETY: reads of GUC variables of this backend.
    let (in_recovery, senders, named, session) = unsafe {
        let names = pg_sys::SyncRepStandbyNames;
        (
            pg_sys::RecoveryInProgress(),
            pg_sys::max_wal_senders,
            !names.is_null() && *names != 0,
            SyncCommit::from_pg(pg_sys::synchronous_commit),
        )
    };
    let ReservationWait::Standbys {
        raise_session_to_flush,
    } = promotion::reservation_wait(in_recovery, senders, named, session)
    else {
        return WaitEnd::NotRequired;
    };
    let raised = raise_session_to_flush.then(SyncCommitRaised::raise);
    // SAFETY: PostgreSQL's commit-time wait, with interrupts held off (the
    // caller's LWLock); `commit = false` waits for the standbys' flush.
    unsafe { pg_sys::SyncRepWaitForLSN(lsn, false) };
    drop(raised);
    // SAFETY: WalSndCtl is PostgreSQL's shared memory (set when there are
    // WAL senders, checked non-null); the flush position is one aligned
    // 64-bit word that walsenders write under SyncRepLock, read here once.
    let (flushed, interrupted) = unsafe {
        let ctl = pg_sys::WalSndCtl;
        let flushed = if ctl.is_null() {
            0
        } else {
            std::ptr::read_volatile(&raw const (*ctl).lsn[pg_sys::SYNC_REP_WAIT_FLUSH as usize])
        };
        (flushed, pg_sys::InterruptPending != 0)
    };
    promotion::wait_end(flushed, lsn, interrupted)
}

/// Writes backfill grant records, one per `(bucket, grants)`: `grants` of
/// `bucket` are handed out; flushed once after the last, whose end it
/// returns. Does nothing during recovery (backfill is refused there).
pub fn log_backfill_grants(counts: &[(u32, u32)]) -> Option<u64> {
    // SAFETY: plain calls into the WAL machinery with records of our own
    // resource manager; each data pointer is valid for its call.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            return None;
        }
        let mut last = 0;
        for &(bucket, grants) in counts {
            let mut data = [0u8; 8];
            data[..4].copy_from_slice(&bucket.to_le_bytes());
            data[4..].copy_from_slice(&grants.to_le_bytes());
            pg_sys::XLogBeginInsert();
            pg_sys::XLogRegisterData(data.as_ptr() as _, data.len() as _);
            last = pg_sys::XLogInsert(RMGR_ID, XLOG_SNOWFLAKE_BACKFILL);
        }
        if last != 0 {
            pg_sys::XLogFlush(last);
        }
        (last != 0).then_some(last)
    }
}

fn log(info: u8, data: [u8; 8]) -> Option<u64> {
    // SAFETY: plain calls into the WAL machinery with a record of our own
    // resource manager; the data pointer is valid for the call.
    unsafe {
        if pg_sys::RecoveryInProgress() {
            return None;
        }
        pg_sys::XLogBeginInsert();
        // The pointer and length types differ between versions (char * and
        // int on 15, const char * and uint32 on 16-17, const void * on 18).
        pg_sys::XLogRegisterData(data.as_ptr() as _, data.len() as _);
        let lsn = pg_sys::XLogInsert(RMGR_ID, info);
        pg_sys::XLogFlush(lsn);
        Some(lsn)
    }
}

/// The 8 bytes a record of ours carries.
///
/// # Safety
/// `record` must be a decoded record of our resource manager.
unsafe fn record_data(record: *mut pg_sys::XLogReaderState) -> Option<[u8; 8]> {
    // SAFETY: per the contract, `record` and its decoded record are valid.
    unsafe {
        let decoded = (*record).record;
        if decoded.is_null() || (*decoded).main_data_len as usize != 8 {
            return None;
        }
        let bytes = std::slice::from_raw_parts((*decoded).main_data as *const u8, 8);
        bytes.try_into().ok()
    }
}

/// The reservation a record carries.
///
/// # Safety
/// `record` must be a decoded record of our resource manager.
unsafe fn record_until(record: *mut pg_sys::XLogReaderState) -> Option<i64> {
    // SAFETY: as the caller promises.
    unsafe { record_data(record) }.map(i64::from_le_bytes)
}

/// The record type of a decoded record (0 when there is none).
///
/// # Safety
/// `record` must be a decoded record of our resource manager.
unsafe fn record_info(record: *mut pg_sys::XLogReaderState) -> u8 {
    // SAFETY: as the caller promises.
    unsafe {
        let decoded = (*record).record;
        if decoded.is_null() {
            0
        } else {
            (*decoded).header.xl_info & !(pg_sys::XLR_INFO_MASK as u8)
        }
    }
}

/// A backfill grant record's bucket and grants.
fn split_grant(data: [u8; 8]) -> (u32, u32) {
    let [a, b, c, d, e, f, g, h] = data;
    (
        u32::from_le_bytes([a, b, c, d]),
        u32::from_le_bytes([e, f, g, h]),
    )
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn redo(record: *mut pg_sys::XLogReaderState) {
    // Like PostgreSQL's own resource managers: an unknown record type means
    // WAL this build cannot replay correctly, so stop.
    // SAFETY: PostgreSQL calls redo with a decoded record of ours.
    let info = unsafe { record_info(record) };
    if info == XLOG_SNOWFLAKE_BACKFILL {
        // SAFETY: PostgreSQL calls redo with a record of our resource manager.
        let Some(data) = (unsafe { record_data(record) }) else {
            pgrx::error!("malformed snowflake_id backfill record in WAL");
        };
        let (bucket, grants) = split_grant(data);
        let on_backfill = CALLBACKS.read().on_backfill;
        if let Some(on_backfill) = on_backfill {
            on_backfill(bucket, grants);
        }
        return;
    }
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
        let text = match (record_info(record), record_data(record)) {
            (XLOG_SNOWFLAKE_BACKFILL, Some(data)) => {
                let (bucket, grants) = split_grant(data);
                format!("backfill bucket {bucket}: {grants} grants")
            }
            (_, Some(data)) => format!(
                "reserved until {}",
                snowflake_core::layout::format_unix_ms(i64::from_le_bytes(data))
            ),
            (_, None) => return,
        };
        let text = std::ffi::CString::new(text).unwrap_or_default();
        pg_sys::appendStringInfoString(buf, text.as_ptr());
    }
}

#[pgrx::pg_guard]
unsafe extern "C-unwind" fn identify(info: u8) -> *const c_char {
    if info & !(pg_sys::XLR_INFO_MASK as u8) == XLOG_SNOWFLAKE_BACKFILL {
        c"BACKFILL_GRANT".as_ptr()
    } else {
        c"RESERVE".as_ptr()
    }
}
