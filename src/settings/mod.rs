//! The `snowflake_id.*` settings: one load phase, then typed getters.
//!
//! `_PG_init` calls [`load`] once. It defines every setting, checks what
//! the configuration wrote and returns one validated [`Config`] — the
//! layout, the ids set aside for backfill, where worker ids come from —
//! or refuses the start with every problem it found. The postmaster
//! settings are read there and never again. The sighup settings
//! (`worker_ids`, `max_drift`, the lease settings, the public key file)
//! are checked by their hooks on every reload and read by their getters
//! when used.
//!
//! - `define`      the table of definitions: every setting, in order
//! - `load`        the load phase: placeholders, refusals, the collector
//!   the check hooks report to while it runs
//! - `layout`      the layout and time settings: rules, hooks, getters
//! - `worker_ids`  the live worker ids, and the check of any id list
//! - `backfill`    the ids set aside for backfill IDs
//! - `fleet`       the registry, leases, Citus; connection-string rules
//! - `public_keys` the public key file (and the removed `public_key`)

mod backfill;
mod define;
mod fleet;
mod layout;
mod load;
mod public_keys;
mod worker_ids;

pub use backfill::backfill_ids_text;
pub use fleet::{
    lease_replication, lease_time_ms, max_blocks, registry, registry_database, registry_options,
    Fleet,
};
pub use layout::{
    drift_can_cover, layout_end_warning_years, max_drift_ms, preset_name, standby_clock_skew_ms,
    warn_if_layout_ends_soon,
};
pub use public_keys::{public_key_stamp, public_keys};
pub use worker_ids::worker_ranges;

use crate::errors;
use pgrx::pg_sys;
use snowflake_core::backfill::Space;
use snowflake_core::layout::Layout;
use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// What the settings decided at load, for the life of the process.
#[derive(Debug)]
pub struct Config {
    /// The ID layout.
    pub layout: Layout,
    /// The ids set aside for backfill (`None`: no backfill).
    pub backfill: Option<Space>,
    /// Where worker ids come from.
    pub fleet: Fleet,
    /// Whether the registry worker runs.
    pub registry_worker: bool,
}

/// The configuration in use, set once by [`load`].
static CONFIG: OnceLock<Config> = OnceLock::new();

/// The load phase ([`load::load`]): the validated configuration, kept for
/// the life of the process; an ERROR refuses the start (when preloading)
/// or the load. `preloading`: called while `shared_preload_libraries`
/// loads (PostgreSQL only allows postmaster settings to be defined then;
/// loaded on demand, the layout settings are superuser settings, so the
/// decoders still follow postgresql.conf). `on_max_drift_change` runs in
/// each process whenever `snowflake_id.max_drift` changes there, before the
/// new value is in force.
pub fn load(preloading: bool, on_max_drift_change: fn()) -> &'static Config {
    layout::on_max_drift_change(on_max_drift_change);
    let config = load::load(preloading);
    CONFIG.get_or_init(|| config)
}

/// The configuration decided at load.
pub fn config() -> &'static Config {
    match CONFIG.get() {
        Some(config) => config,
        None => errors::internal("the snowflake_id settings were read before _PG_init"),
    }
}

/// The layout in use in this process.
pub fn layout() -> &'static Layout {
    &config().layout
}

/// The backfill space, or `None` when no ids are set aside (also while the
/// settings load).
pub fn backfill_space() -> Option<&'static Space> {
    CONFIG.get().and_then(|c| c.backfill.as_ref())
}

/// Whether worker ids come from a registry's leases (or may, once the
/// lease worker has looked at Citus's metadata), rather than from this
/// server's `worker_ids` alone. Never in binary-upgrade mode.
pub fn leases_enabled() -> bool {
    config().fleet != Fleet::Local
}

/// Whether the registry worker runs in this server: a registry database is
/// named and this is not a binary-upgrade start.
pub fn registry_worker_enabled() -> bool {
    config().registry_worker
}

/// Whether the current role may read superuser-only settings such as
/// `snowflake_id.registry` (`SHOW` allows superusers and members of
/// `pg_read_all_settings`): the one rule for everything that shows or
/// hides the registry's address (`snowflake_config()`, errors) or the
/// public key file's name.
pub fn may_read_hidden_settings() -> bool {
    // SAFETY: catalog lookups for the current user, in a backend.
    unsafe {
        pg_sys::superuser()
            || pg_sys::has_privs_of_role(
                pg_sys::GetUserId(),
                pg_sys::Oid::from(pg_sys::ROLE_PG_READ_ALL_SETTINGS),
            )
    }
}

/// A string setting's candidate value in a check hook (`None`: NULL).
///
/// # Safety
/// `newval` is the pointer PostgreSQL passes to a check hook: valid, and
/// pointing to NULL or a NUL-terminated string.
unsafe fn candidate(newval: *mut *mut c_char) -> Option<String> {
    // SAFETY: as the caller promises.
    unsafe {
        if newval.is_null() || (*newval).is_null() {
            return None;
        }
        Some(CStr::from_ptr(*newval).to_string_lossy().into_owned())
    }
}
