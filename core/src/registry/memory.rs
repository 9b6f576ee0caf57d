//! The registry's rules over rows kept in memory: what `leases.sql` does
//! with PostgreSQL's tables, for the holder's tests and the simulation.
//! Gathering and applying are as plain as the SQL's; every decision is
//! [`super::decide`] or [`super::durable::decide`], so a test that passes
//! here passes against the rules the registry runs.

use super::durable::{self, CandidatesRow, Standby};
use super::{token, Call, IncarnationRow, LimitsRow, Refusal, Rows, Server};
use crate::protocol::{format_lsn, Durability, ReleaseReply, Reply, ReplyHead};
use std::collections::BTreeMap;

/// Everything a registry keeps in its tables: what a crash, a restore or a
/// failover takes back to an earlier state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tables {
    pub rows: Rows,
    pub candidates: Option<CandidatesRow>,
}

/// One registry session: its pid, start, login role and advisory locks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Session {
    pub id: String,
    pub role: String,
    /// The node-lock keys it holds ([`super::hello::node_keys`]).
    pub node_locks: Vec<NodeKey>,
    pub blocks: Vec<u32>,
}

/// One of a node's lock keys: its node, the login role it is bound to,
/// its slot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeKey {
    pub node: String,
    pub role: String,
    pub slot: usize,
}

impl Session {
    /// The node it introduced: a key of its own role it holds.
    pub fn node(&self) -> Option<String> {
        self.node_locks
            .iter()
            .find(|k| k.role == self.role)
            .map(|k| k.node.clone())
    }

    fn holds(&self, node: &str) -> bool {
        self.node_locks
            .iter()
            .any(|k| k.node == node && k.role == self.role)
    }
}

/// A registry server in memory.
#[derive(Clone, Debug)]
pub struct Store {
    pub tables: Tables,
    /// The WAL position of the last commit.
    pub lsn: u64,
    pub timeline: u32,
    pub postmaster_start_ms: i64,
    /// The OID of the registry's database.
    pub database_oid: u32,
    pub fsync_off: bool,
    /// `snowflake_id.registry_standby_name` in its configuration files.
    pub standby_name: String,
    /// The last line of its timeline's history (after a promotion).
    pub history: Option<(u32, String, String)>,
    /// `synchronous_standby_names`.
    pub synchronous_standby_names: String,
    /// Its own layout settings.
    pub layout: Option<String>,
    /// Its `snowflake_id.backfill_worker_ids` (empty: none).
    pub backfill_ids: String,
    pub sessions: BTreeMap<u64, Session>,
    /// Node-lock keys held by prepared transactions (no session), at most
    /// `max_prepared_transactions` of them.
    pub prepared: Vec<NodeKey>,
    pub max_prepared_transactions: u32,
    /// The highest grant count signed in each database and the highest a
    /// call found in its row, and the postmaster start they are of
    /// (`Server::signed_grants`, `Server::row_grants_seen`: none after a
    /// restart).
    signed: (i64, BTreeMap<u32, (i64, i64)>),
    /// The row's count a committed call left, before the last call.
    seen_before_last: i64,
    /// The data directory's token key (`snowflake_id.key`): made with the
    /// first row, kept by `DROP EXTENSION`, a snapshot and a standby.
    pub data_key: Option<String>,
    /// The last candidates' row it wrote (`snowflake_id.candidates.<database OID>`, in
    /// the data directory): kept by `DROP EXTENSION`.
    pub data_candidates: Option<CandidatesRow>,
    /// Where fresh incarnation names and keys come from (deterministic).
    pub seed: u64,
    names: u64,
}

impl Store {
    /// A registry made with `CREATE EXTENSION` at `now_ms`: its first
    /// incarnation, unfenced, and an empty candidates' row.
    pub fn created(now_ms: i64, seed: u64) -> Store {
        let mut s = Store {
            tables: Tables::default(),
            lsn: 0x100_0000,
            timeline: 1,
            postmaster_start_ms: now_ms,
            database_oid: 16_384,
            fsync_off: false,
            standby_name: String::new(),
            history: None,
            synchronous_standby_names: String::new(),
            layout: Some("classic".into()),
            backfill_ids: String::new(),
            sessions: BTreeMap::new(),
            prepared: Vec::new(),
            max_prepared_transactions: 0,
            signed: (0, BTreeMap::new()),
            seen_before_last: 0,
            data_key: None,
            data_candidates: None,
            seed,
            names: 0,
        };
        s.create_extension(now_ms);
        s
    }

    /// `CREATE EXTENSION` (after a `DROP EXTENSION`, or the first): new
    /// tables; the incarnation row only when no session holds block locks.
    pub fn create_extension(&mut self, now_ms: i64) {
        // The row goes on from the count found here (snowflake_lease_data_key).
        let grants = self.counts_here().1;
        let live = self.sessions.values().any(|s| !s.blocks.is_empty());
        let name = self.fresh_name();
        let (key, kept) = self.key();
        self.tables = Tables {
            rows: Rows {
                registry: (!live).then(|| IncarnationRow {
                    incarnation: name,
                    timeline: self.timeline,
                    postmaster_start_ms: self.postmaster_start_ms,
                    started_at_ms: now_ms,
                    cause: "created".into(),
                    token_key: key,
                    new_key: !kept,
                    database_oid: Some(self.database_oid),
                    grants,
                    ..IncarnationRow::default()
                }),
                blocks: Vec::new(),
                limits: None,
            },
            candidates: Some(durable::made_anew(
                self.data_candidates.as_ref(),
                self.timeline,
                now_ms,
            )),
        };
        self.commit();
    }

    /// Rows of the lease table forgotten (`how`; `removed` of them, where
    /// the trigger knows: `Server::removed`): the trigger's new, fenced
    /// incarnation.
    pub fn forget(&mut self, now_ms: i64, how: super::begin::Forgotten, removed: Option<i64>) {
        // The trigger gathers the facts without a session (pid 0 is none)
        // and never reads the data directory's key, which only a row to
        // be made needs: with no row there is nothing to forget.
        if self.tables.rows.registry.is_some() {
            let server = Server {
                removed,
                ..self.server(0, "", now_ms)
            };
            let w = super::forgotten(how, &server, &self.tables.rows);
            self.write_rows(&w);
        }
        self.commit();
    }

    /// A `pg_dump` of `dumped` restored into a new `CREATE EXTENSION` on
    /// this server: the block rows and limits come back (the incarnation
    /// and the candidates are not dumped); leased rows fire the trigger.
    pub fn restore_dump(&mut self, dumped: &Tables, now_ms: i64) {
        self.create_extension(now_ms);
        self.tables.rows.blocks = dumped.rows.blocks.clone();
        self.tables.rows.limits = dumped.rows.limits.clone();
        if self
            .tables
            .rows
            .blocks
            .iter()
            .any(|b| b.holder_node.is_some())
        {
            self.forget(now_ms, super::begin::Forgotten::Restored, None);
        } else {
            self.commit();
        }
    }

    /// A copy of the registry's database (`CREATE DATABASE ... TEMPLATE`,
    /// holding `copied`) put in its place (`DROP DATABASE`, `ALTER
    /// DATABASE ... RENAME`): a new OID, every session of it ended, no
    /// restart, and the WAL, one for every database, moving on.
    pub fn put_back_copy(&mut self, copied: &Tables) {
        let oid = self.database_oid + 1;
        self.put_back_database(copied, oid);
    }

    /// The database `oid` holding `tables` put in the registry's place (a
    /// rename): the original put back after a copy served, say.
    pub fn put_back_database(&mut self, tables: &Tables, oid: u32) {
        self.tables = tables.clone();
        self.database_oid = oid;
        self.sessions.clear();
        self.commit();
    }

    /// The last call's transaction rolled back after its reply left (a
    /// `DO` block that shows it, then raises): its rows are `tables` again,
    /// its WAL and signed count stay.
    pub fn roll_back(&mut self, tables: Tables) {
        self.tables = tables;
        self.counts_here().1 = self.seen_before_last;
    }

    /// The highest grant count this postmaster signed in this database.
    fn signed_here(&self) -> i64 {
        if self.signed.0 == self.postmaster_start_ms {
            self.signed.1.get(&self.database_oid).map_or(0, |c| c.0)
        } else {
            0
        }
    }

    /// This postmaster's counts in this database, made when missing.
    fn counts_here(&mut self) -> &mut (i64, i64) {
        if self.signed.0 != self.postmaster_start_ms {
            self.signed = (self.postmaster_start_ms, BTreeMap::new());
        }
        self.signed.1.entry(self.database_oid).or_default()
    }

    pub fn set_limits(&mut self, limits: Option<LimitsRow>, now_ms: i64) {
        // As the limits' trigger writes a row (none: the defaults).
        self.tables.rows.limits =
            limits.map(|l| super::limits::changed(&self.tables.rows, l, now_ms).0);
        self.commit();
    }

    fn fresh_name(&mut self) -> String {
        self.names += 1;
        format!("inc-{:x}-{}", self.seed, self.names)
    }

    /// The data directory's key, and whether it was there (as
    /// `durability::registry_key` reads or makes it).
    fn key(&mut self) -> (String, bool) {
        match &self.data_key {
            Some(k) => (k.clone(), true),
            None => {
                let k = self.fresh_key();
                self.data_key = Some(k.clone());
                (k, false)
            }
        }
    }

    fn fresh_key(&mut self) -> String {
        self.names += 1;
        let a = self.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ self.names;
        format!("{a:016x}{:016x}", a.rotate_left(17) ^ 0x5851_F42D_4C95_7F2D)
    }

    /// A commit: the WAL moves on.
    pub fn commit(&mut self) -> u64 {
        self.lsn += 0x100;
        self.lsn
    }

    /// A new session of the lease role; its id, `pid:start`.
    pub fn connect(&mut self, pid: u64, now_ms: i64) -> u64 {
        self.connect_as(pid, now_ms, "snowflake_lease")
    }

    /// A new session of login role `role`.
    pub fn connect_as(&mut self, pid: u64, now_ms: i64, role: &str) -> u64 {
        self.sessions.insert(
            pid,
            Session {
                id: format!("{pid}:{now_ms}"),
                role: role.to_string(),
                node_locks: Vec::new(),
                blocks: Vec::new(),
            },
        );
        pid
    }

    /// `pg_advisory_unlock` of the session's node locks (any role may).
    pub fn unlock_node(&mut self, pid: u64) {
        if let Some(s) = self.sessions.get_mut(&pid) {
            s.node_locks.clear();
        }
    }

    /// Whether a session or a prepared transaction holds `key`.
    fn key_held(&self, key: &NodeKey, but: u64) -> bool {
        self.prepared.contains(key)
            || self
                .sessions
                .iter()
                .any(|(p, s)| *p != but && s.node_locks.contains(key))
    }

    /// `pg_advisory_lock` by session `pid` of a key it saw held, `key`
    /// (any role may take any advisory lock): false while another session
    /// or a prepared transaction holds it.
    pub fn squat(&mut self, pid: u64, key: &NodeKey) -> bool {
        if self.key_held(key, pid) {
            return false;
        }
        match self.sessions.get_mut(&pid) {
            Some(s) => {
                if !s.node_locks.contains(key) {
                    s.node_locks.push(key.clone());
                }
                true
            }
            None => false,
        }
    }

    /// `pg_advisory_xact_lock` of `key` in a transaction then `PREPARE
    /// TRANSACTION`: the lock kept with no session to end; false while
    /// it is held, or with `max_prepared_transactions` prepared already.
    pub fn squat_prepared(&mut self, key: &NodeKey) -> bool {
        let room =
            u32::try_from(self.prepared.len()).is_ok_and(|n| n < self.max_prepared_transactions);
        if !room || self.key_held(key, 0) {
            return false;
        }
        self.prepared.push(key.clone());
        true
    }

    /// A session ends: its advisory locks go.
    pub fn disconnect(&mut self, pid: u64) {
        self.sessions.remove(&pid);
    }

    /// `snowflake_lease_hello`: gathers the locks on the node's keys for
    /// the caller's role, as the SQL does from `pg_locks`, and applies
    /// [`super::hello::introduce`]: ends the squatters it names, takes
    /// the key; false when another session of its role holds one.
    pub fn hello(&mut self, pid: u64, node: &str) -> Result<bool, Refusal> {
        use super::hello::{key_count, HelloFacts, Introduce, KeyLock, SessionBlock};
        let Some(me) = self.sessions.get(&pid) else {
            return Ok(false);
        };
        let role = me.role.clone();
        let keys = key_count(self.max_prepared_transactions);
        let key = |slot| NodeKey {
            node: node.to_string(),
            role: role.clone(),
            slot,
        };
        let as_pid = |p: u64| i32::try_from(p).unwrap_or(i32::MAX);
        let mut locks: Vec<KeyLock> = Vec::new();
        for slot in 0..keys {
            let k = key(slot);
            for (p, s) in self
                .sessions
                .iter()
                .filter(|(_, s)| s.node_locks.contains(&k))
            {
                locks.push(KeyLock {
                    slot: Some(slot),
                    pid: Some(as_pid(*p)),
                    role: Some(s.role.clone()),
                    endable: true,
                    granted: true,
                });
            }
            if self.prepared.contains(&k) {
                locks.push(KeyLock {
                    slot: Some(slot),
                    granted: true,
                    ..KeyLock::default()
                });
            }
        }
        let facts = HelloFacts {
            node: node.to_string(),
            pid: as_pid(pid),
            role: role.clone(),
            keys,
            other_node_locked: me
                .node_locks
                .iter()
                .any(|k| k.node != node || k.role != role),
            blocks: self
                .tables
                .rows
                .blocks
                .iter()
                .filter(|b| b.holder_session.as_deref() == Some(me.id.as_str()))
                .map(|b| SessionBlock {
                    block: b.block,
                    holder_node: b.holder_node.clone(),
                })
                .collect(),
            locks,
        };
        let introduction = super::hello::introduce(&facts)?;
        // A free key is taken before the squatters are ended, as the SQL
        // does; a squatted one after.
        let took = match introduction.outcome {
            Introduce::Take(slot) => self.squat(pid, &key(slot)),
            Introduce::InUse => false,
        };
        for squatter in &introduction.end {
            self.sessions
                .remove(&u64::try_from(squatter.pid).unwrap_or(u64::MAX));
        }
        match introduction.outcome {
            Introduce::InUse => Ok(false),
            Introduce::Take(slot) => Ok(took || self.squat(pid, &key(slot))),
        }
    }

    fn server(&mut self, pid: u64, node: &str, now_ms: i64) -> Server {
        let session = self.sessions.get(&pid).cloned().unwrap_or_default();
        let others = self
            .sessions
            .iter()
            .any(|(p, s)| *p != pid && !s.blocks.is_empty());
        // Read (or made) only when the row is to be made, as the
        // extension's glue does.
        let (fresh_key, key_kept) = if self.tables.rows.registry.is_none() {
            self.key()
        } else {
            (String::new(), false)
        };
        Server {
            now_ms,
            timeline: self.timeline,
            insert_lsn: self.lsn,
            session: session.id.clone(),
            role: session.role.clone(),
            postmaster_start_ms: self.postmaster_start_ms,
            database_oid: self.database_oid,
            signed_grants: self.signed_here(),
            row_grants_seen: 0,
            fsync_off: self.fsync_off,
            synchronous_commit_off: false,
            node_locked: session.holds(node),
            locked: session.blocks.clone(),
            others_lock_blocks: others,
            proof: super::Proof {
                standby_name: self.standby_name.clone(),
                candidates: self.tables.candidates.clone(),
                history: self.history.clone(),
            },
            layout: self.layout.clone(),
            backfill_ids: self.backfill_ids.clone(),
            fresh_incarnation: self.fresh_name(),
            fresh_key,
            key_kept,
            removed: None,
        }
    }

    /// The rows `w` replaces or adds, as `snowflake_lease_apply` writes
    /// them.
    fn write_rows(&mut self, w: &super::Writes) {
        if let Some(r) = &w.registry {
            self.tables.rows.registry = Some(r.clone());
        }
        for b in &w.blocks {
            match self
                .tables
                .rows
                .blocks
                .iter_mut()
                .find(|r| r.block == b.block)
            {
                Some(r) => *r = b.clone(),
                None => self.tables.rows.blocks.push(b.clone()),
            }
        }
    }

    /// One lease call in session `pid`: gathers, decides, applies, commits.
    fn call(
        &mut self,
        pid: u64,
        call: &Call,
        now_ms: i64,
    ) -> Result<(super::Answer, ReplyHead), Refusal> {
        let mut server = self.server(pid, call.node(), now_ms);
        // The highest count a committed call left in the row (as the glue
        // keeps it).
        server.row_grants_seen = self.counts_here().1;
        self.seen_before_last = server.row_grants_seen;
        let out = super::decide(call, &server, &self.tables.rows)?;
        let w = out.writes;
        self.write_rows(&w);
        if let Some(s) = self.sessions.get_mut(&pid) {
            s.blocks.retain(|b| !w.unlock.contains(b));
            for b in w.lock {
                let free = !self.sessions.values().any(|o| o.blocks.contains(&b));
                if let (true, Some(s)) = (free, self.sessions.get_mut(&pid)) {
                    s.blocks.push(b);
                }
            }
        }
        let lsn = self.commit();
        let left = self.tables.rows.registry.as_ref().map_or(0, |r| r.grants);
        let seen = &mut self.counts_here().1;
        *seen = (*seen).max(left);
        let key = self
            .tables
            .rows
            .registry
            .as_ref()
            .map(|r| r.token_key.clone())
            .unwrap_or_default();
        let signed = &mut self.counts_here().0;
        *signed = (*signed).max(out.answer.grants);
        let head = ReplyHead {
            token: token::sign(
                &key,
                self.database_oid,
                &out.answer.incarnation,
                lsn,
                out.answer.grants,
            ),
            grants: out.answer.grants,
            incarnation: out.answer.incarnation.clone(),
            lsn: format_lsn(lsn),
            fenced_until_ms: out.answer.fenced_until_ms,
        };
        Ok((out.answer, head))
    }

    pub fn lease(&mut self, pid: u64, call: &Call, now_ms: i64) -> Result<Reply, Refusal> {
        let (answer, head) = self.call(pid, call, now_ms)?;
        Ok(Reply {
            head,
            blocks: answer.blocks,
        })
    }

    pub fn release(&mut self, pid: u64, call: &Call, now_ms: i64) -> Result<ReleaseReply, Refusal> {
        let (answer, head) = self.call(pid, call, now_ms)?;
        Ok(ReleaseReply {
            head,
            released: answer.released.unwrap_or(false),
        })
    }

    /// `snowflake_lease_durable` once the standbys are as `standbys` say,
    /// for a commit at `target`.
    pub fn durable(&mut self, now_ms: i64, target: u64, standbys: &[Standby]) -> Durability {
        let facts = durable::Facts {
            now_ms,
            synchronous_standby_names: self.synchronous_standby_names.clone(),
            me: self.standby_name.clone(),
            target,
            timeline: self.timeline,
            incarnation_here: self
                .tables
                .rows
                .registry
                .as_ref()
                .is_some_and(|r| r.timeline == self.timeline),
            standbys: standbys.to_vec(),
            candidates: self.tables.candidates.clone(),
            // Read only when the row is to be made anew, as the glue does.
            kept: self
                .tables
                .candidates
                .is_none()
                .then(|| self.data_candidates.clone())
                .flatten(),
        };
        let d = durable::decide(&facts);
        if let Some(row) = d.write {
            // The file first, as the glue writes it.
            self.data_candidates = Some(row.clone());
            self.tables.candidates = Some(row);
            // Written with synchronous_commit = local: not waited for.
            self.commit();
        }
        d.reply
    }

    /// This server promoted from a copy of another's tables at `lsn`: a
    /// new timeline whose history says a promotion ended recovery.
    pub fn promoted_from(
        tables: Tables,
        lsn: u64,
        old_timeline: u32,
        standby_name: &str,
        now_ms: i64,
        seed: u64,
    ) -> Store {
        Store {
            tables,
            lsn,
            timeline: old_timeline + 1,
            postmaster_start_ms: now_ms,
            // A physical copy: the caller sets the primary's.
            database_oid: 16_384,
            fsync_off: false,
            standby_name: standby_name.to_string(),
            history: Some((
                old_timeline,
                format_lsn(lsn),
                "no recovery target specified".into(),
            )),
            synchronous_standby_names: String::new(),
            layout: Some("classic".into()),
            backfill_ids: String::new(),
            sessions: BTreeMap::new(),
            prepared: Vec::new(),
            max_prepared_transactions: 0,
            signed: (0, BTreeMap::new()),
            seen_before_last: 0,
            data_key: None,
            data_candidates: None,
            seed,
            names: 0,
        }
    }
}
