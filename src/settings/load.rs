//! The load phase: defines every setting (`define`), checks what the
//! configuration wrote, and returns one validated [`Config`] or refuses the
//! start with every problem it found.
//!
//! PostgreSQL, given a value a check hook rejects, only warns and starts on
//! the default (another layout, or every worker id, which could make this
//! server collide with others); and it drops a `snowflake_id.*` name no
//! library defines. So `load` reads the configuration's placeholders
//! before defining anything, and refuses instead. The check hooks report
//! to a collector that exists only while `load` runs ([`LoadScope`]).
//!
//! Three stages, because each needs the one before: the layout settings
//! and the layout they make; the worker-id lists (their hooks need the
//! layout); everything else. A stage with a problem ends the load.

use super::fleet::{self, Fleet};
use super::layout::{self, accepted_values, drift_shorter_than_tick};
use super::{backfill, define, public_keys, Config};
use crate::errors;
use parking_lot::{const_mutex, Mutex};
use pgrx::pg_sys;
use snowflake_core::key_file::KeyFileError;
use snowflake_core::layout::Layout;
use std::ffi::{CStr, CString};

/// A problem that refuses the start (or, loaded on demand, the load). Each
/// is reported by the function in `errors` that names it; none echoes the
/// value of a secret setting.
pub(super) enum Refusal {
    /// The layout settings make no layout.
    Layout(String),
    /// A check hook rejected the configured value of a layout setting.
    LayoutSetting {
        name: &'static str,
        problem: String,
    },
    /// A value PostgreSQL rejects, set in `origin`.
    Setting {
        name: String,
        value: String,
        origin: String,
        accepted: String,
    },
    WorkerIds(String),
    BackfillIds(String),
    BackfillOverlap {
        backfill: String,
        live: String,
    },
    TickLongerThanDrift {
        unit_ms: i64,
        drift_ms: i64,
    },
    /// A password in a connection-string setting.
    Secret {
        setting: &'static str,
        origin: String,
        keyword: &'static str,
    },
    Registry {
        origin: String,
        problem: String,
    },
    PublicKeyRemoved {
        origin: String,
    },
    PublicKeyFile {
        path: String,
        err: KeyFileError,
    },
    Unknown {
        name: String,
        origin: String,
        known: String,
    },
}

impl Refusal {
    /// The setting refused (lower case).
    fn setting(&self) -> String {
        match self {
            Refusal::Layout(_) => "snowflake_id.layout".into(),
            Refusal::LayoutSetting { name, .. } => (*name).into(),
            Refusal::Setting { name, .. } | Refusal::Unknown { name, .. } => {
                name.to_ascii_lowercase()
            }
            Refusal::WorkerIds(_) => "snowflake_id.worker_ids".into(),
            Refusal::BackfillIds(_) | Refusal::BackfillOverlap { .. } => {
                "snowflake_id.backfill_worker_ids".into()
            }
            Refusal::TickLongerThanDrift { .. } => "snowflake_id.max_drift".into(),
            Refusal::Secret { setting, .. } => (*setting).into(),
            Refusal::Registry { .. } => "snowflake_id.registry".into(),
            Refusal::PublicKeyRemoved { .. } => "snowflake_id.public_key".into(),
            Refusal::PublicKeyFile { .. } => "snowflake_id.public_key_file".into(),
        }
    }

    /// Raises the error that reports this refusal.
    fn raise(self) -> ! {
        match self {
            Refusal::Layout(problem) => errors::invalid_layout(&problem),
            Refusal::LayoutSetting { name, problem } => {
                errors::invalid_layout(&format!("{name} = {problem}"))
            }
            Refusal::Setting {
                name,
                value,
                origin,
                accepted,
            } => errors::bad_setting(&name, &value, &origin, &accepted),
            Refusal::WorkerIds(detail) => errors::bad_worker_ids(&detail),
            Refusal::BackfillIds(detail) => errors::bad_backfill_ids(&detail),
            Refusal::BackfillOverlap { backfill, live } => {
                errors::backfill_ids_overlap(&backfill, &live)
            }
            Refusal::TickLongerThanDrift { unit_ms, drift_ms } => {
                errors::tick_longer_than_drift(unit_ms, drift_ms, layout::drift_can_cover(unit_ms))
            }
            Refusal::Secret {
                setting,
                origin,
                keyword,
            } => errors::conninfo_secret_setting(setting, &origin, keyword),
            Refusal::Registry { origin, problem } => {
                errors::bad_registry_setting(&origin, &problem)
            }
            Refusal::PublicKeyRemoved { origin } => errors::public_key_removed_setting(&origin),
            Refusal::PublicKeyFile { path, err } => errors::public_key_file(Some(&path), &err),
            Refusal::Unknown {
                name,
                origin,
                known,
            } => errors::unknown_setting(&name, &origin, &known),
        }
    }
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

impl Configured {
    fn is(&self, name: &str) -> bool {
        self.name.to_string_lossy().eq_ignore_ascii_case(name)
    }
}

/// What the check hooks report while `load` runs.
#[derive(Default)]
struct Loading {
    /// The layout, once the first stage has made it (for the hooks of the
    /// worker-id lists).
    layout: Option<Layout>,
    /// Configured values a check hook rejected: the setting, and
    /// `"value": why`.
    rejected: Vec<(&'static str, String)>,
}

static LOADING: Mutex<Option<Loading>> = const_mutex(None);

/// The collector's lifetime: from [`LoadScope::open`] to the drop (also
/// when an error unwinds through `load`).
struct LoadScope;

impl LoadScope {
    fn open() -> LoadScope {
        *LOADING.lock() = Some(Loading::default());
        LoadScope
    }

    fn set_layout(&self, layout: Layout) {
        if let Some(loading) = LOADING.lock().as_mut() {
            loading.layout = Some(layout);
        }
    }

    /// The rejections reported since the last call.
    fn take_rejected(&self) -> Vec<(&'static str, String)> {
        LOADING
            .lock()
            .as_mut()
            .map(|l| std::mem::take(&mut l.rejected))
            .unwrap_or_default()
    }
}

impl Drop for LoadScope {
    fn drop(&mut self) {
        *LOADING.lock() = None;
    }
}

/// Rejects a value in a check hook: sets PostgreSQL's error detail, and
/// while `load` runs, reports the rejection of a configured value.
pub(super) fn reject(
    name: &'static str,
    value: &str,
    detail: &str,
    source: pg_sys::GucSource::Type,
) -> bool {
    if source != pg_sys::GucSource::PGC_S_DEFAULT {
        if let Some(loading) = LOADING.lock().as_mut() {
            loading
                .rejected
                .push((name, format!("\"{value}\": {detail}")));
        }
    }
    errors::guc_check_detail(detail);
    false
}

/// The layout for a check hook: the one in use, or, while `load` runs, the
/// one its first stage made (`None` before that).
pub(super) fn hook_layout() -> Option<Layout> {
    if let Some(config) = super::CONFIG.get() {
        return Some(config.layout);
    }
    LOADING.lock().as_ref().and_then(|l| l.layout)
}

/// Whether `load` has finished: the hooks check what it checked itself.
pub(super) fn loaded() -> bool {
    super::CONFIG.get().is_some()
}

/// Defines every setting and checks the configuration: the validated
/// [`Config`], or the start is refused with every problem found (an ERROR
/// naming the first, after a WARNING naming the others). `preloading`:
/// called while `shared_preload_libraries` loads.
pub(super) fn load(preloading: bool) -> Config {
    let scope = LoadScope::open();
    // What the configuration says, before defining the settings replaces
    // PostgreSQL's placeholders (and forgets values it cannot parse).
    let mut configured = if preloading {
        configured_placeholders()
    } else {
        Vec::new()
    };
    let origins: Vec<(String, String)> = configured
        .iter()
        .map(|c| {
            (
                c.name.to_string_lossy().to_ascii_lowercase(),
                c.origin.clone(),
            )
        })
        .collect();
    let mut refusals = Refusals::default();

    // 1. The layout.
    define::define_layout(preloading);
    for (name, problem) in scope.take_rejected() {
        refusals.push(Refusal::LayoutSetting { name, problem });
    }
    refusals.check_values(&mut configured, 0);
    // (The hooks have reported again what the values' check found.)
    scope.take_rejected();
    let layout = match layout::compute() {
        Ok(layout) => layout,
        Err(message) => {
            refusals.push(Refusal::Layout(message));
            refusals.raise(&origins)
        }
    };
    refusals.raise_any(&origins);
    scope.set_layout(layout);

    // 2. The worker-id lists.
    define::define_worker_ids(preloading);
    for (name, problem) in scope.take_rejected() {
        match name {
            "snowflake_id.worker_ids" => refusals.push(Refusal::WorkerIds(problem)),
            "snowflake_id.backfill_worker_ids" => refusals.push(Refusal::BackfillIds(problem)),
            _ => {}
        }
    }
    let backfill = match backfill::space(&layout) {
        Ok(space) => space,
        Err(refusal) => {
            refusals.push(refusal);
            None
        }
    };
    refusals.raise_any(&origins);

    // 3. Everything else.
    define::define_the_rest(preloading);
    check_the_rest(&mut configured, &layout, preloading, &mut refusals);
    refusals.raise_any(&origins);

    // SAFETY: a plain call into PostgreSQL with a static C string.
    unsafe { pg_sys::MarkGUCPrefixReserved(c"snowflake_id".as_ptr()) };
    Config {
        layout,
        backfill,
        fleet: Fleet::at_load(),
        registry_worker: fleet::registry_worker_at_load(),
    }
}

/// The third stage's checks, in the order their refusals are reported.
fn check_the_rest(
    configured: &mut Vec<Configured>,
    layout: &Layout,
    preloading: bool,
    refusals: &mut Refusals,
) {
    // The secret settings first, and never echoed (they leave `configured`
    // before the values are checked, whose errors quote them).
    configured.retain(|c| {
        let refusal = if c.is("snowflake_id.public_key") {
            public_keys::refuse_removed_public_key(&c.value.to_string_lossy(), &c.origin)
        } else if c.is("snowflake_id.registry") {
            fleet::refuse_registry(&c.value.to_string_lossy(), &c.origin)
        } else if c.is("snowflake_id.registry_options") {
            fleet::refuse_registry_options(&c.value.to_string_lossy(), &c.origin)
        } else {
            return true;
        };
        if let Some(refusal) = refusal {
            refusals.push(refusal);
        }
        false
    });
    refusals.check_values(configured, layout.max_worker_id());
    // (After the values: a max_drift PostgreSQL rejected is named as
    // written, not as the default it would fall back to.)
    if let Some(drift_ms) = drift_shorter_than_tick(layout) {
        refusals.push(Refusal::TickLongerThanDrift {
            unit_ms: layout.unit_ms,
            drift_ms,
        });
    }
    if let Some(unknown) = configured.first() {
        refusals.push(Refusal::Unknown {
            name: unknown.name.to_string_lossy().into_owned(),
            origin: unknown.origin.clone(),
            known: defined_names().join(", "),
        });
    }
    if preloading {
        if let Some(refusal) = public_keys::check_at_start() {
            refusals.push(refusal);
        }
    }
}

/// The problems found so far, one per setting, in the order found.
#[derive(Default)]
struct Refusals(Vec<Refusal>);

impl Refusals {
    /// Adds a problem, unless its setting is refused already.
    fn push(&mut self, refusal: Refusal) {
        let setting = refusal.setting();
        if !self.0.iter().any(|r| r.setting() == setting) {
            self.0.push(refusal);
        }
    }

    /// Refuses configured values of settings defined by now that
    /// PostgreSQL rejects: it would only warn and run on the default (for
    /// example `layout = 'js-53'` running the classic layout), so this
    /// server would make IDs another way than written. Checked settings
    /// leave `configured`.
    fn check_values(&mut self, configured: &mut Vec<Configured>, max_worker_id: u32) {
        configured.retain(|c| {
            // SAFETY: plain lookups of a setting by a valid C string name.
            let flags = unsafe { pg_sys::GetConfigOptionFlags(c.name.as_ptr(), true) };
            if flags & pg_sys::GUC_CUSTOM_PLACEHOLDER as i32 != 0 {
                return true; // not defined (yet)
            }
            if !value_accepted(c) {
                let name = c.name.to_string_lossy().into_owned();
                let accepted = accepted_values(&name.to_ascii_lowercase(), max_worker_id)
                    .unwrap_or_else(|| {
                        "see the setting's description: SELECT extra_desc FROM pg_settings WHERE name = '<setting>'".into()
                    });
                self.push(Refusal::Setting {
                    name,
                    value: c.value.to_string_lossy().into_owned(),
                    origin: c.origin.clone(),
                    accepted,
                });
            }
            false
        });
    }

    /// Ends the load if anything was found.
    fn raise_any(&mut self, origins: &[(String, String)]) {
        if !self.0.is_empty() {
            self.raise(origins);
        }
    }

    /// Reports the problems: a WARNING naming all but the first (with where
    /// each was set), then the first's ERROR.
    fn raise(&mut self, origins: &[(String, String)]) -> ! {
        let mut all = std::mem::take(&mut self.0).into_iter();
        let Some(first) = all.next() else {
            errors::internal("snowflake_id settings refused without a problem")
        };
        let others: Vec<String> = all
            .map(|r| {
                let setting = r.setting();
                match origins.iter().find(|(name, _)| *name == setting) {
                    Some((_, origin)) => format!("{setting} ({origin})"),
                    None => setting,
                }
            })
            .collect();
        if !others.is_empty() {
            errors::also_refused(&others);
        }
        first.raise()
    }
}

/// Whether PostgreSQL accepts the configured value (validated only,
/// quietly: PostgreSQL already logged its own WARNING with the details
/// when it reapplied the value).
fn value_accepted(c: &Configured) -> bool {
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
    ok != 0
}

const PREFIX: &str = "snowflake_id.";

/// Every `snowflake_id.*` variable PostgreSQL knows now. PostgreSQL 15
/// keeps them in an array, 16 and later return a palloc'd copy.
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

/// Whether a variable is a placeholder: a name the configuration set and
/// no library defined.
fn is_placeholder(var: &pg_sys::config_generic) -> bool {
    var.flags & pg_sys::GUC_CUSTOM_PLACEHOLDER as i32 != 0
}

/// The names this library defines, sorted (for the error that refuses an
/// unknown one).
fn defined_names() -> Vec<String> {
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
    names
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
        configured.push(Configured {
            name,
            value,
            source: var.source,
            origin: origin_of(var),
        });
    }
    configured
}

/// Where a placeholder's value was set, for errors.
fn origin_of(var: &pg_sys::config_generic) -> String {
    if var.sourcefile.is_null() {
        return match var.source {
            pg_sys::GucSource::PGC_S_ARGV => "the server's command line".to_string(),
            _ => "the server's configuration".to_string(),
        };
    }
    // SAFETY: a valid C string owned by the GUC record.
    let file = unsafe { CStr::from_ptr(var.sourcefile) }.to_string_lossy();
    format!("file \"{file}\" line {}", var.sourceline)
}
