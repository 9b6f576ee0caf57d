//! Backfill in a fleet (the rules: `snowflake_core::registry::backfill`).
//!
//! - The registry's side: `snowflake_backfill_grant(req jsonb)`
//!   (`backfill_fleet.sql`, for the lease role) gathers the lease rows and
//!   the caller, and [`snowflake_backfill_grant_take`] decides and hands
//!   out the grants from this server's own counters (shared memory, state
//!   file, WAL: `durability::backfill::grant`), the ones its own
//!   `snowflake_at()` takes from. The WAL record of a grant is flushed
//!   before the reply, so the caller's `snowflake_lease_durable` that
//!   follows, in the same session, checks a position at or past it.
//! - The holder's side: [`grant`], called by `snowflake_at()` when this
//!   server leases from a registry. Its session backend asks the registry
//!   itself, on a connection of its own for the call (libpq,
//!   `registry_client`, waiting on the latch, each call within
//!   `CALL_TIMEOUT_MS`), then asks whether the grant is durable, and uses
//!   it only then.

use crate::errors;
use crate::settings;
use crate::shmem;
use crate::workers::registry_client::{AnswerBy, Connection};
use pgrx::prelude::*;
use pgrx::JsonB;
use serde_json::Value;
use snowflake_core::holder::{CallError, Durability, DurabilityMode, Replication};
use snowflake_core::protocol::parse_lsn;
use snowflake_core::registry::backfill::{plan, Facts, GrantReply, GrantRequest};
use snowflake_core::registry::BlockRow;
use std::sync::atomic::Ordering::Acquire;
use std::time::Instant;

// ------------------------------------------------------------ the registry

/// The grants of one call from a holder (`request`, its jsonb text), with
/// the facts `snowflake_backfill_grant` gathered (`now_ms`, the lease
/// rows as `blocks`, the caller's `role` and `client` for the log).
/// Refusals are logged with the caller, then raised.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_backfill_grant_take(request text, facts jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_backfill_grant_take_wrapper';
"#)]
fn snowflake_backfill_grant_take(request: &str, facts: JsonB) -> JsonB {
    const KEYS: &str = "node, layout and ids (strings), buckets (an array of numbers) and first (an array of booleans) are required.";
    let req: GrantRequest = super::leases::request(request, KEYS);
    let caller = super::leases::caller(&facts.0);
    let now_ms = facts.0.get("now_ms").and_then(Value::as_i64).unwrap_or(0);
    let blocks: Vec<BlockRow> = facts
        .0
        .get("blocks")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .unwrap_or_else(|e| {
            errors::internal(&format!(
                "snowflake_id registry: the lease rows gathered for a backfill grant do not parse: {e}"
            ))
        })
        .unwrap_or_default();
    let header = crate::claims::require_shared("snowflake_backfill_grant");
    // SAFETY: a plain read of PostgreSQL's recovery state.
    if unsafe { pg_sys::RecoveryInProgress() } {
        errors::backfill_on_standby();
    }
    if header.layout_changed.load(Acquire) {
        errors::layout_changed(&header.recorded_layout.differences(settings::layout()));
    }
    let backfill = header.backfill();
    if settings::backfill_space().is_some() && !backfill.history_read.load(Acquire) {
        super::backfill::wait_for_history(header);
    }
    if backfill.ids_changed.load(Acquire) {
        errors::backfill_ids_changed(&backfill.recorded_ids.get(), &settings::backfill_ids_text());
    }
    let layout = settings::layout();
    let layout_text = snowflake_core::lease::layout_text(layout);
    let decided = plan(
        &req,
        &Facts {
            layout: &layout_text,
            space: settings::backfill_space(),
            after_ms: backfill.after_ms.load(Acquire),
            blocks: &blocks,
            now_ms,
        },
    );
    let plan = match decided {
        Ok(plan) => plan,
        Err(refusal) => super::leases::refuse(refusal, &caller),
    };
    // The holder's own counts first (it backfilled alone before): never
    // a grant it handed out itself.
    crate::durability::backfill::raise_counted(header, &plan.raise, false);
    let grants = crate::durability::backfill::grant(header, &plan.buckets, &plan.limits, false);
    let handed_out = plan
        .buckets
        .first()
        .and_then(|&b| backfill.grants.get(b as usize))
        .map_or(0, |n| n.load(Acquire));
    JsonB(
        serde_json::to_value(GrantReply {
            grants,
            after_ms: plan.after_ms,
            handed_out,
            lsn: String::new(),
        })
        .unwrap_or(Value::Null),
    )
}

pgrx::extension_sql_file!(
    "backfill_fleet.sql",
    name = "backfill_fleet",
    requires = ["leases", "backfill", snowflake_backfill_grant_take]
);

// -------------------------------------------------------------- the holder

/// Session settings of the backfill connection to the registry, as the
/// lease worker's: names resolve in pg_catalog only, grants committed
/// synchronously whatever the registry's default.
const SESSION_OPTIONS: &str = "-c statement_timeout=10s -c lock_timeout=5s -c search_path=pg_catalog,pg_temp -c synchronous_commit=on";

/// Where the backfill grant function is: the schema of the extension's
/// member `snowflake_backfill_grant(jsonb)` (none: a registry before 0.8.0).
const FIND_SCHEMA: &str = "SELECT quote_ident(n.nspname) \
       FROM pg_extension e \
       JOIN pg_depend d ON d.refobjid = e.oid AND d.refclassid = 'pg_extension'::regclass \
                       AND d.classid = 'pg_proc'::regclass AND d.deptype = 'e' \
       JOIN pg_proc p ON p.oid = d.objid \
       JOIN pg_namespace n ON n.oid = p.pronamespace \
      WHERE e.extname = 'snowflake_id' AND p.proname = 'snowflake_backfill_grant' \
        AND has_function_privilege(p.oid, 'EXECUTE') \
      LIMIT 1";

/// How long a backfill waits for its grants to be durable on the
/// registry's synchronous standbys, in ms (each check waits up to 5 s
/// there).
const DURABLE_WAIT_MS: u128 = 30_000;

/// A backend's session on the registry, for one grant call.
struct Session {
    conn: Connection,
    schema: String,
}

/// Grants of `buckets` from the registry (`first`: this backend holds none
/// of the stretch's), used only once durable: per stretch the grant, or
/// `None`; the holder's floor; how many grants the first stretch has.
/// Raises when the registry cannot be reached, refuses, or the grants are
/// not durable in time (they are then lost, never used).
pub fn grant(buckets: &[u32], first: &[bool]) -> GrantReply {
    let header = shmem::header();
    let (conninfo, display) = registry_conninfo(header);
    let req = GrantRequest {
        node: header.map(|h| h.lease.node_id.get()).unwrap_or_default(),
        name: crate::workers::lease_worker::node_name(),
        layout: snowflake_core::lease::layout_text(settings::layout()),
        ids: settings::backfill_ids_text(),
        buckets: buckets.iter().map(|&b| i64::from(b)).collect(),
        first: first.to_vec(),
        held: buckets
            .iter()
            .map(|&b| {
                header
                    .and_then(|h| h.backfill().grants.get(b as usize))
                    .map_or(0, |n| i64::from(n.load(Acquire)))
            })
            .collect(),
    };
    let body = serde_json::to_string(&req)
        .unwrap_or_else(|e| errors::internal(&format!("a backfill request does not encode: {e}")));
    // A connection per call, closed after it (also when an error is
    // raised: it is a local): sessions that import do not hold the lease
    // role's connections, which its CONNECTION LIMIT keeps for the lease
    // workers, while they do other work. One retry on a new connection.
    for attempt in 0..2 {
        let mut s = connect(&conninfo, &display);
        match ask(&mut s, &body) {
            Ok(reply) => return durable(&mut s, buckets, reply, &display),
            Err(CallError::Refused(r)) if r.sqlstate.is_some() => {
                if r.functions_gone() {
                    errors::backfill_registry_too_old(&display);
                }
                errors::backfill_registry_refused(&display, &r.message, r.hint);
            }
            Err(e) => {
                drop(s);
                interrupted();
                if attempt == 1 {
                    errors::backfill_registry_unreachable(&display, &problem(&e));
                }
            }
        }
    }
    errors::internal("a backfill grant call ended without an answer")
}

/// Serves a cancel or a termination that cut a call short (the session
/// is closed by then).
fn interrupted() {
    pgrx::check_for_interrupts!();
}

/// libpq's problem with the registry, as errors show it: it may name the
/// registry's address, which only roles that may read
/// `snowflake_id.registry` see (`settings::may_read_hidden_settings`).
fn problem(e: &CallError) -> String {
    if settings::may_read_hidden_settings() {
        e.text().to_string()
    } else {
        "the connection failed (its problem is shown to superusers and members of pg_read_all_settings)".into()
    }
}

/// The registry's connection string and how messages show it (hidden
/// from roles that may not read `snowflake_id.registry`): that of
/// `snowflake_id.registry`, else the Citus coordinator the lease worker
/// follows.
fn registry_conninfo(header: Option<&shmem::Header>) -> (String, String) {
    let shown = settings::may_read_hidden_settings();
    let hide = |display: String| {
        if shown {
            display
        } else {
            errors::REGISTRY_HIDDEN.to_string()
        }
    };
    if let Some(conninfo) = settings::registry() {
        let display = crate::workers::lease_worker::redact(&conninfo);
        return (conninfo, hide(display));
    }
    let Some(lease) = header.map(|h| &h.lease) else {
        errors::backfill_with_leases("a registry that is not known")
    };
    let conninfo = lease.coordinator.get();
    // Empty: not known yet; 1023 bytes: cut by shared memory.
    if conninfo.is_empty() || conninfo.len() >= 1023 {
        errors::backfill_with_leases("a Citus coordinator that is not known yet")
    }
    (conninfo, hide(lease.registry.get()))
}

fn connect(conninfo: &str, display: &str) -> Session {
    let answer_by = AnswerBy {
        origin: Instant::now(),
        deadline_mono_ms: None,
    };
    let (mut conn, _) = Connection::connect(
        conninfo,
        "snowflake_id backfill",
        SESSION_OPTIONS,
        0,
        answer_by,
    )
    .unwrap_or_else(|e| {
        interrupted();
        errors::backfill_registry_unreachable(display, &problem(&e))
    });
    let schema = conn
        .value(FIND_SCHEMA, &[])
        .unwrap_or_else(|e| drop_and_raise(display, &e));
    let Some(schema) = schema else {
        errors::backfill_registry_too_old(display)
    };
    Session { conn, schema }
}

#[cold]
fn drop_and_raise(display: &str, e: &CallError) -> ! {
    interrupted();
    errors::backfill_registry_unreachable(display, &problem(e))
}

fn ask(s: &mut Session, body: &str) -> Result<GrantReply, CallError> {
    let sql = format!(
        "SELECT {}.snowflake_backfill_grant($1::jsonb)::text",
        s.schema
    );
    let text = s
        .conn
        .value(&sql, &[body])?
        .ok_or_else(|| CallError::unusable("snowflake_backfill_grant answered nothing"))?;
    serde_json::from_str(&text).map_err(|e| {
        CallError::unusable(format!(
            "snowflake_backfill_grant answered what this server cannot read: {e}"
        ))
    })
}

/// Counts the fleet's grants of `reply` in this server's own counters
/// (durably, before use): its dumps and `pg_upgrade` carry them, so that
/// its rows restored where it backfills alone, or its next requests,
/// start above them.
fn count_used(buckets: &[u32], reply: &GrantReply) {
    let Some(header) = shmem::header() else {
        return;
    };
    let used: Vec<(u32, u32)> = buckets
        .iter()
        .zip(&reply.grants)
        .filter_map(|(&bucket, grant)| grant.map(|g| (bucket, g.saturating_add(1))))
        .collect();
    crate::durability::backfill::raise_counted(header, &used, false);
}

/// Waits until the registry says the grants of `reply` are durable where a
/// failover keeps them (`snowflake_lease_durable`, in the same session,
/// checks a position at or past their WAL); raises when they are not in
/// [`DURABLE_WAIT_MS`].
fn durable(s: &mut Session, buckets: &[u32], reply: GrantReply, display: &str) -> GrantReply {
    if reply.grants.iter().all(Option::is_none) {
        return reply;
    }
    let needed = parse_lsn(&reply.lsn).unwrap_or(u64::MAX);
    let sql = format!(
        "SELECT {}.snowflake_lease_durable('{{\"wait_ms\": 5000}}'::jsonb)::text",
        s.schema
    );
    let started = Instant::now();
    let mut last = String::from("no answer");
    while started.elapsed().as_millis() < DURABLE_WAIT_MS {
        let answer = s.conn.value(&sql, &[]).and_then(|t| {
            let t =
                t.ok_or_else(|| CallError::unusable("snowflake_lease_durable answered nothing"))?;
            serde_json::from_str::<Durability>(&t)
                .map_err(|e| CallError::unusable(format!("snowflake_lease_durable: {e}")))
        });
        let d = match answer {
            Ok(d) => d,
            Err(e) => {
                interrupted();
                errors::backfill_registry_unreachable(display, &problem(&e))
            }
        };
        let reaches = parse_lsn(&d.lsn).is_some_and(|lsn| lsn >= needed);
        let usable = d.durable
            && reaches
            && (settings::lease_replication() == Replication::Auto
                || d.mode == DurabilityMode::Synchronous);
        if usable {
            count_used(buckets, &reply);
            return reply;
        }
        last = format!(
            "{} of {} synchronous standbys flushed {} (mode {}, behind: {})",
            d.flushed,
            d.needed,
            d.lsn,
            d.mode.as_str(),
            if d.behind.is_empty() {
                "none".to_string()
            } else {
                d.behind.join(", ")
            }
        );
        // An answer at once (a promoted registry before its first lease
        // call): not a busy loop.
        crate::clock::wait_ms(100);
        interrupted();
    }
    errors::backfill_grants_not_durable(display, &last)
}
