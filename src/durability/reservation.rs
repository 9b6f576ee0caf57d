//! The reservation: how far IDs may go, made durable before an ID is
//! returned, so that no ID repeats after a restart, a crash, a promotion or
//! a layout change.
//!
//! - The state file `snowflake_id.state` in the data directory records the
//!   reservation (Unix ms) and the layout that made the IDs.
//! - Each extension is also WAL-logged (`wal`), so standbys and crash
//!   recovery replay it.
//! - The floor: at startup, replay and after an accepted layout change,
//!   every claim starts its generator above `Header::floor_ms`.
//! - High-water marks found later ([`advance_past`]: the registry table read
//!   at startup after `pg_upgrade`, rows a restore brings back, a DBA's
//!   `snowflake_advance_past()`) raise the floor, the server's newest tick
//!   (so generators that already run jump above them too) and the durable
//!   reservation (so a restart keeps them).
//!
//! All changes happen under `Header::reserve_lock` (see `shmem`).

use crate::clock;
use crate::durability::wal;
use crate::errors;
use crate::settings;
use crate::shmem::{self, Header, Startup};
use pgrx::pg_sys;
use serde::{Deserialize, Serialize};
use snowflake_core::layout::Layout;
use snowflake_core::promotion::{self, Floor, RecoveryEnd, WaitEnd};
use std::ffi::CStr;
use std::sync::atomic::Ordering::*;

/// How far beyond the newest ID the state file reserves time, in ms.
///
/// Each extension costs the backend that makes it a state file write and
/// fsync and a WAL flush (1.3-1.7 ms here), and a session's first ID after
/// a pause longer than this pays it inline. 1 s keeps that to about one
/// call per second of ID time and server (250 ms, before 0.7.0, cost case
/// 1 of the bench 1.5 ns per ID in wall time: every query of 1M IDs made
/// one); the price is a floor up to 1 s ahead of the clock after a crash
/// (`claims::FLOOR_WAIT_MS` covers it).
pub const RESERVE_MS: i64 = 1000;
/// How long before the newest ID reaches the reservation it is extended,
/// in ms: the backend whose ID comes within this of it extends it (if the
/// lock is free; others go on), so that while one backend writes and
/// fsyncs, the others keep making IDs below the old reservation instead of
/// waiting for it. The state file is then written about once per
/// `RESERVE_MS - EXTEND_AHEAD_MS` per server (800 ms); an extension slower
/// than this makes the backends that reach the reservation wait, as before.
pub const EXTEND_AHEAD_MS: i64 = 200;
// An extension ahead of time must still raise the reservation.
const _: () = assert!(EXTEND_AHEAD_MS < RESERVE_MS);
/// The state file, relative to the data directory (the server's cwd).
pub const STATE_FILE: &str = "snowflake_id.state";

/// The format version written into the state file: 2 added the backfill
/// grants (a build that knows only 1 refuses the file rather than drop
/// them on its next write).
const STATE_FILE_VERSION: u32 = 2;

/// What the state file holds.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct StateFile {
    version: u32,
    layout: Layout,
    /// Unix ms up to which IDs may have been issued.
    reserved_until_ms: i64,
    /// Backfill grants (`durability::backfill`); empty in version 1.
    #[serde(default)]
    backfill: BackfillRecord,
}

/// The backfill part of the state file.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct BackfillRecord {
    /// The set-aside ids the grants are numbered across.
    ids: String,
    /// No backfill ID at or before this Unix ms (an accepted layout change).
    after_ms: i64,
    /// `(bucket, grants handed out)` of every bucket with grants.
    grants: Vec<(u32, u32)>,
}

impl Default for BackfillRecord {
    fn default() -> Self {
        BackfillRecord {
            ids: String::new(),
            after_ms: i64::MIN,
            grants: Vec::new(),
        }
    }
}

/// Registers WAL replay. Called from `_PG_init` while preloading.
pub fn init() {
    wal::init(replay, recovery_end, persist_replayed);
}

/// Makes sure the state file reserves at least up to `unix_ms`, writing
/// it (durably) when needed, and extends it ahead of time when `unix_ms`
/// is within [`EXTEND_AHEAD_MS`] of it. Cheap otherwise.
#[inline]
pub fn reserve(header: &Header, unix_ms: i64, layout: &Layout) {
    if extension_due(unix_ms, header.reserved_until_ms.load(Acquire)) {
        extend(header, unix_ms, layout);
    }
}

/// Whether an ID at `unix_ms` calls for an extension of the reservation
/// `reserved`: it is past it or within [`EXTEND_AHEAD_MS`] of its end.
#[inline]
fn extension_due(unix_ms: i64, reserved: i64) -> bool {
    unix_ms > reserved.saturating_sub(EXTEND_AHEAD_MS)
}

/// Extends the reservation to `RESERVE_MS` beyond `unix_ms`. The state
/// file's fsync and the WAL flush run under `reserve_lock`, and no backend
/// waits for that lock uninterruptibly: others try it without waiting.
/// While `unix_ms` is still reserved (an extension ahead of time) a backend
/// that does not get the lock returns at once: its IDs are covered, and
/// whoever holds the lock is extending. Only past the reservation does it
/// sleep on its latch for 1 ms at a time (cancel, timeouts and postmaster
/// death are served) until the reservation covers `unix_ms`.
#[cold]
fn extend(header: &Header, unix_ms: i64, layout: &Layout) {
    loop {
        let reserved = header.reserved_until_ms.load(Acquire);
        if !extension_due(unix_ms, reserved) {
            return;
        }
        if let Some(_guard) = header.try_reserve_lock() {
            if !extension_due(unix_ms, header.reserved_until_ms.load(Acquire)) {
                return;
            }
            // Covers a floor raised by replay (hot standby) as well. (With
            // ticks of EXTEND_AHEAD_MS or more, this reaches into the next
            // tick, so that its first ID finds the reservation extended
            // ahead rather than past; a restart then skips that tick.)
            let until = (unix_ms + RESERVE_MS).max(header.floor_ms.load(Acquire));
            write_state_file(header, &layout_to_record(header, layout), until);
            if let Some(lsn) = wal::log_reservation(until) {
                // Where synchronous standbys are named, a promoted one must
                // have every reservation an ID was handed out under. An
                // interrupted wait fails closed: the reservation in force
                // stays the one before (the state file's higher value only
                // raises this server's own floor).
                if wal::wait_for_sync_standbys(lsn) == WaitEnd::Interrupted {
                    errors::reservation_not_replicated();
                }
            }
            header.reserved_until_ms.store(until, Release);
            return;
        }
        if unix_ms <= reserved {
            return;
        }
        clock::wait_ms(1);
    }
}

/// The layout the state file records: the one it recorded before, while
/// a changed layout waits for `snowflake_accept_layout()` (else a write of
/// the reservation would adopt the new layout behind the refusal's back,
/// and the next start would make IDs in it without moving above the old
/// one's); otherwise `current`.
fn layout_to_record(header: &Header, current: &Layout) -> Layout {
    if header.layout_changed.load(Acquire) {
        header.recorded_layout
    } else {
        *current
    }
}

/// Makes every later ID of this server larger than every ID of `layout`
/// made at or before `unix_ms` (any worker id): raises the floor to the end
/// of that tick, the server's newest tick above it, and the durable
/// reservation to it. A generator that is in the middle of an older tick
/// moves above it at its next tick (at most one tick later).
pub fn advance_past(header: &Header, unix_ms: i64, layout: &Layout) {
    let tick = layout.tick_at(unix_ms);
    let end_ms = layout
        .tick_start_unix_ms(tick)
        .saturating_add(layout.unit_ms - 1);
    header.floor_ms.fetch_max(end_ms, AcqRel);
    // IDs at `tick` exist for any worker id: continue one tick above it.
    header.newest_tick.fetch_max(tick + 1, AcqRel);
    reserve(header, end_ms, layout);
}

/// WAL replay of a primary's reservation: raises the floor in shared
/// memory only. Writing the state file (an fsync) for every record would
/// cost a standby catching up on a day of WAL ~345,000 fsyncs. Instead it
/// is written
/// - when a restartpoint has begun since the last write (checked at each
///   record): a restartpoint removes the WAL before its redo pointer, and
///   the records replayed before it began are then in the file;
/// - when replay ends: end of recovery (promotion, end of crash recovery)
///   and exit of the startup process (a standby's shutdown);
/// - by any claim on a hot standby: its first ID is above the floor, and
///   extending the reservation writes the floor with it.
///
/// Records after the last restartpoint are replayed again after a crash,
/// so the floor is rebuilt from the file plus that WAL. `reserved_until_ms`
/// (what the hot path trusts as durable) moves only with the file.
///
/// Known window: the write for a restartpoint happens at the first record
/// after it began. If a standby crashes after a restartpoint completed and
/// before any later reservation record arrived (the primary made no IDs in
/// between), the file lacks the records replayed since the previous write;
/// they are at least a checkpoint old, so a promoted standby repeats IDs
/// only if its clock is that far behind. PostgreSQL has no checkpoint hook
/// for extensions that would close it.
fn replay(until_ms: i64) {
    let Some(header) = shmem::header() else {
        return;
    };
    header.floor_ms.fetch_max(until_ms, AcqRel);
    persist_at_restartpoint();
}

/// The end of recovery: after archive recovery (a promotion, a restore
/// ending recovery) IDs start above this server's clock plus
/// `standby_clock_skew` plus `max_drift` too, which covers the IDs of a
/// primary whose last reservations never reached this server
/// (`snowflake_core::promotion`). Runs in the startup process, before any
/// backend can make IDs as a primary; the state file is written right
/// after (`persist_replayed`), so a restart keeps the floor. The first ID
/// above the floor extends the reservation (it is within
/// `EXTEND_AHEAD_MS` of it), so the floor reaches this server's WAL and
/// its synchronous standbys before any ID above it is returned.
fn recovery_end(end: RecoveryEnd) {
    let Some(header) = shmem::header() else {
        return;
    };
    if end == RecoveryEnd::Crash {
        return;
    }
    let replayed_ms = header
        .floor_ms
        .load(Acquire)
        .max(header.reserved_until_ms.load(Acquire));
    let at = promotion::AtRecoveryEnd {
        end,
        replayed_ms,
        now_ms: clock::unix_ms(),
        standby_clock_skew_ms: settings::standby_clock_skew_ms(),
        max_drift_ms: settings::max_drift_ms(),
    };
    let floor = promotion::floor_at_recovery_end(&at);
    if let Floor::ClockBound(ms) = floor {
        let layout = settings::layout();
        let tick = layout.tick_at(ms);
        let end_ms = layout
            .tick_start_unix_ms(tick)
            .saturating_add(layout.unit_ms - 1);
        header.floor_ms.fetch_max(end_ms, AcqRel);
        header.newest_tick.fetch_max(tick + 1, AcqRel);
    }
    pgrx::log!(
        "snowflake_id: recovery ended as a new primary: IDs start above {} ({}; the replayed reservation {}, this server's clock {} + standby_clock_skew {} ms + max_drift {} ms)",
        snowflake_core::layout::format_unix_ms(floor.ms()),
        match floor {
            Floor::ClockBound(_) => "the clock bound",
            Floor::Replayed(_) => "the replayed reservation",
        },
        if replayed_ms == i64::MIN {
            "none".to_string()
        } else {
            snowflake_core::layout::format_unix_ms(replayed_ms)
        },
        snowflake_core::layout::format_unix_ms(at.now_ms),
        at.standby_clock_skew_ms,
        at.max_drift_ms,
    );
}

/// During replay: writes the replayed state to the state file when a
/// restartpoint has begun since the last write.
fn persist_at_restartpoint() {
    /// The redo pointer when replay last wrote the state file.
    static PERSISTED_AT_REDO: parking_lot::Mutex<u64> = parking_lot::const_mutex(0);
    let redo = wal::redo_pointer();
    if *PERSISTED_AT_REDO.lock() != redo {
        persist_replayed();
        *PERSISTED_AT_REDO.lock() = redo;
    }
}

/// Writes the state file again with what shared memory holds now (the
/// caller holds `reserve_lock`): after a backfill grant.
pub(crate) fn rewrite_state_file(header: &Header) {
    let until = header.reserved_until_ms.load(Acquire);
    write_state_file(header, &layout_to_record(header, settings::layout()), until);
}

/// Writes the replayed floor to the state file when it is above what the
/// file holds, and replayed backfill grants it does not hold yet.
pub(crate) fn persist_replayed() {
    let Some(header) = shmem::header() else {
        return;
    };
    let _guard = header.reserve_lock();
    let floor = header.floor_ms.load(Acquire);
    let until = header.reserved_until_ms.load(Acquire);
    if floor > until || header.backfill().replayed.swap(false, AcqRel) {
        write_state_file(
            header,
            &layout_to_record(header, settings::layout()),
            floor.max(until),
        );
        header.reserved_until_ms.store(floor.max(until), Release);
    }
}

/// Reads the state file at server start: the reservation floor (Unix ms;
/// `i64::MIN` when there is no file), the recorded layout (`layout` itself
/// when nothing is recorded) and the backfill grants. Runs once, in the
/// postmaster, before any backend exists, so plain file access is used.
pub fn read_at_startup(layout: &Layout) -> Startup {
    let none = || Startup {
        floor_ms: i64::MIN,
        layout: *layout,
        backfill_after_ms: i64::MIN,
        backfill_ids: String::new(),
        backfill_grants: Vec::new(),
    };
    match std::fs::read_to_string(STATE_FILE) {
        Ok(text) => match parse_state_file(&text) {
            Ok(state) => Startup {
                floor_ms: state.reserved_until_ms,
                layout: state.layout,
                backfill_after_ms: state.backfill.after_ms,
                backfill_ids: state.backfill.ids,
                backfill_grants: state.backfill.grants,
            },
            Err(StateFileError::TooNew(version)) => {
                errors::state_file_too_new(STATE_FILE, version, STATE_FILE_VERSION)
            }
            // Without the file we cannot know how far IDs went, or which
            // layout made them: refuse rather than guess.
            Err(StateFileError::Unreadable(problem)) => {
                errors::state_file_unreadable(STATE_FILE, &problem)
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => none(),
        Err(e) => errors::state_file("read", STATE_FILE, e),
    }
}

#[derive(Debug, PartialEq)]
enum StateFileError {
    /// Written by a newer build, in a format this one does not know.
    TooNew(u32),
    Unreadable(String),
}

/// Parses the state file, checking its format version first: every version
/// up to [`STATE_FILE_VERSION`] is read (fields added by later versions get
/// serde defaults), a later one is refused.
fn parse_state_file(text: &str) -> Result<StateFile, StateFileError> {
    #[derive(Deserialize)]
    struct Version {
        version: u32,
    }
    let unreadable = |e: serde_json::Error| StateFileError::Unreadable(e.to_string());
    let Version { version } = serde_json::from_str(text).map_err(unreadable)?;
    if version > STATE_FILE_VERSION {
        return Err(StateFileError::TooNew(version));
    }
    if version == 0 {
        return Err(StateFileError::Unreadable("format version 0".into()));
    }
    let state: StateFile = serde_json::from_str(text).map_err(unreadable)?;
    // A damaged or hand-edited layout must not be used (a unit of 0 would
    // divide by zero when a changed layout is accepted).
    state
        .layout
        .check_ranges()
        .map_err(|e| StateFileError::Unreadable(format!("its layout is invalid: {e}")))?;
    Ok(state)
}

/// The temporary file the state file is written to before it is renamed.
const STATE_FILE_TMP: &CStr = c"snowflake_id.state.tmp";
const STATE_FILE_C: &CStr = c"snowflake_id.state";

/// Writes the state file durably, the way PostgreSQL writes its own small
/// files: a temporary file opened through PostgreSQL's fd accounting
/// (`OpenTransientFile`), then `durable_rename`, which fsyncs the file,
/// renames it and fsyncs the directory, under PostgreSQL's fsync-failure
/// policy (`data_sync_retry`: a failed fsync is a PANIC by default). Each
/// error names the file that failed. The backfill grants are read from
/// shared memory: the caller holds `reserve_lock`, under which they change.
fn write_state_file(header: &Header, layout: &Layout, reserved_until_ms: i64) {
    let backfill = header.backfill();
    // Only once some counter was raised: a server that makes no backfill
    // IDs does not read 16,384 counters at every extension.
    let grants: Vec<(u32, u32)> = if backfill.used.load(Acquire) {
        backfill
            .grants
            .iter()
            .enumerate()
            .filter_map(|(bucket, n)| {
                let n = n.load(Acquire);
                (n > 0).then_some((bucket as u32, n))
            })
            .collect()
    } else {
        Vec::new()
    };
    let state = StateFile {
        version: STATE_FILE_VERSION,
        layout: *layout,
        reserved_until_ms,
        backfill: BackfillRecord {
            ids: backfill.recorded_ids.get(),
            after_ms: backfill.after_ms.load(Acquire),
            grants,
        },
    };
    let text = match serde_json::to_string(&state) {
        Ok(text) => text,
        Err(e) => errors::internal(&format!("could not encode the state file: {e}")),
    };
    write_durably(STATE_FILE_TMP, STATE_FILE_C, &text);
}

/// Writes `text` to the data-directory file `name` durably, through the
/// temporary file `tmp` (see [`write_state_file`]). Errors are raised.
pub fn write_durably(tmp: &CStr, name: &CStr, text: &str) {
    use std::io::Write;
    use std::os::fd::FromRawFd;
    let tmp_name = tmp.to_string_lossy();
    let tmp_name = tmp_name.as_ref();
    // SAFETY: opening a file by a C name through PostgreSQL's fd
    // accounting; the descriptor is closed below on every path.
    let fd = unsafe {
        pg_sys::OpenTransientFile(
            tmp.as_ptr(),
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | pg_sys::PG_BINARY as i32,
        )
    };
    if fd < 0 {
        errors::state_file("create", tmp_name, std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is an open descriptor we own; ManuallyDrop keeps `File`
    // from closing it, CloseTransientFile does (and updates the accounting).
    let mut file = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(fd) });
    let written = file.write_all(text.as_bytes());
    // SAFETY: closing the transient file opened above.
    let closed = unsafe { pg_sys::CloseTransientFile(fd) };
    if let Err(e) = written {
        errors::state_file("write", tmp_name, e);
    }
    if closed != 0 {
        errors::state_file("close", tmp_name, std::io::Error::last_os_error());
    }
    // SAFETY: C names; durable_rename reports its own errors (naming
    // both files) at ERROR, or PANIC for a failed fsync as data_sync_retry
    // requires.
    unsafe { pg_sys::durable_rename(tmp.as_ptr(), name.as_ptr(), pg_sys::PGERROR as i32) };
}

/// Adopts `layout` after the server started with a layout other than the
/// recorded one: claims start above every ID the old layout can have
/// issued, and the state file records the new layout. Returns the first
/// tick new IDs may use. Nothing changes when `layout` cannot get above the
/// old IDs, or only after `latest_ms` (the generator could not issue until
/// then). No claim exists yet: claims are refused until the layout is
/// accepted.
pub fn accept_layout(header: &Header, layout: &Layout, latest_ms: i64) -> Result<i64, AcceptError> {
    let _guard = header.reserve_lock();
    let until = header.reserved_until_ms.load(Acquire);
    let first = layout
        .first_tick_above(&header.recorded_layout, until)
        .ok_or(AcceptError::CannotRise)?
        .max(layout.tick_at(until) + 1);
    if layout.tick_start_unix_ms(first) > latest_ms {
        return Err(AcceptError::NotUntil(layout.tick_start_unix_ms(first)));
    }
    // Every ID at or below the tick before `first` counts as issued.
    let floor_ms = layout.tick_start_unix_ms(first) - 1;
    let until = until.max(floor_ms);
    // IDs of the old layout may have any bits at or before the change
    // (backfill IDs too: they extend the reservation like live ones): no
    // backfill ID at or before it. The grant counters stay as they are
    // (they only ever grow): set back, they would hand out grants a
    // concurrent backfill, or a primary whose WAL a promoted standby
    // replayed, already used.
    header.backfill().after_ms.fetch_max(floor_ms, AcqRel);
    write_state_file(header, layout, until);
    header.floor_ms.fetch_max(floor_ms, AcqRel);
    header.reserved_until_ms.store(until, Release);
    header.layout_changed.store(false, Release);
    Ok(first)
}

/// Why a layout cannot be adopted.
pub enum AcceptError {
    /// No ID of the new layout is above the old IDs.
    CannotRise,
    /// New IDs would only get above the old ones at this Unix ms.
    NotUntil(i64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_file_versions_up_to_this_build_are_read_later_ones_refused() {
        // Exactly what 0.1.0 writes (format version 1).
        let v1 = r#"{"version":1,"layout":{"epoch_ms":1704067200000,"unit_ms":1,"total_bits":63,"worker_bits":10,"sequence_bits":12},"reserved_until_ms":1795305600250}"#;
        let state = parse_state_file(v1).unwrap();
        assert_eq!(state.reserved_until_ms, 1_795_305_600_250);
        assert_eq!(state.backfill, BackfillRecord::default());
        // Version 2 carries the backfill grants.
        let v2 = StateFile {
            version: 2,
            backfill: BackfillRecord {
                ids: "1020-1023".into(),
                after_ms: 5,
                grants: vec![(3, 7), (16383, 1)],
            },
            ..state
        };
        let text = serde_json::to_string(&v2).unwrap();
        assert_eq!(parse_state_file(&text), Ok(v2));
        let future = v1.replace(r#""version":1"#, r#""version":99"#);
        assert_eq!(parse_state_file(&future), Err(StateFileError::TooNew(99)));
        assert!(matches!(
            parse_state_file("{}"),
            Err(StateFileError::Unreadable(_))
        ));
        // Well-formed, but a layout no setting can make: refused too.
        for (field, bad) in [
            (r#""unit_ms":1"#, r#""unit_ms":0"#),
            (r#""total_bits":63"#, r#""total_bits":200"#),
            (r#""sequence_bits":12"#, r#""sequence_bits":60"#),
        ] {
            let damaged = v1.replace(field, bad);
            assert!(
                matches!(&parse_state_file(&damaged), Err(StateFileError::Unreadable(p)) if p.contains("layout is invalid")),
                "{bad}"
            );
        }
    }
}
