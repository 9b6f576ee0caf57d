//! `snowflake_health()`: the decisions. The extension gathers the facts
//! (shared memory, settings); this module decides, for each check, the
//! status (`ok`, `warn`, `critical`), the value shown, the threshold and
//! what to do. Pure: the same facts always give the same rows.

/// A check's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Ok,
    Warn,
    Critical,
}

impl Status {
    /// As `snowflake_health()` shows it.
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Critical => "critical",
        }
    }
}

/// The checks, in the order of the rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckName {
    LayoutYearsLeft,
    LeaseDeadlineMargin,
    LeaseProblem,
    RegistryUnreachable,
    WorkerIdsInUse,
    ReservationAhead,
    BackfillSpace,
    RegistryTable,
}

impl CheckName {
    /// As `snowflake_health()` shows it (a Prometheus label value).
    pub fn name(self) -> &'static str {
        match self {
            CheckName::LayoutYearsLeft => "layout_years_left",
            CheckName::LeaseDeadlineMargin => "lease_deadline_margin",
            CheckName::LeaseProblem => "lease_problem",
            CheckName::RegistryUnreachable => "registry_unreachable",
            CheckName::WorkerIdsInUse => "worker_ids_in_use",
            CheckName::ReservationAhead => "reservation_ahead",
            CheckName::BackfillSpace => "backfill_space",
            CheckName::RegistryTable => "registry_table",
        }
    }
}

/// One row of `snowflake_health()`.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub name: CheckName,
    pub status: Status,
    pub value: String,
    pub threshold: String,
    /// What to do when the status is not `ok` (the same text whatever the
    /// status, so a dashboard can show it next to the value).
    pub action: &'static str,
}

/// The last problem the lease worker reported, as the caller may see it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    None,
    /// The text (it names the registry's address).
    Shown(String),
    /// There is one, but the caller may not read the registry's address
    /// (superusers and `pg_read_all_settings` may, as with `SHOW`).
    Hidden,
}

/// Where worker ids come from, when leased.
#[derive(Clone, Debug, PartialEq)]
pub struct Lease {
    /// `snowflake_id.lease_time`.
    pub lease_time_ms: i64,
    /// The earliest deadline of a held block (Unix ms; `None`: none held).
    pub deadline_ms: Option<i64>,
    pub blocks_held: u32,
    /// Since when the registry has not answered (Unix ms).
    pub unreachable_since_ms: Option<i64>,
    pub problem: Problem,
}

/// The table `snowflake_worker_registry` in
/// `snowflake_id.registry_database`, as the registry worker last found it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistryTable {
    /// Not looked at yet (a server just started, or a standby, where the
    /// worker does not run).
    Unchecked,
    /// `snowflake_id.registry_database = ''`: no registry worker.
    Off,
    /// The database does not exist.
    NoDatabase,
    /// The database exists but has no `snowflake_id` extension.
    NoExtension,
    /// Kept.
    Kept,
}

/// Backfill grants: the fullest stretch of time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backfill {
    pub grants: u64,
    pub capacity: u64,
}

/// What the extension gathered.
#[derive(Clone, Debug, PartialEq)]
pub struct Facts {
    pub now_ms: i64,
    /// Years until the layout's time field ends (negative: ended).
    pub years_left: f64,
    /// `snowflake_id.layout_end_warning`.
    pub warning_years: u32,
    /// `None`: worker ids from `snowflake_id.worker_ids`, no leases.
    pub lease: Option<Lease>,
    /// The worker ids this server may hold at once: its range, or in a
    /// fleet what `snowflake_id.max_blocks` blocks of it hold.
    pub worker_ids_total: u64,
    pub worker_ids_held: u64,
    /// Every claim starts above this (the reservation made before a
    /// restart, replay, `snowflake_advance_past()`), Unix ms.
    pub floor_ms: i64,
    pub max_drift_ms: i64,
    /// How long a claim waits for the clock to reach the floor before it
    /// refuses.
    pub floor_wait_ms: i64,
    /// `None`: backfill is off.
    pub backfill: Option<Backfill>,
    pub registry_table: RegistryTable,
    pub in_recovery: bool,
}

/// Below this many years left the layout check is critical.
pub const LAYOUT_CRITICAL_YEARS: f64 = 1.0;
/// Worker ids in use (held of the range), in percent, from which to warn.
pub const WORKER_IDS_WARN_PERCENT: u64 = 80;
/// Backfill grants used of a stretch, in percent, from which to warn.
pub const BACKFILL_WARN_PERCENT: u64 = 80;

/// Every check, in [`CheckName`] order.
pub fn checks(f: &Facts) -> Vec<Check> {
    vec![
        layout_years_left(f),
        lease_deadline_margin(f),
        lease_problem(f),
        registry_unreachable(f),
        worker_ids_in_use(f),
        reservation_ahead(f),
        backfill_space(f),
        registry_table(f),
    ]
}

fn check(
    name: CheckName,
    status: Status,
    value: String,
    threshold: String,
    action: &'static str,
) -> Check {
    Check {
        name,
        status,
        value,
        threshold,
        action,
    }
}

fn seconds(ms: i64) -> String {
    format!("{:.1} s", ms as f64 / 1000.0)
}

fn layout_years_left(f: &Facts) -> Check {
    let warn = f64::from(f.warning_years);
    let status = if f.years_left < LAYOUT_CRITICAL_YEARS {
        Status::Critical
    } else if f.years_left < warn {
        Status::Warn
    } else {
        Status::Ok
    };
    check(
        CheckName::LayoutYearsLeft,
        status,
        format!("{:.1} years", f.years_left),
        format!(
            "warn below {} years (snowflake_id.layout_end_warning), critical below {}",
            f.warning_years, LAYOUT_CRITICAL_YEARS
        ),
        "Plan a layout with a later end before the time field runs out (docs/reference/layout.md).",
    )
}

fn lease_deadline_margin(f: &Facts) -> Check {
    const ACTION: &str = "The lease worker cannot renew: read lease_problem and the server log (lines starting with 'snowflake_id lease'); when the deadline passes no ID is made.";
    let Some(lease) = &f.lease else {
        return check(
            CheckName::LeaseDeadlineMargin,
            Status::Ok,
            "no leases".into(),
            "applies to servers with snowflake_id.registry".into(),
            ACTION,
        );
    };
    let threshold = format!(
        "warn below {} (half of snowflake_id.lease_time), critical below {} or no block held",
        seconds(lease.lease_time_ms / 2),
        seconds(lease.lease_time_ms / 5)
    );
    let (status, value) = match lease.deadline_ms {
        Some(deadline) if lease.blocks_held > 0 => {
            let margin = deadline.saturating_sub(f.now_ms);
            let status = if margin < lease.lease_time_ms / 5 {
                Status::Critical
            } else if margin < lease.lease_time_ms / 2 {
                Status::Warn
            } else {
                Status::Ok
            };
            (status, seconds(margin))
        }
        _ => (Status::Critical, "no block held".into()),
    };
    check(
        CheckName::LeaseDeadlineMargin,
        status,
        value,
        threshold,
        ACTION,
    )
}

fn lease_problem(f: &Facts) -> Check {
    const ACTION: &str =
        "Fix what the problem names (docs/operations/fleet.md, docs/reference/errors.md).";
    let threshold = "critical when the lease worker reports a problem".to_string();
    let problem = f.lease.as_ref().map_or(&Problem::None, |l| &l.problem);
    let (status, value) = match problem {
        Problem::None => (Status::Ok, "none".to_string()),
        Problem::Shown(text) => (Status::Critical, text.clone()),
        Problem::Hidden => (
            Status::Critical,
            "hidden (it names the registry: superusers and pg_read_all_settings see it)"
                .to_string(),
        ),
    };
    check(CheckName::LeaseProblem, status, value, threshold, ACTION)
}

fn registry_unreachable(f: &Facts) -> Check {
    const ACTION: &str = "Check the registry server and the network path to it; the lease deadline says how long IDs can still be made.";
    let Some(lease) = &f.lease else {
        return check(
            CheckName::RegistryUnreachable,
            Status::Ok,
            "no leases".into(),
            "applies to servers with snowflake_id.registry".into(),
            ACTION,
        );
    };
    let threshold = format!(
        "warn when unreachable, critical after {} (half of snowflake_id.lease_time)",
        seconds(lease.lease_time_ms / 2)
    );
    let (status, value) = match lease.unreachable_since_ms {
        None => (Status::Ok, "reachable".to_string()),
        Some(since) => {
            let for_ms = f.now_ms.saturating_sub(since).max(0);
            let status = if for_ms >= lease.lease_time_ms / 2 {
                Status::Critical
            } else {
                Status::Warn
            };
            let since = crate::layout::format_unix_ms(since);
            (status, format!("since {since} ({})", seconds(for_ms)))
        }
    };
    check(
        CheckName::RegistryUnreachable,
        status,
        value,
        threshold,
        ACTION,
    )
}

fn worker_ids_in_use(f: &Facts) -> Check {
    let (held, total) = (f.worker_ids_held, f.worker_ids_total);
    let status = if total == 0 || held >= total {
        Status::Critical
    } else if held * 100 >= total * WORKER_IDS_WARN_PERCENT {
        Status::Warn
    } else {
        Status::Ok
    };
    check(
        CheckName::WorkerIdsInUse,
        status,
        format!("{held} of {total}"),
        format!(
            "warn from {WORKER_IDS_WARN_PERCENT}%, critical when all are held (new sessions share ids)"
        ),
        "Widen snowflake_id.worker_ids (or snowflake_id.max_blocks in a fleet), or pool connections (docs/operations/worker-ids.md).",
    )
}

fn reservation_ahead(f: &Facts) -> Check {
    let ahead = f.floor_ms.saturating_sub(f.now_ms).max(0);
    let status = if ahead > f.max_drift_ms.saturating_add(f.floor_wait_ms) {
        Status::Critical
    } else if ahead > f.max_drift_ms {
        Status::Warn
    } else {
        Status::Ok
    };
    check(
        CheckName::ReservationAhead,
        status,
        format!("{} ahead of the clock", seconds(ahead)),
        format!(
            "warn beyond {} (snowflake_id.max_drift: new sessions wait), critical beyond {} (they refuse)",
            seconds(f.max_drift_ms),
            seconds(f.max_drift_ms.saturating_add(f.floor_wait_ms))
        ),
        "The clock is behind IDs already made (a clock set back, a far-future snowflake_advance_past()): fix the clock, or wait until it passes the reservation.",
    )
}

fn backfill_space(f: &Facts) -> Check {
    const ACTION: &str = "Set aside more worker ids with snowflake_id.backfill_worker_ids, or spread backfills over other stretches of time (docs/guides/backfill.md).";
    let Some(b) = f.backfill else {
        return check(
            CheckName::BackfillSpace,
            Status::Ok,
            "backfill off".into(),
            "applies with snowflake_id.backfill_worker_ids".into(),
            ACTION,
        );
    };
    let status = if b.capacity == 0 || b.grants >= b.capacity {
        Status::Critical
    } else if b.grants * 100 >= b.capacity * BACKFILL_WARN_PERCENT {
        Status::Warn
    } else {
        Status::Ok
    };
    check(
        CheckName::BackfillSpace,
        status,
        format!(
            "{} of {} grants in the fullest stretch",
            b.grants, b.capacity
        ),
        format!("warn from {BACKFILL_WARN_PERCENT}%, critical when a stretch is full"),
        ACTION,
    )
}

fn registry_table(f: &Facts) -> Check {
    const ACTION: &str = "Run CREATE EXTENSION snowflake_id in the database named by snowflake_id.registry_database: without its table, IDs after pg_upgrade or a restore rest on the clock alone (docs/operations/backup-restore.md).";
    let threshold = "critical when the database or the extension there is missing".to_string();
    let (status, value) = match f.registry_table {
        RegistryTable::Kept => (Status::Ok, "kept"),
        RegistryTable::Unchecked if f.in_recovery => (Status::Ok, "standby (the primary keeps it)"),
        RegistryTable::Unchecked => (Status::Warn, "not checked yet"),
        RegistryTable::Off => (
            Status::Warn,
            "off (snowflake_id.registry_database is empty)",
        ),
        RegistryTable::NoDatabase => (Status::Critical, "database missing"),
        RegistryTable::NoExtension => (Status::Critical, "extension missing"),
    };
    check(
        CheckName::RegistryTable,
        status,
        value.to_string(),
        threshold,
        ACTION,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000_000;

    fn local() -> Facts {
        Facts {
            now_ms: NOW,
            years_left: 60.0,
            warning_years: 10,
            lease: None,
            worker_ids_total: 1024,
            worker_ids_held: 3,
            floor_ms: NOW - 5_000,
            max_drift_ms: 1000,
            floor_wait_ms: 2000,
            backfill: None,
            registry_table: RegistryTable::Kept,
            in_recovery: false,
        }
    }

    fn leased() -> Lease {
        Lease {
            lease_time_ms: 60_000,
            deadline_ms: Some(NOW + 55_000),
            blocks_held: 1,
            unreachable_since_ms: None,
            problem: Problem::None,
        }
    }

    fn status(f: &Facts, name: CheckName) -> Status {
        let all = checks(f);
        all.iter()
            .find(|c| c.name == name)
            .map(|c| c.status)
            .unwrap_or_else(|| panic!("no check {name:?}"))
    }

    #[test]
    fn a_healthy_local_server_is_ok_everywhere() {
        let all = checks(&local());
        assert_eq!(all.len(), 8);
        for c in &all {
            assert_eq!(c.status, Status::Ok, "{c:?}");
        }
        let names: Vec<_> = all.iter().map(|c| c.name.name()).collect();
        assert_eq!(
            names,
            [
                "layout_years_left",
                "lease_deadline_margin",
                "lease_problem",
                "registry_unreachable",
                "worker_ids_in_use",
                "reservation_ahead",
                "backfill_space",
                "registry_table"
            ]
        );
    }

    #[test]
    fn layout_years_left() {
        use Status::*;
        for (years, warning, want) in [
            (60.0, 10, Ok),
            (10.0, 10, Ok),
            (9.9, 10, Warn),
            (1.0, 10, Warn),
            (0.9, 10, Critical),
            (-3.0, 10, Critical),
            (0.5, 0, Critical),
            (5.0, 0, Ok),
        ] {
            let f = Facts {
                years_left: years,
                warning_years: warning,
                ..local()
            };
            assert_eq!(
                status(&f, CheckName::LayoutYearsLeft),
                want,
                "{years} years, warning {warning}"
            );
        }
    }

    #[test]
    fn lease_deadline_margin() {
        use Status::*;
        for (deadline, blocks, want) in [
            (Some(NOW + 55_000), 1, Ok),
            (Some(NOW + 30_000), 1, Ok),
            (Some(NOW + 29_999), 1, Warn),
            (Some(NOW + 12_000), 4, Warn),
            (Some(NOW + 11_999), 4, Critical),
            (Some(NOW - 1), 1, Critical),
            (Some(i64::MIN), 1, Critical),
            (None, 0, Critical),
            (Some(NOW + 55_000), 0, Critical),
        ] {
            let f = Facts {
                lease: Some(Lease {
                    deadline_ms: deadline,
                    blocks_held: blocks,
                    ..leased()
                }),
                ..local()
            };
            assert_eq!(
                status(&f, CheckName::LeaseDeadlineMargin),
                want,
                "{deadline:?} {blocks}"
            );
        }
        assert_eq!(status(&local(), CheckName::LeaseDeadlineMargin), Ok);
    }

    #[test]
    fn a_lease_problem_is_critical_and_hidden_from_who_may_not_see_the_registry() {
        let with = |problem| Facts {
            lease: Some(Lease {
                problem,
                ..leased()
            }),
            ..local()
        };
        assert_eq!(
            status(&with(Problem::None), CheckName::LeaseProblem),
            Status::Ok
        );
        let shown = checks(&with(Problem::Shown("registry host=r refused".into())));
        assert_eq!(shown[2].status, Status::Critical);
        assert_eq!(shown[2].value, "registry host=r refused");
        let hidden = checks(&with(Problem::Hidden));
        assert_eq!(hidden[2].status, Status::Critical);
        assert!(!hidden[2].value.contains("host="), "{}", hidden[2].value);
    }

    #[test]
    fn registry_unreachable() {
        use Status::*;
        for (since, want) in [
            (None, Ok),
            (Some(NOW - 1_000), Warn),
            (Some(NOW - 29_999), Warn),
            (Some(NOW - 30_000), Critical),
            (Some(NOW + 5), Warn),
            (Some(i64::MIN), Critical),
        ] {
            let f = Facts {
                lease: Some(Lease {
                    unreachable_since_ms: since,
                    ..leased()
                }),
                ..local()
            };
            assert_eq!(
                status(&f, CheckName::RegistryUnreachable),
                want,
                "{since:?}"
            );
        }
        assert_eq!(status(&local(), CheckName::RegistryUnreachable), Ok);
        let f = Facts {
            lease: Some(Lease {
                unreachable_since_ms: Some(NOW - 1_500),
                ..leased()
            }),
            ..local()
        };
        assert_eq!(
            checks(&f)[3].value,
            "since 2027-01-15 07:59:58.500Z (1.5 s)"
        );
    }

    #[test]
    fn worker_ids_in_use() {
        use Status::*;
        for (held, total, want) in [
            (0, 1024, Ok),
            (818, 1024, Ok),
            (820, 1024, Warn),
            (1023, 1024, Warn),
            (1024, 1024, Critical),
            (0, 0, Critical),
            (4, 5, Warn),
            (3, 5, Ok),
        ] {
            let f = Facts {
                worker_ids_held: held,
                worker_ids_total: total,
                ..local()
            };
            assert_eq!(
                status(&f, CheckName::WorkerIdsInUse),
                want,
                "{held} of {total}"
            );
        }
    }

    #[test]
    fn reservation_ahead() {
        use Status::*;
        for (floor, want) in [
            (NOW - 10_000, Ok),
            (NOW + 1_000, Ok),
            (NOW + 1_001, Warn),
            (NOW + 3_000, Warn),
            (NOW + 3_001, Critical),
            (NOW + 86_400_000, Critical),
            (i64::MIN, Ok),
            (i64::MAX, Critical),
        ] {
            let f = Facts {
                floor_ms: floor,
                ..local()
            };
            assert_eq!(
                status(&f, CheckName::ReservationAhead),
                want,
                "{}",
                floor - NOW
            );
        }
    }

    #[test]
    fn backfill_space() {
        use Status::*;
        for (b, want) in [
            (None, Ok),
            (Some((0, 64)), Ok),
            (Some((51, 64)), Ok),
            (Some((52, 64)), Warn),
            (Some((64, 64)), Critical),
            (Some((0, 0)), Critical),
        ] {
            let f = Facts {
                backfill: b.map(|(grants, capacity)| Backfill { grants, capacity }),
                ..local()
            };
            assert_eq!(status(&f, CheckName::BackfillSpace), want, "{b:?}");
        }
    }

    #[test]
    fn registry_table() {
        use RegistryTable::*;
        use Status::*;
        for (table, recovery, want) in [
            (Kept, false, Ok),
            (Unchecked, true, Ok),
            (Unchecked, false, Warn),
            (Off, false, Warn),
            (NoDatabase, false, Critical),
            (NoExtension, false, Critical),
            (NoExtension, true, Critical),
        ] {
            let f = Facts {
                registry_table: table,
                in_recovery: recovery,
                ..local()
            };
            assert_eq!(
                status(&f, CheckName::RegistryTable),
                want,
                "{table:?} {recovery}"
            );
        }
    }

    #[test]
    fn status_names_order_by_severity() {
        assert!(Status::Ok < Status::Warn && Status::Warn < Status::Critical);
        assert_eq!(
            [Status::Ok, Status::Warn, Status::Critical].map(Status::name),
            ["ok", "warn", "critical"]
        );
    }
}
