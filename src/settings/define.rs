//! The table of definitions: every `snowflake_id.*` setting, its storage,
//! default, bounds, context and hooks, in the order `load` defines them.
//!
//! Two parts, because the second's check hooks need the layout the first
//! defines: [`define_layout`] (the layout settings), then, once `load` has
//! computed the layout, [`define_the_rest`]. The hooks live with their
//! concern (`layout`, `worker_ids`, `backfill`, `fleet`, `public_keys`);
//! the typed getters too.

use super::fleet::{check_registry, check_registry_options};
use super::layout::{
    assign_max_drift, check_epoch, check_max_drift, check_sequence_bits, check_time_unit_ms,
    check_total_bits, show_epoch, show_sequence_bits, show_time_unit, show_total_bits,
    show_worker_bits, Preset, FROM_PRESET,
};
use super::public_keys::{assign_public_key_file, check_public_key};
use super::{backfill::check_backfill_worker_ids, worker_ids::check_worker_ids};
use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::{pg_sys, PostgresGucEnum};
use snowflake_core::layout;
use std::ffi::{c_char, c_void, CStr, CString};

/// `snowflake_id.lease_replication`: what a grant from the registry must be
/// before this server uses it (`snowflake_core::holder::Replication`).
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum LeaseReplication {
    #[name = c"auto"]
    Auto,
    #[name = c"synchronous"]
    Synchronous,
}

type Text = GucSetting<Option<CString>>;

// ------------------------------------------------------------- the layout
pub(super) static PRESET: GucSetting<Preset> = GucSetting::<Preset>::new(Preset::Classic);
/// Empty: the epoch of `snowflake_id.layout`'s preset.
pub(super) static EPOCH: Text = Text::new(Some(c""));
pub(super) static TIME_UNIT_MS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
pub(super) static TOTAL_BITS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
pub(super) static WORKER_BITS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);
pub(super) static SEQUENCE_BITS: GucSetting<i32> = GucSetting::<i32>::new(FROM_PRESET);

// -------------------------------------------------------- worker ids, time
pub(super) static WORKER_IDS: Text = Text::new(None);
pub(super) static BACKFILL_WORKER_IDS: Text = Text::new(None);
pub(super) static MAX_DRIFT_MS: GucSetting<i32> = GucSetting::<i32>::new(60_000);
/// The largest `snowflake_id.max_drift`, in milliseconds.
pub(super) const MAX_DRIFT_LIMIT_MS: i32 = 3_600_000;
/// `snowflake_id.standby_clock_skew`: how far a standby's clock may be
/// behind its primary's (ms), for the floor of a promotion.
pub(super) static STANDBY_CLOCK_SKEW_MS: GucSetting<i32> = GucSetting::<i32>::new(1_000);
/// `snowflake_id.layout_end_warning`: warn when the layout's time field runs
/// out within this many years (0: never).
pub(super) static LAYOUT_END_WARNING: GucSetting<i32> = GucSetting::<i32>::new(10);

// ---------------------------------------------------------------- the fleet
pub(super) static REGISTRY_DATABASE: Text = Text::new(Some(c"postgres"));
pub(super) static REGISTRY: Text = Text::new(None);
/// `snowflake_id.registry_standby_name`: read by the registry's SQL
/// (`leases.sql`, from `pg_file_settings`), on a registry server, whether
/// or not the library is loaded there.
pub(super) static REGISTRY_STANDBY_NAME: Text = Text::new(None);
pub(super) static LEASE_TIME_MS: GucSetting<i32> = GucSetting::<i32>::new(600_000);
/// The shortest and longest `snowflake_id.lease_time`, in milliseconds.
const LEASE_TIME_MIN_MS: i32 = 2_000;
const LEASE_TIME_MAX_MS: i32 = 86_400_000;
pub(super) static LEASE_REPLICATION: GucSetting<LeaseReplication> =
    GucSetting::<LeaseReplication>::new(LeaseReplication::Auto);
/// `snowflake_id.max_blocks`: the most blocks this server leases.
pub(super) static MAX_BLOCKS: GucSetting<i32> = GucSetting::<i32>::new(8);
/// `snowflake_id.registry_options`: connection options added to the
/// Citus coordinator's connection string (user, TLS, passfile).
pub(super) static REGISTRY_OPTIONS: Text = Text::new(None);

// ---------------------------------------------------------- public IDs
/// `snowflake_id.public_key_file`: the file holding the keys of public IDs.
/// Only its name is a setting: PostgreSQL logs a changed value and shows it
/// to `pg_read_all_settings`, so no key may be one.
pub(super) static PUBLIC_KEY_FILE: Text = Text::new(None);
/// `snowflake_id.public_key`, removed in 0.4.0: still defined, so that any
/// value is refused without being shown rather than taken for an unknown
/// name (which the log would show with its value).
static PUBLIC_KEY: Text = Text::new(None);

type StringCheck = unsafe extern "C-unwind" fn(
    *mut *mut c_char,
    *mut *mut c_void,
    pg_sys::GucSource::Type,
) -> bool;
type IntCheck =
    unsafe extern "C-unwind" fn(*mut i32, *mut *mut c_void, pg_sys::GucSource::Type) -> bool;
type StringAssign = unsafe extern "C-unwind" fn(*const c_char, *mut c_void);
type IntAssign = unsafe extern "C-unwind" fn(i32, *mut c_void);
type Show = unsafe extern "C-unwind" fn() -> *const c_char;

/// The context of the layout settings: postmaster settings when
/// preloading, superuser settings when loaded on demand (PostgreSQL only
/// allows postmaster settings while preloading; the decoders still follow
/// postgresql.conf).
fn layout_context(preloading: bool) -> GucContext {
    if preloading {
        GucContext::Postmaster
    } else {
        GucContext::Suset
    }
}

/// A string setting.
#[allow(clippy::too_many_arguments)]
fn string(
    name: &'static CStr,
    short: &'static CStr,
    long: &'static CStr,
    setting: &'static Text,
    context: GucContext,
    flags: GucFlags,
    check: Option<StringCheck>,
    assign: Option<StringAssign>,
) {
    // SAFETY: the hooks are #[pg_guard] functions with the signatures
    // PostgreSQL expects; they only read the values they are given.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            name, short, long, setting, context, flags, check, assign, None,
        );
    }
}

/// An integer setting.
#[allow(clippy::too_many_arguments)]
fn int(
    name: &'static CStr,
    short: &'static CStr,
    long: &'static CStr,
    setting: &'static GucSetting<i32>,
    (min, max): (i32, i32),
    context: GucContext,
    flags: GucFlags,
    (check, assign, show): (Option<IntCheck>, Option<IntAssign>, Option<Show>),
) {
    // SAFETY: as in `string`.
    unsafe {
        GucRegistry::define_int_guc_with_hooks(
            name, short, long, setting, min, max, context, flags, check, assign, show,
        );
    }
}

/// A layout setting: -1 (the default) takes the preset's value, which SHOW
/// and pg_settings give (as `wal_buffers` shows its computed size).
fn layout_int(
    name: &'static CStr,
    short: &'static CStr,
    setting: &'static GucSetting<i32>,
    max: i32,
    context: GucContext,
    flags: GucFlags,
    (check, show): (Option<IntCheck>, Option<Show>),
) {
    int(
        name,
        short,
        c"-1 (the default) takes the value from snowflake_id.layout; SHOW gives the value in use.",
        setting,
        (FROM_PRESET, max),
        context,
        flags,
        (check, None, show),
    );
}

/// The layout settings ([`layout_context`]).
pub(super) fn define_layout(preloading: bool) {
    let context = || layout_context(preloading);
    GucRegistry::define_enum_guc(
        c"snowflake_id.layout",
        c"Preset for the ID layout: classic, sonyflake, js53 or pgedge.",
        c"classic: 41 bits of milliseconds, 10 worker bits, 12 sequence bits. \
          sonyflake: 39 bits of 10 ms, 16 worker bits, 8 sequence bits. \
          js53: IDs below 2^53 with 6 worker bits and 6 sequence bits. \
          pgedge: pgEdge snowflake's IDs, classic's fields from the epoch 2023-01-01. \
          The individual layout settings override the preset.",
        &PRESET,
        context(),
        GucFlags::default(),
    );
    // SAFETY: as in `string`; the show hook only reads the settings.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"snowflake_id.epoch",
            c"Time zero of the IDs' time field (UTC date, date and time, or Unix milliseconds).",
            c"Empty (the default) takes the epoch of snowflake_id.layout (2024-01-01; \
              2023-01-01 for pgedge); SHOW gives the epoch in use. Changing it changes \
              the meaning of every ID already issued.",
            &EPOCH,
            context(),
            GucFlags::default(),
            Some(check_epoch),
            None,
            Some(show_epoch),
        );
    }
    layout_int(
        c"snowflake_id.time_unit_ms",
        c"Length of one tick of the time field.",
        &TIME_UNIT_MS,
        86_400_000,
        context(),
        GucFlags::UNIT_MS,
        (Some(check_time_unit_ms), Some(show_time_unit)),
    );
    layout_int(
        c"snowflake_id.total_bits",
        c"Bits an ID may use (63 for the whole bigint, 53 for JavaScript-safe IDs).",
        &TOTAL_BITS,
        63,
        context(),
        GucFlags::default(),
        (Some(check_total_bits), Some(show_total_bits)),
    );
    layout_int(
        c"snowflake_id.worker_bits",
        c"Bits of the worker id field.",
        &WORKER_BITS,
        layout::MAX_WORKER_BITS as i32,
        context(),
        GucFlags::default(),
        (None, Some(show_worker_bits)),
    );
    layout_int(
        c"snowflake_id.sequence_bits",
        c"Bits of the per-tick sequence field.",
        &SEQUENCE_BITS,
        layout::MAX_SEQUENCE_BITS as i32,
        context(),
        GucFlags::default(),
        (Some(check_sequence_bits), Some(show_sequence_bits)),
    );
}

/// The worker-id lists, whose check hooks need the layout.
pub(super) fn define_worker_ids(preloading: bool) {
    string(
        c"snowflake_id.worker_ids",
        c"Worker ids this server may claim, e.g. 0-511 or 0-15,32-47 (empty: all).",
        c"Give servers that can write the same tables disjoint ranges. \
          A change applies to claims made after the reload.",
        &WORKER_IDS,
        GucContext::Sighup,
        GucFlags::default(),
        Some(check_worker_ids),
        None,
    );
    string(
        c"snowflake_id.backfill_worker_ids",
        c"Worker ids set aside for snowflake_at() (backfill IDs), e.g. 1023 (empty: no backfill).",
        c"Live IDs never use them. No server of the fleet may use them for live IDs, and no \
          other server may set them aside too. Ids may be added at the end later, never \
          taken away.",
        &BACKFILL_WORKER_IDS,
        layout_context(preloading),
        GucFlags::default(),
        Some(check_backfill_worker_ids),
        None,
    );
}

/// Every other setting: time, the fleet, public IDs.
pub(super) fn define_the_rest(preloading: bool) {
    int(
        c"snowflake_id.max_drift",
        c"How far the time of an ID may run ahead of the wall clock.",
        c"Covers sequence exhaustion (borrowing future ticks), a clock that went \
          backwards and a restart within a tick. Beyond it snowflake_nextval() waits \
          (exhaustion) or fails (clock). 0, or at least one tick of the layout.",
        &MAX_DRIFT_MS,
        (0, MAX_DRIFT_LIMIT_MS),
        GucContext::Sighup,
        GucFlags::UNIT_MS,
        (Some(check_max_drift), Some(assign_max_drift), None),
    );
    int(
        c"snowflake_id.standby_clock_skew",
        c"How far a standby's clock may be behind its primary's.",
        c"A server that ends recovery as a new primary (a promoted standby, a restore) starts \
          its IDs above its clock plus this plus max_drift: above every ID a primary whose \
          clock was at most this far ahead can have made, including IDs whose reservation \
          never reached this server.",
        &STANDBY_CLOCK_SKEW_MS,
        (0, MAX_DRIFT_LIMIT_MS),
        GucContext::Sighup,
        GucFlags::UNIT_MS,
        (None, None, None),
    );
    int(
        c"snowflake_id.layout_end_warning",
        c"Years before the layout's time field runs out from which the server warns (0: never).",
        c"Warned about in the log at server start and shown by snowflake_layout() (years_left, \
          ends_soon). A layout that has run out makes no IDs, whatever this says.",
        &LAYOUT_END_WARNING,
        (0, 10_000),
        GucContext::Sighup,
        GucFlags::default(),
        (None, None, None),
    );
    define_fleet(preloading);
    define_public_keys();
}

/// The fleet: the registry worker, leases from a registry server.
fn define_fleet(preloading: bool) {
    string(
        c"snowflake_id.registry_database",
        c"Database whose snowflake_worker_registry table the registry worker keeps (empty: no worker).",
        c"The registry worker records who held each worker id and how far its IDs went.",
        &REGISTRY_DATABASE,
        layout_context(preloading),
        GucFlags::default(),
        None,
        None,
    );
    string(
        c"snowflake_id.registry_standby_name",
        c"On a registry server: the application_name it streams with as a standby (empty: none).",
        c"A promoted standby that the registry's synchronous_standby_names made a failover candidate \
          under this name starts its new incarnation without a fence (snowflake_lease_standbys). \
          Must equal the application_name in its primary_conninfo, and be unique.",
        &REGISTRY_STANDBY_NAME,
        GucContext::Sighup,
        GucFlags::default(),
        None,
        None,
    );
    string(
        c"snowflake_id.registry",
        c"Connection string of the server that leases worker ids to this one (empty: this server's own worker_ids, or the Citus coordinator).",
        c"A libpq key=value string or URI naming a database where the snowflake_id extension is created; it may name this server. Only superusers can see it.",
        &REGISTRY,
        layout_context(preloading),
        GucFlags::SUPERUSER_ONLY,
        Some(check_registry),
        None,
    );
    int(
        c"snowflake_id.lease_time",
        c"How long a lease of worker ids from the registry lasts without a renewal.",
        c"A server keeps making IDs from the blocks it holds for this long when the registry is unreachable; a block of a server that vanished goes to another after it (plus a grace period).",
        &LEASE_TIME_MS,
        (LEASE_TIME_MIN_MS, LEASE_TIME_MAX_MS),
        GucContext::Sighup,
        GucFlags::UNIT_MS,
        (None, None, None),
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
    int(
        c"snowflake_id.max_blocks",
        c"The most blocks of worker ids this server leases from the registry.",
        c"Sessions beyond the leased ids share them. Keeps one server from taking every block of the fleet.",
        &MAX_BLOCKS,
        (1, snowflake_core::lease::BLOCKS_PER_LAYOUT as i32),
        GucContext::Sighup,
        GucFlags::default(),
        (None, None, None),
    );
    string(
        c"snowflake_id.registry_options",
        c"Connection options for the Citus coordinator the lease worker finds (libpq key=value: user, sslmode, sslrootcert, passfile, ...).",
        c"Added to the host, port and database read from Citus's metadata. No password: use a passfile.",
        &REGISTRY_OPTIONS,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY,
        Some(check_registry_options),
        None,
    );
}

/// `snowflake_id.public_key_file` (superuser-only, as `ssl_key_file`) and
/// the removed `snowflake_id.public_key`: sighup settings, defined with or
/// without preloading.
fn define_public_keys() {
    string(
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
    );
    string(
        c"snowflake_id.public_key",
        c"Removed in 0.4.0: the keys of public IDs are read from snowflake_id.public_key_file.",
        c"Any value but empty is refused, without being shown.",
        &PUBLIC_KEY,
        GucContext::Sighup,
        GucFlags::SUPERUSER_ONLY | GucFlags::NO_SHOW_ALL | GucFlags::NO_RESET_ALL,
        Some(check_public_key),
        None,
    );
}

/// A string setting's value, trimmed, or `None` when unset or empty.
pub(super) fn text(setting: &Text) -> Option<String> {
    setting
        .get()
        .map(|s| s.to_string_lossy().trim().to_string())
        .filter(|s| !s.is_empty())
}
