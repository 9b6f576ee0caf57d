//! The simulated fleet: registry servers (a primary, its standbys, and
//! whatever failovers and restores make of them), holders with their
//! sessions, clocks and links, advanced in steps of [`TICK_MS`].

use crate::checker::Checker;
use crate::faults::{Fault, Scenario, HOLDERS, STANDBYS};
use crate::rng::Rng;
use snowflake_core::generator::{GeneratorState, Step};
use snowflake_core::holder::{
    AcquireRequest, CallError, Durability, Event, Holder, Host, Identity, Now, Registry,
    ReleaseReply, ReleaseRequest, RenewRequest, Replication, Reply,
};
use snowflake_core::layout::{Layout, DEFAULT_EPOCH_MS, PRESETS};
use snowflake_core::lease::{CallEnd, Held, Timing, Usage};
use snowflake_core::protocol::{BlockMark, Seen};
use snowflake_core::registry::durable::Standby;
use snowflake_core::registry::memory::{Store, Tables};
use snowflake_core::registry::mutation::{self, Mutation};
use snowflake_core::registry::{Call, LimitsRow};
use std::collections::{BTreeMap, HashMap, VecDeque};

/// Unix ms at simulated time 0.
pub const T0: i64 = 1_795_305_600_000;
pub const TICK_MS: i64 = 20;
pub const LEASE_MS: i64 = 6_000;
pub const DRIFT_MS: i64 = 1_000;
/// The registry's `max_ahead_ms`.
pub const MAX_AHEAD_MS: i64 = LEASE_MS + DRIFT_MS + 3_000;
/// The blocks the holders share (few, so that they change hands often).
pub const BLOCKS: u32 = 7;
pub const BLOCK_SIZE: u32 = 16;
pub const MAX_BLOCKS: u32 = 2;
/// The hostile lease role's login role (a leaked credential of a server
/// that is not running), and the sessions it keeps open.
const ROGUE: &str = "rogue";
const ROGUE_SESSIONS: usize = 3;
const HOLDER_STEP_MS: i64 = 100;

/// A process's clock: an offset (steps move it), and a rate.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    pub offset: i64,
    since: i64,
    acc: i64,
    ppm: i64,
}

impl Clock {
    fn elapsed(&self, t: i64) -> i64 {
        self.acc + (t - self.since) * (1_000_000 + self.ppm) / 1_000_000
    }
    pub fn mono(&self, t: i64) -> i64 {
        self.elapsed(t)
    }
    pub fn wall(&self, t: i64) -> i64 {
        T0 + self.offset + self.elapsed(t)
    }
    pub fn set_rate(&mut self, t: i64, ppm: i64) {
        self.acc = self.elapsed(t);
        self.since = t;
        self.ppm = ppm;
    }
}

#[derive(Clone, Debug)]
enum Kind {
    Primary,
    Standby {
        of: usize,
        copy: Box<Tables>,
        lsn: u64,
        reply_ms: Option<i64>,
    },
    Gone,
}

/// A registry server.
struct Reg {
    name: String,
    store: Store,
    clock: Clock,
    kind: Kind,
    down_until: i64,
    stalled_until: i64,
    /// Its clock when its rows were last restored or made anew: rows
    /// leased before come from a dump or a snapshot, and name sessions as
    /// they were then.
    restored_ms: i64,
    /// Snapshots of its rows, one a second (for restores, and for the
    /// crash of a registry that committed asynchronously).
    history: VecDeque<(i64, Tables, u64)>,
    /// The database a copy was put in place of: its rows and OID.
    put_aside: Option<(Tables, u32)>,
}

impl Reg {
    fn answering(&self, t: i64) -> bool {
        matches!(self.kind, Kind::Primary) && t >= self.down_until && t >= self.stalled_until
    }
}

/// The slots of one holder's server: which blocks its sessions may use.
#[derive(Default)]
struct SimHost {
    /// block → (floor, mark, stop): IDs above the floor up to the mark,
    /// while the server's clock reads before the stop.
    active: BTreeMap<u32, (i64, i64, i64)>,
    newest: HashMap<u32, i64>,
    busy: BTreeMap<u32, u32>,
    saved: Vec<Held>,
}

impl Host for SimHost {
    fn activate(&mut self, block: u32, floor_ms: i64, high_ms: i64, stop_ms: i64) {
        self.active.insert(block, (floor_ms, high_ms, stop_ms));
    }
    fn raise(&mut self, block: u32, high_ms: i64, stop_ms: i64) {
        if let Some(a) = self.active.get_mut(&block) {
            a.1 = a.1.max(high_ms);
            a.2 = a.2.max(stop_ms);
        }
    }
    fn revoke(&mut self, block: u32) {
        self.active.remove(&block);
    }
    fn stop_if_idle(&mut self, block: u32) -> Option<Option<i64>> {
        if self.busy.get(&block).copied().unwrap_or(0) > 0 {
            return None;
        }
        self.active.remove(&block);
        Some(self.newest.get(&block).copied())
    }
    fn save(&mut self, holder: &Holder) {
        self.saved = holder.held().to_vec();
    }
}

/// A holder's server.
struct Node {
    /// The server, for the checker (a copy is another server).
    id: u32,
    /// Its login role on the registry (a copy of its data directory
    /// keeps its credential).
    role: String,
    holder: Holder,
    host: SimHost,
    clock: Clock,
    conn: Option<(usize, u64)>,
    session: String,
    next_step: i64,
    stalled_until: i64,
    cut_until: i64,
    down_until: i64,
    demand: u32,
    /// `snowflake_id.lease_time` (holder 0 leases for half as long: a
    /// fence must not rest on what one holder asked for).
    lease_ms: i64,
    gens: HashMap<u32, GeneratorState>,
    /// Since it last wanted a block and had none (liveness).
    wanted_since: Option<i64>,
    /// Its clock runs beyond the documented bound on rates: no wait of
    /// its is owed a bound (its IDs still never repeat another's).
    beyond_bound: bool,
    /// A copy of its data directory runs (or it is one): the two share
    /// one login role, so one of them may wait as long as the other keeps
    /// the role's `max_blocks_per_role` (documented): no wait is owed a
    /// bound.
    shares_role: bool,
}

/// A lease call's way to the registry server `p` and back.
struct Link<'a> {
    regs: &'a mut Vec<Reg>,
    p: usize,
    pid: u64,
    t: i64,
    rng: &'a mut Rng,
    cut: bool,
    /// The primary's `synchronous_standby_names`.
    names: String,
}

fn needed(names: &str) -> usize {
    snowflake_core::registry::durable::needed(names) as usize
}

impl Link<'_> {
    fn reachable(&self) -> Result<(), CallError> {
        if self.cut || !self.regs[self.p].answering(self.t) {
            return Err(CallError::NoAnswer {
                end: CallEnd::Timeout,
                text: "no answer".into(),
            });
        }
        if !self.regs[self.p].store.sessions.contains_key(&self.pid) {
            // The registry restarted (or ended the session) meanwhile: the
            // connection is gone, as libpq reports it.
            return Err(CallError::Lost("server closed the connection".into()));
        }
        Ok(())
    }

    /// The standbys that stream from `p` now, as pg_stat_replication shows
    /// them (a stalled one with its stale position and reply time).
    fn standbys(&self) -> Vec<Standby> {
        let mut out = Vec::new();
        let listed: Vec<&str> = ["s1", "s2"]
            .into_iter()
            .filter(|n| self.names.contains(n) || self.names.contains('*'))
            .collect();
        let first = self
            .names
            .trim_start()
            .to_ascii_lowercase()
            .starts_with("first");
        let mut sync_taken = 0;
        for r in self.regs.iter() {
            if let Kind::Standby {
                of, lsn, reply_ms, ..
            } = &r.kind
            {
                if *of != self.p || self.t < r.down_until {
                    continue;
                }
                let state = if !listed.contains(&r.name.as_str()) {
                    "async"
                } else if first {
                    sync_taken += 1;
                    if sync_taken <= needed(&self.names) {
                        "sync"
                    } else {
                        "potential"
                    }
                } else {
                    "quorum"
                };
                out.push(Standby {
                    application_name: r.name.clone(),
                    sync_state: state.into(),
                    flush_lsn: Some(*lsn),
                    physical: true,
                    streaming: true,
                    reply_time_ms: *reply_ms,
                });
            }
        }
        out
    }

    /// Ships the primary's rows to each synchronous standby that is not
    /// stalled (the others catch up later: `World::replicate_async`).
    fn replicate(&mut self) {
        let (tables, lsn) = (
            self.regs[self.p].store.tables.clone(),
            self.regs[self.p].store.lsn,
        );
        let t = self.t;
        let synchronous: Vec<String> = self
            .standbys()
            .into_iter()
            .filter(|s| s.sync_state == "sync" || s.sync_state == "quorum")
            .map(|s| s.application_name)
            .collect();
        for r in self.regs.iter_mut() {
            let wall = r.clock.wall(t);
            let listed = synchronous.contains(&r.name);
            if let Kind::Standby {
                of,
                copy,
                lsn: l,
                reply_ms,
            } = &mut r.kind
            {
                if listed && *of == self.p && t >= r.stalled_until && t >= r.down_until {
                    **copy = tables.clone();
                    *l = lsn;
                    *reply_ms = Some(wall);
                }
            }
        }
    }

    /// A lease call: decided and committed there; the answer comes back
    /// only once the commit's wait for the synchronous standbys is over,
    /// and may be lost.
    fn lease<T>(
        &mut self,
        call: Call,
        f: impl FnOnce(&mut Store, u64, &Call, i64) -> Result<T, snowflake_core::registry::Refusal>,
    ) -> Result<T, CallError> {
        self.reachable()?;
        let now = self.regs[self.p].clock.wall(self.t);
        let out = f(&mut self.regs[self.p].store, self.pid, &call, now);
        let lsn = self.regs[self.p].store.lsn;
        let hist_now = self.t;
        let snap = (hist_now, self.regs[self.p].store.tables.clone(), lsn);
        let h = &mut self.regs[self.p].history;
        if h.back().is_none_or(|b| b.0 + 200 <= hist_now) {
            h.push_back(snap);
            if h.len() > 120 {
                h.pop_front();
            }
        }
        self.replicate();
        let flushed = self
            .standbys()
            .iter()
            .filter(|s| {
                s.sync_state != "async"
                    && s.sync_state != "potential"
                    && s.flush_lsn.is_some_and(|f| f >= lsn)
            })
            .count();
        let out = out
            .map_err(|r| CallError::from_registry(Some(r.code.code().into()), r.message, r.hint))?;
        if flushed < needed(&self.names) && self.rng.chance(0.5) {
            // The commit waits for a standby that does not come: the
            // holder gives the call up at its deadline (committed here).
            // Otherwise someone cancels the wait, and the answer comes
            // with a warning only.
            return Err(CallError::NoAnswer {
                end: CallEnd::LeaseDeadline,
                text: "synchronous wait given up".into(),
            });
        }
        if self.rng.chance(0.03) {
            return Err(CallError::Lost("answer lost".into()));
        }
        Ok(out)
    }
}

impl Registry for Link<'_> {
    fn acquire(&mut self, req: &AcquireRequest) -> Result<Reply, CallError> {
        self.lease(Call::Acquire(req.clone()), |s, pid, c, now| {
            s.lease(pid, c, now)
        })
    }
    fn renew(&mut self, req: &RenewRequest) -> Result<Reply, CallError> {
        self.lease(Call::Renew(req.clone()), |s, pid, c, now| {
            s.lease(pid, c, now)
        })
    }
    fn release(&mut self, req: &ReleaseRequest) -> Result<ReleaseReply, CallError> {
        self.lease(Call::Release(req.clone()), |s, pid, c, now| {
            s.release(pid, c, now)
        })
    }
    fn durable(&mut self, _wait_ms: i64) -> Result<Durability, CallError> {
        self.reachable()?;
        let now = self.regs[self.p].clock.wall(self.t);
        let standbys = self.standbys();
        let target = self.regs[self.p].store.lsn;
        let d = self.regs[self.p].store.durable(now, target, &standbys);
        self.replicate();
        if self.rng.chance(0.03) {
            return Err(CallError::Lost("answer lost".into()));
        }
        Ok(d)
    }
    fn answer_by(&mut self, _deadline_mono_ms: Option<i64>) {}
}

/// What a play found.
pub struct Played {
    pub violation: Option<String>,
    pub duplicates: u64,
    pub ids: u64,
    pub longest_wait_ms: i64,
    pub at_ms: Option<i64>,
}

pub struct World {
    rng: Rng,
    scenario: Scenario,
    regs: Vec<Reg>,
    nodes: Vec<Node>,
    layout: Layout,
    checker: Checker,
    next_pid: u64,
    hostile_until: i64,
    /// The lease role's sessions: (registry server, pid).
    hostile_pids: Vec<(usize, u64)>,
    /// Cuts to come: (from, node, for ms).
    cuts: Vec<(i64, usize, i64)>,
    /// The last simulated ms a fault was applied or still lasted (a
    /// crash, stall or cut not over): waits for a block count from then.
    /// The lease role is there all along and is not a fault here: the
    /// fleet must stay live with it.
    calm_since: i64,
    longest_wait_ms: i64,
    seed: u64,
    pub trace: Vec<String>,
}

fn identity(node: &str) -> Identity {
    Identity {
        node: node.into(),
        name: node.into(),
        layout: "classic".into(),
        block_size: BLOCK_SIZE,
        max_worker_id: 1023,
    }
}

impl World {
    pub fn new(seed: u64, scenario: Scenario) -> World {
        let mut rng = Rng::new(seed);
        let names = scenario.synchronous_standby_names();
        let mut regs = Vec::new();
        for (i, name) in ["p0", "s1", "s2"]
            .into_iter()
            .enumerate()
            .take(1 + STANDBYS)
        {
            let clock = Clock {
                offset: rng.range(-500, 500),
                ..Clock::default()
            };
            let mut store = Store::created(clock.wall(0), seed.wrapping_add(i as u64 * 1_000));
            store.standby_name = name.into();
            store.synchronous_standby_names = names.into();
            store.set_limits(
                Some(LimitsRow {
                    max_lease_ms: LEASE_MS,
                    max_grace_ms: Timing::new(LEASE_MS).grace_ms,
                    max_ahead_ms: MAX_AHEAD_MS,
                    max_blocks_per_node: 8,
                    // The documented configuration: a login role per server,
                    // bounded to a server's blocks.
                    max_blocks_per_role: Some(i64::from(MAX_BLOCKS)),
                    ..LimitsRow::default()
                }),
                clock.wall(0),
            );
            let kind = if i == 0 {
                Kind::Primary
            } else {
                Kind::Standby {
                    of: 0,
                    copy: Box::default(),
                    lsn: 0,
                    reply_ms: None,
                }
            };
            regs.push(Reg {
                name: name.into(),
                store,
                clock,
                kind,
                down_until: 0,
                stalled_until: 0,
                restored_ms: i64::MIN,
                put_aside: None,
                history: VecDeque::new(),
            });
        }
        // The standbys start as copies of the primary.
        let (tables, lsn) = (regs[0].store.tables.clone(), regs[0].store.lsn);
        for r in regs.iter_mut().skip(1) {
            r.kind = Kind::Standby {
                of: 0,
                copy: Box::new(tables.clone()),
                lsn,
                reply_ms: Some(r.clock.wall(0)),
            };
        }
        let nodes = (0..HOLDERS)
            .map(|i| Node {
                id: i as u32,
                role: format!("server{i}"),
                holder: Holder::new(identity(&format!("h{i}"))),
                host: SimHost::default(),
                // One clock far behind: a new holder waits for its floor.
                clock: Clock {
                    offset: if i == HOLDERS - 1 {
                        -8_000
                    } else {
                        rng.range(-2_500, 2_500)
                    },
                    ..Clock::default()
                },
                conn: None,
                session: String::new(),
                next_step: rng.range(0, HOLDER_STEP_MS),
                stalled_until: 0,
                cut_until: 0,
                down_until: 0,
                demand: 8,
                lease_ms: if i == 0 { LEASE_MS / 2 } else { LEASE_MS },
                gens: HashMap::new(),
                wanted_since: None,
                beyond_bound: false,
                shares_role: false,
            })
            .collect();
        let layout = match PRESETS[0].layout(DEFAULT_EPOCH_MS, T0) {
            Ok(l) => l,
            Err(e) => panic!("the classic layout: {e:?}"),
        };
        World {
            rng,
            scenario,
            regs,
            nodes,
            layout,
            checker: Checker::default(),
            next_pid: 1_000,
            // The lease role is there from the start.
            hostile_until: i64::MAX,
            hostile_pids: Vec::new(),
            cuts: Vec::new(),
            calm_since: 0,
            longest_wait_ms: 0,
            seed,
            trace: Vec::new(),
        }
    }

    fn log(&mut self, t: i64, what: String) {
        if self.trace.len() >= 4_000 {
            self.trace.drain(..2_000);
        }
        self.trace.push(format!("{t:>7} ms  {what}"));
    }

    /// Plays `duration_ms` with `schedule`'s faults.
    pub fn play(&mut self, duration_ms: i64, schedule: &[(i64, Fault)]) -> Played {
        let mut next = 0;
        let mut t = 0;
        while t <= duration_ms {
            while next < schedule.len() && schedule[next].0 <= t {
                self.fault(t, schedule[next].1);
                self.calm_since = t;
                next += 1;
            }
            if self.disturbed(t) {
                self.calm_since = t;
            }
            if t % 12_000 == 0 {
                // Demand that comes and goes: idle blocks are given back.
                for i in 0..self.nodes.len() {
                    self.nodes[i].demand = match self.rng.range(0, 10) {
                        0 | 1 => 0,
                        2..=5 => self.rng.range(1, 17) as u32,
                        _ => self.rng.range(17, 40) as u32,
                    };
                }
            }
            self.replicate_async(t);
            let due: Vec<(i64, usize, i64)> =
                self.cuts.iter().copied().filter(|c| c.0 <= t).collect();
            self.cuts.retain(|c| c.0 > t);
            for (_, node, ms) in due {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.cut_until = t + ms;
                }
            }
            self.hostile(t);
            for i in 0..self.nodes.len() {
                if t >= self.nodes[i].next_step {
                    self.step_holder(i, t);
                }
                self.sessions(i, t);
            }
            if self.checker.violation.is_some() {
                break;
            }
            t += TICK_MS;
        }
        // Holders still waiting when the run ends.
        for n in self
            .nodes
            .iter()
            .filter(|n| !n.beyond_bound && !n.shares_role)
        {
            if let Some(since) = n.wanted_since {
                self.longest_wait_ms = self.longest_wait_ms.max(t - since.max(self.calm_since));
            }
        }
        Played {
            violation: self.checker.violation.clone(),
            duplicates: self.checker.duplicates,
            ids: self.checker.ids,
            longest_wait_ms: self.longest_wait_ms,
            at_ms: self.checker.at_ms,
        }
    }

    /// Asynchronous standbys (and synchronous ones not waited for) catch
    /// up now and then; every standby keeps a snapshot history.
    fn replicate_async(&mut self, t: i64) {
        if t % 1_000 == 0 {
            for r in self.regs.iter_mut() {
                if matches!(r.kind, Kind::Primary) {
                    r.history
                        .push_back((t, r.store.tables.clone(), r.store.lsn));
                    if r.history.len() > 120 {
                        r.history.pop_front();
                    }
                }
            }
        }
        if !self.rng.chance(0.005) {
            return;
        }
        // A server that is down streams nothing.
        let sources: Vec<Option<(Tables, u64)>> = self
            .regs
            .iter()
            .map(|r| (t >= r.down_until).then(|| (r.store.tables.clone(), r.store.lsn)))
            .collect();
        for r in self.regs.iter_mut() {
            let wall = r.clock.wall(t);
            if t < r.stalled_until || t < r.down_until {
                continue;
            }
            if let Kind::Standby {
                of,
                copy,
                lsn,
                reply_ms,
            } = &mut r.kind
            {
                let Some((tables, l)) = &sources[*of] else {
                    continue;
                };
                **copy = tables.clone();
                *lsn = *l;
                *reply_ms = Some(wall);
            }
        }
    }

    fn primaries(&self, t: i64) -> Vec<usize> {
        (0..self.regs.len())
            .filter(|&i| self.regs[i].answering(t))
            .collect()
    }

    fn drop_conn(&mut self, i: usize) {
        if let Some((p, pid)) = self.nodes[i].conn.take() {
            self.regs[p].store.disconnect(pid);
        }
    }

    fn step_holder(&mut self, i: usize, t: i64) {
        let n = &mut self.nodes[i];
        n.next_step = t + HOLDER_STEP_MS;
        if t < n.down_until || t < n.stalled_until {
            return;
        }
        let mono = n.clock.mono(t);
        let wall = n.clock.wall(t);
        n.holder.expire_due(mono, &mut n.host);
        // The connection: a primary that answers, chosen at random (with
        // an old primary left running, either).
        let lost = n
            .conn
            .is_some_and(|(p, _)| !self.regs[p].answering(t) || t < self.nodes[i].cut_until);
        if lost {
            self.drop_conn(i);
        }
        if self.nodes[i].conn.is_none() && t >= self.nodes[i].cut_until {
            let ps = self.primaries(t);
            if !ps.is_empty() {
                let p = self.rng.pick(&ps);
                self.next_pid += 1;
                let pid = self.next_pid;
                let now_p = self.regs[p].clock.wall(t);
                let role = self.nodes[i].role.clone();
                self.regs[p].store.connect_as(pid, now_p, &role);
                let node = self.nodes[i].holder.id().node.clone();
                match self.regs[p].store.hello(pid, &node) {
                    Ok(true) => {
                        let n = &mut self.nodes[i];
                        n.conn = Some((p, pid));
                        n.holder
                            .set_previous_session(std::mem::take(&mut n.session));
                        n.session = format!("{pid}:{now_p}");
                        n.holder.reconnected();
                    }
                    _ => {
                        // Another live session is this node: a copy takes
                        // a new node id (the lease worker does).
                        self.regs[p].store.disconnect(pid);
                        let n = &mut self.nodes[i];
                        for b in n.host.active.keys().copied().collect::<Vec<_>>() {
                            n.host.revoke(b);
                        }
                        let fresh = format!("{node}'");
                        n.holder = Holder::new(identity(&fresh));
                        n.session.clear();
                    }
                }
            }
        }
        let registry_wall = self.primary().map(|p| self.regs[p].clock.wall(t));
        let n = &mut self.nodes[i];
        let usage: Vec<Usage> = {
            let mut left = n.demand;
            n.host.busy.clear();
            n.holder
                .held()
                .iter()
                .map(|h| {
                    let busy = if n.host.active.contains_key(&h.block) {
                        let b = left.min(BLOCK_SIZE);
                        left -= b;
                        b
                    } else {
                        0
                    };
                    n.host.busy.insert(h.block, busy);
                    Usage {
                        block: h.block,
                        ids: BLOCK_SIZE,
                        busy,
                    }
                })
                .collect()
        };
        let allowed: Vec<u32> = (0..BLOCKS).collect();
        let now = Now {
            mono_ms: mono,
            wall_ms: wall,
            timing: Timing::new(n.lease_ms),
            max_drift_ms: DRIFT_MS,
            max_blocks: MAX_BLOCKS,
            replication: Replication::Auto,
        };
        let result = match n.conn {
            Some((p, pid)) => {
                let names = self.regs[p].store.synchronous_standby_names.clone();
                let mut link = Link {
                    regs: &mut self.regs,
                    p,
                    pid,
                    t,
                    rng: &mut self.rng,
                    cut: t < n.cut_until,
                    names,
                };
                n.holder
                    .step(now, &usage, &allowed, Some(&mut link), &mut n.host)
            }
            None => n.holder.step(now, &usage, &allowed, None, &mut n.host),
        };
        n.holder.expire_due(mono, &mut n.host);
        // The lease file, as the lease worker writes it after each round.
        n.host.saved = n.holder.held().to_vec();
        let events: Vec<Event> = n.holder.take_events();
        let id = n.id;
        let wants = n.demand > 0;
        let has = !n.host.active.is_empty();
        match (wants && !has, n.wanted_since) {
            (true, None) => n.wanted_since = Some(t),
            (false, Some(since)) => {
                // A floor is used once it is within max_drift of the
                // holder's own clock: one behind the registry's waits that
                // much longer (docs/operations/fleet.md, the fleet's limits).
                let lag = registry_wall.map_or(0, |w| (w - n.clock.wall(t)).max(0));
                let waited = if n.beyond_bound || n.shares_role {
                    0
                } else {
                    (t - since.max(self.calm_since) - lag).max(0)
                };
                self.longest_wait_ms = self.longest_wait_ms.max(waited);
                self.nodes[i].wanted_since = None;
                if waited > 5_000 {
                    self.log(t, format!("server {id} waited {waited} ms for a block (wanted since {since} ms, calm since {} ms)", self.calm_since));
                }
            }
            _ => {}
        }
        if result.error.as_ref().is_some_and(CallError::drops_session) {
            self.drop_conn(i);
        }
        // This server's clock so far ahead of the registry's that its
        // marks pass max_ahead_ms: refused as documented, until the clocks
        // agree again; the wait owed a bound starts again.
        let ahead = self.primary().is_some_and(|p| {
            self.nodes[i].clock.wall(t) - self.regs[p].clock.wall(t)
                > MAX_AHEAD_MS - LEASE_MS - DRIFT_MS
        });
        if ahead && self.nodes[i].wanted_since.is_some() {
            self.nodes[i].wanted_since = Some(t);
        }
        for e in events {
            // Every block is held by others: capacity, not a fault; the
            // wait owed a bound starts again.
            if matches!(e, Event::NoFreeBlock) && self.nodes[i].wanted_since.is_some() {
                self.nodes[i].wanted_since = Some(t);
            }
            self.log(t, format!("server {id}: {e:?}"));
        }
    }

    /// The sessions of holder `i` make one ID in each block they use,
    /// within the bound the holder granted (the generator's own rules).
    fn sessions(&mut self, i: usize, t: i64) {
        let n = &mut self.nodes[i];
        if t < n.down_until || n.demand == 0 {
            return;
        }
        let wall = n.clock.wall(t);
        let now_tick = self.layout.tick_at(wall);
        let blocks: Vec<(u32, i64, i64, i64)> = n
            .host
            .active
            .iter()
            .map(|(&b, &(f, h, s))| (b, f, h, s))
            .collect();
        for (block, floor, high, stop) in blocks {
            if n.host.busy.get(&block).copied().unwrap_or(1) == 0 || wall >= stop {
                continue;
            }
            let floor_tick = self.layout.tick_at(floor);
            let layout = &self.layout;
            let g = n
                .gens
                .entry(block)
                .or_insert_with(|| GeneratorState::starting_above(floor_tick, layout));
            g.raise_floor(floor_tick, layout);
            let mut next = *g;
            if let Ok(Step::Issue(id)) = next.step(layout, block, now_tick, DRIFT_MS, || i64::MIN) {
                let Ok(parts) = layout.decode(id) else {
                    continue;
                };
                let tick = parts.ticks;
                if layout.tick_start_unix_ms(tick) <= high {
                    *g = next;
                    n.host.newest.insert(block, layout.tick_start_unix_ms(tick));
                    self.checker.made(n.id, block, tick, parts.sequence, t);
                }
            }
        }
    }

    fn primary(&self) -> Option<usize> {
        (0..self.regs.len()).find(|&i| matches!(self.regs[i].kind, Kind::Primary))
    }

    fn fault(&mut self, t: i64, f: Fault) {
        self.log(t, format!("FAULT {f:?}"));
        let Some(p) = self.primary() else { return };
        let pnow = self.regs[p].clock.wall(t);
        match f {
            Fault::RegistryCrash => {
                let r = &mut self.regs[p];
                r.store.sessions.clear();
                r.down_until = t + self.rng.range(500, 3_000);
                r.store.postmaster_start_ms = pnow;
                if mutation::active(Mutation::AsyncGrantCommit)
                    || mutation::active(Mutation::AsyncGrantCommitUncounted)
                {
                    // Unflushed commits lost; the WAL of other work passes
                    // the holders' positions after the restart.
                    let back = self.rng.range(1, 5) as usize;
                    if let Some((_, tables, _)) = r.history.iter().rev().nth(back).cloned() {
                        r.store.tables = tables;
                        r.store.lsn += 0x10_0000;
                    }
                }
            }
            Fault::Failover {
                named,
                old_runs,
                to,
            } => {
                let standbys: Vec<usize> = (0..self.regs.len())
                    .filter(|&i| matches!(&self.regs[i].kind, Kind::Standby { of, .. } if *of == p))
                    .filter(|&i| to.is_none_or(|k| i == 1 + k))
                    .collect();
                if standbys.is_empty() {
                    return;
                }
                let s = self.rng.pick(&standbys);
                self.regs[s].stalled_until = 0;
                self.regs[s].down_until = 0;
                let Kind::Standby { copy, lsn, .. } = self.regs[s].kind.clone() else {
                    return;
                };
                let now_s = self.regs[s].clock.wall(t);
                let name = if named {
                    self.regs[s].name.clone()
                } else {
                    String::new()
                };
                let timeline = self.regs[p].store.timeline;
                let mut store = Store::promoted_from(
                    *copy,
                    lsn,
                    timeline,
                    &name,
                    now_s,
                    self.seed ^ (t as u64),
                );
                // A standby is a base backup of the primary: it has its key
                // file.
                store.data_key = self.regs[p].store.data_key.clone();
                store.database_oid = self.regs[p].store.database_oid;
                // In a split brain, the promoted server runs without a
                // synchronous standby (it has none left to wait for).
                store.synchronous_standby_names =
                    if old_runs && self.scenario == Scenario::SplitBrainAny {
                        String::new()
                    } else {
                        self.scenario.synchronous_standby_names().into()
                    };
                let r = &mut self.regs[s];
                r.store = store;
                r.kind = Kind::Primary;
                r.history.clear();
                // The other standbys follow the new primary, but with the
                // old primary left running in a split-brain scenario.
                let (tables, l) = (self.regs[s].store.tables.clone(), self.regs[s].store.lsn);
                let follow = !(old_runs && self.scenario == Scenario::SplitBrainAny);
                for (i, r) in self.regs.iter_mut().enumerate() {
                    if let Kind::Standby { of, copy, lsn, .. } = &mut r.kind {
                        if follow && *of == p && i != s {
                            *of = s;
                            **copy = tables.clone();
                            *lsn = l;
                        }
                    }
                }
                if !old_runs {
                    self.regs[p].kind = Kind::Gone;
                    self.regs[p].store.sessions.clear();
                } else {
                    // A network blip: holders connect again, to either.
                    for i in 0..self.nodes.len() {
                        self.drop_conn(i);
                    }
                }
            }
            Fault::RestoreSnapshot | Fault::RestoreSnapshotWalPassed => {
                let r = &mut self.regs[p];
                let back = self.rng.range(2, 20) as usize;
                let Some((_, tables, lsn)) = r.history.iter().rev().nth(back).cloned() else {
                    return;
                };
                r.store.tables = tables;
                r.store.lsn = lsn;
                r.restored_ms = pnow;
                r.store.sessions.clear();
                r.store.postmaster_start_ms = pnow;
                r.down_until = t + 1_000;
                if f == Fault::RestoreSnapshotWalPassed {
                    r.store.lsn += 0x1000_0000;
                }
            }
            Fault::RestoreSnapshotBefore { before_ms } => {
                let r = &mut self.regs[p];
                let Some((_, tables, lsn)) =
                    r.history.iter().rev().find(|h| h.0 < before_ms).cloned()
                else {
                    return;
                };
                r.store.tables = tables;
                r.store.lsn = lsn.max(r.store.lsn) + 0x1000_0000;
                r.restored_ms = pnow;
                r.store.sessions.clear();
                r.store.postmaster_start_ms = pnow;
                r.down_until = t + 1_000;
            }
            Fault::DropCreate => {
                // The DBA's script sets the fleet's limits again.
                let limits = self.regs[p].store.tables.rows.limits.clone();
                self.regs[p].restored_ms = pnow;
                self.regs[p].store.create_extension(pnow);
                self.regs[p].store.set_limits(limits, pnow);
            }
            Fault::PutBackDatabaseCopy {
                copied_ms,
                same_oid,
            } => {
                let r = &mut self.regs[p];
                let Some((_, tables, _)) =
                    r.history.iter().rev().find(|h| h.0 < copied_ms).cloned()
                else {
                    return;
                };
                r.restored_ms = pnow;
                r.put_aside = Some((r.store.tables.clone(), r.store.database_oid));
                if same_oid {
                    // The original dropped: nothing to put back.
                    r.put_aside = None;
                    let oid = r.store.database_oid;
                    r.store.put_back_database(&tables, oid);
                } else {
                    r.store.put_back_copy(&tables);
                }
                // Its sessions ended: holders connect again.
                for i in 0..self.nodes.len() {
                    self.drop_conn(i);
                }
            }
            Fault::PutBackOriginal => {
                let r = &mut self.regs[p];
                let Some((tables, oid)) = r.put_aside.take() else {
                    return;
                };
                r.restored_ms = pnow;
                r.store.put_back_database(&tables, oid);
                for i in 0..self.nodes.len() {
                    self.drop_conn(i);
                }
            }
            Fault::TakeOut { standby } => {
                // What a DBA does with a synchronous standby that is gone,
                // so that commits do not wait for it.
                let name = format!("s{}", standby + 1);
                let names = &mut self.regs[p].store.synchronous_standby_names;
                *names = without(names, &name);
            }
            Fault::LoseKeptCandidates => self.regs[p].store.data_candidates = None,
            Fault::DumpRestore => {
                let back = self.rng.range(2, 30) as usize;
                let Some((_, dumped, _)) = self.regs[p].history.iter().rev().nth(back).cloned()
                else {
                    return;
                };
                self.regs[p].restored_ms = pnow;
                self.regs[p].store.restore_dump(&dumped, pnow);
            }
            Fault::CopyDataDir { holder, detected } => {
                if holder >= self.nodes.len() {
                    return;
                }
                // The original is cut off meanwhile (so that the copy can
                // take its node id), and the copy starts from its lease
                // file as if it were the original.
                let back = t + self.rng.range(1_000, 8_000);
                self.nodes[holder].cut_until = back;
                // The copy is cut off in its turn, once the original is back.
                self.cuts.push((
                    back - self.rng.range(200, 1_000),
                    self.nodes.len(),
                    self.rng.range(2_000, 9_000),
                ));
                self.drop_conn(holder);
                let orig = &self.nodes[holder];
                let mut h = Holder::new(orig.holder.id().clone());
                // As the lease worker starts in a copied data directory:
                // a saved block, once confirmed, only above the registry's
                // mark.
                h.resume(&orig.holder.seen(), detected);
                for b in &orig.host.saved {
                    h.add_saved(b.block, b.floor_ms, b.high_ms, b.deadline_mono_ms);
                }
                let copy = Node {
                    id: self.nodes.len() as u32 + 100,
                    role: orig.role.clone(),
                    holder: h,
                    host: SimHost::default(),
                    clock: orig.clock,
                    conn: None,
                    session: String::new(),
                    next_step: t,
                    stalled_until: 0,
                    cut_until: 0,
                    down_until: 0,
                    demand: 8,
                    lease_ms: orig.lease_ms,
                    gens: orig.gens.clone(),
                    wanted_since: None,
                    beyond_bound: false,
                    shares_role: true,
                };
                self.nodes[holder].shares_role = true;
                self.nodes.push(copy);
            }
            Fault::HolderRestart { holder } => {
                if holder >= self.nodes.len() {
                    return;
                }
                self.drop_conn(holder);
                let n = &mut self.nodes[holder];
                let saved = std::mem::take(&mut n.host.saved);
                let mut h = Holder::new(n.holder.id().clone());
                h.resume(&n.holder.seen(), false);
                for s in saved {
                    h.add_saved(s.block, s.floor_ms, s.high_ms, s.deadline_mono_ms);
                }
                n.holder = h;
                n.host.active.clear();
                n.session.clear();
                n.down_until = t + 1_000;
            }
            Fault::HolderStall { holder, ms } => {
                if let Some(n) = self.nodes.get_mut(holder) {
                    n.stalled_until = t + ms;
                }
            }
            Fault::RegistryStall { ms } => self.regs[p].stalled_until = t + ms,
            Fault::StandbyStall { standby, ms } => {
                if let Some(r) = self.regs.get_mut(1 + standby) {
                    r.stalled_until = t + ms;
                }
            }
            Fault::StandbyCut { standby, ms } => {
                if let Some(r) = self.regs.get_mut(1 + standby) {
                    r.down_until = t + ms;
                }
            }
            Fault::Partition { holder, ms } => {
                if let Some(n) = self.nodes.get_mut(holder) {
                    n.cut_until = t + ms;
                }
            }
            Fault::ClockStep { holder, ms } => {
                if let Some(n) = self.nodes.get_mut(holder) {
                    n.clock.offset += ms;
                }
            }
            Fault::ClockRate { process, ppm } => {
                if process < HOLDERS {
                    self.nodes[process].clock.set_rate(t, ppm);
                } else if let Some(r) = self.regs.get_mut(process - HOLDERS) {
                    r.clock.set_rate(t, ppm);
                }
            }
            Fault::ClockRateBeyond { holder } => {
                if let Some(n) = self.nodes.get_mut(holder) {
                    n.clock.set_rate(t, -300_000);
                    n.beyond_bound = true;
                }
            }
            Fault::Hostile { ms } => self.hostile_until = t + ms,
            Fault::RegistryClockStep { ms } => self.regs[p].clock.offset += ms,
            Fault::StandbyClock { standby, ms } => {
                if let Some(r) = self.regs.get_mut(1 + standby) {
                    r.clock.offset += ms;
                }
            }
        }
    }

    /// Whether a fault still lasts at `t`: a registry server or holder
    /// down or stalled, a holder cut off, a cut still to come, or a
    /// primary short of the synchronous standby its
    /// `synchronous_standby_names` needs (failovers used them up: nothing
    /// it commits is durable, and holders rightly get no block).
    fn disturbed(&self, t: i64) -> bool {
        let Some(p) = self.primary() else {
            return true;
        };
        let needs_standby = !self.scenario.synchronous_standby_names().is_empty();
        let standby_up = self.regs.iter().any(|r| {
            matches!(r.kind, Kind::Standby { of, .. } if of == p)
                && t >= r.stalled_until
                && t >= r.down_until
        });
        // A primary whose clock is further behind the holders' than the
        // marks may be ahead of it refuses them (documented) until its
        // clock is set right.
        let behind = T0 + t - self.regs[p].clock.wall(t) > MAX_AHEAD_MS;
        behind
            || (needs_standby && !standby_up)
            || !self.cuts.is_empty()
            || self
                .regs
                .iter()
                .any(|r| t < r.stalled_until || t < r.down_until)
            || self
                .nodes
                .iter()
                .any(|n| t < n.stalled_until || t < n.cut_until || t < n.down_until)
    }

    /// The lease role, sending what it may: forged positions, tokens and
    /// incarnations, layouts no holder uses, releases of others' blocks
    /// with a mark of 0, renewals of blocks it does not hold; from up to
    /// [`ROGUE_SESSIONS`] sessions, each a made-up node, which give up
    /// their node's lock and introduce others.
    fn hostile(&mut self, t: i64) {
        if t >= self.hostile_until || t % 200 != 0 {
            return;
        }
        let Some(p) = self.primary().filter(|&p| self.regs[p].answering(t)) else {
            return;
        };
        // Its sessions on this server, up to ROGUE_SESSIONS, each a
        // made-up node.
        let store = &self.regs[p].store;
        self.hostile_pids
            .retain(|&(q, pid)| q == p && store.sessions.contains_key(&pid));
        if self.hostile_pids.len() < ROGUE_SESSIONS
            && (self.hostile_pids.is_empty() || self.rng.chance(0.2))
        {
            self.next_pid += 1;
            let pid = self.next_pid;
            let now = self.regs[p].clock.wall(t);
            self.regs[p].store.connect_as(pid, now, ROGUE);
            let node = format!("rogue{}", self.rng.range(0, 6));
            if self.regs[p].store.hello(pid, &node) == Ok(true) {
                self.hostile_pids.push((p, pid));
            } else {
                self.regs[p].store.disconnect(pid);
            }
        }
        let Some(&(_, pid)) = self.hostile_pids.get(
            self.rng.range(0, ROGUE_SESSIONS as i64) as usize % self.hostile_pids.len().max(1),
        ) else {
            return;
        };
        if self.rng.chance(0.15) {
            self.hostile_other_node(t, p, pid);
        }
        let node = self.regs[p]
            .store
            .sessions
            .get(&pid)
            .and_then(|s| s.node())
            .unwrap_or_default();
        let now = self.regs[p].clock.wall(t);
        let incarnation = self.regs[p]
            .store
            .tables
            .rows
            .registry
            .as_ref()
            .map(|r| r.incarnation.clone())
            .unwrap_or_default();
        let seen = Seen {
            incarnation: match self.rng.range(0, 3) {
                0 => incarnation,
                1 => "never-issued".into(),
                _ => String::new(),
            },
            lsn: if self.rng.chance(0.5) {
                "FFFFFFFF/FFFFFFFF".into()
            } else {
                "0/0".into()
            },
            grants: if self.rng.chance(0.5) { i64::MAX } else { 0 },
            token: if self.rng.chance(0.5) {
                "ab".repeat(16)
            } else {
                String::new()
            },
            earlier: Vec::new(),
        };
        // Earlier incarnations it says it saw: this one, far ahead, under
        // a token it cannot make.
        let seen = Seen {
            earlier: if self.rng.chance(0.5) {
                vec![Seen {
                    lsn: "FFFFFFFF/FFFFFFFF".into(),
                    grants: i64::MAX,
                    token: "cd".repeat(16),
                    earlier: Vec::new(),
                    ..seen.clone()
                }]
            } else {
                Vec::new()
            },
            ..seen
        };
        let block = self.rng.range(0, BLOCKS as i64);
        // Blocks this role holds: given back at once with a mark of 0.
        let mine: Vec<u32> = self.regs[p]
            .store
            .tables
            .rows
            .blocks
            .iter()
            .filter(|b| b.holder_node.as_deref() == Some(node.as_str()))
            .map(|b| b.block)
            .collect();
        let call = match self.rng.range(0, 6) {
            _ if !mine.is_empty() && self.rng.chance(0.7) => Call::Release(ReleaseRequest {
                node,
                block: i64::from(mine[0]),
                high_ms: 0,
                seen,
                previous_session: String::new(),
            }),
            2 | 3 => Call::Acquire(AcquireRequest {
                node: node.clone(),
                name: node,
                layout: "classic".into(),
                block_size: i64::from(BLOCK_SIZE),
                max_worker_id: 1023,
                allowed: (0..i64::from(BLOCKS)).collect(),
                want: 1,
                lease_ms: LEASE_MS,
                grace_ms: 1_200,
                high_ms: now + LEASE_MS,
                seen,
            }),
            0 => Call::Acquire(AcquireRequest {
                node: node.clone(),
                name: node,
                layout: if self.rng.chance(0.5) {
                    "not a layout".into()
                } else {
                    "classic".into()
                },
                block_size: i64::from(BLOCK_SIZE),
                max_worker_id: 1023,
                allowed: (0..i64::from(BLOCKS)).collect(),
                want: self.rng.range(1, 9),
                lease_ms: LEASE_MS,
                grace_ms: 1_200,
                high_ms: now + LEASE_MS,
                seen,
            }),
            1 => Call::Renew(RenewRequest {
                node,
                layout: "classic".into(),
                block_size: i64::from(BLOCK_SIZE),
                max_worker_id: 1023,
                blocks: (0..i64::from(BLOCKS))
                    .map(|b| BlockMark {
                        block: b,
                        high_ms: 0,
                    })
                    .collect(),
                lease_ms: LEASE_MS,
                grace_ms: 1_200,
                high_ms: now + LEASE_MS,
                seen,
                previous_session: format!("{}:0", self.rng.range(1_000, 2_000)),
            }),
            _ => Call::Release(ReleaseRequest {
                node,
                block,
                high_ms: 0,
                seen,
                previous_session: String::new(),
            }),
        };
        let before = self.regs[p]
            .store
            .tables
            .rows
            .registry
            .as_ref()
            .map(|r| r.incarnation.clone());
        let role_before = snowflake_core::registry::blocks::role_held(
            &self.regs[p].store.tables.rows.blocks,
            ROGUE,
            now,
        );
        let store = &mut self.regs[p].store;
        let what = match &call {
            Call::Release(_) => store
                .release(pid, &call, now)
                .map(|r| format!("released: {}", r.released)),
            _ => store
                .lease(pid, &call, now)
                .map(|r| format!("{:?} fenced {:?}", r.blocks, r.head.fenced_until_ms)),
        };
        self.hostile_bounds(t, p, now, role_before);
        let after = self.regs[p].store.tables.rows.registry.clone();
        if after.as_ref().map(|r| r.incarnation.clone()) != before {
            let cause = after.map(|r| r.cause).unwrap_or_default();
            self.log(
                t,
                format!("hostile call {call:?} began a new incarnation: {cause}"),
            );
        }
        if let Ok(what) = what {
            self.log(
                t,
                format!(
                    "hostile {}: {what}",
                    match call {
                        Call::Acquire(_) => "acquire",
                        Call::Renew(_) => "renew",
                        Call::Release(_) => "release",
                    }
                ),
            );
        }
    }

    /// The lease role's session `pid` gives up its node's lock
    /// (`pg_advisory_unlock`, open to every role) and introduces another
    /// node: refused while it holds blocks of the first. Its own node
    /// again otherwise.
    fn hostile_other_node(&mut self, t: i64, p: usize, pid: u64) {
        let store = &mut self.regs[p].store;
        let Some(was) = store.sessions.get(&pid).and_then(|s| s.node()) else {
            return;
        };
        let other = format!("rogue{}", self.rng.range(0, 6));
        store.unlock_node(pid);
        let got = store.hello(pid, &other);
        if got != Ok(true) {
            let _ = store.hello(pid, &was);
        }
        self.log(
            t,
            format!("hostile session {pid}: node {was} to {other}: {got:?}"),
        );
    }

    /// What the registry promises about the lease role, after each of its
    /// calls at registry time `now`: every session's blocks are of one
    /// node (`snowflake_lease_hello`), and a call that granted the role
    /// blocks (it held `before`) leaves it within `max_blocks_per_role`.
    fn hostile_bounds(&mut self, t: i64, p: usize, now: i64, before: i64) {
        let rows = &self.regs[p].store.tables.rows;
        let mut by_session: BTreeMap<&str, &str> = BTreeMap::new();
        let mut broken = None;
        let restored_ms = self.regs[p].restored_ms;
        for b in rows
            .blocks
            .iter()
            .filter(|b| b.leased_at_ms.is_some_and(|l| l > restored_ms))
        {
            if let (Some(s), Some(n)) = (b.holder_session.as_deref(), b.holder_node.as_deref()) {
                match by_session.insert(s, n) {
                    Some(m) if m != n => {
                        broken = Some(format!("session {s} holds blocks of nodes {m} and {n}"));
                    }
                    _ => {}
                }
            }
        }
        let limit = snowflake_core::registry::limits::in_force(rows.limits.as_ref(), now)
            .max_blocks_per_role;
        let held = snowflake_core::registry::blocks::role_held(&rows.blocks, ROGUE, now);
        if let Some(max) = limit.filter(|&m| held > before && held > m) {
            broken = Some(format!(
                "the lease role {ROGUE} holds {held} blocks, above max_blocks_per_role {max}"
            ));
        }
        if let Some(what) = broken {
            self.checker.broken(t, what);
        }
    }
}

/// `synchronous_standby_names` (`FIRST n (...)`, `ANY n (...)`) with `name`
/// taken out of its list; empty when none is left.
fn without(names: &str, name: &str) -> String {
    let (Some(open), Some(close)) = (names.find('('), names.rfind(')')) else {
        return names.to_string();
    };
    let rest: Vec<&str> = names[open + 1..close]
        .split(',')
        .map(str::trim)
        .filter(|n| *n != name)
        .collect();
    if rest.is_empty() {
        String::new()
    } else {
        format!("{}({})", &names[..open], rest.join(", "))
    }
}
