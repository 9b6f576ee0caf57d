//! The registry's side of the lease protocol. `leases.sql` has the tables
//! and the SECURITY DEFINER functions a holder calls
//! (`snowflake_lease_acquire`, `_renew`, `_release`, `_durable`): they
//! gather the facts of a call, pass them to the functions below, and apply
//! the writes these return. The rules are `snowflake_core::registry`'s
//! (the holder's side is `snowflake_core::holder`, driven by
//! `workers::lease_worker`); this is glue: jsonb in, jsonb out, refusals
//! raised as errors.
//!
//! Internal (`snowflake_id_internal`, EXECUTE revoked from PUBLIC in
//! `leases.sql`): only the lease functions, which run as the extension's
//! owner, call them. Each is declared by hand (`sql = ...`): pgrx's
//! `schema =` wants a schema of its own (`#[pg_schema]`), and this one is
//! made by `internal_schema.sql`.

use crate::errors;
use pgrx::prelude::*;
use pgrx::JsonB;
use pgrx::{register_xact_callback, PgXactCallbackEvent};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use snowflake_core::protocol::{AcquireRequest, ReleaseRequest, RenewRequest};
use snowflake_core::registry::begin::Forgotten;
use snowflake_core::registry::{self, durable, hello, token, Call, Rows, Server};

/// What each call's request must have (the detail of `invalid lease
/// request`).
const ACQUIRE_KEYS: &str = "node, name and layout (strings), allowed (an array), block_size, max_worker_id, want, lease_ms, grace_ms and high_ms (numbers) are required.";
const RENEW_KEYS: &str =
    "node (a string), blocks (an array), lease_ms, grace_ms and high_ms (numbers) are required.";
const RELEASE_KEYS: &str = "node (a string), block and high_ms (numbers) are required.";

/// A request, from its text: parsed here rather than converted by pgrx,
/// so that a request nested deeper than serde's limit is refused as
/// invalid (22023) like any other that does not parse.
pub(super) fn request<T: DeserializeOwned>(text: &str, keys: &str) -> T {
    serde_json::from_str(text)
        .unwrap_or_else(|e| errors::invalid_lease_request(keys, &e.to_string()))
}

/// Who made the call, for the log: the `role` and `client` the SQL
/// gathered with the facts.
pub(super) fn caller(facts: &Value) -> (String, String) {
    let text = |key: &str| {
        facts
            .get(key)
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string()
    };
    (text("role"), text("client"))
}

/// A refusal of the rules: its log line, with who made the call, then the
/// error.
pub(super) fn refuse(refusal: registry::Refusal, (role, client): &(String, String)) -> ! {
    if let Some(line) = &refusal.log {
        pgrx::log!("snowflake_id registry: {line} (role {role}, {client})");
    }
    errors::registry_refusal(refusal)
}

/// Facts the registry's own SQL gathered: one that does not parse is a bug.
fn facts<T: DeserializeOwned>(value: Value, what: &str) -> T {
    serde_json::from_value(value).unwrap_or_else(|e| {
        errors::internal(&format!(
            "snowflake_id registry: the {what} gathered for a lease call do not parse: {e}"
        ))
    })
}

fn to_jsonb<T: serde::Serialize>(value: &T) -> JsonB {
    JsonB(serde_json::to_value(value).unwrap_or_else(|e| {
        errors::internal(&format!(
            "snowflake_id registry: a decision does not serialize: {e}"
        ))
    }))
}

/// One lease call decided: `call` is `acquire`, `renew` or `release`,
/// `request` the holder's jsonb, `server` and `rows` the facts
/// `snowflake_lease_facts()` gathered (`server` also has the session's
/// `role` and `client`, for the log). Returns the outcome (`answer`,
/// `writes`); a refusal is raised, its log line logged first.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_decide(call text, request text, server jsonb, rows jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_decide_wrapper';
"#)]
fn snowflake_lease_decide(call: &str, request: &str, server: JsonB, rows: JsonB) -> JsonB {
    super::lease_lock::bound();
    super::lease_lock::commit_on_flush();
    let req = request;
    let call = match call {
        "acquire" => Call::Acquire(self::request::<AcquireRequest>(req, ACQUIRE_KEYS)),
        "renew" => Call::Renew(self::request::<RenewRequest>(req, RENEW_KEYS)),
        "release" => Call::Release(self::request::<ReleaseRequest>(req, RELEASE_KEYS)),
        other => errors::internal(&format!(
            "snowflake_id registry: no lease call is named {other}"
        )),
    };
    let caller = caller(&server.0);
    let mut server: Server = facts(server.0, "server facts");
    let db = this_database();
    let header = crate::shmem::header();
    server.signed_grants = header.map_or(0, |h| h.signed_grants.get(db));
    server.row_grants_seen = header.map_or(0, |h| h.signed_grants.left_in(db));
    // This registry server's own layout settings: the fleet's layout on a
    // registry with no rows and none fixed by the DBA.
    server
        .layout
        .get_or_insert_with(|| snowflake_core::lease::layout_text(crate::settings::layout()));
    // The ids it sets aside for backfill: blocks holding one are never
    // leased (snowflake_core::registry::backfill).
    server.backfill_ids = crate::settings::backfill_ids_text();
    let rows: Rows = facts(rows.0, "rows");
    if rows.registry.is_none() {
        // The row is to be made: with the data directory's key.
        (server.fresh_key, server.key_kept) = crate::durability::registry_key::key();
    }
    match registry::decide(&call, &server, &rows) {
        Ok(outcome) => {
            // The count this call leaves in the row, once it committed (a
            // call that rolled back left none).
            if let Some(h) = header {
                let grants = outcome.answer.grants;
                register_xact_callback(PgXactCallbackEvent::Commit, move || {
                    h.signed_grants.left(db, grants);
                });
            }
            to_jsonb(&outcome)
        }
        Err(refusal) => refuse(refusal, &caller),
    }
}

/// The `snowflake_lease_forget` trigger's rule
/// (`snowflake_core::registry::forgotten`): rows of the lease table
/// `deleted`, `truncated` or `restored`; `server` and `rows` as
/// `snowflake_lease_facts` gathers them. Returns the writes.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_forget_decide(how text, server jsonb, rows jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_forget_decide_wrapper';
"#)]
fn snowflake_lease_forget_decide(how: &str, server: JsonB, rows: JsonB) -> JsonB {
    let how = match how {
        "deleted" => Forgotten::Deleted,
        "truncated" => Forgotten::Truncated,
        "restored" => Forgotten::Restored,
        other => errors::internal(&format!(
            "snowflake_id registry: no change of the lease table is named {other}"
        )),
    };
    let server: Server = facts(server.0, "server facts");
    let rows: Rows = facts(rows.0, "rows");
    to_jsonb(&registry::forgotten(how, &server, &rows))
}

/// The limits' trigger's rule (`snowflake_core::registry::limits::changed`):
/// `new` is the row to be written (its limits), `server` and `rows` as
/// `snowflake_lease_facts` gathers them (the row before the change).
/// Returns `{"row": ..., "kept": ...}`: the row with its `previous_*`
/// values, and whether fences keep the higher limits.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_limits_decide(new jsonb, server jsonb, rows jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_limits_decide_wrapper';
"#)]
fn snowflake_lease_limits_decide(new: JsonB, server: JsonB, rows: JsonB) -> JsonB {
    let new: registry::LimitsRow = facts(new.0, "limits");
    let server: Server = facts(server.0, "server facts");
    let rows: Rows = facts(rows.0, "rows");
    let (row, kept) = registry::limits::changed(&rows, new, server.now_ms);
    to_jsonb(&json!({ "row": row, "kept": kept }))
}

/// Whether a registry session may be the node it introduces, which of the
/// node's keys for its role it takes and which sessions it ends first
/// (`snowflake_core::registry::hello::introduce`): `facts` are what the
/// SQL gathered (`node`, the session's `pid` and `role`, how many `keys`,
/// `other_node_locked`, this session's `blocks`, the `locks` on the keys,
/// and `client` for the log). Returns `{"slot": n, "end": [{pid, role}]}`,
/// `slot` null when another session of its role is the node (a copied
/// data directory); a refusal is raised, its log line logged first.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_hello_decide(facts jsonb)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_hello_decide_wrapper';
"#)]
fn snowflake_lease_hello_decide(facts: JsonB) -> JsonB {
    let caller = caller(&facts.0);
    let hello: hello::HelloFacts = self::facts(facts.0, "hello facts");
    match hello::introduce(&hello) {
        Ok(i) => {
            let slot = match i.outcome {
                hello::Introduce::Take(slot) => Some(slot),
                hello::Introduce::InUse => None,
            };
            to_jsonb(&json!({ "slot": slot, "end": i.end }))
        }
        Err(refusal) => refuse(refusal, &caller),
    }
}

/// The advisory-lock keys of `node` for sessions of login role `role`
/// (`snowflake_core::registry::hello::node_keys`), under this data
/// directory's key and this postmaster's start: a role cannot compute
/// another's, nor keep one past a restart. (Without the key file, made
/// with the registry's row, only the start: a restart still changes them.)
/// One more than `max_prepared_transactions` can hold
/// (`hello::key_count`).
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_node_keys(node text, role text)
RETURNS bigint[] VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_node_keys_wrapper';
"#)]
fn snowflake_lease_node_keys(node: &str, role: &str) -> Vec<i64> {
    if let Err(refusal) = hello::check_node(node) {
        let client = "the caller of snowflake_lease_node_keys".to_string();
        refuse(refusal, &(role.to_string(), client));
    }
    // Read once per backend: a session's keys stay those it took at its
    // hello while the file is overwritten (tests/fleet/test_adversarial_s18.py:
    // renewals go on over a garbage key file).
    static KEY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| crate::durability::registry_key::read().unwrap_or_else(|| {
        static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
            pgrx::warning!(
                "snowflake_id registry: the data directory's key file snowflake_id.key is missing or unreadable: the lock keys of the fleet's nodes rest on public values, and a role that computes another server's can hold them until that server's next introduction ends its session; restore the file (the postgres user's, mode 0600) from a backup of this data directory"
            );
        }
        String::new()
    }));
    // SAFETY: set by the postmaster before any backend starts, never
    // written again.
    let start = unsafe { pg_sys::PgStartTime };
    // SAFETY: a postmaster setting, fixed from its start.
    let prepared = unsafe { pg_sys::max_prepared_xacts };
    let count = hello::key_count(u32::try_from(prepared).unwrap_or(0));
    hello::node_keys(key, start, node, role, count).collect()
}

/// One look at the standbys while `snowflake_lease_durable` waits:
/// `flushed`, `behind`, `done` (nothing left to wait for) and `enough`
/// (enough synchronous standbys flushed the target).
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_durable_progress(facts jsonb)
RETURNS jsonb IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_durable_progress_wrapper';
"#)]
fn snowflake_lease_durable_progress(facts: JsonB) -> JsonB {
    let facts: durable::Facts = self::facts(facts.0, "durability facts");
    let p = durable::progress(&facts);
    JsonB(json!({
        "flushed": p.flushed,
        "behind": p.behind,
        "done": p.done,
        "enough": p.flushed >= durable::needed(&facts.synchronous_standby_names),
    }))
}

/// The durability decision after the wait: the `reply`, the candidates'
/// row to `write` (null: none) and the `log` lines.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_durable_decide(facts jsonb)
RETURNS jsonb IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_durable_decide_wrapper';
"#)]
fn snowflake_lease_durable_decide(facts: JsonB) -> JsonB {
    super::lease_lock::bound();
    let facts: durable::Facts = self::facts(facts.0, "durability facts");
    let d = durable::decide(&facts);
    JsonB(json!({
        "reply": serde_json::to_value(&d.reply).unwrap_or(Value::Null),
        "write": serde_json::to_value(&d.write).unwrap_or(Value::Null),
        "log": d.log,
    }))
}

/// The last candidates' row this data directory wrote
/// (`durability::registry_candidates`), or NULL: for the durability
/// check's facts (`kept`).
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_kept()
RETURNS jsonb VOLATILE PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_candidates_kept_wrapper';
"#)]
fn snowflake_lease_candidates_kept() -> Option<JsonB> {
    crate::durability::registry_candidates::kept().map(|row| to_jsonb(&row))
}

/// Keeps the candidates' row `candidates` in the data directory, durably:
/// called by `snowflake_lease_durable` before it writes the row.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_keep(candidates jsonb)
RETURNS void VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_candidates_keep_wrapper';
"#)]
fn snowflake_lease_candidates_keep(candidates: JsonB) {
    let row: durable::CandidatesRow = self::facts(candidates.0, "candidates' row");
    crate::durability::registry_candidates::keep(&row);
}

/// The candidates' row `CREATE EXTENSION` makes on timeline `timeline` at
/// `now_ms` (`durable::made_anew`): the members of the last one this data
/// directory wrote, or every standby that may be synchronous.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_candidates_anew(timeline int, now_ms bigint)
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_candidates_anew_wrapper';
"#)]
fn snowflake_lease_candidates_anew(timeline: i32, now_ms: i64) -> JsonB {
    let kept = crate::durability::registry_candidates::kept();
    let timeline = u32::try_from(timeline).unwrap_or_default();
    to_jsonb(&durable::made_anew(kept.as_ref(), timeline, now_ms))
}

/// The data directory's token key (`durability::registry_key`), as
/// `{"key": ..., "kept": ..., "grants": ...}` (`kept`: it was there
/// before; `grants`: the count lease calls left in this database's row
/// since the postmaster started): for the row `CREATE EXTENSION` (or its
/// update from 0.7.0) makes.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_data_key()
RETURNS jsonb VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_data_key_wrapper';
"#)]
fn snowflake_lease_data_key() -> JsonB {
    let (key, kept) = crate::durability::registry_key::key();
    // A row made anew goes on from the count calls left here
    // (`Server::row_grants_seen`).
    let grants = crate::shmem::header().map_or(0, |h| h.signed_grants.left_in(this_database()));
    JsonB(serde_json::json!({"key": key, "kept": kept, "grants": grants}))
}

/// The registry's token for `incarnation` at `lsn` with `grants` under
/// `key` (`snowflake_core::registry::token`): '' for a key that is none.
/// Records `grants` as signed in this database first (refused, 53400, past
/// the slots: `shmem::SignedGrants`). Declared with `pg_lsn`, which is passed by
/// value as a 64-bit integer, as the `i64` the wrapper reads.
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_sign(key text, incarnation text, lsn pg_lsn, grants bigint)
RETURNS text VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_sign_wrapper';
"#)]
fn snowflake_lease_sign(key: &str, incarnation: &str, lsn: i64, grants: i64) -> String {
    if let Some(header) = crate::shmem::header() {
        if !header.signed_grants.record(this_database(), grants) {
            errors::registry_databases_full(crate::shmem::SIGNED_DATABASES);
        }
    }
    token::sign(
        key,
        this_database(),
        incarnation,
        u64::from_ne_bytes(lsn.to_ne_bytes()),
        grants,
    )
}

/// Refuses a lease call inside a transaction block (`BEGIN` ... ):
/// called first by every lease call, before it takes a lock, so that no
/// session can hold the registry's locks open past its call. A holder
/// calls one statement at a time (an implicit transaction, which ends
/// with its statement).
#[pg_extern(sql = r#"
CREATE FUNCTION snowflake_id_internal.snowflake_lease_autocommit()
RETURNS void VOLATILE STRICT PARALLEL UNSAFE
LANGUAGE c AS 'MODULE_PATHNAME', 'snowflake_lease_autocommit_wrapper';
"#)]
fn snowflake_lease_autocommit() {
    // SAFETY: reads this backend's transaction state; called inside a
    // transaction, as every SQL function is.
    if unsafe { pg_sys::IsTransactionBlock() } {
        errors::lease_call_in_transaction();
    }
}

pgrx::extension_sql_file!(
    "leases.sql",
    name = "leases",
    requires = [
        snowflake_lease_decide,
        snowflake_lease_forget_decide,
        snowflake_lease_limits_decide,
        snowflake_lease_durable_progress,
        snowflake_lease_durable_decide,
        snowflake_lease_sign,
        snowflake_lease_data_key,
        snowflake_lease_candidates_kept,
        snowflake_lease_candidates_keep,
        snowflake_lease_candidates_anew,
        snowflake_lease_autocommit,
        snowflake_lease_hello_decide,
        snowflake_lease_node_keys
    ]
);

/// The OID of the database this backend is connected to.
pub(crate) fn this_database() -> u32 {
    // SAFETY: MyDatabaseId is set once this backend is connected to a
    // database, as every backend running SQL functions is.
    unsafe { pg_sys::MyDatabaseId }.to_u32()
}
