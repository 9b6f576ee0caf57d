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
//! Grants. The layout's time field is cut into [`BUCKETS`] buckets of equal
//! length ([`Space::bucket_ticks`]). In each bucket, the set-aside `(worker
//! id, sequence)` pairs are numbered 0, 1, 2... ([`Space::grant_parts`]);
//! a *grant* is one such number, handed out once, in increasing order, by a
//! per-bucket counter that only grows and is made durable before any ID of
//! the grant is returned (the extension keeps it in shared memory, the state
//! file and WAL). A grant is a block of [`Space::per_tick`] consecutive
//! sequences of one set-aside worker id, and belongs to one backend, which
//! uses it as a *lane* ([`Lanes`]): for ticks that never decrease, and
//! within one tick each sequence of the block once. Hence: two backfill IDs
//! of the same tick and the same grant come from the same lane, which gave
//! them different sequences; different grants of a bucket are disjoint
//! `(worker id, sequence)` sets. No two backfill IDs are equal.
//!
//! What it costs. Capacity: the set-aside ids (each `1/2^worker_bits` of the
//! live capacity). A grant is a lane through a whole bucket: a time-ordered
//! import needs one grant per bucket it crosses (one more for each
//! `per_tick` rows sharing one tick), an unordered one about as many lanes
//! as the longest run of decreasing times within a bucket (kept per
//! backend up to [`MAX_LANES`]), and an interrupted or repeated import
//! takes fresh grants. A bucket holds [`Space::grants_per_bucket`] grants.

use crate::layout::Layout;
use crate::ranges::WorkerRanges;
use std::fmt;

/// How many buckets the layout's time field is cut into.
pub const BUCKETS: u32 = 16_384;
/// How many lanes one backend keeps; beyond that, the least recently used
/// lane is given up (the rest of its grant is never used).
pub const MAX_LANES: usize = 16;

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

/// One grant in use by a backend: the last tick it made an ID at, and how
/// many IDs it made in that tick.
#[derive(Clone, Copy, Debug, Default)]
struct Lane {
    bucket: u32,
    grant: u32,
    last_tick: i64,
    in_tick: u32,
    used_at: u64,
    live: bool,
}

/// A backend's lanes: the grants it holds and how far each went. Fixed
/// size, no allocation.
#[derive(Clone, Debug)]
pub struct Lanes {
    lanes: [Lane; MAX_LANES],
    uses: u64,
}

impl Default for Lanes {
    fn default() -> Self {
        Self::new()
    }
}

impl Lanes {
    pub const fn new() -> Lanes {
        Lanes {
            lanes: [Lane {
                bucket: 0,
                grant: 0,
                last_tick: 0,
                in_tick: 0,
                used_at: 0,
                live: false,
            }; MAX_LANES],
            uses: 0,
        }
    }

    /// The grant and the index within it of a new ID at `tick` of `bucket`
    /// (each grant allows `per_tick` IDs per tick, in increasing ticks):
    /// a lane at `tick` with room left, else the lane whose last tick is
    /// nearest below (so lanes stay useful for earlier times). `None`: a
    /// new grant is needed ([`Lanes::add`]).
    pub fn take(&mut self, bucket: u32, tick: i64, per_tick: u32) -> Option<(u32, u32)> {
        let lane = self
            .lanes
            .iter_mut()
            .filter(|l| {
                l.live
                    && l.bucket == bucket
                    && (l.last_tick < tick || (l.last_tick == tick && l.in_tick < per_tick))
            })
            .max_by_key(|l| l.last_tick)?;
        if lane.last_tick < tick {
            lane.last_tick = tick;
            lane.in_tick = 0;
        }
        let index = lane.in_tick;
        lane.in_tick += 1;
        self.uses += 1;
        lane.used_at = self.uses;
        Some((lane.grant, index))
    }

    /// Keeps a new grant of `bucket`, whose first ID (index 0) was just
    /// made at `tick`, giving up the least recently used lane when all are
    /// taken.
    pub fn add(&mut self, bucket: u32, grant: u32, tick: i64) {
        self.uses += 1;
        let lane = Lane {
            bucket,
            grant,
            last_tick: tick,
            in_tick: 1,
            used_at: self.uses,
            live: true,
        };
        let slot = match self.lanes.iter().position(|l| !l.live) {
            Some(i) => i,
            None => self
                .lanes
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| l.used_at)
                .map_or(0, |(i, _)| i),
        };
        self.lanes[slot] = lane;
    }

    /// Gives up every lane (their grants are never used again).
    pub fn clear(&mut self) {
        *self = Lanes::new();
    }

    /// Lanes held.
    pub fn len(&self) -> usize {
        self.lanes.iter().filter(|l| l.live).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
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
    fn make(
        space: &Space,
        l: &Layout,
        lanes: &mut Lanes,
        g: &mut Grants,
        tick: i64,
    ) -> Option<i64> {
        let bucket = space.bucket_of(tick);
        let (grant, index) = match lanes.take(bucket, tick, space.per_tick()) {
            Some(taken) => taken,
            None => {
                let grant = g.next(bucket, space.grants_per_bucket())?;
                lanes.add(bucket, grant, tick);
                (grant, 0)
            }
        };
        let (worker, seq) = space.grant_parts(grant, index)?;
        Some(l.compose(tick, worker, seq).unwrap())
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
        let mut lanes = Lanes::new();
        let mut ids = HashSet::new();
        let step = space.bucket_ticks() / 1000;
        for i in 0..5000 {
            assert!(ids.insert(make(&space, &l, &mut lanes, &mut g, i * step).unwrap()));
        }
        assert_eq!(g.0.len(), 5);
        assert!(g.0.values().all(|&n| n == 1), "{:?}", g.0);
    }

    #[test]
    fn rows_sharing_a_tick_fill_a_grant_first_and_a_full_bucket_refuses() {
        let l = preset("js53");
        let space = Space::new(&l, WorkerRanges::parse("63", 63).unwrap());
        let mut g = Grants(Default::default());
        let mut lanes = Lanes::new();
        let mut ids = HashSet::new();
        for i in 0..8 {
            assert!(ids.insert(make(&space, &l, &mut lanes, &mut g, 777).unwrap()));
            assert_eq!(g.0[&space.bucket_of(777)], 1, "row {i}");
        }
        for _ in 8..64 {
            assert!(ids.insert(make(&space, &l, &mut lanes, &mut g, 777).unwrap()));
        }
        assert_eq!(g.0[&space.bucket_of(777)], 8);
        assert_eq!(make(&space, &l, &mut lanes, &mut g, 777), None);
        // Another bucket still has room.
        assert!(make(&space, &l, &mut lanes, &mut g, 777 + space.bucket_ticks()).is_some());
    }

    #[test]
    fn lanes_fit_best_and_evict_the_least_recently_used() {
        let mut lanes = Lanes::new();
        lanes.add(0, 7, 100);
        lanes.add(0, 8, 50);
        // 120: both fit; the nearest below (100) is used.
        assert_eq!(lanes.take(0, 120, 2), Some((7, 0)));
        assert_eq!(lanes.take(0, 120, 2), Some((7, 1)));
        // The block of 2 is used up at 120: the other lane, behind it.
        assert_eq!(lanes.take(0, 120, 2), Some((8, 0)));
        assert_eq!(lanes.take(0, 60, 2), None);
        assert_eq!(lanes.take(1, 1000, 2), None);
        for i in 0..MAX_LANES as u32 {
            lanes.add(2, 100 + i, 5);
        }
        assert_eq!(lanes.len(), MAX_LANES);
        // Grants 7 and 8 were the least recently used: gone.
        assert_eq!(lanes.take(0, 1000, 2), None);
        lanes.clear();
        assert!(lanes.is_empty());
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
        let mut backends: Vec<Lanes> = (0..4).map(|_| Lanes::new()).collect();
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
