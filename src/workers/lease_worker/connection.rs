//! The lease worker's connection to the registry: connect, find the lease
//! functions, introduce this node (its id, name and layout), take the
//! node's lock, end this worker's own earlier session if a network break
//! left it behind; and what a connection that failed or broke leaves (the
//! backoff, the host to try next). Each step of `Worker::connect` returns
//! the problem text on failure; `connect` reports it once, through
//! `Worker::unreachable`.

use super::file::new_node_id;
use super::host::ShmHost;
use super::registry::PgRegistry;
use super::{Target, Worker};

use crate::workers::registry_client::{AnswerBy, Connection};
use snowflake_core::node::{Ending, NodeClaim, Refused, Rename};

/// Session settings of the registry connection. Names resolve in
/// pg_catalog only: the session may be a superuser's, and other roles may
/// create objects on the registry's default search_path. Grants are
/// durable before the holder uses them, whatever the registry's default.
const SESSION_OPTIONS: &str = "-c statement_timeout=10s -c lock_timeout=5s -c search_path=pg_catalog,pg_temp -c synchronous_commit=on";

/// Where the lease functions are: the schema of the extension's member
/// snowflake_lease_begin(jsonb), found through the extension's membership
/// (pg_depend, deptype 'e'), not by name on a search_path. A 0.4.0 or
/// 0.5.0 registry has it in the extension's schema, 0.6.0 and later in
/// snowflake_id_internal; every call names that schema.
const FIND_LEASE_SCHEMA: &str = "SELECT f.schema, f.usable, \
                    has_database_privilege('public', current_database(), 'CONNECT'), \
                    quote_ident(current_user), f.durable \
               FROM pg_extension e \
               LEFT JOIN LATERAL ( \
                    SELECT quote_ident(n.nspname) AS schema, \
                           has_schema_privilege(n.oid, 'USAGE') AS usable, \
                           EXISTS (SELECT 1 FROM pg_proc q WHERE q.pronamespace = n.oid \
                                      AND q.proname = 'snowflake_lease_durable') AS durable \
                      FROM pg_depend d \
                      JOIN pg_proc p ON p.oid = d.objid \
                      JOIN pg_namespace n ON n.oid = p.pronamespace \
                     WHERE d.classid = 'pg_proc'::regclass \
                       AND d.refclassid = 'pg_extension'::regclass \
                       AND d.refobjid = e.oid AND d.deptype = 'e' \
                       AND p.proname = 'snowflake_lease_begin' AND p.pronargs = 1 \
                       AND p.proargtypes[0] = 'jsonb'::regtype \
                     LIMIT 1) f ON true \
              WHERE e.extname = 'snowflake_id'";

/// The registry's lease functions, as [`find_lease_schema`] found them.
struct LeaseSchema {
    /// Quoted.
    schema: String,
    /// 0.7.0 and later: grants are checked durable on the registry's
    /// standbys (snowflake_lease_durable).
    durable_check: bool,
    /// Every role may connect to the registry's database.
    public_connect: bool,
}

/// The connection: opening it, and what a failed or broken one leaves.
impl Worker {
    /// Connects, finds the schema of the registry's lease functions and
    /// introduces this node. A failure makes the registry unreachable
    /// until the next attempt.
    pub(super) fn connect(&mut self) {
        let Some(target) = self.file.target.clone() else {
            return;
        };
        match self.open_session(&target) {
            Ok(registry) => self.connected(registry),
            Err(problem) => {
                self.drop_session(false);
                let logs = self.problems.connect_failed(problem, self.at());
                self.report(logs);
            }
        }
    }

    /// The steps of [`Worker::connect`], in order.
    fn open_session(&mut self, target: &Target) -> Result<PgRegistry, String> {
        let mut client = self.open_connection(target)?;
        let found = find_lease_schema(&mut client, target)?;
        if found.public_connect && !self.public_warned {
            self.public_warned = true;
            pgrx::warning!(
                "snowflake_id lease: every role may connect to the registry database at {}: any role that can log in there sees this server's lock keys in pg_locks and can take them, holding up its leases",
                target.display
            );
        }
        self.claim_node_id(&mut client, &found.schema, target)?;
        self.registry_session = session_fingerprint(&mut client, target)?;
        Ok(PgRegistry {
            client,
            schema: found.schema,
            durable_check: found.durable_check,
        })
    }

    /// By when the registry must answer: the earliest deadline of the
    /// blocks in use, so that the worker is back to revoke them at it.
    pub(super) fn answer_by(&self) -> AnswerBy {
        AnswerBy {
            origin: self.file.started,
            deadline_mono_ms: self.holder.in_use_deadline(),
        }
    }

    /// Opens the connection, beginning with the host to try first; notes
    /// which host it is on.
    fn open_connection(&mut self, target: &Target) -> Result<Connection, String> {
        let connected = Connection::connect(
            &target.conninfo,
            "snowflake_id lease",
            SESSION_OPTIONS,
            self.next_host,
            self.answer_by(),
        );
        match connected {
            Ok((client, host)) => {
                self.host_index = Some(host);
                Ok(client)
            }
            Err(e) => Err(format!(
                "could not connect to {}: {}",
                target.display,
                e.text()
            )),
        }
    }

    /// Takes the node id's session lock. Taken by a live session means a
    /// copy of this data directory (or its original) is running, unless
    /// that session is this worker's own earlier one, left behind by a
    /// broken connection: the rule is [`NodeClaim`].
    fn claim_node_id(
        &mut self,
        client: &mut Connection,
        schema: &str,
        target: &Target,
    ) -> Result<(), String> {
        let lingering = self.registry_session.take();
        // Blocks leased in that session stay this server's in the next one
        // (the registry lets a session it cannot tie to the node's earlier
        // one take them only after their lease and grace ran out).
        self.holder.set_previous_session(
            lingering
                .map(|(pid, start)| format!("{pid}:{start}"))
                .unwrap_or_default(),
        );
        let mut claim = NodeClaim::new(lingering.is_some());
        // Why this worker's earlier session did not end, for the log.
        let mut not_ended = String::new();
        loop {
            let node = self.holder.id().node.clone();
            let hello = client.value(
                &format!("SELECT {schema}.snowflake_lease_hello($1)"),
                &[&node],
            );
            match hello {
                Ok(Some(t)) if t == "t" => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(format!("{}: {}", target.display, e.text())),
            }
            let refused = claim.refused(|| match lingering {
                Some(old) => {
                    let (ending, why) = self.end_lingering(client, old);
                    not_ended = why;
                    ending
                }
                None => Ending::Gone,
            });
            match refused {
                Refused::Retry => {}
                Refused::Rename(why) => {
                    let own = lingering.map(|(pid, _)| (pid, not_ended.as_str()));
                    self.rename_node(why, own);
                    // No block is in use any more.
                    client.set_answer_by(self.answer_by().deadline_mono_ms);
                }
                Refused::GiveUp => return Err("the registry refused a fresh node id".into()),
            }
        }
    }

    /// Takes a new node id, forgetting every block saved under the old
    /// one; logs why, as [`Rename`] says it is known (`own`: this worker's
    /// earlier session, its pid and why it did not end).
    fn rename_node(&mut self, why: Rename, own: Option<(i32, &str)>) {
        let old = self.holder.rename(new_node_id());
        let new = &self.holder.id().node;
        match (why, own) {
            (Rename::OwnSessionNotEnded, Some((pid, reason))) => pgrx::log!(
                "snowflake_id lease: node id {old} is still held on the registry by this server's own earlier session (pid {pid}), which could not be ended ({reason}); no other server is known to use it: this server is now node {new} and leases its own worker ids, and the old node id's blocks go back to the registry when their lease and grace run out"
            ),
            _ => pgrx::log!(
                "snowflake_id lease: node id {old} is in use by another running server: a registry session this server does not know holds it (this data directory is a copy of that server's, or it of this one): this server is now node {new} and leases its own worker ids"
            ),
        }
        self.header.lease.node_id.set(&self.holder.id().node);
        let mut host = ShmHost::new(self.header, &self.layout, &mut self.file);
        self.holder.forget_all(&mut host);
        self.saved_provable = false;
        self.persist();
    }

    /// A session is open and introduced: the registry is reachable again.
    fn connected(&mut self, registry: PgRegistry) {
        self.client = Some(registry);
        let logs = self.problems.connected(&self.display());
        self.report(logs);
        // Renew at once: confirms the leases held before a restart or an
        // outage, and drops those handed to another server since.
        self.holder.reconnected();
    }

    /// The session is gone (or none could be made): drops it and picks
    /// the host to try first next. `stalled`: its host gave no answer
    /// within the call's limit.
    pub(super) fn drop_session(&mut self, stalled: bool) {
        // With several hosts in the connection string: the next attempt
        // begins with the host of the session that ended, unless that host
        // stalled (no answer within the call's limit: a frozen VM), then
        // with the one after it (Connection::connect tries them all).
        self.client = None;
        if let Some(host) = self.host_index.take() {
            self.next_host = if stalled { host + 1 } else { host };
        }
    }

    /// Ends `old`, this worker's earlier registry session, if it is still
    /// there (same pid and start, so not a reused pid): `Ended` when it
    /// ended, and with it its hold on the node id and the blocks' locks;
    /// `Gone` when it is not there any more; else `NotEnded`, with why.
    fn end_lingering(&mut self, client: &mut Connection, old: (i32, i64)) -> (Ending, String) {
        let ended = client.query(
            "SELECT count(*) > 0, coalesce(bool_or(pg_terminate_backend(pid, 5000)), false) \
               FROM pg_stat_activity \
              WHERE pid = $1::int AND (extract(epoch FROM backend_start) * 1000000)::int8 = $2::int8",
            &[&old.0.to_string(), &old.1.to_string()],
        );
        let row = ended.map(|rows| {
            let row = rows.into_iter().next().unwrap_or_default();
            let flag = |i: usize| row.get(i).cloned().flatten().as_deref() == Some("t");
            (flag(0), flag(1))
        });
        match row {
            Ok((_, true)) => {
                pgrx::log!(
                    "snowflake_id lease: ended this server's earlier session on {} (pid {}), left behind by a broken connection, to take back node id {}",
                    self.display(),
                    old.0,
                    self.holder.id().node
                );
                (Ending::Ended, String::new())
            }
            Ok((false, _)) => (Ending::Gone, String::new()),
            Ok((true, false)) => (
                Ending::NotEnded,
                "it did not exit within 5 s of pg_terminate_backend(): the registry backend is stopped or stuck".into(),
            ),
            Err(e) => {
                let why = e.text();
                pgrx::log!(
                    "snowflake_id lease: could not end this server's earlier session on {} (pid {}): {why}",
                    self.display(),
                    old.0,
                );
                (Ending::NotEnded, format!("ending it failed: {why}"))
            }
        }
    }
}

/// Finds the schema of the registry's lease functions (see
/// [`FIND_LEASE_SCHEMA`]), and checks that this session may use it.
fn find_lease_schema(client: &mut Connection, target: &Target) -> Result<LeaseSchema, String> {
    let display = &target.display;
    let rows = client
        .query(FIND_LEASE_SCHEMA, &[])
        .map_err(|e| format!("{display}: {}", e.text()))?;
    let Some(row) = rows.into_iter().next() else {
        return Err(format!(
            "{display} has no snowflake_id extension: run CREATE EXTENSION snowflake_id in that database"
        ));
    };
    let column = |i: usize| row.get(i).cloned().flatten();
    let (Some(schema), usable) = (column(0), column(1)) else {
        return Err(format!(
            "the snowflake_id extension at {display} predates this server's (0.4.0 fences leases): run ALTER EXTENSION snowflake_id UPDATE there"
        ));
    };
    if usable.as_deref() != Some("t") {
        let role = column(3).unwrap_or_default();
        return Err(format!(
            "the role {role} may not use schema {schema} at {display}, which holds the lease functions: run GRANT USAGE ON SCHEMA {schema} TO {role} there (with EXECUTE on its snowflake_lease_* functions), or connect as a superuser"
        ));
    }
    Ok(LeaseSchema {
        schema,
        durable_check: column(4).as_deref() == Some("t"),
        public_connect: column(2).as_deref() == Some("t"),
    })
}

/// This session's backend pid and start on the registry (microseconds
/// since 1970), kept to recognize it after a network break.
fn session_fingerprint(
    client: &mut Connection,
    target: &Target,
) -> Result<Option<(i32, i64)>, String> {
    let rows = client
        .query(
            "SELECT pg_backend_pid()::text, \
                    (SELECT (extract(epoch FROM backend_start) * 1000000)::int8::text \
                       FROM pg_stat_activity WHERE pid = pg_backend_pid())",
            &[],
        )
        .map_err(|e| format!("{}: {}", target.display, e.text()))?;
    Ok(rows.into_iter().next().and_then(|row| {
        let pid = row.first().cloned().flatten()?.parse().ok()?;
        let start = row.get(1).cloned().flatten()?.parse().ok()?;
        Some((pid, start))
    }))
}
