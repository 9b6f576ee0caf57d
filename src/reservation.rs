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

use crate::errors;
use crate::gucs;
use crate::layout::Layout;
use crate::shmem::{self, Header};
use crate::wal;
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering::*;

/// How far beyond the newest ID the state file reserves time, in ms: the
/// state file is written at most once per this interval per server.
pub const RESERVE_MS: i64 = 250;
/// The state file, relative to the data directory (the server's cwd).
pub const STATE_FILE: &str = "snowflake_id.state";

/// The format version written into the state file.
const STATE_FILE_VERSION: u32 = 1;

/// What the state file holds.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
struct StateFile {
    version: u32,
    layout: Layout,
    /// Unix ms up to which IDs may have been issued.
    reserved_until_ms: i64,
}

/// Registers WAL replay. Called from `_PG_init` while preloading.
pub fn init() {
    wal::init(replay);
}

/// Makes sure the state file reserves at least up to `unix_ms`, writing
/// it (durably) when needed. Cheap when already reserved.
#[inline]
pub fn reserve(header: &Header, unix_ms: i64, layout: &Layout) {
    if unix_ms > header.reserved_until_ms.load(Acquire) {
        extend(header, unix_ms, layout);
    }
}

#[cold]
fn extend(header: &Header, unix_ms: i64, layout: &Layout) {
    let _guard = header.reserve_lock();
    if unix_ms <= header.reserved_until_ms.load(Acquire) {
        return;
    }
    let until = unix_ms + RESERVE_MS;
    write_state_file(layout, until);
    wal::log_reservation(until);
    header.reserved_until_ms.store(until, Release);
}

/// Makes every later ID of this server larger than every ID of `layout`
/// made at or before `unix_ms` (any worker id): raises the floor to the end
/// of that tick, the server's newest tick above it, and the durable
/// reservation to it. A generator that is in the middle of an older tick
/// moves above it at its next tick (at most one tick later).
pub fn advance_past(header: &Header, unix_ms: i64, layout: &Layout) {
    let tick = layout.tick_at(unix_ms);
    let end_ms = layout.tick_start_unix_ms(tick) + layout.unit_ms - 1;
    header.floor_ms.fetch_max(end_ms, AcqRel);
    // IDs at `tick` exist for any worker id: continue one tick above it.
    header.newest_tick.fetch_max(tick + 1, AcqRel);
    reserve(header, end_ms, layout);
}

/// WAL replay of a primary's reservation: raises the floor and the
/// reservation to `until_ms`, writing the state file when it grows.
fn replay(until_ms: i64) {
    let Some(header) = shmem::header() else {
        return;
    };
    let _guard = header.reserve_lock();
    header.floor_ms.fetch_max(until_ms, AcqRel);
    if until_ms > header.reserved_until_ms.load(Acquire) {
        let layout = if header.layout_changed.load(Acquire) {
            header.recorded_layout
        } else {
            *gucs::layout()
        };
        write_state_file(&layout, until_ms);
        header.reserved_until_ms.store(until_ms, Release);
    }
}

/// Reads the state file at server start: returns the reservation floor
/// (Unix ms; `i64::MIN` when there is no file) and the recorded layout
/// (`layout` itself when nothing is recorded).
pub fn read_at_startup(layout: &Layout) -> (i64, Layout) {
    match std::fs::read_to_string(STATE_FILE) {
        Ok(text) => match serde_json::from_str::<StateFile>(&text) {
            Ok(state) => (state.reserved_until_ms, state.layout),
            // Without the file we cannot know how far IDs went, or which
            // layout made them: refuse rather than guess.
            Err(e) => errors::state_file_unreadable(STATE_FILE, &e.to_string()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (i64::MIN, *layout),
        Err(e) => errors::state_file("read", STATE_FILE, e),
    }
}

/// Writes the state file durably (temporary file, fsync, rename, fsync of
/// the directory).
fn write_state_file(layout: &Layout, reserved_until_ms: i64) {
    use std::io::Write;
    let state = StateFile {
        version: STATE_FILE_VERSION,
        layout: *layout,
        reserved_until_ms,
    };
    let tmp = format!("{STATE_FILE}.tmp");
    let text = match serde_json::to_string(&state) {
        Ok(text) => text,
        Err(e) => errors::internal(&format!("could not encode the state file: {e}")),
    };
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, STATE_FILE)?;
        std::fs::File::open(".")?.sync_all()
    })();
    if let Err(e) = result {
        errors::state_file("write", STATE_FILE, e);
    }
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
    write_state_file(layout, until);
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
