//! Backfill: IDs for past times (`snowflake_at(ts)`) that never equal
//! another ID. Pure rules, no PostgreSQL.
//!
//! The reserved space. A server sets aside worker ids that live generators
//! never claim (`snowflake_id.backfill_worker_ids`). A backfill ID is
//! `(tick of ts, one of those worker ids, a sequence)`, so it never equals a
//! live ID of any server whose live ids are disjoint from them, and what is
//! left to prove is that two backfill IDs of the same tick never share the
//! worker id and the sequence.
//!
//! Grants. The layout's time field is cut into [`BUCKETS`] stretches
//! (buckets) of equal length ([`Space::bucket_ticks`]). In each stretch,
//! the set-aside `(worker id, sequence)` pairs are numbered 0, 1, 2...
//! ([`Space::grant_parts`]); a *grant* is one such number: a block of
//! [`Space::per_tick`] consecutive sequences of one set-aside worker id, at
//! every tick of the stretch. Grants are handed out once, in increasing
//! order, by a per-stretch counter that only grows and is made durable
//! before any ID of the grant is returned (the extension keeps it in shared
//! memory, the state file and WAL). In a fleet the counters are the
//! registry's, and a holder's grants come from it
//! ([`crate::registry::backfill`]).
//!
//! Open stretches. A grant belongs to the one backend that took it, which
//! keeps it in its [`Open`] table with how many IDs it made at each tick:
//! the `n`th ID at a tick (from 0) is index `n % per_tick` of the
//! stretch's `n / per_tick`th grant held. Times may come in any order.
//! Hence: two backfill IDs of the same tick and the same grant come from
//! the same backend's table, which counted them apart (the table and the
//! grants it names are given up together, never one without the other);
//! different grants of a stretch are disjoint `(worker id, sequence)` sets.
//! No two backfill IDs are equal.
//!
//! Memory. The table is bounded whatever the input: [`MAX_TICKS`] ticks
//! and [`MAX_GRANTS`] grants, about 18 MiB at most. At either bound the
//! backend gives up every grant it holds (the rest of them is never used)
//! and takes new ones as IDs need them.
//!
//! What it costs. Capacity: the set-aside ids (each `1/2^worker_bits` of the
//! live capacity). A stretch holds [`Space::grants_per_bucket`] grants. A
//! backend takes one grant per stretch it makes IDs in, in any order, one
//! more per `per_tick` IDs it makes at one tick, and again one per
//! stretch after each bound (every `MAX_TICKS` distinct ticks). First
//! grants come in batches of nearby stretches ([`Open::to_take`]): one
//! durable write for up to [`MAX_BATCH`] of them; a batch takes only
//! stretches the backend holds none of, so a backend still takes at most
//! one first grant per stretch between bounds, used or not. It keeps its
//! grants across statements and transactions, so a repeated statement in
//! the same session takes none for its stretches.
//!
//! Refusals take nothing. A session's further grants of a stretch (IDs
//! sharing a tick) stop [`Space::reserve`] short of the stretch's grants,
//! which stay for first grants ([`Space::grant_limit`]): rows on one time
//! that a stretch cannot hold are refused while other sessions can still
//! import into it. A refused stretch takes nothing, not even the nearby
//! stretches of its batch ([`to_hand_out`]).
//!
//! What a failure costs, and why grants are never given back. A statement
//! that fails or is cancelled leaves the grants it took with its backend,
//! whose table still counts the IDs the statement made: the next statement
//! of the session goes on with them. Only when the backend exits are they
//! lost: per failed statement (in a session that then ends) at most the
//! grants it took, one per stretch (reached or taken in a batch) plus one
//! per `per_tick` IDs at one tick (never the stretch's reserve). They are not given back to the server
//! for other backends, because a grant's IDs may be visible although the
//! statement failed: the rows of a rolled-back INSERT are not, but an ID
//! can leave the backend before the failure (the rows a `SELECT
//! snowflake_at(...)` already sent to the client, `COPY ... TO`, `dblink`
//! or `postgres_fdw` writes of another transaction, a `NOTICE`), or be
//! committed by an earlier
//! statement or a released savepoint of the same transaction with the same
//! grant; the backend cannot tell which of these happened. A grant that
//! made no ID (taken in a batch for a stretch the backend never reached)
//! would be safe to give back, but grants are numbered by a counter that
//! only grows: only a stretch's last grant could be given back, by
//! lowering the counter durably (state file) before another backend could
//! take it, while WAL replay, which only raises counters, would lose it
//! again after a crash (safe, never handed out twice). It is not done:
//! such grants cost at most one per stretch per session, the bound above.

use crate::layout::Layout;
use crate::ranges::WorkerRanges;
use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

/// How many buckets the layout's time field is cut into.
pub const BUCKETS: u32 = 16_384;

/// The set-aside worker ids and what the layout makes of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Space {
    ids: WorkerRanges,
    sequence_bits: u32,
    bucket_ticks: i64,
}

impl Space {
    /// The space of `ids` (non-empty, inside the layout) under `layout`.
    pub fn new(layout: &Layout, ids: WorkerRanges) -> Space {
        Space {
            ids,
            sequence_bits: layout.sequence_bits,
            bucket_ticks: Self::ticks_per_bucket(layout),
        }
    }

    /// Ticks per bucket: [`BUCKETS`] buckets cover every tick of `layout`.
    pub fn ticks_per_bucket(layout: &Layout) -> i64 {
        layout.max_ticks() / i64::from(BUCKETS) + 1
    }

    pub fn bucket_ticks(&self) -> i64 {
        self.bucket_ticks
    }

    pub fn ids(&self) -> &WorkerRanges {
        &self.ids
    }

    /// IDs a grant allows per tick: `2^(sequence_bits / 2)` consecutive
    /// sequences of one set-aside worker id (64 under classic, 8 under
    /// js53), so that rows sharing a time take few grants while a bucket
    /// still holds many.
    pub fn per_tick(&self) -> u32 {
        1 << (self.sequence_bits / 2)
    }

    /// How many grants a bucket holds.
    pub fn grants_per_bucket(&self) -> u32 {
        let per_id = 1u64 << (self.sequence_bits - self.sequence_bits / 2);
        u32::try_from(self.ids.len().saturating_mul(per_id)).unwrap_or(u32::MAX)
    }

    /// The bucket of a tick (0 or more, below the layout's end).
    pub fn bucket_of(&self, tick: i64) -> u32 {
        u32::try_from(tick.max(0) / self.bucket_ticks).unwrap_or(BUCKETS - 1)
    }

    /// The bucket of a tick under `layout`, whatever ids are set aside.
    pub fn bucket_for(layout: &Layout, tick: i64) -> u32 {
        u32::try_from(tick.max(0) / Self::ticks_per_bucket(layout)).unwrap_or(BUCKETS - 1)
    }

    /// The first tick of a bucket.
    pub fn bucket_start(&self, bucket: u32) -> i64 {
        i64::from(bucket).saturating_mul(self.bucket_ticks)
    }

    /// The first and last Unix ms of a bucket under `layout` (the last at
    /// most the layout's end), whatever ids are set aside.
    pub fn bucket_span_ms(layout: &Layout, bucket: u32) -> (i64, i64) {
        let ticks = Self::ticks_per_bucket(layout);
        let first = i64::from(bucket).saturating_mul(ticks);
        let start = layout.tick_start_unix_ms(first);
        let end = layout
            .tick_start_unix_ms(first.saturating_add(ticks))
            .saturating_sub(1)
            .min(layout.end_unix_ms());
        (start, end)
    }

    /// Grants of a stretch a session's further grants never take: a
    /// grant beyond a session's first of a stretch (for IDs sharing a
    /// tick) stops this many short of [`Space::grants_per_bucket`], which
    /// stay for first grants. One sixteenth of a stretch, at least one:
    /// rows at one time that a stretch cannot hold are refused while
    /// other sessions can still import into it.
    pub fn reserve(&self) -> u32 {
        (self.grants_per_bucket() / 16).max(1)
    }

    /// How far a stretch's counter may go for a new grant of a session
    /// holding `held` of the stretch's grants: to
    /// [`Space::grants_per_bucket`] for a first grant, [`Space::reserve`]
    /// short of it for a further one.
    pub fn grant_limit(&self, held: usize) -> u32 {
        if held == 0 {
            self.grants_per_bucket()
        } else {
            self.grants_per_bucket().saturating_sub(self.reserve())
        }
    }

    /// The worker id and sequence of the `index`th ID (below
    /// [`Space::per_tick`]) of a grant in a tick; `None` past the capacity.
    pub fn grant_parts(&self, grant: u32, index: u32) -> Option<(u32, u32)> {
        if index >= self.per_tick() {
            return None;
        }
        let blocks_per_id = self.sequence_bits - self.sequence_bits / 2;
        let id_index = u64::from(grant >> blocks_per_id);
        let block = grant & ((1u32 << blocks_per_id) - 1);
        let sequence = (block << (self.sequence_bits / 2)) | index;
        self.ids
            .iter()
            .nth(id_index as usize)
            .map(|id| (id, sequence))
    }

    /// The grant an ID of this space belongs to; `None` for a worker id not
    /// set aside.
    pub fn grant_of(&self, worker_id: u32, sequence: u32) -> Option<u32> {
        let id_index = self.ids.iter().position(|id| id == worker_id)? as u64;
        let blocks_per_id = self.sequence_bits - self.sequence_bits / 2;
        let block = u64::from(sequence >> (self.sequence_bits / 2));
        u32::try_from((id_index << blocks_per_id) | block).ok()
    }
}

/// Why a time cannot be backfilled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TimeError {
    /// Before the layout's epoch.
    BeforeEpoch { epoch_ms: i64 },
    /// After the last time the layout's time field can hold.
    PastEnd { end_ms: i64 },
    /// Further ahead of the clock than `max_drift` allows.
    Future { ahead_ms: i64, max_drift_ms: i64 },
    /// At or before a time other IDs may have used the space: an accepted
    /// layout change (IDs of the old layout may have any bits), or live IDs
    /// the set-aside ids made before they were set aside.
    NotAfter { from_ms: i64 },
}

impl fmt::Display for TimeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::layout::format_unix_ms as at;
        match self {
            TimeError::BeforeEpoch { epoch_ms } => {
                write!(f, "it is before the layout's epoch, {}", at(*epoch_ms))
            }
            TimeError::PastEnd { end_ms } => {
                write!(f, "it is after the layout's last time, {}", at(*end_ms))
            }
            TimeError::Future {
                ahead_ms,
                max_drift_ms,
            } => write!(
                f,
                "it is {ahead_ms} ms ahead of the clock, more than snowflake_id.max_drift ({max_drift_ms} ms) allows"
            ),
            TimeError::NotAfter { from_ms } => write!(
                f,
                "it is not after {}, up to which the set-aside worker ids made live IDs or this server's layout changed",
                at(*from_ms)
            ),
        }
    }
}

/// The tick a backfill ID for `unix_ms` gets, or why there is none:
/// `now_ms` is the clock, `after_ms` the time at or before which no
/// backfill ID may be made (see [`TimeError::NotAfter`]; `i64::MIN`: none).
pub fn tick_for(
    layout: &Layout,
    unix_ms: i64,
    now_ms: i64,
    max_drift_ms: i64,
    after_ms: i64,
) -> Result<i64, TimeError> {
    if unix_ms < layout.epoch_ms {
        return Err(TimeError::BeforeEpoch {
            epoch_ms: layout.epoch_ms,
        });
    }
    if unix_ms > layout.end_unix_ms() {
        return Err(TimeError::PastEnd {
            end_ms: layout.end_unix_ms(),
        });
    }
    let ahead_ms = unix_ms.saturating_sub(now_ms);
    if ahead_ms > max_drift_ms {
        return Err(TimeError::Future {
            ahead_ms,
            max_drift_ms,
        });
    }
    if unix_ms <= after_ms {
        return Err(TimeError::NotAfter { from_ms: after_ms });
    }
    Ok(layout.tick_at(unix_ms))
}

/// Which stretches of one durable write get a grant, from their counters
/// now (`counts`) and how far each may go (`limits`, [`Space::grant_limit`]);
/// the first is the stretch asked for. None when the first is at its
/// limit: a refusal takes nothing, not even the nearby stretches of its
/// batch. Otherwise each one below its limit.
pub fn to_hand_out(counts: &[u32], limits: &[u32]) -> Vec<bool> {
    let below: Vec<bool> = counts.iter().zip(limits).map(|(c, l)| c < l).collect();
    if below.first().copied().unwrap_or(false) {
        below
    } else {
        vec![false; below.len()]
    }
}

/// Distinct ticks a backend remembers IDs at, over every stretch it holds
/// grants of. At this many, a new tick first gives up every grant held.
/// `2^20 * 7/8`: the most a hash table of `2^20` slots holds, so the table
/// never grows past them (16 bytes and a control byte each: 17 MiB).
pub const MAX_TICKS: usize = 917_504;
/// Grants a backend holds at once. At this many, a new grant first gives
/// up every grant held (4 bytes each, plus 32 per stretch: under 1 MiB).
pub const MAX_GRANTS: usize = 65_536;
/// The most stretches a backend takes first grants of at once
/// ([`Open::to_take`]).
pub const MAX_BATCH: usize = 256;

/// What a backend does for an ID at a tick ([`Open::take`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Take {
    /// The ID is `(tick, grant_parts(grant, index))`.
    Id { grant: u32, index: u32 },
    /// A new grant of the stretch `bucket` is needed: take one (durably),
    /// give it to [`Open::add`] and ask again.
    NeedGrant { bucket: u32 },
}

/// A backend's open stretches: the grants it holds, per stretch in the
/// order it took them, and how many IDs it made at each tick. The `n`th ID
/// at a tick (from 0) is index `n % per_tick` of the stretch's
/// `n / per_tick`th grant: each `(grant, tick, index)` once, in any order
/// of ticks. Bounded: at most [`MAX_TICKS`] ticks and [`MAX_GRANTS`]
/// grants; beyond, every grant is given up ([`Open::clear`]) and the
/// following IDs take new ones.
#[derive(Clone, Debug, Default)]
pub struct Open {
    counts: HashMap<i64, u32, Mix>,
    stretches: HashMap<u32, Vec<u32>, Mix>,
    grants: usize,
    given_up: u64,
    taken: usize,
}

impl Open {
    pub fn new() -> Open {
        Open::default()
    }

    /// The grant and index of a new ID at `tick`, counted as made; or the
    /// stretch that needs a new grant first (nothing counted).
    pub fn take(&mut self, space: &Space, tick: i64) -> Take {
        let bucket = space.bucket_of(tick);
        let per_tick = space.per_tick();
        let made = match self.counts.get(&tick) {
            Some(&n) => n,
            None => {
                if self.counts.len() >= MAX_TICKS {
                    self.clear();
                }
                0
            }
        };
        let slot = (made / per_tick) as usize;
        let Some(&grant) = self.stretches.get(&bucket).and_then(|g| g.get(slot)) else {
            if self.grants + MAX_BATCH > MAX_GRANTS {
                self.clear();
            }
            return Take::NeedGrant { bucket };
        };
        self.counts.insert(tick, made + 1);
        Take::Id {
            grant,
            index: made % per_tick,
        }
    }

    /// The stretches to take a grant of, in one durable write, when
    /// [`Take::NeedGrant`] asks for one of `bucket`: `bucket` first. When
    /// the backend holds no grant of `bucket`, also first grants of the
    /// nearest stretches within `usable` it holds none of, as many as it
    /// took grants so far (so doubling), at most [`MAX_BATCH`] in all: an
    /// import over many stretches then writes durably about once per
    /// `MAX_BATCH` stretches, and one that stays in a few takes few more
    /// than it uses (at most as many as it used).
    pub fn to_take(&self, bucket: u32, usable: (u32, u32)) -> Vec<u32> {
        let mut take = vec![bucket];
        if self.held(bucket) > 0 {
            return take;
        }
        let want = self.taken.clamp(1, MAX_BATCH);
        let (lo, hi) = usable;
        let mut step = 1u32;
        while take.len() < want {
            let up = bucket.checked_add(step).filter(|&b| b <= hi);
            let down = bucket.checked_sub(step).filter(|&b| b >= lo);
            if up.is_none() && down.is_none() {
                break;
            }
            for b in [up, down].into_iter().flatten() {
                if take.len() < want && self.held(b) == 0 {
                    take.push(b);
                }
            }
            step += 1;
        }
        take
    }

    /// Keeps a new grant of `bucket`, taken after [`Take::NeedGrant`]
    /// (or with it, [`Open::to_take`]).
    pub fn add(&mut self, bucket: u32, grant: u32) {
        self.stretches.entry(bucket).or_default().push(grant);
        self.grants += 1;
        self.taken = self.taken.saturating_add(1);
    }

    /// Gives up every grant held: no ID is made from them again (they stay
    /// handed out). Memory is kept for the next ones.
    pub fn clear(&mut self) {
        if self.grants > 0 {
            self.given_up += 1;
        }
        self.counts.clear();
        self.stretches.clear();
        self.grants = 0;
    }

    /// Grants held.
    pub fn len(&self) -> usize {
        self.grants
    }

    pub fn is_empty(&self) -> bool {
        self.grants == 0
    }

    /// IDs made at `tick` since the grants were last given up.
    pub fn made_at(&self, tick: i64) -> u32 {
        self.counts.get(&tick).copied().unwrap_or(0)
    }

    /// Grants held of the stretch `bucket`.
    pub fn held(&self, bucket: u32) -> usize {
        self.stretches.get(&bucket).map_or(0, Vec::len)
    }

    /// Grants taken since the backend started, given up or not.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Ticks remembered.
    pub fn ticks(&self) -> usize {
        self.counts.len()
    }

    /// How many times a bound made it give up the grants it held.
    pub fn given_up(&self) -> u64 {
        self.given_up
    }
}

/// The hash of [`Open`]'s tables: SplitMix64's finalizer over the key, so
/// that ticks with equal low bits (times on whole seconds) spread over the
/// table. Not keyed: the keys are times the importer chose, whose worst
/// case costs only its own speed.
#[derive(Clone, Copy, Debug, Default)]
pub struct Mix;

impl BuildHasher for Mix {
    type Hasher = MixHasher;
    fn build_hasher(&self) -> MixHasher {
        MixHasher(0)
    }
}

#[derive(Clone, Copy, Debug)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        let mut z = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 ^= u64::from(n);
    }
    fn write_i64(&mut self, n: i64) {
        self.0 ^= n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::PRESETS;
    use std::collections::HashSet;

    /// 2026-11-26, within every preset's usable time.
    const NOW: i64 = 1_795_651_200_000;

    fn preset(name: &str) -> Layout {
        PRESETS
            .iter()
            .find(|p| p.name == name)
            .unwrap()
            .layout(crate::layout::DEFAULT_EPOCH_MS, NOW)
            .unwrap()
    }

    /// The shared part: per-bucket grant counters, as shared memory holds
    /// them (they survive "crashes" of backends and servers).
    struct Grants(std::collections::HashMap<u32, u32>);

    impl Grants {
        fn next(&mut self, bucket: u32, cap: u32) -> Option<u32> {
            let n = self.0.entry(bucket).or_insert(0);
            (*n < cap).then(|| {
                *n += 1;
                *n - 1
            })
        }
    }

    /// What the extension does for one call.
    fn make(space: &Space, l: &Layout, open: &mut Open, g: &mut Grants, tick: i64) -> Option<i64> {
        loop {
            match open.take(space, tick) {
                Take::Id { grant, index } => {
                    let (worker, seq) = space.grant_parts(grant, index)?;
                    return Some(l.compose(tick, worker, seq).unwrap());
                }
                Take::NeedGrant { bucket } => {
                    let grant = g.next(bucket, space.grant_limit(open.held(bucket)))?;
                    open.add(bucket, grant);
                }
            }
        }
    }

    #[test]
    fn grants_map_to_distinct_set_aside_pairs_and_back() {
        let l = preset("js53");
        let ids = WorkerRanges::parse("60-61,63", 63).unwrap();
        let space = Space::new(&l, ids.clone());
        assert_eq!(space.per_tick(), 8);
        assert_eq!(space.grants_per_bucket(), 3 * 8);
        let mut seen = HashSet::new();
        for g in 0..space.grants_per_bucket() {
            for i in 0..space.per_tick() {
                let (w, s) = space.grant_parts(g, i).unwrap();
                assert!(ids.contains(w) && s <= l.max_sequence());
                assert!(seen.insert((w, s)));
                assert_eq!(space.grant_of(w, s), Some(g));
            }
            assert_eq!(space.grant_parts(g, space.per_tick()), None);
        }
        assert_eq!(seen.len(), 3 * 64);
        assert_eq!(space.grant_parts(space.grants_per_bucket(), 0), None);
        assert_eq!(space.grant_of(5, 0), None);
        let classic = Space::new(
            &preset("classic"),
            WorkerRanges::parse("1023", 1023).unwrap(),
        );
        assert_eq!((classic.per_tick(), classic.grants_per_bucket()), (64, 64));
        let sony = Space::new(
            &preset("sonyflake"),
            WorkerRanges::parse("9", 65535).unwrap(),
        );
        assert_eq!((sony.per_tick(), sony.grants_per_bucket()), (16, 16));
    }

    #[test]
    fn buckets_cover_the_whole_layout() {
        for p in PRESETS {
            let l = p.layout(crate::layout::DEFAULT_EPOCH_MS, NOW).unwrap();
            let space = Space::new(&l, WorkerRanges::parse("1", l.max_worker_id()).unwrap());
            assert_eq!(space.bucket_of(0), 0);
            assert!(space.bucket_of(l.max_ticks()) < BUCKETS, "{}", p.name);
            let b = space.bucket_of(123_456_789);
            assert!(space.bucket_start(b) <= 123_456_789);
            assert!(123_456_789 < space.bucket_start(b + 1));
        }
    }

    #[test]
    fn times_outside_the_layout_the_drift_or_after_a_layout_change_are_refused() {
        let l = preset("classic");
        let now = l.epoch_ms + 1_000_000;
        assert_eq!(tick_for(&l, l.epoch_ms, now, 0, i64::MIN), Ok(0));
        assert!(matches!(
            tick_for(&l, l.epoch_ms - 1, now, 0, i64::MIN),
            Err(TimeError::BeforeEpoch { .. })
        ));
        assert!(matches!(
            tick_for(&l, l.end_unix_ms() + 1, i64::MAX, i64::MAX, i64::MIN),
            Err(TimeError::PastEnd { .. })
        ));
        assert_eq!(
            tick_for(&l, now + 60_000, now, 60_000, i64::MIN),
            Ok(1_060_000)
        );
        assert_eq!(
            tick_for(&l, now + 60_001, now, 60_000, i64::MIN),
            Err(TimeError::Future {
                ahead_ms: 60_001,
                max_drift_ms: 60_000
            })
        );
        assert_eq!(
            tick_for(&l, now - 5, now, 0, now - 5),
            Err(TimeError::NotAfter { from_ms: now - 5 })
        );
        assert_eq!(tick_for(&l, now - 4, now, 0, now - 5), Ok(999_996));
    }

    #[test]
    fn a_time_ordered_import_uses_one_grant_per_bucket() {
        let l = preset("classic");
        let space = Space::new(&l, WorkerRanges::parse("1023", 1023).unwrap());
        let mut g = Grants(Default::default());
        let mut open = Open::new();
        let mut ids = HashSet::new();
        let step = space.bucket_ticks() / 1000;
        for i in 0..5000 {
            assert!(ids.insert(make(&space, &l, &mut open, &mut g, i * step).unwrap()));
        }
        assert_eq!(g.0.len(), 5);
        assert!(g.0.values().all(|&n| n == 1), "{:?}", g.0);
    }

    /// The case 0.7.0 failed: unordered times over five years use one
    /// grant per stretch, however often they go back.
    #[test]
    fn unordered_times_use_one_grant_per_stretch() {
        let l = preset("classic");
        let space = Space::new(&l, WorkerRanges::parse("1020-1023", 1023).unwrap());
        let mut g = Grants(Default::default());
        let mut open = Open::new();
        let mut ids = HashSet::new();
        // The layout's first years (its epoch is less than five years
        // before NOW).
        let span = l.tick_at(NOW) as u64;
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for _ in 0..300_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let tick = (x % span) as i64;
            let id = make(&space, &l, &mut open, &mut g, tick).unwrap();
            assert!(ids.insert(id));
            assert_eq!(l.decode(id).unwrap().ticks, tick);
        }
        assert!(g.0.values().all(|&n| n == 1), "{:?}", g.0.values().max());
        assert_eq!(open.len(), g.0.len());
        assert_eq!(open.given_up(), 0);
    }

    /// What the extension does for one call, taking grants in batches:
    /// returns the ID and whether it took grants (one durable write).
    fn make_batched(
        space: &Space,
        l: &Layout,
        open: &mut Open,
        g: &mut Grants,
        tick: i64,
        usable: (u32, u32),
    ) -> Option<(i64, bool)> {
        let mut wrote = false;
        loop {
            match open.take(space, tick) {
                Take::Id { grant, index } => {
                    let (worker, seq) = space.grant_parts(grant, index)?;
                    return Some((l.compose(tick, worker, seq).unwrap(), wrote));
                }
                Take::NeedGrant { bucket } => {
                    wrote = true;
                    let batch = open.to_take(bucket, usable);
                    let counts: Vec<u32> = batch
                        .iter()
                        .map(|b| g.0.get(b).copied().unwrap_or(0))
                        .collect();
                    let limits: Vec<u32> = batch
                        .iter()
                        .map(|&b| space.grant_limit(open.held(b)))
                        .collect();
                    let give = to_hand_out(&counts, &limits);
                    if !give[0] {
                        return None;
                    }
                    for (b, give) in batch.into_iter().zip(give) {
                        if give {
                            let grant = g.next(b, space.grants_per_bucket())?;
                            open.add(b, grant);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn grants_are_taken_in_doubling_batches_of_nearby_stretches() {
        let l = preset("classic");
        let space = Space::new(&l, WorkerRanges::parse("1020-1023", 1023).unwrap());
        let usable = (100, 100 + 1175);
        // Ordered over 1,176 stretches: 1, 1, 2, 4, ... 64, 64... grants
        // per write; no stretch outside the usable ones.
        let mut g = Grants(Default::default());
        let mut open = Open::new();
        let mut ids = HashSet::new();
        let mut writes = 0;
        for i in 0..1176 * 10 {
            let tick = space.bucket_start(100) + i * space.bucket_ticks() / 10;
            let (id, wrote) = make_batched(&space, &l, &mut open, &mut g, tick, usable).unwrap();
            assert!(ids.insert(id));
            writes += usize::from(wrote);
        }
        assert!(writes <= 1176 / MAX_BATCH + 10, "{writes} writes");
        assert_eq!(g.0.len(), 1176);
        assert!(g
            .0
            .iter()
            .all(|(&b, &n)| n == 1 && (100..=1275).contains(&b)));
        // One stretch only: one grant.
        let mut g = Grants(Default::default());
        let mut open = Open::new();
        for i in 0..1000 {
            make_batched(
                &space,
                &l,
                &mut open,
                &mut g,
                space.bucket_start(500) + i,
                usable,
            )
            .unwrap();
        }
        assert_eq!(g.0.values().sum::<u32>(), 1);
        // Grants beyond the first of a stretch (rows sharing a tick) are
        // taken one at a time.
        let before = open.len();
        for _ in 0..65 {
            make_batched(
                &space,
                &l,
                &mut open,
                &mut g,
                space.bucket_start(500),
                usable,
            )
            .unwrap();
        }
        assert_eq!(open.len(), before + 1);
        assert_eq!(open.to_take(500, usable), vec![500]);
        assert_eq!(open.to_take(501, usable), vec![501, 502]);
        assert_eq!(open.to_take(1275, usable).len(), 2);
    }

    #[test]
    fn rows_sharing_a_tick_fill_a_grant_first_and_stop_short_of_the_reserve() {
        let l = preset("js53");
        let space = Space::new(&l, WorkerRanges::parse("63", 63).unwrap());
        assert_eq!((space.grants_per_bucket(), space.reserve()), (8, 1));
        let b = space.bucket_of(777);
        let mut g = Grants(Default::default());
        let mut open = Open::new();
        let mut ids = HashSet::new();
        for i in 0..8 {
            assert!(ids.insert(make(&space, &l, &mut open, &mut g, 777).unwrap()));
            assert_eq!(g.0[&b], 1, "row {i}");
        }
        for _ in 8..56 {
            assert!(ids.insert(make(&space, &l, &mut open, &mut g, 777).unwrap()));
        }
        assert_eq!((g.0[&b], open.held(b), open.made_at(777)), (7, 7, 56));
        // The 57th ID at that tick would take the stretch's last grant, kept
        // for first grants: refused, nothing taken, nothing counted.
        assert_eq!(make(&space, &l, &mut open, &mut g, 777), None);
        assert_eq!((g.0[&b], open.made_at(777)), (7, 56));
        // Other ticks of the stretch use the first grant again.
        for t in [700, 900, 1] {
            assert!(ids.insert(make(&space, &l, &mut open, &mut g, t).unwrap()));
        }
        // Another session's first grant takes the last one; then the
        // stretch is full for everyone.
        let mut other = Open::new();
        assert!(ids.insert(make(&space, &l, &mut other, &mut g, 777).unwrap()));
        assert_eq!(g.0[&b], 8);
        assert_eq!(make(&space, &l, &mut Open::new(), &mut g, 778), None);
        // Another bucket still has room.
        assert!(make(&space, &l, &mut open, &mut g, 777 + space.bucket_ticks()).is_some());
        let classic = Space::new(
            &preset("classic"),
            WorkerRanges::parse("1020-1023", 1023).unwrap(),
        );
        assert_eq!(
            (
                classic.reserve(),
                classic.grant_limit(0),
                classic.grant_limit(3)
            ),
            (16, 256, 240)
        );
    }

    #[test]
    fn a_refused_stretch_takes_nothing_of_its_batch() {
        assert_eq!(to_hand_out(&[8, 0, 3], &[8, 8, 8]), vec![false; 3]);
        assert_eq!(to_hand_out(&[7, 8, 3], &[8, 8, 8]), vec![true, false, true]);
        assert_eq!(to_hand_out(&[7], &[7]), vec![false]);
        assert!(to_hand_out(&[], &[]).is_empty());
    }

    #[test]
    fn the_table_is_bounded_and_gives_up_its_grants_at_the_bound() {
        let l = preset("classic");
        let space = Space::new(&l, WorkerRanges::parse("1023", 1023).unwrap());
        let mut g = Grants(Default::default());
        let mut open = Open::new();
        // Ticks on whole seconds, across two stretches.
        let ticks = |i: i64| (i % 2) * space.bucket_ticks() + i * 1000 % space.bucket_ticks();
        let mut ids = HashSet::new();
        for i in 0..MAX_TICKS as i64 {
            assert!(ids.insert(make(&space, &l, &mut open, &mut g, ticks(i)).unwrap()));
        }
        assert_eq!(
            (open.ticks(), open.len(), open.given_up()),
            (MAX_TICKS, 2, 0)
        );
        // A tick it knows: no bound reached.
        assert!(ids.insert(make(&space, &l, &mut open, &mut g, ticks(5)).unwrap()));
        assert_eq!(open.given_up(), 0);
        // A new tick: every grant is given up, one new grant taken.
        let id = make(&space, &l, &mut open, &mut g, ticks(MAX_TICKS as i64)).unwrap();
        assert!(ids.insert(id));
        assert_eq!((open.ticks(), open.len(), open.given_up()), (1, 1, 1));
        // The same ticks again: other grants, other IDs.
        for i in 0..1000 {
            assert!(ids.insert(make(&space, &l, &mut open, &mut g, ticks(i)).unwrap()));
        }
        assert_eq!(g.0.values().sum::<u32>(), 4);
        // The grants bound: a stretch's grants are taken only by IDs
        // sharing a tick; many stretches each with one.
        let mut open = Open::new();
        let mut g = Grants(Default::default());
        let space = Space::new(&l, WorkerRanges::parse("0-1023", 1023).unwrap());
        for b in 0..(MAX_GRANTS as i64 / 64 + 1) {
            for _ in 0..64 * 64 + 1 {
                make(&space, &l, &mut open, &mut g, b * space.bucket_ticks()).unwrap();
            }
        }
        assert!(
            open.len() <= MAX_GRANTS && open.given_up() == 1,
            "{}",
            open.len()
        );
    }

    /// Many backends, unordered and repeated times, crashes that drop every
    /// lane, and bucket boundaries: every ID is unique, decodes to its tick
    /// and carries a set-aside worker id.
    #[test]
    fn no_two_backfill_ids_are_equal_under_churn() {
        let l = preset("js53");
        let ids_set = WorkerRanges::parse("62-63", 63).unwrap();
        let space = Space::new(&l, ids_set.clone());
        let mut g = Grants(Default::default());
        let mut backends: Vec<Open> = (0..4).map(|_| Open::new()).collect();
        let mut seen = HashSet::new();
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut refused = 0;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = (x % 4) as usize;
            if x.is_multiple_of(5000) {
                backends[b].clear(); // the backend exits or crashes
            }
            // Ticks near bucket boundaries, repeated often.
            let tick = space.bucket_ticks() * ((x >> 8) % 3) as i64 + ((x >> 16) % 40) as i64 - 20;
            let tick = tick.max(0);
            match make(&space, &l, &mut backends[b], &mut g, tick) {
                Some(id) => {
                    assert!(seen.insert(id), "call {i}: {id} twice");
                    let p = l.decode(id).unwrap();
                    assert_eq!(p.ticks, tick);
                    assert!(ids_set.contains(p.worker_id));
                }
                None => refused += 1,
            }
        }
        assert!(seen.len() > 1000, "{} made, {refused} refused", seen.len());
    }
}
