//! Fleet leases, the pure rules: block geometry, what a renewal grants,
//! when a holder must stop, and which blocks to lease or give back. No
//! PostgreSQL calls; `lease_worker` is the glue, `leases.sql` the registry.
//!
//! # Why IDs never repeat across a hand-over
//!
//! A block of worker ids is leased by one holder (a data directory) at a
//! time, from the registry server. Every lease row carries a *mark*: the
//! highest ID time any holder of the block may have issued.
//!
//! 1. A holder makes an ID from a block only when the ID's time is at or
//!    below a mark the registry has already *committed* for that block
//!    (the holder asks for the new mark in a renewal and raises its local
//!    bound only once the registry confirmed it). The bound is checked on
//!    every ID against the ID's own time, not against any clock.
//! 2. The registry only raises a block's mark while the block stays with
//!    the same holder (`greatest(...)`); a holder that gives a block back
//!    lowers it to the newest ID time it actually issued there, after it
//!    stopped issuing from it, and never below the floor the registry
//!    recorded when it leased the block (`floor_ms`, so not even a forged
//!    release can undo rule 3).
//! 3. Whoever leases the block next starts every generator of it above the
//!    mark it read when it took the block (`floor`).
//!
//! So the old holder's IDs are at or below the mark and the new holder's
//! are above it: disjoint, whatever the two servers' clocks say, even when
//! they disagree by more than the lease time, and even when the old holder
//! never learns that it lost the block. Clocks only decide *when* things
//! happen: the holder asks for a mark of `deadline + max_drift` (its own
//! wall clock when the renewal was sent, plus the lease time, plus the
//! drift its generators may borrow) and stops using the block at its
//! deadline by its own monotonic clock, measured from the moment the
//! renewal was sent (no call to the registry waits past it, so a stalled
//! registry cannot hold the lease worker away from revoking the block:
//! [`CallLimit`]); the registry hands a block over only after the
//! expiry plus a grace period by its own clock, which, with sane clock
//! *rates*, is after the old holder stopped. The one assumption is about
//! rates; an offset between clocks only makes a new holder start further
//! ahead (it waits until the floor is within `max_drift` of its clock
//! before it uses the block, see [`Plan::activate`]).
//!
//! # What the registry must not forget, and what happens when it does
//!
//! Rules 2 and 3 assume the registry never forgets a mark it confirmed.
//! That is made true where it can be and detected where it cannot
//! (`leases.sql`, `holder`, docs/design/fleet-fencing.md):
//!
//! - A grant is durable before the holder uses it: the holder's session
//!   commits synchronously (`synchronous_commit = on`), and the registry
//!   refuses a session that does not. With synchronous standbys, a commit
//!   that returned is not enough (a cancelled wait for the standby returns
//!   with a warning only): the holder uses a grant only once the registry
//!   says, after the commit, that it is flushed on enough synchronous
//!   standbys to satisfy `synchronous_standby_names` (`holder`, "What the
//!   holder trusts"). So a failover to a synchronous standby keeps every
//!   grant in use, and an old primary cut off from its standby grants
//!   nothing usable.
//! - Every way a registry can still lose committed rows is detected and
//!   starts a new *incarnation*: a new WAL timeline (promotion, PITR, a
//!   restored base backup), a WAL position below one a holder saw (a
//!   snapshot restored without recovery), the incarnation row gone (the
//!   lease table emptied, the extension made again, a pg_dump restore),
//!   a restart with `fsync` off.
//! - The registry refuses every request beyond the fleet's limits
//!   (`snowflake_lease_limits`: the longest lease time and grace, how far a
//!   mark may lead its clock, blocks per node), so every grant it ever
//!   confirmed is within them; a holder's settings must fit them.
//! - A new incarnation with any sign of holders (leased rows, live block
//!   locks, a timeline change or a rollback, a holder that knew the older
//!   incarnation) is *fenced*: no block is leased anew for the limits'
//!   longest lease time plus grace, by which time every grant it may have
//!   forgotten has run out at its holder (rule: clock *rates*); and every
//!   block's mark, and the mark of every row made later, is raised to the
//!   registry's clock plus the limits' largest lead of a mark over it,
//!   plus grace. A forgotten mark was granted within that lead before the
//!   fence began, so it is below that, as long as no holder's clock moved
//!   further ahead of the registry's by more than the grace since: this is
//!   the one place where clock offsets matter, and only after the registry
//!   lost data. The fence rests on the limits, not on what the registry
//!   saw of requests, which it may have lost with the grants.
//! - A promotion that provably kept every durable grant is not fenced
//!   (0.7.0). The registry keeps *failover candidates*
//!   (`snowflake_lease_standbys`, by application name): synchronous
//!   standbys that flushed every grant reported durable since they were
//!   added, each a candidate until `valid_until` (about 30 s ahead, moved
//!   on while all keep up). A grant is reported durable only once every
//!   candidate has flushed it too; a candidate that is gone or behind is
//!   dropped only 15 s (a margin for the registry servers' clocks) after
//!   the `valid_until` of the newest row, and until then nothing is
//!   reported durable. A standby promoted from timeline T, named
//!   (`snowflake_id.registry_standby_name`) in the last candidates' row it
//!   received (written on T), before that row's `valid_until`, with a
//!   timeline history that says a promotion ended recovery (not a
//!   recovery target), therefore has every grant any holder used: had its
//!   old primary reported one durable without it, it would have dropped
//!   it first, after a `valid_until` at least as late as the one the
//!   standby read, plus the margin. Its new incarnation continues the old
//!   one (`previous_incarnation`: holders of it are not evidence).
//!   Anything less (no name, an expired row, a point-in-time recovery, the
//!   history unreadable, `fsync` off) fences as above. The name is read
//!   from the server's configuration files, never from a session; a name
//!   stands for a candidate only while exactly one physical WAL sender uses
//!   it. Not covered: two servers given one name (a `pg_basebackup` copy of
//!   a candidate keeps its `postgresql.auto.conf`), and an old primary that
//!   keeps running with a second candidate after the promotion of the
//!   first (split brain), which drops the promoted one after the margin and
//!   grants on.
//! - During the fence, holders that knew the older incarnation re-assert
//!   their blocks with their marks and keep them.
//! - Not covered: an old primary that goes on granting after a standby was
//!   promoted when the registry names no synchronous standby (its own
//!   flush makes a grant durable: fence the old primary, as any failover
//!   must), and a snapshot restored in place over a registry whose WAL has since
//!   passed every position its holders saw before any of them calls.

use crate::ranges::WorkerRanges;

/// A layout as holders and the registry compare it between servers (the
/// `layout` of a lease request, and of the registry's block rows).
pub fn layout_text(layout: &crate::layout::Layout) -> String {
    format!(
        "{} total bits, {} worker bits, {} sequence bits, {} ms per tick, epoch {}",
        layout.total_bits,
        layout.worker_bits,
        layout.sequence_bits,
        layout.unit_ms,
        crate::layout::format_unix_ms(layout.epoch_ms)
    )
}

/// How many blocks a layout's worker ids are cut into (at most).
pub const BLOCKS_PER_LAYOUT: u32 = 64;

/// Ids per block for a layout whose largest worker id is `max_worker_id`.
pub fn block_size(max_worker_id: u32) -> u32 {
    let ids = u64::from(max_worker_id) + 1;
    (ids / u64::from(BLOCKS_PER_LAYOUT)).max(1) as u32
}

/// The block of a worker id.
pub fn block_of(worker_id: u32, size: u32) -> u32 {
    worker_id / size
}

/// The worker ids of `block` (inclusive).
pub fn block_ids(block: u32, size: u32, max_worker_id: u32) -> (u32, u32) {
    let first = block.saturating_mul(size);
    (first, first.saturating_add(size - 1).min(max_worker_id))
}

/// The blocks holding at least one id of `ranges`, in increasing order.
pub fn allowed_blocks(ranges: &WorkerRanges, size: u32) -> Vec<u32> {
    let mut blocks: Vec<u32> = ranges.iter().map(|id| block_of(id, size)).collect();
    blocks.dedup();
    blocks
}

/// The time settings of leases, all in ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a lease lasts after a renewal is sent.
    pub lease_ms: i64,
    /// How often the holder renews.
    pub renew_every_ms: i64,
    /// How long after the expiry (registry clock) a block may go to another.
    pub grace_ms: i64,
    /// How long a block's ids must all have been free before it is given back.
    pub idle_ms: i64,
}

impl Timing {
    pub fn new(lease_ms: i64) -> Timing {
        Timing {
            lease_ms,
            renew_every_ms: (lease_ms / 10).clamp(100, 5_000),
            grace_ms: (lease_ms / 5).max(1_000),
            idle_ms: (lease_ms / 2).max(10_000),
        }
    }
}

/// What a renewal (or lease) sent at these clock readings grants once the
/// registry confirms it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The holder's monotonic ms after which it must not use the block.
    pub deadline_mono_ms: i64,
    /// The mark asked for: the highest ID time (Unix ms) it may issue.
    pub high_ms: i64,
}

pub fn grant(sent_mono_ms: i64, sent_wall_ms: i64, timing: &Timing, max_drift_ms: i64) -> Grant {
    Grant {
        deadline_mono_ms: sent_mono_ms.saturating_add(timing.lease_ms),
        high_ms: sent_wall_ms
            .saturating_add(timing.lease_ms)
            .saturating_add(max_drift_ms),
    }
}

/// When sessions stop using a block whose deadline is `deadline_mono_ms`:
/// that deadline on the wall clock of this server (read at
/// `now_mono_ms`), which its sessions compare with their own reading
/// before each ID. Not the block's mark: that bounds the IDs' times, which
/// run up to `max_drift` ahead of the clock on a block whose floor is
/// ahead (an earlier holder's clock was), and stopping there would leave
/// such a block unused until the clock caught up. For a grant just
/// confirmed this is the mark less `max_drift` ([`grant`]).
pub fn stop_ms(deadline_mono_ms: i64, now_mono_ms: i64, now_wall_ms: i64) -> i64 {
    now_wall_ms.saturating_add(deadline_mono_ms.saturating_sub(now_mono_ms))
}

/// The earliest deadline (monotonic ms) of the blocks sessions may use
/// now (`active`), `None` when none is in use. Every wait on the registry
/// ends by then ([`CallLimit`]): a lease worker stuck in a call cannot
/// revoke a block at its deadline (its sessions stop there by their own
/// clock, [`stop_ms`], but the block is revoked and renewed only here).
pub fn in_use_deadline(held: &[Held]) -> Option<i64> {
    held.iter()
        .filter(|h| h.active)
        .map(|h| h.deadline_mono_ms)
        .min()
}

/// What ends a registry call's wait first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallEnd {
    /// The call timeout (the registry stalled, or the network drops
    /// packets).
    Timeout,
    /// The deadline of a block in use ([`in_use_deadline`]): the lease
    /// worker must be back in its loop to revoke it.
    LeaseDeadline,
}

/// How long one registry call (or connection attempt) may wait, on the
/// lease worker's monotonic clock: until its timeout, or until the
/// earliest deadline of the blocks in use when that comes first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimit {
    /// Monotonic ms at which the wait ends.
    pub until_mono_ms: i64,
    pub end: CallEnd,
}

impl CallLimit {
    /// A call that starts at `started_mono_ms`, with a timeout of
    /// `timeout_ms`, while blocks are in use until `lease_deadline_mono_ms`
    /// ([`in_use_deadline`]).
    pub fn new(
        started_mono_ms: i64,
        timeout_ms: i64,
        lease_deadline_mono_ms: Option<i64>,
    ) -> CallLimit {
        let timeout = started_mono_ms.saturating_add(timeout_ms.max(0));
        match lease_deadline_mono_ms {
            Some(deadline) if deadline <= timeout => CallLimit {
                until_mono_ms: deadline,
                end: CallEnd::LeaseDeadline,
            },
            _ => CallLimit {
                until_mono_ms: timeout,
                end: CallEnd::Timeout,
            },
        }
    }

    /// How long the call may still wait at `now_mono_ms`; 0: give it up.
    pub fn left_ms(&self, now_mono_ms: i64) -> i64 {
        self.until_mono_ms.saturating_sub(now_mono_ms).max(0)
    }

    /// Whether an answer complete at `answered_mono_ms` may be used. Not
    /// one that came at or after a lease deadline: the blocks were due to
    /// stop then (as [`plan`] expires a block at its deadline), so the
    /// worker gives the call up, revokes them, and asks again in a new
    /// session rather than act on an answer it had to stop waiting for.
    pub fn answer_usable(&self, answered_mono_ms: i64) -> bool {
        self.end == CallEnd::Timeout || answered_mono_ms < self.until_mono_ms
    }
}

/// A block this server holds, as the lease worker tracks it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Held {
    pub block: u32,
    /// Every ID of this block must be above this Unix ms (the mark it had
    /// when this server leased it).
    pub floor_ms: i64,
    /// The confirmed mark: no ID of this block above this Unix ms.
    pub high_ms: i64,
    /// Monotonic ms after which the block must not be used.
    pub deadline_mono_ms: i64,
    /// Whether sessions may use it now.
    pub active: bool,
    /// Whether the registry confirmed it since this server started (a
    /// block saved before a restart is not, until a renewal keeps it).
    pub confirmed: bool,
    /// Since when (monotonic ms) none of its ids has had a session.
    pub idle_since_mono_ms: Option<i64>,
}

/// How a block's ids are used right now (from shared memory).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub block: u32,
    /// Ids of the block that this server may use (in `worker_ids`).
    pub ids: u32,
    /// Of those, ids with at least one session.
    pub busy: u32,
}

/// What the lease worker should do now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Blocks past their deadline: stop using them now.
    pub expire: Vec<u32>,
    /// Blocks whose floor is now within `max_drift` of the clock.
    pub activate: Vec<u32>,
    /// Idle blocks to give back.
    pub release: Vec<u32>,
    /// How many more blocks to lease.
    pub acquire: u32,
}

/// Most blocks held while they wait for this server's clock to come within
/// `max_drift` of their marks for longer than a renewal interval.
pub const MAX_FAR_WAITING: usize = 2;

/// Decides the next steps from the held blocks and their usage.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    held: &[Held],
    usage: &[Usage],
    now_mono_ms: i64,
    now_wall_ms: i64,
    timing: &Timing,
    max_drift_ms: i64,
    block_size: u32,
    max_blocks: u32,
) -> Plan {
    let mut plan = Plan::default();
    let use_of = |block: u32| usage.iter().find(|u| u.block == block).copied();
    let low_water = (block_size / 4).max(1);
    let mut free = 0u32;
    // Ids of blocks usable within a renewal interval, and how many blocks
    // wait longer (a mark far ahead of this server's clock: an earlier
    // holder's clock ran ahead). Those are not counted as supply, so the
    // server leases another block instead of failing until its clock gets
    // there; at most [`MAX_FAR_WAITING`] of them, so it does not hoard.
    let mut pending = 0u32;
    let mut far = 0usize;
    let mut live: Vec<&Held> = Vec::new();
    for h in held {
        if now_mono_ms >= h.deadline_mono_ms {
            plan.expire.push(h.block);
            continue;
        }
        let u = use_of(h.block).unwrap_or(Usage {
            block: h.block,
            ids: 0,
            busy: 0,
        });
        if h.active {
            free += u.ids - u.busy.min(u.ids);
            live.push(h);
        } else if !h.confirmed {
            pending += u.ids;
        } else if h.floor_ms.saturating_sub(max_drift_ms) <= now_wall_ms {
            plan.activate.push(h.block);
            free += u.ids;
        } else if h.floor_ms.saturating_sub(max_drift_ms) - now_wall_ms <= timing.renew_every_ms {
            pending += u.ids;
        } else {
            far += 1;
        }
    }
    // At most `max_blocks` (snowflake_id.max_blocks): past that, sessions
    // share ids rather than drain the fleet's blocks.
    if free + pending < low_water
        && far < MAX_FAR_WAITING
        && held.len() - plan.expire.len() < max_blocks as usize
    {
        plan.acquire = 1;
    }
    // Give back idle blocks while enough free ids remain without them.
    // The last block is kept: a server that made IDs will make more.
    let mut kept = live.len() + plan.activate.len();
    for h in live {
        let Some(since) = h.idle_since_mono_ms else {
            continue;
        };
        let ids = use_of(h.block).map_or(0, |u| u.ids);
        if kept > 1
            && now_mono_ms - since >= timing.idle_ms
            && free.saturating_sub(ids) >= low_water
        {
            plan.release.push(h.block);
            free -= ids;
            kept -= 1;
        }
    }
    plan
}

/// The mark to record when giving a block back: the end of the newest
/// tick issued from it, never below the floor it was leased with.
pub fn release_mark(floor_ms: i64, newest_tick_end_ms: Option<i64>) -> i64 {
    newest_tick_end_ms.map_or(floor_ms, |t| t.max(floor_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_795_305_600_000;

    fn held(block: u32, deadline: i64, active: bool, idle: Option<i64>) -> Held {
        Held {
            block,
            floor_ms: T0,
            high_ms: T0 + 700_000,
            deadline_mono_ms: deadline,
            active,
            confirmed: true,
            idle_since_mono_ms: idle,
        }
    }

    #[test]
    fn blocks_cut_the_worker_ids_into_at_most_64() {
        assert_eq!(block_size(1023), 16);
        assert_eq!(block_size(15), 1);
        assert_eq!(block_size(0), 1);
        assert_eq!(block_ids(3, 16, 1023), (48, 63));
        assert_eq!(block_ids(0, 1, 0), (0, 0));
        let ranges = WorkerRanges::parse("0-3,17,40-47", 1023).unwrap();
        assert_eq!(allowed_blocks(&ranges, 16), vec![0, 1, 2]);
        assert_eq!(allowed_blocks(&WorkerRanges::all(1023), 16).len(), 64);
    }

    #[test]
    fn a_grant_is_measured_from_the_moment_the_renewal_was_sent() {
        let t = Timing::new(600_000);
        assert_eq!(t.renew_every_ms, 5_000);
        assert_eq!(t.grace_ms, 120_000);
        let g = grant(50, T0, &t, 60_000);
        assert_eq!(g.deadline_mono_ms, 600_050);
        assert_eq!(g.high_ms, T0 + 660_000);
        let short = Timing::new(4_000);
        assert_eq!(short.renew_every_ms, 400);
        assert_eq!(short.grace_ms, 1_000);
    }

    #[test]
    fn no_block_leases_one_and_a_busy_server_leases_more() {
        let t = Timing::new(600_000);
        let p = plan(&[], &[], 0, T0, &t, 60_000, 16, 64);
        assert_eq!(p.acquire, 1);
        let h = [held(0, 1_000, true, None)];
        // Low water: a quarter of a block free.
        let busy = [Usage {
            block: 0,
            ids: 16,
            busy: 12,
        }];
        assert_eq!(plan(&h, &busy, 0, T0, &t, 60_000, 16, 64).acquire, 0);
        let busier = [Usage {
            block: 0,
            ids: 16,
            busy: 13,
        }];
        assert_eq!(plan(&h, &busier, 0, T0, &t, 60_000, 16, 64).acquire, 1);
    }

    #[test]
    fn a_block_past_its_deadline_is_expired_and_replaced() {
        let t = Timing::new(600_000);
        let h = [held(0, 1_000, true, None)];
        let p = plan(&h, &[], 1_000, T0, &t, 60_000, 16, 64);
        assert_eq!(p.expire, vec![0]);
        assert_eq!(p.acquire, 1);
        let p = plan(&h, &[], 999, T0, &t, 60_000, 16, 64);
        assert!(p.expire.is_empty());
    }

    #[test]
    fn a_block_whose_floor_is_far_ahead_waits_until_within_max_drift() {
        let t = Timing::new(600_000);
        let mut h = held(0, 10_000_000, false, None);
        h.floor_ms = T0 + 90_000;
        let u = [Usage {
            block: 0,
            ids: 16,
            busy: 0,
        }];
        let p = plan(&[h], &u, 0, T0 + 25_000, &t, 60_000, 16, 64);
        assert!(p.activate.is_empty());
        assert_eq!(
            p.acquire, 0,
            "a block usable within a renewal counts as supply"
        );
        let p = plan(&[h], &u, 0, T0 + 30_000, &t, 60_000, 16, 64);
        assert_eq!(p.activate, vec![0]);
    }

    #[test]
    fn a_block_that_waits_longer_than_a_renewal_is_no_supply_but_few_are_held() {
        let t = Timing::new(600_000);
        let mut h = held(0, 10_000_000, false, None);
        h.floor_ms = T0 + 90_000;
        let u = |block| Usage {
            block,
            ids: 16,
            busy: 0,
        };
        // 25 s to wait (max_drift 60 s): another block is leased.
        let p = plan(&[h], &[u(0)], 0, T0 + 5_000, &t, 60_000, 16, 64);
        assert!(p.activate.is_empty());
        assert_eq!(p.acquire, 1);
        // With two such blocks, no third.
        let mut h2 = h;
        h2.block = 1;
        let p = plan(&[h, h2], &[u(0), u(1)], 0, T0 + 5_000, &t, 60_000, 16, 64);
        assert_eq!(p.acquire, 0);
    }

    #[test]
    fn idle_blocks_go_back_but_the_last_one_stays() {
        let t = Timing::new(600_000);
        let u = [
            Usage {
                block: 0,
                ids: 16,
                busy: 0,
            },
            Usage {
                block: 1,
                ids: 16,
                busy: 0,
            },
        ];
        let h = [
            held(0, i64::MAX, true, Some(0)),
            held(1, i64::MAX, true, Some(0)),
        ];
        let early = plan(&h, &u, t.idle_ms - 1, T0, &t, 60_000, 16, 64);
        assert!(early.release.is_empty());
        let late = plan(&h, &u, t.idle_ms, T0, &t, 60_000, 16, 64);
        assert_eq!(late.release, vec![0]);
        assert_eq!(late.acquire, 0);
    }

    #[test]
    fn a_server_leases_no_more_than_max_blocks() {
        let t = Timing::new(600_000);
        let h = [held(0, i64::MAX, true, None), held(1, i64::MAX, true, None)];
        let u = [
            Usage {
                block: 0,
                ids: 16,
                busy: 16,
            },
            Usage {
                block: 1,
                ids: 16,
                busy: 16,
            },
        ];
        assert_eq!(plan(&h, &u, 0, T0, &t, 60_000, 16, 3).acquire, 1);
        assert_eq!(plan(&h, &u, 0, T0, &t, 60_000, 16, 2).acquire, 0);
    }

    #[test]
    fn a_call_waits_no_longer_than_the_earliest_deadline_of_the_blocks_in_use() {
        let mut a = held(0, 6_000, true, None);
        let b = held(1, 5_400, true, None);
        let waiting = held(2, 100, false, None);
        assert_eq!(in_use_deadline(&[a, b, waiting]), Some(5_400));
        assert_eq!(in_use_deadline(&[waiting]), None);
        assert_eq!(in_use_deadline(&[]), None);
        // A renewal sent 600 ms after the last one, on a 6 s lease, with a
        // 10 s call timeout: it waits until the deadline, not 10 s.
        let l = CallLimit::new(600, 10_000, in_use_deadline(&[a]));
        assert_eq!(
            l,
            CallLimit {
                until_mono_ms: 6_000,
                end: CallEnd::LeaseDeadline
            }
        );
        assert_eq!(l.left_ms(600), 5_400);
        assert_eq!(l.left_ms(5_999), 1);
        assert_eq!(l.left_ms(6_000), 0, "given up at the deadline");
        assert_eq!(l.left_ms(9_000), 0);
        // An answer at the deadline is not used: the block expires then.
        assert!(l.answer_usable(5_999));
        assert!(!l.answer_usable(6_000));
        assert!(
            plan(&[a], &[], 6_000, T0, &Timing::new(6_000), 1_000, 16, 64)
                .expire
                .contains(&0)
        );
        // A deadline already past: no wait at all.
        a.deadline_mono_ms = 500;
        let l = CallLimit::new(600, 10_000, in_use_deadline(&[a]));
        assert_eq!(l.left_ms(600), 0);
        assert!(!l.answer_usable(600));
    }

    #[test]
    fn a_call_with_no_block_in_use_or_a_far_deadline_waits_its_timeout() {
        let l = CallLimit::new(1_000, 10_000, None);
        assert_eq!(l.end, CallEnd::Timeout);
        assert_eq!(l.left_ms(1_000), 10_000);
        assert_eq!(l.left_ms(11_000), 0);
        assert!(
            l.answer_usable(11_000),
            "the timeout alone does not void an answer"
        );
        let l = CallLimit::new(1_000, 10_000, Some(600_000));
        assert_eq!(l.end, CallEnd::Timeout);
        assert_eq!(l.until_mono_ms, 11_000);
        // Exactly at the timeout, the deadline wins (it voids late answers).
        let l = CallLimit::new(1_000, 10_000, Some(11_000));
        assert_eq!(l.end, CallEnd::LeaseDeadline);
        // No overflow at the clock's ends.
        let l = CallLimit::new(i64::MAX - 5, 10_000, None);
        assert_eq!(l.until_mono_ms, i64::MAX);
        assert_eq!(
            CallLimit::new(0, 10_000, Some(i64::MIN)).left_ms(i64::MAX),
            0
        );
    }

    #[test]
    fn the_release_mark_never_goes_below_the_floor() {
        assert_eq!(release_mark(T0, None), T0);
        assert_eq!(release_mark(T0, Some(T0 - 5)), T0);
        assert_eq!(release_mark(T0, Some(T0 + 5)), T0 + 5);
    }
}
