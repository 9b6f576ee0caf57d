//! The fleet's settings: the registry worker (`registry_database`), leases
//! from a registry server (`registry`, `lease_time`, `lease_replication`,
//! `max_blocks`) or from the Citus coordinator (`registry_options`), and
//! the rules a connection string must meet (usable by the lease worker's
//! client, no password in it).

use super::define::{
    LeaseReplication, LEASE_REPLICATION, LEASE_TIME_MS, MAX_BLOCKS, REGISTRY, REGISTRY_DATABASE,
    REGISTRY_OPTIONS,
};
use super::load::Refusal;
use crate::errors;
use pgrx::{pg_guard, pg_sys};
use std::ffi::{c_char, c_void, CStr};

/// Where this server's worker ids come from, decided once at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fleet {
    /// This server's own `snowflake_id.worker_ids` (also in binary-upgrade
    /// mode, whatever is configured).
    Local,
    /// Leases from the server `snowflake_id.registry` names.
    Registry,
    /// Leases from the Citus coordinator, if the lease worker finds one in
    /// Citus's metadata (Citus is preloaded, no registry is named).
    Citus,
}

impl Fleet {
    /// The fleet the settings in force at load choose.
    pub(super) fn at_load() -> Fleet {
        // SAFETY: reading a flag PostgreSQL sets from the command line (-b)
        // before it loads preload libraries.
        if unsafe { pg_sys::IsBinaryUpgrade } {
            Fleet::Local
        } else if registry().is_some() {
            Fleet::Registry
        } else if citus_preloaded() {
            Fleet::Citus
        } else {
            Fleet::Local
        }
    }
}

/// Whether the registry worker runs in this server, decided at load: a
/// registry database is named and this is not a binary-upgrade start
/// (`pg_upgrade` needs the cluster to itself).
pub(super) fn registry_worker_at_load() -> bool {
    // SAFETY: as in `Fleet::at_load`.
    registry_database().is_some() && !unsafe { pg_sys::IsBinaryUpgrade }
}

/// `snowflake_id.registry_database`, or `None` when the registry worker is
/// turned off.
pub fn registry_database() -> Option<String> {
    super::define::text(&REGISTRY_DATABASE)
}

/// `snowflake_id.registry`, trimmed, or `None` when empty.
pub fn registry() -> Option<String> {
    super::define::text(&REGISTRY)
}

/// `snowflake_id.registry_options`, trimmed (empty when unset).
pub fn registry_options() -> String {
    super::define::text(&REGISTRY_OPTIONS).unwrap_or_default()
}

/// `snowflake_id.max_blocks`.
pub fn max_blocks() -> u32 {
    MAX_BLOCKS.get().max(1) as u32
}

/// `snowflake_id.lease_replication`.
pub fn lease_replication() -> snowflake_core::holder::Replication {
    match LEASE_REPLICATION.get() {
        LeaseReplication::Auto => snowflake_core::holder::Replication::Auto,
        LeaseReplication::Synchronous => snowflake_core::holder::Replication::Synchronous,
    }
}

/// `snowflake_id.lease_time` in milliseconds.
pub fn lease_time_ms() -> i64 {
    i64::from(LEASE_TIME_MS.get())
}

/// Whether Citus is listed in `shared_preload_libraries`.
fn citus_preloaded() -> bool {
    // SAFETY: reading PostgreSQL's GUC variable, NULL or a C string.
    let list = unsafe {
        let p = pg_sys::shared_preload_libraries_string;
        if p.is_null() {
            return false;
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    };
    list.split(',')
        .map(|l| l.trim().trim_matches('"'))
        .any(|l| l == "citus" || l.ends_with("/citus") || l.starts_with("citus."))
}

/// Why a value of `snowflake_id.registry` is refused.
pub(super) enum RegistryRefusal {
    /// It holds a password (the keyword: `password`, `sslpassword`): a
    /// setting's value is readable by `pg_read_all_settings` and logged
    /// when it changes. libpq reads passwords from a passfile instead.
    Password(&'static str),
    /// The lease worker could not use it: an invalid connection string.
    Unusable(String),
}

/// Why `text` is refused as `snowflake_id.registry`, if it is: first what
/// makes it unusable, then a password in it. The answer never quotes the
/// text (it may hold a password).
pub(super) fn registry_refusal(text: &str) -> Option<RegistryRefusal> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    if let Some(e) = snowflake_core::conninfo::problem(text) {
        return Some(RegistryRefusal::Unusable(format!(
            "invalid connection string: {e}"
        )));
    }
    snowflake_core::conninfo::secret_in(text).map(RegistryRefusal::Password)
}

/// At start: why the configured `snowflake_id.registry` (set in `origin`)
/// refuses the start, if it does (else the server would start and every
/// `snowflake_nextval()` fail with 55000), without echoing the value.
pub(super) fn refuse_registry(text: &str, origin: &str) -> Option<Refusal> {
    registry_refusal(text).map(|refusal| match refusal {
        RegistryRefusal::Password(keyword) => Refusal::Secret {
            setting: "snowflake_id.registry",
            origin: origin.into(),
            keyword,
        },
        RegistryRefusal::Unusable(problem) => Refusal::Registry {
            origin: origin.into(),
            problem,
        },
    })
}

/// At start: why the configured `snowflake_id.registry_options` refuses the
/// start (a password in it), if it does.
pub(super) fn refuse_registry_options(text: &str, origin: &str) -> Option<Refusal> {
    snowflake_core::conninfo::secret_in(text).map(|keyword| Refusal::Secret {
        setting: "snowflake_id.registry_options",
        origin: origin.into(),
        keyword,
    })
}

#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_registry(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let Some(text) = (unsafe { super::candidate(newval) }) else {
        return true;
    };
    match registry_refusal(&text) {
        None => true,
        Some(RegistryRefusal::Password(keyword)) => {
            errors::conninfo_secret_check_failed("snowflake_id.registry", keyword);
            false
        }
        Some(RegistryRefusal::Unusable(problem)) => {
            errors::registry_check_failed(&problem);
            false
        }
    }
}

/// Check hook of `snowflake_id.registry_options`: no password in it, as
/// in `snowflake_id.registry` (the value is not echoed).
#[pg_guard]
pub(super) unsafe extern "C-unwind" fn check_registry_options(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let Some(text) = (unsafe { super::candidate(newval) }) else {
        return true;
    };
    match snowflake_core::conninfo::secret_in(&text) {
        None => true,
        Some(keyword) => {
            errors::conninfo_secret_check_failed("snowflake_id.registry_options", keyword);
            false
        }
    }
}
