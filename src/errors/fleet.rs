//! Errors of a fleet that leases worker ids from a registry (or Citus): no
//! lease, an unknown Citus cluster, a standby. The registry's address and
//! the lease worker's problem are shown only to roles that may read them.

use super::raise;
use pgrx::PgSqlErrorCode;
use snowflake_core::layout::format_unix_ms;

/// What replaces the registry's address, and the lease worker's last
/// problem (which may name it), for a role that may not read it.
pub const REGISTRY_HIDDEN: &str =
    "(address hidden: shown to superusers and members of pg_read_all_settings)";

/// 55000: leases are in use and this server holds no usable worker id: the
/// registry is unreachable (for `unreachable_ms`), or no block was leased
/// within `waited_ms`. `shown`: whether the role may read the registry's
/// address (`settings::may_read_hidden_settings`); else neither it nor the
/// problem is in the error.
#[track_caller]
pub fn no_lease(
    registry: &str,
    unreachable_ms: Option<i64>,
    deadline_ms: i64,
    problem: &str,
    waited_ms: i64,
    shown: bool,
) -> ! {
    let registry = if !shown {
        REGISTRY_HIDDEN.to_string()
    } else if registry.is_empty() {
        "(not known yet)".to_string()
    } else {
        registry.to_string()
    };
    let (message, mut detail) = match unreachable_ms {
        Some(ms) => (
            format!(
                "no worker id is leased: the registry {registry} has been unreachable for {} s",
                ms / 1000
            ),
            if deadline_ms > 0 {
                format!(
                    "This server's leases ran out at {}.",
                    format_unix_ms(deadline_ms)
                )
            } else {
                "This server holds no lease from it.".to_string()
            },
        ),
        None => (
            format!(
                "no worker id is leased from the registry {registry} after waiting {waited_ms} ms"
            ),
            "Every block this server may lease is held by other servers, or the lease worker has not leased one yet.".to_string(),
        ),
    };
    if !problem.is_empty() {
        if shown {
            detail.push_str(&format!(" Last problem: {problem}"));
        } else {
            detail.push_str(" The lease worker's last problem is in this server's log and in this error as a superuser or a member of pg_read_all_settings sees it.");
        }
    }
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        message,
        Some(detail),
        Some("Check that the registry server is running and reachable from this server with the connection string in snowflake_id.registry (or the Citus coordinator), and look for \"snowflake_id lease\" in this server's log. IDs resume by themselves once a lease is granted.".into()),
    )
}

/// 55000: Citus is preloaded and the lease worker cannot tell which
/// cluster this server belongs to (see `lease_worker`): no IDs rather
/// than every worker id unchecked. `citus_here`: this session's database,
/// when it has the citus extension. `shown`: as for [`no_lease`] (the
/// problem may name the coordinator).
#[track_caller]
pub fn fleet_unknown(problem: &str, citus_here: Option<String>, shown: bool) -> ! {
    let hint = match citus_here {
        Some(db) => format!(
            "This database ({db}) has the citus extension: set snowflake_id.registry_database = '{}' in postgresql.conf and reload, or set snowflake_id.registry.",
            db.replace('\'', "''")
        ),
        None => "Set snowflake_id.registry_database to the database where CREATE EXTENSION citus ran and reload, or set snowflake_id.registry to the fleet's registry.".into(),
    };
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "no worker id can be leased: this server cannot tell which Citus cluster it belongs to"
            .into(),
        Some(if shown {
            problem.to_string()
        } else {
            "The reason may name servers of the fleet: it is in this server's log, and in this error as a superuser or a member of pg_read_all_settings sees it.".to_string()
        }),
        Some(hint),
    )
}

/// 55000: a hot standby of a fleet that leases worker ids makes no IDs.
#[track_caller]
pub fn no_lease_on_standby() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
        "a standby makes no IDs when worker ids are leased from a registry".into(),
        Some("Leases are taken by the lease worker, which starts when the server is promoted.".into()),
        Some("Make IDs on the primary, or promote this server. To make IDs on a hot standby, give it its own snowflake_id.worker_ids and no snowflake_id.registry.".into()),
    )
}

/// A refusal of the registry's rules (`snowflake_core::registry`), with
/// the SQLSTATE, message, detail and hint they chose: its messages are in
/// `core/src/registry/` (`Refusal::new`), which
/// `tests/docs/test_errors_doc.py` reads as it reads this directory.
pub fn registry_refusal(refusal: snowflake_core::registry::Refusal) -> ! {
    use snowflake_core::registry::SqlState;
    let code = match refusal.code {
        SqlState::InvalidParameterValue => PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        SqlState::ProgramLimitExceeded => PgSqlErrorCode::ERRCODE_PROGRAM_LIMIT_EXCEEDED,
        SqlState::NotInPrerequisiteState => {
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE
        }
        SqlState::InsufficientPrivilege => PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
        SqlState::LockNotAvailable => PgSqlErrorCode::ERRCODE_LOCK_NOT_AVAILABLE,
    };
    raise(code, refusal.message, refusal.detail, refusal.hint)
}

/// 25001: a lease call inside a transaction block. Its locks (the
/// registry's, the failover candidates' row) last to the end of the
/// transaction: a session that sat on it would hold every holder's calls.
pub fn lease_call_in_transaction() -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_ACTIVE_SQL_TRANSACTION,
        "a lease call cannot run inside a transaction block".into(),
        Some("Lease calls are decided under locks held to the end of their transaction; the lease worker calls them one statement at a time.".into()),
        Some("Call the lease functions in autocommit mode, outside BEGIN ... COMMIT; the snowflake_id lease worker never does otherwise: who called them by hand?".into()),
    )
}

/// 22023: a lease request (or the facts the registry's SQL gathered for
/// it) that does not parse: `required` names the keys the call needs,
/// `error` what was wrong.
pub fn invalid_lease_request(required: &str, error: &str) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
        "invalid lease request".into(),
        Some(format!("{required} ({error})")),
        Some("The snowflake_id lease worker never sends such a request: who called the lease functions by hand?".into()),
    )
}

/// 53400: a lease call in a registry database past the signed-count slots
/// of the postmaster (`shmem::SIGNED_DATABASES`): it would sign a reply
/// whose grant count nothing kept.
pub fn registry_databases_full(slots: usize) -> ! {
    raise(
        PgSqlErrorCode::ERRCODE_CONFIGURATION_LIMIT_EXCEEDED,
        format!("this registry server already answers lease calls in {slots} databases"),
        Some(format!("Each database in which this server signed a lease reply since it started keeps the reply's grant count in one of {slots} places in shared memory until it restarts; without one, a reply whose call rolled back could not be told from a grant the registry forgot.")),
        Some("Restart the registry server to free the places of databases that no longer serve as registries, or serve this fleet from a registry database in another cluster.".into()),
    )
}
