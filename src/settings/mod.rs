//! The `snowflake_id.*` settings: definitions and typed getters.
//!
//! The layout settings are postmaster settings: they are read once, when the
//! library loads, and turned into the [`Layout`] every function uses
//! ([`layout`]). `worker_ids` and `max_drift` can change on reload.
//! `backfill` holds `snowflake_id.backfill_worker_ids`.

mod backfill;

pub use backfill::{
    backfill_ids_new_since, backfill_ids_text, backfill_ids_to_record, backfill_space,
};

use crate::errors;
use parking_lot::{const_mutex, Mutex};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::{pg_guard, pg_sys, PostgresGucEnum};
use snowflake_core::backfill::Space;
use snowflake_core::key_file::KeyFileError;
use snowflake_core::layout::{self, Layout, PRESETS};
use snowflake_core::ranges::WorkerRanges;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// `snowflake_id.lease_replication`: what a grant from the registry must be
/// before this server uses it (`snowflake_core::holder::Replication`).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum LeaseReplication {
    #[name = c"auto"]
    Auto,
    #[name = c"synchronous"]
    Synchronous,
}

static LEASE_REPLICATION: GucSetting<LeaseReplication> =
    GucSetting::<LeaseReplication>::new(LeaseReplication::Auto);

/// `snowflake_id.layout`: the preset the individual layout settings start from.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Preset {
    #[name = c"classic"]
    Classic,
    #[name = c"sonyflake"]
    Sonyflake,
    #[name = c"js53"]
    Js53,
}

impl Preset {
    fn values(self) -> layout::Preset {
        PRESETS[self as usize]
    }
}

/// "Take the value from the preset", for the numeric layout settings.
const FROM_PRESET: i32 = -1;

static PRESET: GucSetting<Preset> = GucSetting::<Preset>::new(Preset::Classic);
static EPOCH: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"2024-01-01"));
static TIME_UNIT_MS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
static TOTAL_BITS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
static WORKER_BITS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
static SEQUENCE_BITS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
static WORKER_IDS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
static MAX_DRIFT_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
/// The largest `snowflake_id.max_drift`, in milliseconds.
const MAX_DRIFT_LIMIT_MS: i32 = 3_600_000;
static REGISTRY_DATABASE: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(Some(c"postgres"));
static REGISTRY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `snowflake_id.registry_standby_name`: read by the registry's SQL
/// (`leases.sql`, `current_setting`), on a registry server, whether or not
/// the library is loaded there.
static REGISTRY_STANDBY_NAME: GucSetting<Option<CString>> =
    GucSetting::<Option<CString>>::new(None);
static LEASE_TIME_MS: GucSetting<i32> = GucSetting::<i32>::new(600_000);
/// `snowflake_id.max_blocks`: the most blocks this server leases.
static MAX_BLOCKS: GucSetting<i32> = GucSetting::<i32>::new(8);
/// `snowflake_id.layout_end_warning`: warn when the layout's time field runs
/// out within this many years (0: never).
static LAYOUT_END_WARNING: GucSetting<i32> = GucSetting::<i32>::new(10);
/// `snowflake_id.registry_options`: connection options added to the
/// Citus coordinator's connection string (user, TLS, passfile).
static REGISTRY_OPTIONS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// The shortest and longest `snowflake_id.lease_time`, in milliseconds.
const LEASE_TIME_MIN_MS: i32 = 2_000;
const LEASE_TIME_MAX_MS: i32 = 86_400_000;

/// The layout in use, computed once per process by [`init`].
static LAYOUT: OnceLock<Layout> = OnceLock::new();

/// While `init` runs: the settings whose configured value a check hook
/// rejected, with the reason. PostgreSQL would only warn and fall back to
/// the default (another layout, or every worker id, which could make this
/// server collide with others), so `init` refuses instead.
#[allow(clippy::type_complexity)]
static REJECTED_AT_LOAD: Mutex<Option<Vec<(&'static str, String)>>> = const_mutex(None);

/// The first setting rejected so far during `init`, if any.
fn take_rejected() -> Option<(&'static str, String)> {
    REJECTED_AT_LOAD
        .lock()
        .as_mut()
        .and_then(|v| v.drain(..).next())
}

/// Rejects a value in a check hook: sets PostgreSQL's error detail, and
/// during `init` remembers the rejection of a configured value.
fn reject(name: &'static str, value: &str, detail: &str, source: pg_sys::GucSource::Type) -> bool {
    if source != pg_sys::GucSource::PGC_S_DEFAULT {
        if let Some(rejected) = REJECTED_AT_LOAD.lock().as_mut() {
            rejected.push((name, format!("\"{value}\": {detail}")));
        }
    }
    errors::guc_check_detail(detail);
    false
}

/// Defines every setting, validates the layout and reserves the prefix.
/// Called from `_PG_init`; an invalid layout is an error there (so a
/// preloading server refuses to start, as for any bad postmaster setting).
///
/// PostgreSQL only allows postmaster settings to be defined while
/// preloading. Loaded on demand instead, the layout settings are defined as
/// superuser settings so that the decoders still follow postgresql.conf;
/// the layout is read once either way.
pub fn init(preloading: bool) {
    // What the configuration says, before defining the settings replaces
    // PostgreSQL's placeholders (and forgets values it cannot parse).
    let mut configured = if preloading {
        configured_placeholders()
    } else {
        Vec::new()
    };
    let layout_context = || {
        if preloading {
            GucContext::Postmaster
        } else {
            GucContext::Suset
        }
    };
    GucRegistry::define_enum_guc(
        c"snowflake_id.layout",
        c"Preset for the ID layout: classic, sonyflake or js53.",
        c"classic: 41 bits of milliseconds, 10 worker bits, 12 sequence bits. \
          sonyflake: 39 bits of 10 ms, 16 worker bits, 8 sequence bits. \
          js53: IDs below 2^53 with 6 worker bits and 6 sequence bits. \
          The individual layout settings override the preset.",
        &PRESET,
        layout_context(),
        GucFlags::default(),
    );
    *REJECTED_AT_LOAD.lock() = Some(Vec::new());
    // SAFETY (both blocks): the check hooks are #[pg_guard] functions with
    // the signatures PostgreSQL expects; they only read the value given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.epoch",
            c"Time zero of the IDs' time field (UTC date, date and time, or Unix milliseconds).",
            c"Changing it changes the meaning of every ID already issued.",
            &EPOCH,
            layout_context(),
            GucFlags::default(),
            Some(check_epoch),
            None,
            None,
        );
    }
    // SHOW and pg_settings give the value in use: the preset's where the
    // setting is -1 (as wal_buffers shows its computed size).
    let int_setting = |name: &'static CStr,
                       short: &'static CStr,
                       setting,
                       max,
                       flags,
                       check,
                       show: pg_sys::GucShowHook| unsafe {
        GucRegistry::define_int_guc_with_hooks(
            name,
            short,
            c"-1 (the default) takes the value from snowflake_id.layout; SHOW gives the value in use.",
            setting,
            FROM_PRESET,
            max,
            layout_context(),
            flags,
            check,
            None,
            show,
        )
    };
    int_setting(
        c"snowflake_id.time_unit_ms",
        c"Length of one tick of the time field.",
        &TIME_UNIT_MS,
        86_400_000,
        GucFlags::UNIT_MS,
        Some(check_time_unit_ms),
        Some(show_time_unit),
    );
    int_setting(
        c"snowflake_id.total_bits",
        c"Bits an ID may use (63 for the whole bigint, 53 for JavaScript-safe IDs).",
        &TOTAL_BITS,
        63,
        GucFlags::default(),
        Some(check_total_bits),
        Some(show_total_bits),
    );
    int_setting(
        c"snowflake_id.worker_bits",
        c"Bits of the worker id field.",
        &WORKER_BITS,
        layout::MAX_WORKER_BITS as i32,
        GucFlags::default(),
        None,
        Some(show_worker_bits),
    );
    int_setting(
        c"snowflake_id.sequence_bits",
        c"Bits of the per-tick sequence field.",
        &SEQUENCE_BITS,
        layout::MAX_SEQUENCE_BITS as i32,
        GucFlags::default(),
        Some(check_sequence_bits),
        Some(show_sequence_bits),
    );
    if let Some((name, problem)) = take_rejected() {
        errors::invalid_layout(&format!("{name} = {problem}"));
    }
    refuse_invalid_values(&mut configured);

    let layout = match compute_layout() {
        Ok(layout) => layout,
        Err(message) => errors::invalid_layout(&message),
    };
    let _ = LAYOUT.set(layout);

    // SAFETY: the check hook is a #[pg_guard] function with the signature
    // PostgreSQL expects, and it only reads the string it is given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.worker_ids",
            c"Worker ids this server may claim, e.g. 0-511 or 0-15,32-47 (empty: all).",
            c"Give servers that can write the same tables disjoint ranges. \
              A change applies to claims made after the reload.",
            &WORKER_IDS,
            GucContext::Sighup,
            GucFlags::default(),
            Some(check_worker_ids),
            None,
            None,
        );
    }
    let rejected = take_rejected();
    *REJECTED_AT_LOAD.lock() = None;
    if let Some((_, problem)) = rejected {
        errors::bad_worker_ids(&problem);
    }
    backfill::define(layout_context());
    // SAFETY: the check hook is a #[pg_guard] function with the signature
    // PostgreSQL expects; it only reads the value given.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            c"snowflake_id.max_drift",
            c"How far the time of an ID may run ahead of the wall clock.",
            c"Covers sequence exhaustion (borrowing future ticks), a clock that went \
              backwards and a restart within a tick. Beyond it snowflake_nextval() waits \
              (exhaustion) or fails (clock). 0, or at least one tick of the layout.",
            &MAX_DRIFT_MS,
            0,
            MAX_DRIFT_LIMIT_MS,
            GucContext::Sighup,
            GucFlags::UNIT_MS,
            Some(check_max_drift),
            None,
            None,
        );
    }

    GucRegistry::define_int_guc(
        c"snowflake_id.layout_end_warning",
        c"Years before the layout's time field runs out from which the server warns (0: never).",
        c"Warned about in the log at server start and shown by snowflake_layout() (years_left, \
          ends_soon). A layout that has run out makes no IDs, whatever this says.",
        &LAYOUT_END_WARNING,
        0,
        10_000,
        GucContext::Sighup,
        GucFlags::default(),
    );

    GucRegistry::define_string_guc(
        c"snowflake_id.registry_database",
        c"Database whose snowflake_worker_registry table the registry worker keeps (empty: no worker).",
        c"The registry worker records who held each worker id and how far its IDs went.",
        &REGISTRY_DATABASE,
        layout_context(),
        GucFlags::default(),
    );

    GucRegistry::define_string_guc(
        c"snowflake_id.registry_standby_name",
        c"On a registry server: the application_name it streams with as a standby (empty: none).",
        c"A promoted standby that the registry's synchronous_standby_names made a failover candidate \
          under this name starts its new incarnation without a fence (snowflake_lease_standbys). \
          Must equal the application_name in its primary_conninfo, and be unique.",
        &REGISTRY_STANDBY_NAME,
        GucContext::Sighup,
        GucFlags::default(),
    );

    // SAFETY: the check hook is a #[pg_guard] function with the signature
    // PostgreSQL expects; it only reads the value given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.registry",
            c"Connection string of the server that leases worker ids to this one (empty: this server's own worker_ids, or the Citus coordinator).",
            c"A libpq key=value string or URI naming a database where the snowflake_id extension is created; it may name this server. Only superusers can see it.",
            &REGISTRY,
            layout_context(),
            GucFlags::SUPERUSER_ONLY,
            Some(check_registry),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"snowflake_id.lease_time",
        c"How long a lease of worker ids from the registry lasts without a renewal.",
        c"A server keeps making IDs from the blocks it holds for this long when the registry is unreachable; a block of a server that vanished goes to another after it (plus a grace period).",
        &LEASE_TIME_MS,
        LEASE_TIME_MIN_MS,
        LEASE_TIME_MAX_MS,
        GucContext::Sighup,
        GucFlags::UNIT_MS,
    );
    GucRegistry::define_enum_guc(
        c"snowflake_id.lease_replication",
        c"What a grant from the registry must be before this server uses it: auto or synchronous.",
        c"auto: durable as the registry is configured (flushed on the synchronous standbys its \
          synchronous_standby_names names, or locally when it names none). synchronous: on \
          synchronous standbys only; a registry with none grants nothing this server uses.",
        &LEASE_REPLICATION,
        GucContext::Sighup,
        GucFlags::default(),
    );
    GucRegistry::define_int_guc(
        c"snowflake_id.max_blocks",
        c"The most blocks of worker ids this server leases from the registry.",
        c"Sessions beyond the leased ids share them. Keeps one server from taking every block of the fleet.",
        &MAX_BLOCKS,
        1,
        snowflake_core::lease::BLOCKS_PER_LAYOUT as i32,
        GucContext::Sighup,
        GucFlags::default(),
    );
    // SAFETY: the check hook is a #[pg_guard] function with the signature
    // PostgreSQL expects; it only reads the value given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.registry_options",
            c"Connection options for the Citus coordinator the lease worker finds (libpq key=value: user, sslmode, sslrootcert, passfile, ...).",
            c"Added to the host, port and database read from Citus's metadata. No password: use a passfile.",
            &REGISTRY_OPTIONS,
            GucContext::Sighup,
            GucFlags::SUPERUSER_ONLY,
            Some(check_registry_options),
            None,
            None,
        );
    }

    define_public_keys();
    refuse_removed_public_key(&mut configured);
    refuse_invalid_registry(&mut configured);
    refuse_secret(
        &mut configured,
        "snowflake_id.registry_options",
        snowflake_core::conninfo::secret_in,
        |origin, keyword| {
            errors::conninfo_secret_setting("snowflake_id.registry_options", origin, keyword)
        },
    );
    refuse_invalid_values(&mut configured);
    // A drift shorter than a tick (but not 0) would stop every restart
    // within a tick until the next tick began (the reservation is above the
    // IDs of the current tick, and the next tick is more lead than allowed).
    // (After refuse_invalid_values: a max_drift PostgreSQL rejected is
    // named as written, not as the default it would fall back to.)
    let drift = MAX_DRIFT_MS.get();
    if drift > 0 && i64::from(drift) < layout.unit_ms {
        errors::tick_longer_than_drift(
            layout.unit_ms,
            drift.into(),
            drift_can_cover(layout.unit_ms),
        );
    }
    // From now on the check hook refuses such a value (a reload, ALTER
    // SYSTEM); while loading, the check above says it better.
    *DRIFT_CHECKED_BY_HOOK.lock() = true;
    refuse_unknown_names(&configured);

    if preloading {
        check_public_key_file_at_start();
    }

    // SAFETY: a plain call into PostgreSQL with a static C string.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"snowflake_id".as_ptr()) };
}

/// A `snowflake_id.*` setting as the configuration gave it, before the
/// library defined it.
struct Configured {
    name: CString,
    value: CString,
    source: pg_sys::GucSource::Type,
    /// "file postgresql.auto.conf line 3", or how else it was set.
    origin: String,
}

const PREFIX: &str = "snowflake_id.";

/// Every `snowflake_id.*` variable PostgreSQL knows now, with whether it is
/// still a placeholder (a name the configuration set and no library
/// defined). PostgreSQL 15 keeps them in an array, 16 and later return a
/// palloc'd copy.
fn our_variables() -> Vec<&'static pg_sys::config_generic> {
    let mut found = Vec::new();
    // SAFETY: PostgreSQL returns an array of `count` valid pointers to its
    // GUC records, which live as long as the process; we only read them.
    unsafe {
        #[cfg(feature = "pg15")]
        let (vars, count) = (pg_sys::get_guc_variables(), pg_sys::GetNumConfigOptions());
        #[cfg(not(feature = "pg15"))]
        let (vars, count) = {
            let mut count = 0;
            (pg_sys::get_guc_variables(&mut count), count)
        };
        if vars.is_null() {
            return found;
        }
        for i in 0..usize::try_from(count).unwrap_or(0) {
            let Some(var) = (*vars.add(i)).as_ref() else {
                continue;
            };
            if var.name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(var.name).to_bytes();
            if name.len() > PREFIX.len()
                && name[..PREFIX.len()].eq_ignore_ascii_case(PREFIX.as_bytes())
            {
                found.push(var);
            }
        }
    }
    found
}

fn is_placeholder(var: &pg_sys::config_generic) -> bool {
    var.flags & pg_sys::GUC_CUSTOM_PLACEHOLDER as i32 != 0
}

/// The `snowflake_id.*` names the configuration (postgresql.conf,
/// postgresql.auto.conf, `-c`) set, with their values as written.
fn configured_placeholders() -> Vec<Configured> {
    let mut configured = Vec::new();
    for var in our_variables().into_iter().filter(|v| is_placeholder(v)) {
        // SAFETY: the name is a valid C string (checked non-null above);
        // GetConfigOption returns NULL or the placeholder's string value.
        let name = unsafe { CStr::from_ptr(var.name) }.to_owned();
        let value = unsafe { pg_sys::GetConfigOption(name.as_ptr(), true, false) };
        if value.is_null() {
            continue;
        }
        // SAFETY: non-null, a valid C string owned by the GUC record.
        let value = unsafe { CStr::from_ptr(value) }.to_owned();
        let origin = if var.sourcefile.is_null() {
            match var.source {
                pg_sys::GucSource::PGC_S_ARGV => "the server's command line".to_string(),
                _ => "the server's configuration".to_string(),
            }
        } else {
            // SAFETY: a valid C string owned by the GUC record.
            let file = unsafe { CStr::from_ptr(var.sourcefile) }.to_string_lossy();
            format!("file \"{file}\" line {}", var.sourceline)
        };
        configured.push(Configured {
            name,
            value,
            source: var.source,
            origin,
        });
    }
    configured
}

/// Refuses to start when a configured value of a setting defined by now is
/// one PostgreSQL rejects: it would only warn and run on the default (for
/// example `layout = 'js-53'` running the classic layout), so this server
/// would make IDs another way than written. Checked settings are removed
/// from `configured`.
fn refuse_invalid_values(configured: &mut Vec<Configured>) {
    configured.retain(|c| {
        // SAFETY: plain lookups of a setting by a valid C string name.
        let flags = unsafe { pg_sys::GetConfigOptionFlags(c.name.as_ptr(), true) };
        if flags & pg_sys::GUC_CUSTOM_PLACEHOLDER as i32 != 0 {
            return true; // not defined (yet)
        }
        // Validate only (changeVal false), quietly: PostgreSQL already
        // logged its own WARNING with the details when it reapplied the
        // value; the error below says what to do.
        // SAFETY: valid C strings; with changeVal false nothing changes.
        let ok = unsafe {
            pg_sys::set_config_option(
                c.name.as_ptr(),
                c.value.as_ptr(),
                pg_sys::GucContext::PGC_POSTMASTER,
                c.source,
                pg_sys::GucAction::GUC_ACTION_SET,
                false,
                pg_sys::DEBUG5 as i32,
                false,
            )
        };
        if ok == 0 {
            let name = c.name.to_string_lossy();
            errors::bad_setting(
                &name,
                &c.value.to_string_lossy(),
                &c.origin,
                &accepted_values(&name),
            );
        }
        false
    });
}

/// Refuses to start when the configuration sets a `snowflake_id.*` name
/// this library does not define: PostgreSQL would drop it with a WARNING,
/// and a mistyped `worker_id = '0-3'` would leave the server claiming every
/// worker id.
fn refuse_unknown_names(configured: &[Configured]) {
    let Some(unknown) = configured.first() else {
        return;
    };
    let mut names: Vec<String> = our_variables()
        .into_iter()
        .filter(|v| !is_placeholder(v))
        // SAFETY: our_variables only returns records with a non-null name.
        .map(|v| {
            unsafe { CStr::from_ptr(v.name) }
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    errors::unknown_setting(
        &unknown.name.to_string_lossy(),
        &unknown.origin,
        &names.join(", "),
    );
}

/// The values a setting accepts, for the error that refuses a bad one.
fn accepted_values(name: &str) -> String {
    let max_worker_id = LAYOUT.get().map_or(0, |l| l.max_worker_id());
    match name.to_ascii_lowercase().as_str() {
        "snowflake_id.layout" => "classic, sonyflake or js53".into(),
        "snowflake_id.epoch" => {
            "a UTC date (2024-01-01), a UTC date and time (2024-01-01 12:00:00), or Unix milliseconds".into()
        }
        "snowflake_id.time_unit_ms" => "-1 (from snowflake_id.layout) or 1 to 86400000".into(),
        "snowflake_id.total_bits" => "-1 (from snowflake_id.layout) or 2 to 63".into(),
        "snowflake_id.worker_bits" => format!(
            "-1 (from snowflake_id.layout) or 0 to {}",
            layout::MAX_WORKER_BITS
        ),
        "snowflake_id.sequence_bits" => format!(
            "-1 (from snowflake_id.layout) or 1 to {}",
            layout::MAX_SEQUENCE_BITS
        ),
        "snowflake_id.worker_ids" => format!(
            "ids and ranges from 0 to {max_worker_id}, e.g. 0-511 or 0-15,32-47 (empty: all)"
        ),
        "snowflake_id.max_drift" => {
            format!("0 to {MAX_DRIFT_LIMIT_MS} milliseconds, or with a unit: 500ms, 2s, 1min, 1h")
        }
        _ => "see the setting's description: SELECT extra_desc FROM pg_settings WHERE name = '<setting>'".into(),
    }
}

/// The layout in use in this process.
pub fn layout() -> &'static Layout {
    match LAYOUT.get() {
        Some(layout) => layout,
        None => errors::internal("the snowflake_id layout was read before _PG_init"),
    }
}

/// `snowflake_id.max_drift` in milliseconds.
pub fn max_drift_ms() -> i64 {
    i64::from(MAX_DRIFT_MS.get())
}

/// Warns in the log when the layout's time field runs out within
/// `snowflake_id.layout_end_warning` years. Called at server start.
pub fn warn_if_layout_ends_soon() {
    let layout = layout();
    let now = crate::clock::unix_ms();
    let years = layout_end_warning_years();
    if layout.ended(now) || layout.ends_within(now, years) {
        errors::layout_ends_soon(
            &layout::format_unix_ms(layout.end_unix_ms()),
            layout.years_left(now),
            years,
        );
    }
}

/// Whether some `snowflake_id.max_drift` covers one tick of `unit_ms`.
pub fn drift_can_cover(unit_ms: i64) -> bool {
    unit_ms <= i64::from(MAX_DRIFT_LIMIT_MS)
}

/// `snowflake_id.layout_end_warning`, in years (0: never warn).
pub fn layout_end_warning_years() -> u32 {
    u32::try_from(LAYOUT_END_WARNING.get()).unwrap_or(0)
}

/// The ids this server may claim now (`snowflake_id.worker_ids`), and the
/// setting's text. The check hook has already accepted the text.
pub fn worker_ranges() -> (WorkerRanges, String) {
    let text = WORKER_IDS.get();
    let text = text
        .as_deref()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    match WorkerRanges::parse(&text, layout().max_worker_id()) {
        // Live claims never take the ids set aside for backfill.
        Ok(ranges) => match backfill_space() {
            Some(space) => (ranges.without(space.ids()), text),
            None => (ranges, text),
        },
        Err(detail) => errors::bad_worker_ids(&detail.to_string()),
    }
}

/// `snowflake_id.registry_database`, or `None` when the registry worker is
/// turned off.
pub fn registry_database() -> Option<String> {
    REGISTRY_DATABASE
        .get()
        .map(|s| s.to_string_lossy().trim().to_string())
        .filter(|s| !s.is_empty())
}

/// Whether the registry worker runs in this server: a registry database is
/// named and this is not a binary-upgrade start (`pg_upgrade` needs the
/// cluster to itself).
pub fn registry_worker_enabled() -> bool {
    // SAFETY: reading a flag PostgreSQL sets from the command line (-b)
    // before it loads preload libraries.
    registry_database().is_some() && !unsafe { pg_sys::IsBinaryUpgrade }
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

/// `snowflake_id.registry`, trimmed, or `None` when empty.
pub fn registry() -> Option<String> {
    REGISTRY
        .get()
        .map(|s| s.to_string_lossy().trim().to_string())
        .filter(|s| !s.is_empty())
}

/// What is wrong with `text` as `snowflake_id.registry`, if anything: it
/// must be a connection string the lease worker's client can use. The
/// answer never quotes the text (it may hold a password).
fn registry_problem(text: &str) -> Option<String> {
    let text = text.trim();
    if text.is_empty() {
        return None;
    }
    snowflake_core::conninfo::problem(text).map(|e| format!("invalid connection string: {e}"))
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

#[pg_guard]
unsafe extern "C-unwind" fn check_registry(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let Some(text) = (unsafe { candidate(newval) }) else {
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

/// At start, a configured `snowflake_id.registry` that the lease worker
/// could not use refuses the start (else the server would start and every
/// `snowflake_nextval()` fail with 55000), without echoing the value.
/// Removes it from `configured`.
fn refuse_invalid_registry(configured: &mut Vec<Configured>) {
    refuse_secret(
        configured,
        "snowflake_id.registry",
        registry_refusal,
        |origin, refusal| match refusal {
            RegistryRefusal::Password(keyword) => {
                errors::conninfo_secret_setting("snowflake_id.registry", origin, keyword)
            }
            RegistryRefusal::Unusable(problem) => errors::bad_registry_setting(origin, &problem),
        },
    );
}

/// Why a value of `snowflake_id.registry` is refused.
enum RegistryRefusal {
    /// It holds a password (the keyword: `password`, `sslpassword`): a
    /// setting's value is readable by `pg_read_all_settings` and logged
    /// when it changes. libpq reads passwords from a passfile instead.
    Password(&'static str),
    /// The lease worker could not use it ([`registry_problem`]).
    Unusable(String),
}

/// Why `text` is refused as `snowflake_id.registry`, if it is: first what
/// makes it unusable, then a password in it.
fn registry_refusal(text: &str) -> Option<RegistryRefusal> {
    if let Some(problem) = registry_problem(text) {
        return Some(RegistryRefusal::Unusable(problem));
    }
    snowflake_core::conninfo::secret_in(text).map(RegistryRefusal::Password)
}

/// Makes this process resolve unqualified names in `pg_catalog` only:
/// the background workers run SQL as the bootstrap superuser, so a
/// function or operator another role created in a schema on the default
/// `search_path` must never be what they call. Like autovacuum's.
pub fn pin_search_path() {
    // SAFETY: valid C strings; PostgreSQL copies them. Setting search_path
    // needs no transaction (it only invalidates the cached path).
    unsafe {
        pg_sys::SetConfigOption(
            c"search_path".as_ptr(),
            c"pg_catalog, pg_temp".as_ptr(),
            pg_sys::GucContext::PGC_SUSET,
            pg_sys::GucSource::PGC_S_OVERRIDE,
        );
    }
}

/// `snowflake_id.max_blocks`.
pub fn max_blocks() -> u32 {
    MAX_BLOCKS.get().max(1) as u32
}

/// Check hook of `snowflake_id.registry_options`: no password in it, as
/// in `snowflake_id.registry` (the value is not echoed).
#[pg_guard]
unsafe extern "C-unwind" fn check_registry_options(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let Some(text) = (unsafe { candidate(newval) }) else {
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

/// `snowflake_id.registry_options`, trimmed (empty when unset).
pub fn registry_options() -> String {
    REGISTRY_OPTIONS
        .get()
        .map(|s| s.to_string_lossy().trim().to_string())
        .unwrap_or_default()
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

/// Whether Citus is listed before us in `shared_preload_libraries`.
pub fn citus_preloaded() -> bool {
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

/// Whether worker ids come from a registry's leases (or may, once the
/// lease worker has looked at Citus's metadata), rather than from this
/// server's `worker_ids` alone. Not in binary-upgrade mode.
pub fn leases_enabled() -> bool {
    // SAFETY: reading a flag PostgreSQL sets from the command line (-b)
    // before it loads preload libraries.
    (registry().is_some() || citus_preloaded()) && !unsafe { pg_sys::IsBinaryUpgrade }
}

/// The preset's name, for reports.
pub fn preset_name() -> &'static str {
    PRESET.get().values().name
}

fn compute_layout() -> Result<Layout, String> {
    let preset = PRESET.get().values();
    let pick = value_or_preset;
    let epoch_text = EPOCH.get();
    let epoch_text = epoch_text
        .as_deref()
        .and_then(|s| s.to_str().ok())
        .unwrap_or("");
    let epoch_ms =
        layout::parse_epoch(epoch_text).map_err(|e| format!("snowflake_id.epoch: {e}"))?;
    Layout::from_settings(
        epoch_ms,
        pick(&TIME_UNIT_MS, preset.unit_ms),
        pick(&TOTAL_BITS, preset.total_bits.into()) as u32,
        pick(&WORKER_BITS, preset.worker_bits.into()) as u32,
        pick(&SEQUENCE_BITS, preset.sequence_bits.into()) as u32,
    )
    .map_err(|e| e.to_string())
}

/// A layout setting's value: its own, or the preset's when it is -1.
fn value_or_preset(setting: &GucSetting<i32>, preset_value: i64) -> i64 {
    match setting.get() {
        FROM_PRESET => preset_value,
        v => i64::from(v),
    }
}

/// The value in use of a layout setting: its own, or the preset's when it
/// is -1, as a string in the current memory context (PostgreSQL copies it).
fn show_layout_setting(setting: &GucSetting<i32>, preset_value: i64) -> *const c_char {
    let value = value_or_preset(setting, preset_value);
    // Digits and a sign only: no NUL inside, so the CString always builds.
    let text = CString::new(value.to_string()).unwrap_or_default();
    // SAFETY: copies a NUL-terminated string into the current memory
    // context, where PostgreSQL expects a show hook's result.
    unsafe { pg_sys::pstrdup(text.as_ptr()) }
}

#[pg_guard]
unsafe extern "C-unwind" fn show_time_unit() -> *const c_char {
    show_layout_setting(&TIME_UNIT_MS, PRESET.get().values().unit_ms)
}

#[pg_guard]
unsafe extern "C-unwind" fn show_total_bits() -> *const c_char {
    show_layout_setting(&TOTAL_BITS, PRESET.get().values().total_bits.into())
}

#[pg_guard]
unsafe extern "C-unwind" fn show_worker_bits() -> *const c_char {
    show_layout_setting(&WORKER_BITS, PRESET.get().values().worker_bits.into())
}

#[pg_guard]
unsafe extern "C-unwind" fn show_sequence_bits() -> *const c_char {
    show_layout_setting(&SEQUENCE_BITS, PRESET.get().values().sequence_bits.into())
}

/// Check hook of `snowflake_id.worker_ids`: rejects text that does not
/// parse or names ids outside the layout, with PostgreSQL's usual
/// "invalid value for parameter" error (or log line, on reload), and ids
/// set aside for backfill.
#[pg_guard]
unsafe extern "C-unwind" fn check_worker_ids(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    unsafe {
        check_ranges("snowflake_id.worker_ids", newval, source, |text, ranges| {
            if text.trim().is_empty() {
                None
            } else {
                backfill::check_live_ids_against_backfill(ranges)
            }
        })
    }
}

/// The body of the check hooks of the worker-id list settings: the
/// candidate must parse for this layout, and `more` may find a problem with
/// the ranges (the detail of the rejection).
///
/// # Safety
/// `newval` is the check hook's candidate pointer.
unsafe fn check_ranges(
    name: &'static str,
    newval: *mut *mut c_char,
    source: pg_sys::GucSource::Type,
    more: impl Fn(&str, &WorkerRanges) -> Option<String>,
) -> bool {
    // SAFETY: as the caller promises.
    let Some(text) = (unsafe { candidate(newval) }) else {
        return true;
    };
    let Some(layout) = LAYOUT.get() else {
        return true;
    };
    match WorkerRanges::parse(&text, layout.max_worker_id()) {
        Ok(ranges) => match more(&text, &ranges) {
            None => true,
            Some(detail) => reject(name, &text, &detail, source),
        },
        Err(detail) => reject(name, &text, &detail.to_string(), source),
    }
}

/// Check hook of `snowflake_id.epoch`: the text must parse (the layout as a
/// whole is checked when the library loads).
#[pg_guard]
unsafe extern "C-unwind" fn check_epoch(
    newval: *mut *mut c_char,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let text = unsafe { candidate(newval) }.unwrap_or_default();
    // Not compared with the clock: a clock set before the epoch must not
    // stop the server; snowflake_nextval() refuses instead.
    match layout::parse_epoch(&text) {
        Ok(_) => true,
        Err(detail) => reject("snowflake_id.epoch", &text, &detail.to_string(), source),
    }
}

/// An int layout setting must be -1 (from the preset) or at least `min`.
fn check_at_least(
    name: &'static str,
    value: i32,
    min: i32,
    source: pg_sys::GucSource::Type,
) -> bool {
    if value == FROM_PRESET || value >= min {
        return true;
    }
    let detail = format!("Use -1 (take it from snowflake_id.layout) or a value of at least {min}.");
    reject(name, &value.to_string(), &detail, source)
}

#[pg_guard]
unsafe extern "C-unwind" fn check_time_unit_ms(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    check_at_least("snowflake_id.time_unit_ms", unsafe { *newval }, 1, source)
}

/// Set once `init` has checked `snowflake_id.max_drift` against the layout:
/// from then on its check hook does.
static DRIFT_CHECKED_BY_HOOK: Mutex<bool> = const_mutex(false);

/// Check hook of `snowflake_id.max_drift`: 0, or at least one tick of the
/// layout in use (at load, `init` checks instead, naming both settings).
#[pg_guard]
unsafe extern "C-unwind" fn check_max_drift(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    let value = unsafe { *newval };
    // The built-in default is always accepted: PostgreSQL sets it in every
    // parallel worker before it restores the leader's value, and fails the
    // worker when a check hook refuses it. At start, `init` checks the
    // value in force (the default included).
    if source == pg_sys::GucSource::PGC_S_DEFAULT || !*DRIFT_CHECKED_BY_HOOK.lock() {
        return true;
    }
    match LAYOUT.get() {
        Some(layout) if value > 0 && i64::from(value) < layout.unit_ms => reject(
            "snowflake_id.max_drift",
            &value.to_string(),
            &format!(
                "it must be 0 or at least one tick of the layout ({} ms)",
                layout.unit_ms
            ),
            source,
        ),
        _ => true,
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn check_total_bits(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    check_at_least("snowflake_id.total_bits", unsafe { *newval }, 2, source)
}

#[pg_guard]
unsafe extern "C-unwind" fn check_sequence_bits(
    newval: *mut i32,
    _extra: *mut *mut c_void,
    source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes a valid pointer to the candidate value.
    check_at_least("snowflake_id.sequence_bits", unsafe { *newval }, 1, source)
}

// ------------------------------------------- snowflake_id.public_key_file

/// `snowflake_id.public_key_file`: the file holding the keys of public IDs
/// (see `public_id`, `key_file`). Only its name is a setting: PostgreSQL
/// logs a changed value and shows it to `pg_read_all_settings`, so no key
/// may be one.
static PUBLIC_KEY_FILE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// `snowflake_id.public_key`, removed in 0.4.0: still defined, so that any
/// value is refused without being shown rather than taken for an unknown
/// name (which the log would show with its value).
static PUBLIC_KEY: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);
/// This process's view of `snowflake_id.public_key_file`.
struct KeyFileState {
    /// Bumped by the assign hook whenever the setting is set in this
    /// process: a new name, or the same again on a reload.
    version: u64,
    /// Set in the postmaster once `init` has checked the key file: later
    /// calls of the assign hook there are reloads, which check the file
    /// again.
    postmaster_checks_reloads: bool,
}

static KEY_FILE_STATE: Mutex<KeyFileState> = const_mutex(KeyFileState {
    version: 0,
    postmaster_checks_reloads: false,
});

/// Defines `snowflake_id.public_key_file` (superuser-only, as
/// `ssl_key_file`) and the removed `snowflake_id.public_key`. Called from
/// [`init`], with or without preloading: sighup settings can be defined at
/// any time.
fn define_public_keys() {
    // SAFETY: the hooks are #[pg_guard] functions with the signatures
    // PostgreSQL expects; they read only the value given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.public_key_file",
            c"File holding the keys of public IDs (absolute, or relative to the data directory; empty: none).",
            c"Keys of 32 hex digits, one a line or comma-separated; the first makes tokens, all read them. \
              The file must be owned by the server's OS user with mode 0600 or less (or by root, 0640); \
              it is read again after each reload.",
            &PUBLIC_KEY_FILE,
            GucContext::Sighup,
            GucFlags::SUPERUSER_ONLY,
            None,
            Some(assign_public_key_file),
            None,
        );
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.public_key",
            c"Removed in 0.4.0: the keys of public IDs are read from snowflake_id.public_key_file.",
            c"Any value but empty is refused, without being shown.",
            &PUBLIC_KEY,
            GucContext::Sighup,
            GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL | GucFlags::NO_RESET_ALL,
            Some(check_public_key),
            None,
            None,
        );
    }
}

/// At start: a configured `snowflake_id.public_key` refuses the start,
/// without echoing the value (PostgreSQL has only warned). Removes it from
/// `configured`.
fn refuse_removed_public_key(configured: &mut Vec<Configured>) {
    refuse_secret(
        configured,
        "snowflake_id.public_key",
        |text| (!text.trim().is_empty()).then_some(()),
        |origin, ()| errors::public_key_removed_setting(origin),
    );
}

/// At start, in the postmaster: a key file that cannot be used refuses
/// the start, as an unusable `ssl_key_file` does. From then on, the
/// postmaster checks it again on each reload (and only warns).
fn check_public_key_file_at_start() {
    // SAFETY: a flag PostgreSQL sets before loading preload libraries.
    if unsafe { pg_sys::IsUnderPostmaster } {
        return;
    }
    if let Err((path, err)) = public_keys() {
        errors::public_key_file(Some(&path), &err);
    }
    KEY_FILE_STATE.lock().postmaster_checks_reloads = true;
}

/// Refuses the start when the configured value of the secret setting
/// `name` has a `problem`, reporting it with `refuse` (which never echoes
/// the value). Removes the setting from `configured`.
fn refuse_secret<P>(
    configured: &mut Vec<Configured>,
    name: &str,
    problem: impl Fn(&str) -> Option<P>,
    refuse: fn(&str, P) -> !,
) {
    configured.retain(|c| {
        if !c.name.to_string_lossy().eq_ignore_ascii_case(name) {
            return true;
        }
        if let Some(problem) = problem(&c.value.to_string_lossy()) {
            refuse(&c.origin, problem);
        }
        false
    });
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
fn read_public_keys(
    setting: &str,
) -> Result<Option<Vec<snowflake_core::public_id::Key>>, (String, KeyFileError)> {
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
pub fn public_keys() -> Result<Option<Vec<snowflake_core::public_id::Key>>, (String, KeyFileError)>
{
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
unsafe extern "C-unwind" fn assign_public_key_file(newval: *const c_char, _extra: *mut c_void) {
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
unsafe extern "C-unwind" fn check_public_key(
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
