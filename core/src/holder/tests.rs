//! The holder against the registry's real rules over rows in memory
//! (`registry::memory::Store`), which can forget (restores, failovers,
//! DROP/CREATE EXTENSION), and a network that can stall, reorder and
//! lie. Every test checks the one property that matters: two servers
//! never hold usable ID-time ranges of the same block that overlap.

use super::*;
use crate::registry::memory::{Store, Tables};
use crate::registry::Call;
use std::collections::BTreeMap;

const T0: i64 = 1_795_305_600_000;
const LEASE: i64 = 6_000;
const DRIFT: i64 = 1_000;

/// A call the registry did not answer within the call timeout.
fn timeout() -> CallError {
    CallError::NoAnswer {
        end: crate::lease::CallEnd::Timeout,
        text: "timeout".into(),
    }
}

/// The slots of one server, recording every range it could use.
#[derive(Default)]
struct FakeHost {
    name: &'static str,
    /// block → (floor, high) while usable.
    active: BTreeMap<u32, (i64, i64)>,
    /// block → the wall-clock ms its sessions stop at.
    stops: BTreeMap<u32, i64>,
    /// Every (block, floor, high) this server could ever issue in.
    used: Vec<(u32, i64, i64)>,
    busy: Vec<u32>,
    saves: u32,
}

impl Host for FakeHost {
    fn activate(&mut self, block: u32, floor_ms: i64, high_ms: i64, stop_ms: i64) {
        self.active.insert(block, (floor_ms, high_ms));
        self.stops.insert(block, stop_ms);
        self.used.push((block, floor_ms, high_ms));
    }
    fn raise(&mut self, block: u32, high_ms: i64, stop_ms: i64) {
        if let Some(r) = self.active.get_mut(&block) {
            r.1 = r.1.max(high_ms);
            self.used.push((block, r.0, r.1));
            let stop = self.stops.entry(block).or_insert(stop_ms);
            *stop = (*stop).max(stop_ms);
        }
    }
    fn revoke(&mut self, block: u32) {
        self.active.remove(&block);
    }
    fn stop_if_idle(&mut self, block: u32) -> Option<Option<i64>> {
        if self.busy.contains(&block) {
            return None;
        }
        // Conservatively, the newest ID is at the top of the range.
        let newest = self.active.remove(&block).map(|r| r.1);
        Some(newest)
    }
    fn save(&mut self, _holder: &Holder) {
        self.saves += 1;
    }
}

struct Server {
    holder: Holder,
    host: FakeHost,
    /// Offset of this server's clock from the registry's.
    skew: i64,
    connected: bool,
    /// `snowflake_id.lease_time` (ms) and `lease_replication`.
    lease_ms: i64,
    replication: Replication,
    /// `snowflake_id.max_drift` (ms).
    max_drift_ms: i64,
}

impl Server {
    fn new(name: &'static str, skew: i64) -> Server {
        Server {
            holder: Holder::new(Identity {
                node: format!("node-{name}"),
                name: name.into(),
                layout: "classic".into(),
                block_size: 16,
                max_worker_id: 63,
            }),
            host: FakeHost {
                name,
                ..FakeHost::default()
            },
            skew,
            connected: true,
            lease_ms: LEASE,
            replication: Replication::Auto,
            max_drift_ms: DRIFT,
        }
    }

    fn usage(&self) -> Vec<Usage> {
        self.holder
            .held
            .iter()
            .map(|h| Usage {
                block: h.block,
                ids: 16,
                busy: if self.host.busy.contains(&h.block) {
                    16
                } else {
                    0
                },
            })
            .collect()
    }

    fn step(&mut self, t: i64, registry: &mut dyn Clocked, allowed: &[u32]) {
        let now = Now {
            mono_ms: t - T0,
            wall_ms: t + self.skew,
            timing: Timing::new(self.lease_ms),
            max_drift_ms: self.max_drift_ms,
            max_blocks: 64,
            replication: self.replication,
        };
        let usage = self.usage();
        let node = self.holder.id.node.clone();
        registry.at(t, &node, self.connected);
        let reg: Option<&mut dyn Registry> = if self.connected {
            Some(registry.as_registry())
        } else {
            None
        };
        let round = self.holder.step(now, &usage, allowed, reg, &mut self.host);
        if round.error.as_ref().is_some_and(CallError::drops_session) {
            self.holder.reconnected();
        }
    }
}

/// A registry the tests' servers call: its clock is the tests' time `t`,
/// and calls come from the server of node `node` (`connected`: it has a
/// session).
trait Clocked {
    fn at(&mut self, t: i64, node: &str, connected: bool);
    fn as_registry(&mut self) -> &mut dyn Registry;
}

/// The registry's real rules over rows in memory
/// ([`crate::registry::memory::Store`]), one session per server, and what
/// the network can do to its answers: stall, replay an older reply, add a
/// block to a reply (a lie).
struct MemRegistry {
    store: Store,
    now: i64,
    /// Node → its session's pid.
    sessions: BTreeMap<String, u64>,
    pid: u64,
    next_pid: u64,
    /// Calls get no answer (a registry that stalls).
    stalled: bool,
    /// The next lease call's reply is this one (a reordered answer).
    replay: Option<Reply>,
    /// Replies name this extra block (a lie).
    extra_block: Option<u32>,
    /// The bound the holder set before each call (`Registry::answer_by`).
    bounds: Vec<Option<i64>>,
    /// Its standbys, named s0, s1, ... in `synchronous_standby_names`.
    standbys: Vec<MemStandby>,
    /// Answers every durability check as a registry before 0.7.0 does
    /// (it cannot say: "unchecked", used once committed), as a holder
    /// that trusted any COMMIT that returned had it.
    trust_commits: bool,
    /// Durability checks are refused (a lease role without EXECUTE on it).
    durable_refused: bool,
}

/// A standby: what it flushed, unless stalled (then it keeps an older
/// copy of the registry).
#[derive(Clone)]
struct MemStandby {
    stalled: bool,
    copy: (Tables, u64),
}

impl MemRegistry {
    /// A registry with `n` standbys s0.. named in
    /// `synchronous_standby_names` = `names` (e.g. "FIRST 1 (s0)").
    fn replicated(names: &str, n: usize) -> MemRegistry {
        let mut reg = MemRegistry::new().with_test_limits();
        reg.store.synchronous_standby_names = names.into();
        let copy = reg.snapshot();
        reg.standbys = vec![
            MemStandby {
                stalled: false,
                copy,
            };
            n
        ];
        reg
    }

    /// The end of a call: its commit reaches every standby that streams.
    fn stream(&mut self) {
        let copy = self.snapshot();
        for s in self.standbys.iter_mut().filter(|s| !s.stalled) {
            s.copy = copy.clone();
        }
    }

    /// The standbys as `pg_stat_replication` shows them.
    fn standby_rows(&self) -> Vec<crate::registry::durable::Standby> {
        let names = self.store.synchronous_standby_names.to_ascii_lowercase();
        let needed = crate::registry::durable::needed(&names) as usize;
        let mut sync_taken = 0;
        self.standbys
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let sync_state = if names.starts_with("first") {
                    sync_taken += 1;
                    if sync_taken <= needed {
                        "sync"
                    } else {
                        "potential"
                    }
                } else {
                    "quorum"
                };
                crate::registry::durable::Standby {
                    application_name: format!("s{i}"),
                    sync_state: sync_state.into(),
                    flush_lsn: Some(s.copy.1),
                    physical: true,
                    streaming: !s.stalled,
                    reply_time_ms: Some(self.now),
                }
            })
            .collect()
    }

    /// Standby `i` is promoted (with its name): the registry is what it
    /// flushed, on a new timeline; sessions and standbys are gone.
    fn promote(&mut self, i: usize) {
        let promoted = self.promoted(i);
        *self = promoted;
    }

    /// Standby `i` promoted, as another registry (the old primary may go
    /// on: split brain).
    fn promoted(&self, i: usize) -> MemRegistry {
        let (tables, lsn) = self.standbys[i].copy.clone();
        let mut store = Store::promoted_from(
            tables,
            lsn,
            self.store.timeline,
            &format!("s{i}"),
            self.now,
            43 + i as u64,
        );
        store.tables.rows.limits = self.store.tables.rows.limits.clone();
        MemRegistry {
            store,
            now: self.now,
            ..MemRegistry::new()
        }
    }

    fn new() -> MemRegistry {
        MemRegistry {
            store: Store::created(T0 - 60_000, 42),
            now: T0,
            sessions: BTreeMap::new(),
            pid: 0,
            next_pid: 100,
            stalled: false,
            replay: None,
            extra_block: None,
            bounds: Vec::new(),
            standbys: Vec::new(),
            trust_commits: false,
            durable_refused: false,
        }
    }

    fn call<T>(
        &mut self,
        f: impl FnOnce(&mut Store, u64, i64) -> Result<T, crate::registry::Refusal>,
    ) -> Result<T, CallError> {
        if self.stalled {
            return Err(timeout());
        }
        f(&mut self.store, self.pid, self.now)
            .map_err(|r| CallError::from_registry(Some(r.code.code().into()), r.message, r.hint))
    }

    /// The registry's limits for the tests' lease time and drift
    /// (`snowflake_lease_set_limits`), as the fleet tests set them: a
    /// fence then lasts a lease and a grace, not the defaults' 12 min.
    fn with_test_limits(self) -> MemRegistry {
        self.with_limits(LEASE)
    }

    /// The limits for leases up to `lease_ms`.
    fn with_limits(mut self, lease_ms: i64) -> MemRegistry {
        self.store.set_limits(
            Some(crate::registry::limits::LimitsRow {
                max_lease_ms: lease_ms,
                max_grace_ms: Timing::new(lease_ms).grace_ms,
                max_ahead_ms: lease_ms + DRIFT + 1_000,
                max_blocks_per_node: 8,
                ..Default::default()
            }),
            0,
        );
        self
    }

    /// The tables and WAL position, as a restore or a standby has them.
    fn snapshot(&self) -> (Tables, u64) {
        (self.store.tables.clone(), self.store.lsn)
    }

    /// Goes back to a snapshot: a restore in place (`new_timeline`
    /// false), or a failover to a standby that had only that much (a new
    /// timeline).
    fn forget(&mut self, to: (Tables, u64), new_timeline: bool) {
        self.store.tables = to.0;
        self.store.lsn = to.1;
        if new_timeline {
            self.store.timeline += 1;
            self.store.lsn += 0x1000;
        }
    }

    /// The id (`pid:start`) of node `node`'s session.
    fn session_id(&self, node: &str) -> String {
        self.sessions
            .get(node)
            .and_then(|pid| self.store.sessions.get(pid))
            .map(|s| s.id.clone())
            .unwrap_or_default()
    }

    /// Node `node`'s session ends (its server restarts): its locks go.
    fn end_session(&mut self, node: &str) {
        if let Some(pid) = self.sessions.remove(node) {
            self.store.disconnect(pid);
        }
    }

    fn lie(&self, mut reply: Reply) -> Reply {
        if let Some(block) = self.extra_block {
            reply.blocks.push(BlockFloor { block, floor_ms: 0 });
        }
        reply
    }
}

impl Clocked for MemRegistry {
    fn at(&mut self, t: i64, node: &str, connected: bool) {
        self.now = t;
        if !connected {
            // Its session ended with the partition (its locks went).
            if let Some(pid) = self.sessions.remove(node) {
                self.store.disconnect(pid);
            }
            return;
        }
        let pid = match self.sessions.get(node) {
            Some(&pid) => pid,
            None => {
                self.next_pid += 1;
                let pid = self.store.connect(self.next_pid, t);
                self.sessions.insert(node.to_string(), pid);
                pid
            }
        };
        self.pid = pid;
        let _ = self.store.hello(pid, node);
    }
    fn as_registry(&mut self) -> &mut dyn Registry {
        self
    }
}

impl Registry for MemRegistry {
    fn acquire(&mut self, req: &AcquireRequest) -> Result<Reply, CallError> {
        let call = Call::Acquire(req.clone());
        let reply = self.call(|s, pid, now| s.lease(pid, &call, now));
        self.stream();
        let reply = reply?;
        Ok(self.replay.take().unwrap_or_else(|| self.lie(reply)))
    }
    fn renew(&mut self, req: &RenewRequest) -> Result<Reply, CallError> {
        let call = Call::Renew(req.clone());
        let reply = self.call(|s, pid, now| s.lease(pid, &call, now));
        self.stream();
        let reply = reply?;
        Ok(self.replay.take().unwrap_or_else(|| self.lie(reply)))
    }
    fn release(&mut self, req: &ReleaseRequest) -> Result<ReleaseReply, CallError> {
        let call = Call::Release(req.clone());
        let reply = self.call(|s, pid, now| s.release(pid, &call, now));
        self.stream();
        reply
    }
    fn durable(&mut self, _wait_ms: i64) -> Result<Durability, CallError> {
        if self.durable_refused {
            self.call(|_, _, _| Ok(()))?;
            return Err(CallError::from_registry(
                Some("42501".into()),
                "permission denied".into(),
                None,
            ));
        }
        if self.trust_commits {
            return Ok(Durability {
                durable: true,
                mode: DurabilityMode::Unchecked,
                ..Durability::default()
            });
        }
        let target = self.store.lsn;
        let standbys = self.standby_rows();
        let d = self.call(|s, _, now| Ok(s.durable(now, target, &standbys)));
        self.stream();
        d
    }
    fn answer_by(&mut self, deadline_mono_ms: Option<i64>) {
        self.bounds.push(deadline_mono_ms);
    }
}

/// No two servers' usable ranges of a block overlap.
fn assert_disjoint(servers: &[&Server]) {
    for (i, a) in servers.iter().enumerate() {
        for b in &servers[i + 1..] {
            for &(block, lo_a, hi_a) in &a.host.used {
                for &(block_b, lo_b, hi_b) in &b.host.used {
                    if block == block_b {
                        assert!(
                            hi_a <= lo_b || hi_b <= lo_a,
                            "{} ({lo_a}, {hi_a}] and {} ({lo_b}, {hi_b}] overlap on block {block}",
                            a.host.name,
                            b.host.name
                        );
                    }
                }
            }
        }
    }
}

/// Runs both servers every 100 ms of registry time from `from` to `to`.
fn run(
    servers: &mut [&mut Server],
    registry: &mut dyn Clocked,
    from: i64,
    to: i64,
    allowed: &[u32],
) {
    let mut t = from;
    while t < to {
        for s in servers.iter_mut() {
            s.step(t, registry, allowed);
        }
        t += 100;
    }
}

#[test]
fn two_servers_get_disjoint_blocks_and_hand_over_safely() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    // One block for both: b gets it only after a gives it back.
    a.host.busy.push(0);
    run(&mut [&mut a, &mut b], &mut reg, T0, T0 + 2_000, &[0]);
    assert!(a.host.active.contains_key(&0));
    assert!(b.holder.held.is_empty());
    // a stops renewing (partitioned): b gets it after expiry + grace.
    a.connected = false;
    run(
        &mut [&mut a, &mut b],
        &mut reg,
        T0 + 2_000,
        T0 + 20_000,
        &[0],
    );
    assert!(!a.host.active.contains_key(&0), "a stops at its deadline");
    assert!(b.host.active.contains_key(&0));
    assert_disjoint(&[&a, &b]);
}

/// A block handed over from a holder with a longer lease and `max_drift`
/// above the new holder's lease: its floor (the earlier mark) is up to
/// `max_drift` ahead of the new holder's clock when the block becomes
/// usable. Sessions bound by the mark and stopping at the deadline on
/// their clock can use it at once; bounded by the deadline in ID time
/// (the mark less `max_drift`) they could not until the clock caught up
/// with the floor (`max_drift` less the lease later).
#[test]
fn a_block_whose_floor_is_ahead_is_usable_at_once_until_its_deadline() {
    let drift = 60_000;
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    for s in [&mut a, &mut b] {
        s.max_drift_ms = drift;
    }
    a.lease_ms = 60_000;
    a.host.busy.push(0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    assert!(a.host.active.contains_key(&0));
    a.connected = false;
    let mut t = T0 + 1_000;
    while !b.host.active.contains_key(&0) {
        assert!(t < T0 + 200_000, "b never used block 0");
        for s in [&mut a, &mut b] {
            s.step(t, &mut reg, &[0]);
        }
        t += 100;
    }
    let wall = t - 100;
    let (floor, high) = b.host.active[&0];
    let stop = b.host.stops[&0];
    assert!(floor > wall + LEASE, "the floor is ahead of b's deadline");
    assert!(floor <= wall + drift);
    assert!(high > floor, "IDs above the floor are under the mark");
    assert!(stop > wall, "b's sessions may make them now");
    assert!(
        stop <= wall + LEASE,
        "and stop at b's deadline, not at its mark"
    );
    assert_disjoint(&[&a, &b]);
}

/// A registry in use: server z holds block 1 (its row is evidence that
/// holders exist when the registry later forgets).
fn registry_in_use() -> (MemRegistry, Server) {
    let mut reg = MemRegistry::new().with_test_limits();
    let mut z = Server::new("z", 0);
    run(&mut [&mut z], &mut reg, T0 - 1_000, T0, &[1]);
    assert!(z.host.active.contains_key(&1));
    (reg, z)
}

/// The fault in the issue: the registry loses a grant it confirmed (a
/// failover to a standby that was behind, a restore). With fencing, the
/// other server waits; both never overlap.
#[test]
fn a_registry_that_forgets_a_confirmed_grant_fences_until_the_holder_stopped() {
    let (mut reg, mut z) = registry_in_use();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    let before = reg.snapshot();
    run(&mut [&mut a, &mut z], &mut reg, T0, T0 + 1_000, &[0, 1]);
    assert!(a.host.active.contains_key(&0));
    // A new timeline: b may call first.
    reg.forget(before, true);
    run(
        &mut [&mut b, &mut a, &mut z],
        &mut reg,
        T0 + 1_000,
        T0 + 30_000,
        &[0],
    );
    assert_disjoint(&[&a, &b]);
    assert!(
        a.holder
            .events
            .iter()
            .any(|e| matches!(e, Event::NewIncarnation { old, .. } if !old.is_empty())),
        "{:?}",
        a.holder.events
    );
    assert!(b.host.active.contains_key(&0) || a.host.active.contains_key(&0));
}

/// The same without a new timeline (a snapshot restored in place): the
/// holder's WAL position tells the registry, at its next call.
#[test]
fn a_registry_that_went_back_in_time_learns_it_from_the_holder() {
    let (mut reg, mut z) = registry_in_use();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    let before = reg.snapshot();
    run(&mut [&mut a, &mut z], &mut reg, T0, T0 + 1_000, &[0, 1]);
    let incarnation = a.holder.incarnation.clone();
    reg.forget(before, false);
    a.holder.last_renew_mono = None;
    run(
        &mut [&mut a, &mut b, &mut z],
        &mut reg,
        T0 + 1_000,
        T0 + 30_000,
        &[0],
    );
    assert_disjoint(&[&a, &b]);
    assert_ne!(
        a.holder.incarnation, incarnation,
        "the rollback started an incarnation"
    );
}

/// The same fault when the holder was away (not renewing) while the
/// registry forgot: the fence still keeps the block from the other
/// server until the holder's lease ran out, and its mark high.
#[test]
fn a_forgetting_registry_fences_even_when_the_holder_is_away() {
    let (mut reg, mut z) = registry_in_use();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    let before = reg.snapshot();
    run(&mut [&mut a, &mut z], &mut reg, T0, T0 + 1_000, &[0, 1]);
    a.connected = false;
    reg.forget(before, true);
    run(
        &mut [&mut b, &mut a, &mut z],
        &mut reg,
        T0 + 1_000,
        T0 + 30_000,
        &[0],
    );
    assert!(
        b.host.active.contains_key(&0),
        "b gets the block after the fence"
    );
    assert_disjoint(&[&a, &b]);
}

/// The extension dropped and created again, or its table emptied, while
/// holders' sessions are live: fenced too.
#[test]
fn a_recreated_registry_with_live_holders_fences() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    // DROP EXTENSION and CREATE EXTENSION while a's session holds its
    // block's lock.
    reg.store.create_extension(T0 + 1_000);
    run(
        &mut [&mut b, &mut a],
        &mut reg,
        T0 + 1_000,
        T0 + 30_000,
        &[0],
    );
    assert_disjoint(&[&a, &b]);
}

/// A snapshot restored in place while its only holder is away (no
/// session, no call): nothing tells the registry, and the same run
/// overlaps (outside the assumptions: docs/design/limitations.md). The
/// tests above can fail.
#[test]
fn without_fencing_the_same_fault_overlaps() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    let before = reg.snapshot();
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    reg.forget(before, false);
    // A restore in place restarts the registry (with no restart, its row's
    // count going back tells).
    reg.store.postmaster_start_ms = T0 + 1_000;
    a.connected = false;
    run(
        &mut [&mut b, &mut a],
        &mut reg,
        T0 + 1_000,
        T0 + 5_000,
        &[0],
    );
    let result = std::panic::catch_unwind(|| assert_disjoint(&[&a, &b]));
    assert!(
        result.is_err(),
        "a forgetting registry without fencing must overlap"
    );
}

/// A registry that went back in time and does not know it answers with a
/// WAL position below one the holder saw: nothing in that reply is used.
#[test]
fn a_reply_from_the_past_is_not_used() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    let high = a.host.active[&0].1;
    let stale = Reply {
        head: ReplyHead {
            incarnation: a.holder.incarnation.clone(),
            lsn: format_lsn(1),
            ..ReplyHead::default()
        },
        blocks: vec![BlockFloor {
            block: 0,
            floor_ms: 0,
        }],
    };
    reg.replay = Some(stale);
    a.holder.last_renew_mono = None;
    a.step(T0 + 1_100, &mut reg, &[0]);
    assert!(a
        .holder
        .events
        .iter()
        .any(|e| matches!(e, Event::Rollback { .. })));
    assert_eq!(a.host.active[&0].1, high, "the stale reply raised no mark");
}

/// A stalled registry: the holder stops at its deadline and never uses a
/// mark it was not confirmed.
#[test]
fn a_stalled_registry_stops_the_holder_at_its_deadline() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    let high = a.host.used.iter().map(|u| u.2).max().unwrap_or(0);
    reg.stalled = true;
    run(&mut [&mut a], &mut reg, T0 + 1_000, T0 + 10_000, &[0]);
    assert!(a.host.active.is_empty());
    assert_eq!(a.host.used.iter().map(|u| u.2).max().unwrap_or(0), high);
}

/// Every call is bounded by the earliest deadline of the blocks in use:
/// a renewal to a stalled registry gives up at the deadline, not after the
/// call timeout, and the block is revoked then (the glue's
/// `expire_due`). A lease (and its durability check) is bounded by the
/// deadline of the grant it asks for, also while nothing is in use: a
/// late answer would hand sessions a block past its deadline (found by
/// review: a lease answered 2.8 s after its own deadline was activated).
#[test]
fn every_call_is_bounded_by_the_deadline_of_the_blocks_in_use() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    a.step(T0, &mut reg, &[0]);
    assert!(a.host.active.contains_key(&0));
    assert!(!reg.bounds.is_empty());
    let deadline = a.holder.held[0].deadline_mono_ms;
    assert_eq!(deadline, LEASE);
    assert!(
        reg.bounds.iter().all(|b| *b == Some(LEASE)),
        "{:?}",
        reg.bounds
    );
    // The next renewal, and its durability check, end by the deadline.
    reg.bounds.clear();
    a.step(T0 + 600, &mut reg, &[0]);
    assert_eq!(reg.bounds, vec![Some(deadline); 2]);
    let deadline = a.holder.held[0].deadline_mono_ms;
    assert_eq!(deadline, 600 + LEASE);
    // Stalled right after that renewal: the next one fails (at the
    // deadline at the latest), the block stays in use until its deadline
    // and is revoked at it.
    reg.stalled = true;
    reg.bounds.clear();
    let stuck = a.holder.step(
        Now {
            mono_ms: 1_200,
            wall_ms: T0 + 1_200,
            timing: Timing::new(LEASE),
            max_drift_ms: DRIFT,
            max_blocks: 64,
            replication: Replication::Auto,
        },
        &a.usage(),
        &[0],
        Some(&mut reg),
        &mut a.host,
    );
    assert!(matches!(stuck.error, Some(CallError::NoAnswer { .. })));
    assert_eq!(reg.bounds, vec![Some(deadline)]);
    a.holder.expire_due(deadline - 1, &mut a.host);
    assert!(a.host.active.contains_key(&0));
    a.holder.expire_due(deadline, &mut a.host);
    assert!(a.host.active.is_empty(), "revoked at the deadline");
    assert!(a.holder.held.is_empty());
    assert!(a.holder.events.contains(&Event::Expired { block: 0 }));
    // Nothing in use: the next lease is bounded by its own grant's
    // deadline alone.
    reg.stalled = false;
    reg.bounds.clear();
    a.step(T0 + deadline + 300, &mut reg, &[0]);
    assert_eq!(reg.bounds.first(), Some(&Some(deadline + 300 + LEASE)));
}

/// A reply that names a block not asked for is not used for it.
#[test]
fn a_lying_reply_gives_no_block_that_was_not_asked_for() {
    let mut reg = MemRegistry::new();
    reg.extra_block = Some(3);
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 3_000, &[0]);
    assert!(a.host.active.contains_key(&0));
    assert!(!a.host.active.contains_key(&3));
}

/// Saved blocks after a restart: used once confirmed while the registry
/// answers; while it does not, only when trusted; from a backup, only
/// above the registry's mark.
#[test]
fn saved_blocks_wait_for_confirmation_unless_trusted() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    let saved = a.holder.held[0];
    // What the lease file saved of the registry seen.
    let seen = a.holder.seen();
    let leased_in = reg.session_id("node-a");
    let restarted = |trust: bool, backup: bool| {
        let mut s = Server::new("a", 0);
        s.holder.resume(&seen, backup);
        s.holder
            .add_saved(0, saved.floor_ms, saved.high_ms, saved.deadline_mono_ms);
        s.holder.trust_saved = trust;
        s
    };
    // Registry down, not trusted: nothing used.
    let mut r = restarted(false, false);
    r.connected = false;
    r.step(T0 + 1_100, &mut reg, &[0]);
    assert!(r.host.active.is_empty());
    // Registry down, trusted (same data directory): used.
    let mut r = restarted(true, false);
    r.connected = false;
    r.step(T0 + 1_100, &mut reg, &[0]);
    assert!(r.host.active.contains_key(&0));
    // Registry up, in a new session that names the one the block was
    // leased in (the holder reconnected): the first step confirms, the
    // next uses.
    let mut r = restarted(false, false);
    r.holder.set_previous_session(leased_in);
    r.step(T0 + 1_100, &mut reg, &[0]);
    r.step(T0 + 1_200, &mut reg, &[0]);
    assert_eq!(r.host.active.get(&0).map(|a| a.0), Some(saved.floor_ms));
    // Restarted (a new session that names none): another session of the
    // node gets the block only as a new lease once free, so the renewal
    // drops it and nothing is used.
    reg.end_session("node-a");
    let mut r = restarted(false, false);
    r.step(T0 + 1_300, &mut reg, &[0]);
    r.step(T0 + 1_400, &mut reg, &[0]);
    assert!(r.holder.events.contains(&Event::Lost { block: 0 }));
    assert!(r.host.active.is_empty());
    // From a backup: the same, and a block it holds again is used only
    // above the registry's mark.
    reg.end_session("node-a");
    let mut r = restarted(false, true);
    run(&mut [&mut r], &mut reg, T0 + 1_500, T0 + 30_000, &[0]);
    assert!(!r.host.used.is_empty(), "leased anew once free");
    assert!(
        r.host.used.iter().all(|u| u.1 >= saved.high_ms),
        "{:?}",
        r.host.used
    );
}

/// A backup restored in place whose block was given back and leased to
/// another server: with the registry up, the restored server loses it at
/// the first renewal and never used it.
#[test]
fn a_restored_backup_never_uses_a_block_that_moved_on() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    let mut c = Server::new("c", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    let saved = a.holder.held[0];
    let inc = a.holder.incarnation.clone();
    a.connected = false;
    run(
        &mut [&mut c, &mut a],
        &mut reg,
        T0 + 1_000,
        T0 + 20_000,
        &[0],
    );
    assert!(c.host.active.contains_key(&0));
    let mut restored = Server::new("a", 0);
    restored.holder.incarnation = inc;
    restored.holder.from_backup = true;
    restored
        .holder
        .add_saved(0, saved.floor_ms, saved.high_ms, 20_000 + LEASE);
    run(
        &mut [&mut restored, &mut c],
        &mut reg,
        T0 + 20_000,
        T0 + 25_000,
        &[0],
    );
    assert!(restored.host.used.is_empty(), "{:?}", restored.host.used);
    assert_disjoint(&[&a, &c]);
}

#[test]
fn wal_positions_round_trip() {
    assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
    assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
    assert_eq!(parse_lsn("0/0"), Some(0));
    assert_eq!(parse_lsn("x"), None);
    assert_eq!(parse_lsn("1/FFFFFFFFF"), None);
}

#[test]
fn replies_parse_from_the_registrys_json() {
    let r: Reply = serde_json::from_str(
        r#"{"incarnation":"a","lsn":"0/10","fenced_until_ms":null,"blocks":[{"block":3,"floor_ms":7}]}"#,
    )
    .expect("valid reply");
    assert_eq!(
        r.blocks,
        vec![BlockFloor {
            block: 3,
            floor_ms: 7
        }]
    );
}

// ---------------------------------------------------------------------
// Found in review: when a holder's first call to a new (fenced)
// incarnation is an acquire (a busy holder between renewals), it adopted the
// new incarnation, so its next renewal was no re-assertion and the block the
// registry forgot was dropped (an outage for the whole fence). The holder
// now presents the older incarnation in that renewal.
#[test]
fn a_new_incarnation_first_seen_by_an_acquire_is_reasserted_by_the_next_renewal() {
    let (mut reg, mut z) = registry_in_use();
    let mut a = Server::new("a", 0);
    let before = reg.snapshot();
    run(&mut [&mut a, &mut z], &mut reg, T0, T0 + 1_000, &[0]);
    assert!(a.host.active.contains_key(&0));
    a.host.busy.push(0); // every id busy: it wants another block
    reg.forget(before, true);
    // Its renewal is not due yet: the acquire is its first call.
    a.holder.last_renew_mono = Some(1_050);
    a.step(T0 + 1_100, &mut reg, &[0]);
    a.step(T0 + 1_200, &mut reg, &[0]);
    assert!(
        a.host.active.contains_key(&0),
        "the block was not re-asserted: {:?}",
        a.holder.events
    );
}

// ------------------------------------------- grants durable on standbys

/// Issue 30's first run: a renewal whose wait for the synchronous standby
/// was cancelled returned as committed; the holder (now with a 60 s lease,
/// which only that lost renewal carried) used it; the standby was
/// promoted, fenced only for the 6 s lease it knew, and leased the block
/// to another server while the first still used it.
fn stalled_standby_then_promotion(trust_commits: bool) -> (Server, Server, MemRegistry) {
    let mut reg = MemRegistry::replicated("FIRST 1 (s0)", 1).with_limits(60_000);
    reg.trust_commits = trust_commits;
    let mut a = Server::new("a", 0);
    let mut b = Server::new("b", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    assert!(
        a.host.active.contains_key(&0),
        "a leases while the standby streams"
    );
    // The standby stops answering; a's lease time is raised to 60 s.
    // (Its next renewal, at about T0 + 5.6 s, asks for 60 s.)
    reg.standbys[0].stalled = true;
    a.lease_ms = 60_000;
    run(&mut [&mut a], &mut reg, T0 + 1_000, T0 + 8_000, &[0]);
    // The synchronous standby is promoted: it has only what it flushed;
    // a cannot reach it (it keeps what it has until its deadline).
    reg.promote(0);
    a.connected = false;
    // The fence after the promotion lasts the limits' lease and grace.
    run(
        &mut [&mut a, &mut b],
        &mut reg,
        T0 + 8_000,
        T0 + 100_000,
        &[0],
    );
    (a, b, reg)
}

#[test]
fn a_grant_only_committed_locally_is_not_used_and_a_promotion_loses_nothing() {
    let (a, b, _) = stalled_standby_then_promotion(false);
    assert!(
        a.holder.events.iter().any(|e| matches!(
            e,
            Event::NotDurable {
                what: "renewal",
                ..
            }
        )),
        "{:?}",
        a.holder.events
    );
    assert!(
        b.host.active.contains_key(&0),
        "b leases the block after the fence"
    );
    assert_disjoint(&[&a, &b]);
}

/// The same run with a holder that trusts any COMMIT that returned (as
/// before 0.7.0): the grant it used never reached the standby, but the
/// promoted registry, with no proof that it has every durable grant,
/// fences from its limits, which cover that 60 s lease: still apart. (The
/// simulation's mutation proof shows such a holder duplicating where a
/// promotion skips the fence.)
#[test]
fn a_holder_that_trusted_a_commit_is_kept_apart_by_the_fence_from_the_limits() {
    let (a, b, _) = stalled_standby_then_promotion(true);
    assert!(
        !a.holder
            .events
            .iter()
            .any(|e| matches!(e, Event::NotDurable { .. })),
        "it trusted the commit"
    );
    assert!(b.host.active.contains_key(&0));
    assert_disjoint(&[&a, &b]);
}

/// Split brain: the old primary, cut off from its standby after the
/// promotion, goes on answering one holder. Nothing it grants is durable,
/// so that holder never uses a block; the other, on the new primary, does.
#[test]
fn an_old_primary_cut_off_from_its_standby_grants_nothing_usable() {
    let mut old = MemRegistry::replicated("FIRST 1 (s0)", 1);
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut old, T0, T0 + 500, &[1]);
    let mut new = old.promoted(0).with_test_limits();
    old.standbys[0].stalled = true;
    let mut x = Server::new("x", 0);
    let mut y = Server::new("y", 0);
    let mut t = T0 + 500;
    while t < T0 + 30_000 {
        x.step(t, &mut old, &[0]);
        y.step(t, &mut new, &[0]);
        t += 100;
    }
    assert!(x.host.used.is_empty(), "x used {:?}", x.host.used);
    assert!(!x.holder.pending.is_empty() || x.holder.held.is_empty());
    assert!(y.host.active.contains_key(&0));
    assert_disjoint(&[&x, &y]);
}

/// `ANY 1 (s1, s2)` with one stalled: the other has every grant. `ANY 2`
/// of three with one stalled: durable; with two stalled: not.
#[test]
fn a_quorum_of_standbys_makes_a_grant_durable() {
    for (sync, n, stalled, usable) in [
        ("ANY 1 (s0, s1)", 2, 1, true),
        ("ANY 2 (s0, s1, s2)", 3, 1, true),
        ("ANY 2 (s0, s1, s2)", 3, 2, false),
        ("FIRST 1 (s0)", 1, 0, true),
        ("FIRST 2 (s0, s1)", 2, 1, false),
    ] {
        let mut reg = MemRegistry::replicated(sync, n);
        for s in reg.standbys.iter_mut().take(stalled) {
            s.stalled = true;
        }
        let mut a = Server::new("a", 0);
        run(&mut [&mut a], &mut reg, T0, T0 + 2_000, &[0]);
        assert_eq!(
            a.host.active.contains_key(&0),
            usable,
            "{sync:?} with {stalled} of {n} stalled"
        );
        assert_eq!(a.holder.pending.is_empty(), usable, "{sync:?}");
    }
}

/// A lease granted while the standby stalled waits in `pending`; once
/// the standby streams again, the next renewal confirms and uses it.
#[test]
fn a_pending_lease_is_used_once_a_renewal_is_durable() {
    let mut reg = MemRegistry::replicated("FIRST 1 (s0)", 1);
    reg.standbys[0].stalled = true;
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0]);
    assert!(a.host.used.is_empty());
    assert_eq!(a.holder.pending.len(), 1);
    assert!(a.holder.not_durable);
    reg.standbys[0].stalled = false;
    run(&mut [&mut a], &mut reg, T0 + 1_000, T0 + 2_000, &[0]);
    assert!(a.holder.pending.is_empty());
    assert!(a.host.active.contains_key(&0));
    assert!(a.holder.events.contains(&Event::DurableAgain));
}

/// `lease_replication = synchronous`: a registry with no synchronous
/// standby grants nothing this server uses; `auto` takes its local flush.
#[test]
fn synchronous_replication_required_refuses_a_registry_without_standbys() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    a.replication = Replication::Synchronous;
    run(&mut [&mut a], &mut reg, T0, T0 + 2_000, &[0]);
    assert!(a.host.used.is_empty());
    assert!(a.holder.events.iter().any(|e| matches!(
        e,
        Event::NotDurable {
            required: Replication::Synchronous,
            ..
        }
    )));
    let mut reg = MemRegistry::new();
    let mut b = Server::new("b", 0);
    run(&mut [&mut b], &mut reg, T0, T0 + 2_000, &[0]);
    assert!(b.host.active.contains_key(&0));
    assert!(b.holder.events.contains(&Event::DurabilityMode {
        mode: DurabilityMode::Local
    }));
}

/// A durability check that fails after a lease leaves the blocks pending
/// (renewed, not stranded until their expiry), and unused; once the check
/// works they are used.
#[test]
fn a_failed_durability_check_keeps_the_leased_blocks_pending() {
    let mut reg = MemRegistry::replicated("FIRST 1 (s0)", 1);
    reg.durable_refused = true;
    let mut a = Server::new("a", 0);
    run(&mut [&mut a], &mut reg, T0, T0 + 1_000, &[0, 1]);
    assert!(a.host.used.is_empty());
    assert_eq!(a.holder.pending.len(), 1, "one lease, not one per round");
    assert!(a
        .holder
        .events
        .contains(&Event::Refused("permission denied".into())));
    reg.durable_refused = false;
    run(&mut [&mut a], &mut reg, T0 + 1_000, T0 + 2_000, &[0, 1]);
    assert!(a.holder.pending.is_empty());
    assert_eq!(a.host.active.len(), 1);
}

/// What each failed call means to the glue: whether the registry
/// answered, and whether the session is dropped.
#[test]
fn call_errors_say_what_happened() {
    let refused =
        |code: &str| CallError::from_registry(Some(code.into()), format!("error {code}"), None);
    let no_answer = |end| CallError::NoAnswer {
        end,
        text: String::new(),
    };
    // (error, is a registry timeout, answered, drops the session)
    let table = [
        (refused("57014"), true, false, false),
        (refused("55P03"), true, false, false),
        (refused("54000"), false, true, false),
        (refused("22023"), false, true, false),
        (refused("42501"), false, true, false),
        (refused("42883"), false, false, true),
        (refused("3F000"), false, false, true),
        (CallError::unusable("answered nothing"), false, true, false),
        (
            no_answer(crate::lease::CallEnd::Timeout),
            false,
            false,
            true,
        ),
        (
            no_answer(crate::lease::CallEnd::LeaseDeadline),
            false,
            false,
            true,
        ),
        (
            CallError::Lost("connection lost".into()),
            false,
            false,
            true,
        ),
    ];
    for (e, timeout, answered, drops) in table {
        assert_eq!(
            matches!(e, CallError::RegistryTimeout { .. }),
            timeout,
            "{e:?}"
        );
        assert_eq!(e.answered(), answered, "{e:?}");
        assert_eq!(e.drops_session(), drops, "{e:?}");
    }
    let CallError::Refused(r) = CallError::from_registry(
        Some("54000".into()),
        "beyond the limits".into(),
        Some("lower lease_time".into()),
    ) else {
        panic!("a refusal");
    };
    assert_eq!(r.sqlstate.as_deref(), Some("54000"));
    assert_eq!(r.hint.as_deref(), Some("lower lease_time"));
}

/// A round reports whether the registry answered any call, also when a
/// later call of the round failed, and not when its only call timed out
/// at the registry.
#[test]
fn a_round_says_whether_the_registry_answered() {
    let mut reg = MemRegistry::new();
    let mut a = Server::new("a", 0);
    reg.at(T0, "node-a", true);
    a.host.busy.push(0);
    let now = |t: i64| Now {
        mono_ms: t - T0,
        wall_ms: t,
        timing: Timing::new(LEASE),
        max_drift_ms: DRIFT,
        max_blocks: 64,
        replication: Replication::Auto,
    };
    reg.now = T0;
    let usage = a.usage();
    let round = a
        .holder
        .step(now(T0), &usage, &[0], Some(&mut reg), &mut a.host);
    assert_eq!(
        round,
        Round {
            answered: true,
            error: None
        }
    );
    reg.stalled = true;
    reg.now = T0 + 5_000;
    let usage = a.usage();
    let round = a
        .holder
        .step(now(T0 + 5_000), &usage, &[0], Some(&mut reg), &mut a.host);
    assert!(!round.answered);
    assert!(round.error.is_some_and(|e| e.drops_session()));
    let round = a
        .holder
        .step(now(T0 + 5_100), &usage, &[0], None, &mut a.host);
    assert_eq!(round, Round::default());
}

fn test_now(t: i64) -> Now {
    Now {
        mono_ms: t - T0,
        wall_ms: t,
        timing: Timing::new(LEASE),
        max_drift_ms: DRIFT,
        max_blocks: 64,
        replication: Replication::Auto,
    }
}

fn reply(incarnation: &str, lsn: &str, blocks: &[(u32, i64)]) -> Reply {
    Reply {
        head: ReplyHead {
            incarnation: incarnation.into(),
            lsn: lsn.into(),
            ..ReplyHead::default()
        },
        blocks: blocks
            .iter()
            .map(|&(block, floor_ms)| BlockFloor { block, floor_ms })
            .collect(),
    }
}

/// The pure steps of a lease and a renewal, without a registry: a lease
/// that is not durable leaves its blocks pending and unused; a durable one
/// uses them; a renewal's reply gives up what it does not keep at once,
/// and its durable step raises the marks of what it keeps.
#[test]
fn a_lease_and_a_renewal_apply_their_replies_in_steps() {
    let mut a = Server::new("a", 0);
    let now = test_now(T0);
    let (req, grant) = a.holder.acquire_request(2, &[0, 1], &now);
    assert_eq!((req.want, req.allowed.len()), (2, 2));
    let lease = reply("i1", "0/10", &[(0, T0 - 10), (1, T0 - 10), (5, T0)]);
    assert!(a.holder.apply_lease_reply(&lease));
    a.holder
        .apply_lease(&lease.blocks, &[0, 1], false, grant, &now, &mut a.host);
    assert!(a.holder.held.is_empty() && a.host.active.is_empty());
    assert_eq!(a.holder.pending.len(), 2, "block 5 was not asked for");
    a.holder
        .apply_lease(&lease.blocks, &[0, 1], true, grant, &now, &mut a.host);
    assert_eq!(a.host.active.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(a.host.stops[&0], T0 + LEASE);
    // A renewal a second later that keeps block 0 only.
    a.holder.pending.clear();
    let later = test_now(T0 + 1_000);
    let (req, grant) = a.holder.renew_request(&later);
    assert_eq!(req.blocks.len(), 2);
    let renewal = reply("i1", "0/20", &[(0, T0 - 10)]);
    let kept = a
        .holder
        .apply_renewal_reply(&renewal, &mut a.host)
        .expect("usable");
    assert!(!a.host.active.contains_key(&1), "lost before durability");
    a.holder
        .apply_durable_renewal(&kept, grant, &later, &mut a.host);
    assert_eq!(a.host.active[&0].1, grant.high_ms);
    assert_eq!(a.host.stops[&0], T0 + 1_000 + LEASE);
    // A reply from below the position seen is not used.
    assert!(a
        .holder
        .apply_renewal_reply(&reply("i1", "0/15", &[]), &mut a.host)
        .is_none());
    assert!(a.host.active.contains_key(&0));
}

/// An answer that came at or after a lease deadline is no answer, what
/// ever it said; one within the call timeout alone is used.
#[test]
fn a_late_answer_settles_as_no_answer() {
    use crate::lease::{CallEnd, CallLimit};
    let by_deadline = CallLimit::new(0, 10_000, Some(3_000));
    let by_timeout = CallLimit::new(0, 10_000, None);
    let refused = || CallError::unusable("no");
    // (limit, answered at, the answer, None: used; Some(no answer?))
    type Row<'a> = (&'a CallLimit, i64, Result<u8, CallError>, Option<bool>);
    let table: [Row; 5] = [
        (&by_deadline, 2_999, Ok(1), None),
        (&by_deadline, 3_000, Ok(1), Some(true)),
        (&by_deadline, 3_500, Err(refused()), Some(true)),
        (&by_deadline, 2_000, Err(refused()), Some(false)),
        (&by_timeout, 12_000, Ok(1), None),
    ];
    for (limit, at, answer, error_is_no_answer) in table {
        let settled = settle(limit, at, answer);
        match (error_is_no_answer, &settled) {
            (None, Ok(_)) => {}
            (Some(true), Err(CallError::NoAnswer { end, .. })) => {
                assert_eq!(*end, CallEnd::LeaseDeadline);
            }
            (Some(false), Err(CallError::Refused(_))) => {}
            _ => panic!("{at}: {settled:?}"),
        }
    }
}
