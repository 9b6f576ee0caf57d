//! The clock and sequence rules of one generator: pure logic, no PostgreSQL
//! calls. The clock is injected, so every rule is tested with a fake one.
//!
//! The rules, for one worker id:
//! 1. IDs strictly increase, always.
//! 2. A new tick starts the sequence at 0; within a tick the sequence counts up.
//! 3. When a tick's sequence is used up, the next tick is *borrowed* (the ID's
//!    time runs ahead of the wall clock) instead of stalling, as long as the
//!    drift (ID time minus wall-clock time) stays within `max_drift` ticks.
//!    At the bound the generator waits for the clock to catch up.
//! 4. When the clock goes backwards, IDs keep coming from the last tick used
//!    (that is drift too). When the clock is behind by more than the bound,
//!    the generator refuses with [`GenError::ClockBehind`] until the clock
//!    catches up or the bound is raised; it never waits minutes.
//! 5. A tick past the layout's time field is [`GenError::LayoutExhausted`].
//! 6. One server-wide order: when a generator moves to a new tick it never
//!    stamps an ID below the server's newest ID tick
//!    ([`Clock::server_newest_tick`]), so after a clock step back every
//!    backend, old or new, continues from the server's newest ID time (that
//!    lead counts as drift, like rule 4). Only a tick change reads the
//!    shared value, and only a move to a tick above it publishes one.
//!
//! Sharing: the *position* of a worker id (tick and sequence of its last
//! ID) is one word ([`pack`]), ordered like the IDs. Any number of
//! generators may share a worker id: each computes the next position from
//! the word it read and its own clock reading ([`GeneratorState::step`]),
//! and publishes it with a compare-and-swap ([`SharedPosition`]); when
//! another generator moved the word first, it starts over from the new
//! word. The word only ever grows, so IDs on one worker id never repeat and
//! each generator's IDs strictly increase, under any interleaving. A
//! generator alone on a worker id is merely uncontended; it may also take
//! sequence numbers of the tick ahead in the same compare-and-swap
//! ([`GeneratorState::next_ahead`]) and make those IDs without touching the
//! word ([`GeneratorState::next_held`]): nobody else issues below the word.

use crate::layout::Layout;
use std::fmt;

/// The state of one generator. Plain data. `last_tick` and `sequence` are
/// this generator's view of its worker id's position (see [`pack`]); the
/// other fields are its own clock observations and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GeneratorState {
    /// Tick of the last ID issued (or the floor the generator starts above).
    pub last_tick: i64,
    /// Sequence of the last ID issued within `last_tick`.
    pub sequence: u32,
    /// The last wall-clock tick observed ([`NOT_SEEN`] before the first).
    pub last_seen: i64,
    pub ids_issued: u64,
    /// Ticks whose sequence was used up.
    pub sequence_exhausted: u64,
    /// Clock readings that went backwards.
    pub clock_backward: u64,
    /// The largest drift (in ticks) of an issued ID.
    pub max_drift: i64,
}

/// `last_seen` of a generator that has not read the clock yet, so that its
/// first reading never counts as the clock going backwards.
pub const NOT_SEEN: i64 = i64::MIN;

/// What one attempt produced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An ID.
    Issue(i64),
    /// Nothing yet: sleep until the wall clock reaches this tick, then retry.
    WaitUntil(i64),
}

/// Why no ID can be made now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenError {
    /// The wall clock is `behind` ticks before the last tick used, more than
    /// the `bound` allows.
    ClockBehind { behind: i64, bound: i64 },
    /// The time field of the layout is used up.
    LayoutExhausted { tick: i64, max: i64 },
    /// The clock's wait was interrupted ([`Clock::interrupted`]): nothing
    /// was issued, and the caller handles the interrupt.
    Interrupted,
}

impl fmt::Display for GenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GenError::ClockBehind { behind, bound } => write!(
                f,
                "the clock is {behind} ticks behind the last ID issued, more than the drift bound of {bound}"
            ),
            GenError::LayoutExhausted { tick, max } => {
                write!(f, "tick {tick} is past the last tick of the layout ({max})")
            }
            GenError::Interrupted => write!(f, "the wait for the clock was interrupted"),
        }
    }
}

/// A source of time for [`GeneratorState::next_id`].
pub trait Clock {
    /// Current Unix time in milliseconds.
    fn now_ms(&mut self) -> i64;
    /// Sleep for about this many milliseconds (at least 1).
    fn sleep_ms(&mut self, ms: i64);
    /// The tick of the newest ID any generator of this server issued
    /// (`i64::MIN`: none, or a generator on its own). Read only when a
    /// generator moves to a new tick.
    fn server_newest_tick(&mut self) -> i64 {
        i64::MIN
    }
    /// A generator moved to `tick`, above the last `server_newest_tick`.
    fn publish_newest_tick(&mut self, _tick: i64) {}
    /// Whether a sleep was interrupted: the generator then stops waiting
    /// and returns [`GenError::Interrupted`].
    fn interrupted(&mut self) -> bool {
        false
    }
}

/// The position `(tick, sequence)` of a worker id's last ID as one word,
/// ordered like the IDs: `tick << sequence_bits | sequence`. A fresh
/// position (tick -1, every sequence used) is -1. `tick` must lie in
/// `-1..=layout.max_ticks()`.
#[inline]
pub fn pack(layout: &Layout, tick: i64, sequence: u32) -> i64 {
    (tick << layout.sequence_bits) | i64::from(sequence)
}

/// The inverse of [`pack`].
#[inline]
pub fn unpack(layout: &Layout, word: i64) -> (i64, u32) {
    (
        word >> layout.sequence_bits,
        (word & i64::from(layout.max_sequence())) as u32,
    )
}

/// The word of a position above every ID of `floor_tick` (see
/// [`GeneratorState::starting_above`]); never below a fresh position.
pub fn floor_word(layout: &Layout, floor_tick: i64) -> i64 {
    pack(
        layout,
        floor_tick.clamp(-1, layout.max_ticks()),
        layout.max_sequence(),
    )
}

/// Where the position word of a worker id lives. Every generator on that
/// worker id reads it and replaces it by compare-and-swap; it only grows.
pub trait SharedPosition {
    /// The current word.
    fn load(&self) -> i64;
    /// Replaces the word by `new` if it is still `current`; `false` when
    /// another generator moved it first.
    fn compare_exchange(&self, current: i64, new: i64) -> bool;
}

/// A position nobody else shares (a generator on its own, in tests).
impl SharedPosition for std::cell::Cell<i64> {
    fn load(&self) -> i64 {
        self.get()
    }
    fn compare_exchange(&self, current: i64, new: i64) -> bool {
        let ok = self.get() == current;
        if ok {
            self.set(new);
        }
        ok
    }
}

impl GeneratorState {
    /// This generator's view of the position, as a word (see [`pack`]).
    #[inline]
    pub fn word(&self, layout: &Layout) -> i64 {
        pack(layout, self.last_tick, self.sequence)
    }

    /// Takes the position from `word` (see [`pack`]).
    #[inline]
    pub fn set_word(&mut self, layout: &Layout, word: i64) {
        (self.last_tick, self.sequence) = unpack(layout, word);
    }

    /// A generator that has issued nothing yet: its first ID may be at tick 0.
    pub fn new(layout: &Layout) -> Self {
        Self::starting_above(-1, layout)
    }

    /// A state whose next ID is above every ID of `floor_tick` (all its
    /// sequence numbers count as used).
    pub fn starting_above(floor_tick: i64, layout: &Layout) -> Self {
        GeneratorState {
            last_tick: floor_tick,
            sequence: layout.max_sequence(),
            last_seen: NOT_SEEN,
            ids_issued: 0,
            sequence_exhausted: 0,
            clock_backward: 0,
            max_drift: 0,
        }
    }

    /// Makes sure the next ID lies above every ID of `floor_tick`. Returns
    /// whether the floor moved the generator.
    pub fn raise_floor(&mut self, floor_tick: i64, layout: &Layout) -> bool {
        if floor_tick >= self.last_tick {
            self.last_tick = floor_tick;
            self.sequence = layout.max_sequence();
            true
        } else {
            false
        }
    }

    /// The drift, in ticks, of the last ID relative to `now_tick` (0 when the
    /// clock is ahead of it).
    pub fn drift_at(&self, now_tick: i64) -> i64 {
        (self.last_tick - now_tick).max(0)
    }

    /// One attempt at an ID for `worker_id` at wall-clock tick `now`, with a
    /// drift bound of `max_drift` ticks. `server_newest` is called only when
    /// the generator would move to a new tick (rule 6). On `Err` and
    /// `WaitUntil` the state is unchanged apart from clock observations.
    #[inline]
    pub fn step(
        &mut self,
        layout: &Layout,
        worker_id: u32,
        now: i64,
        max_drift: i64,
        server_newest: impl FnOnce() -> i64,
    ) -> Result<Step, GenError> {
        let went_back = now < self.last_seen;
        if went_back {
            self.clock_backward += 1;
        }
        self.last_seen = now;

        // The server's newest tick, read only when this ID could move to a
        // new tick or the clock went back (rule 6).
        let exhausted = self.sequence >= layout.max_sequence();
        let newest = if now > self.last_tick || exhausted || went_back {
            server_newest()
        } else {
            i64::MIN
        };
        // `lead`: how far the tick no new ID may go below is ahead of the
        // clock (this worker's last tick, or the server's newest).
        let (tick, sequence, lead) = if newest > now && newest > self.last_tick {
            // The clock is behind the server's newest ID: continue there.
            // This worker id has issued nothing at that tick yet.
            (newest, 0, newest - now)
        } else if now > self.last_tick {
            (now, 0, self.last_tick - now)
        } else if !exhausted {
            (self.last_tick, self.sequence + 1, self.last_tick - now)
        } else {
            (self.last_tick + 1, 0, self.last_tick - now)
        };
        let drift = tick - now;
        if drift > max_drift {
            let behind = lead;
            if behind > max_drift {
                return Err(GenError::ClockBehind {
                    behind,
                    bound: max_drift,
                });
            }
            // Only the borrowed tick is over the bound: wait for the clock.
            return Ok(Step::WaitUntil(tick - max_drift));
        }
        if tick > layout.max_ticks() {
            return Err(GenError::LayoutExhausted {
                tick,
                max: layout.max_ticks(),
            });
        }
        self.last_tick = tick;
        self.sequence = sequence;
        self.ids_issued += 1;
        if sequence == layout.max_sequence() {
            self.sequence_exhausted += 1;
        }
        if drift > self.max_drift {
            self.max_drift = drift;
        }
        Ok(Step::Issue(
            layout.compose_unchecked(tick, worker_id, sequence),
        ))
    }

    /// Makes one ID, sleeping on `clock` when the drift bound requires it.
    /// `max_drift_ms` is converted to whole ticks of the layout. A
    /// generator on its own: [`GeneratorState::next_shared`] with a
    /// position nobody else moves.
    pub fn next_id(
        &mut self,
        layout: &Layout,
        worker_id: u32,
        max_drift_ms: i64,
        clock: &mut impl Clock,
    ) -> Result<i64, GenError> {
        let position = std::cell::Cell::new(self.word(layout));
        self.next_shared(layout, worker_id, max_drift_ms, clock, &position)
    }

    /// One attempt from the position `current` (a word read from the
    /// shared position) at wall-clock tick `now`: what [`Self::step`] makes
    /// of it, and the generator state to keep if the position can be moved
    /// from `current` to `next.word(layout)`. `self` is not changed: a
    /// generator that loses the compare-and-swap starts over.
    #[inline]
    pub fn attempt(
        &self,
        layout: &Layout,
        worker_id: u32,
        current: i64,
        now: i64,
        max_drift: i64,
        server_newest: impl FnOnce() -> i64,
    ) -> (Result<Step, GenError>, GeneratorState) {
        let mut next = *self;
        next.set_word(layout, current);
        let step = next.step(layout, worker_id, now, max_drift, server_newest);
        (step, next)
    }

    /// Makes one ID on a worker id whose position may be shared with other
    /// generators, sleeping on `clock` when the drift bound requires it:
    /// reads the word, computes the next position, and publishes it by
    /// compare-and-swap, starting over (with a new clock reading) when
    /// another generator moved the word first. On `Err`, this generator's
    /// view of the position is the word it last read. A sleep that the
    /// clock reports as interrupted ([`Clock::interrupted`]) ends the call
    /// with [`GenError::Interrupted`], nothing issued and the word not
    /// moved: the caller handles the interrupt, then may call again.
    #[inline(always)]
    pub fn next_shared(
        &mut self,
        layout: &Layout,
        worker_id: u32,
        max_drift_ms: i64,
        clock: &mut impl Clock,
        position: &impl SharedPosition,
    ) -> Result<i64, GenError> {
        self.next_ahead(layout, worker_id, max_drift_ms, clock, position, None, 0)
            .map(|(id, _)| id)
    }

    /// [`Self::next_shared`], with two more inputs:
    ///
    /// - `seen`: a word and then a clock reading (Unix ms), read in that
    ///   order just before, for the first attempt (the caller read them
    ///   for [`Self::next_held`]); `None` reads both.
    /// - `ahead`: the compare-and-swap that publishes the ID's position
    ///   also takes up to `ahead` more sequence numbers of its tick (never
    ///   the last of the tick, so that only an issued ID uses a tick's
    ///   sequence up). Returns the ID and `held`, the last sequence number
    ///   the word now holds for this generator: the positions from the
    ///   ID's to `(last_tick, held)` are this generator's alone, since
    ///   every other generator issues only above a word it read and moved
    ///   by compare-and-swap, and the word only grows. [`Self::next_held`]
    ///   issues them without touching the word. With `ahead` 0, `held` is
    ///   the ID's own sequence number: nothing is held.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub fn next_ahead(
        &mut self,
        layout: &Layout,
        worker_id: u32,
        max_drift_ms: i64,
        clock: &mut impl Clock,
        position: &impl SharedPosition,
        mut seen: Option<(i64, i64)>,
        ahead: u32,
    ) -> Result<(i64, u32), GenError> {
        let max_drift = layout.whole_ticks(max_drift_ms);
        // The server's newest tick as read by an attempt that it refused:
        // see the `ClockBehind` arm below.
        let mut refused_at: Option<i64> = None;
        loop {
            // The word first, then the clock: whoever moved the word to
            // `current` read its clock before we read ours, so `current` is
            // at most `max_drift` ahead of our reading unless the clock
            // really stepped back. Read the other way round, a generator
            // preempted between the two reads would compare the others'
            // fresh positions with its stale clock and fail as if the clock
            // had gone back.
            let (current, now_ms) = match seen.take() {
                Some(seen) => seen,
                None => {
                    let current = position.load();
                    (current, clock.now_ms())
                }
            };
            let now = layout.tick_at(now_ms);
            let mut newest = i64::MIN;
            let (step, next) = self.attempt(layout, worker_id, current, now, max_drift, || {
                newest = refused_at.unwrap_or_else(|| clock.server_newest_tick());
                newest
            });
            match step {
                Ok(Step::Issue(id)) => {
                    let held = next.held_after(layout, ahead);
                    if !position.compare_exchange(current, pack(layout, next.last_tick, held)) {
                        continue;
                    }
                    if next.last_tick != current >> layout.sequence_bits && next.last_tick > newest
                    {
                        clock.publish_newest_tick(next.last_tick);
                    }
                    *self = next;
                    return Ok((id, held));
                }
                Ok(Step::WaitUntil(tick)) => {
                    // Keep the clock observation; the position is re-read.
                    *self = next;
                    clock.sleep_ms((layout.tick_start_unix_ms(tick) - now_ms).max(1));
                    if clock.interrupted() {
                        return Err(GenError::Interrupted);
                    }
                }
                // The server's newest tick is read after the clock (only
                // when needed), so a generator preempted between the two
                // reads compares the others' newer IDs with its stale
                // reading. Once, read the clock again *after* that newest
                // tick (and the word before it) and decide on the same
                // newest tick: whoever published it read its clock before
                // we read it, so only a clock that really went back is
                // still refused. The stale reading is not kept.
                Err(GenError::ClockBehind { .. }) if newest != i64::MIN && refused_at.is_none() => {
                    refused_at = Some(newest);
                }
                Err(e) => {
                    *self = next;
                    return Err(e);
                }
            }
        }
    }

    /// The last sequence number of `last_tick` to take with the ID just
    /// made (see [`Self::next_ahead`]): up to `ahead` more, below the
    /// tick's last.
    #[inline(always)]
    fn held_after(&self, layout: &Layout, ahead: u32) -> u32 {
        let below_last = layout.max_sequence().saturating_sub(1);
        if self.sequence < below_last {
            self.sequence.saturating_add(ahead).min(below_last)
        } else {
            self.sequence
        }
    }

    /// The next ID's sequence number without the shared word, when this
    /// generator already holds it: `held` (what [`Self::next_ahead`]
    /// returned) is above the last sequence number, and the clock (`now`,
    /// in ticks) is at the last ID's tick or behind it within `max_drift`
    /// ticks (a tick borrowed ahead of the clock), and not behind the last
    /// reading. Then [`Self::step`] would make exactly this ID in the same
    /// tick: no server-wide tick to read (no new tick, nothing used up:
    /// `held` is below the tick's last sequence number, and the clock did
    /// not go back), a drift within the bound and not above the largest
    /// recorded (it is at most the drift of the last ID, whose clock
    /// reading was not later), and a position the word already holds for
    /// this generator. `None`: go through the word ([`Self::next_ahead`]).
    ///
    /// `held` is valid only for the state [`Self::next_ahead`] returned it
    /// with, as this method advances it: after anything else changes the
    /// state (an error, a wait, a floor), pass 0.
    #[inline(always)]
    pub fn next_held(&mut self, now: i64, held: u32, max_drift: i64) -> Option<u32> {
        // No arithmetic that can panic: `claims` calls this without an
        // error guard. The drift, `last_tick - now`, is at least 0 once
        // `now <= last_tick`, so below 2^64: exact as a u64 (no saturating
        // arithmetic on the path of every ID).
        if now > self.last_tick || now < self.last_seen || self.sequence >= held {
            return None;
        }
        match u64::try_from(max_drift) {
            Ok(bound) if self.last_tick.wrapping_sub(now) as u64 <= bound => {}
            _ => return None,
        }
        self.sequence += 1;
        self.ids_issued += 1;
        self.last_seen = now;
        Some(self.sequence)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::layout::{DEFAULT_EPOCH_MS, PRESETS};

    const NOW: i64 = 1_795_305_600_000;

    /// A clock that only moves when told to, or when slept on.
    pub(crate) struct FakeClock {
        pub ms: i64,
        pub slept: i64,
    }

    impl Clock for FakeClock {
        fn now_ms(&mut self) -> i64 {
            self.ms
        }
        fn sleep_ms(&mut self, ms: i64) {
            assert!(ms >= 1);
            self.ms += ms;
            self.slept += ms;
        }
    }

    pub(crate) fn layout(name: &str) -> Layout {
        let p = PRESETS.iter().find(|p| p.name == name).unwrap();
        p.layout(DEFAULT_EPOCH_MS, NOW).unwrap()
    }

    #[test]
    fn new_tick_starts_sequence_at_zero_and_counts_within_a_tick() {
        let l = layout("classic");
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let a = g.next_id(&l, 7, 1000, &mut c).unwrap();
        let b = g.next_id(&l, 7, 1000, &mut c).unwrap();
        let pa = l.decode(a).unwrap();
        let pb = l.decode(b).unwrap();
        assert_eq!(
            (pa.ticks, pa.worker_id, pa.sequence),
            (l.tick_at(NOW), 7, 0)
        );
        assert_eq!((pb.ticks, pb.sequence), (l.tick_at(NOW), 1));
        c.ms += 5;
        let pc = l.decode(g.next_id(&l, 7, 1000, &mut c).unwrap()).unwrap();
        assert_eq!((pc.ticks, pc.sequence), (l.tick_at(NOW) + 5, 0));
    }

    #[test]
    fn exhausted_sequence_borrows_the_next_tick_then_waits_at_the_bound() {
        let l = layout("js53"); // 64 IDs per millisecond
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let mut last = -1;
        // 3 ms of drift allowed: 4 ticks' worth of IDs without sleeping.
        for _ in 0..4 * 64 {
            let id = g.next_id(&l, 1, 3, &mut c).unwrap();
            assert!(id > last);
            last = id;
        }
        assert_eq!(c.slept, 0);
        assert_eq!(g.max_drift, 3);
        assert_eq!(g.sequence_exhausted, 4);
        // The next one must wait one tick.
        let id = g.next_id(&l, 1, 3, &mut c).unwrap();
        assert!(id > last);
        assert_eq!(c.slept, 1);
        assert_eq!(l.decode(id).unwrap().ticks - l.tick_at(c.ms), 3);
    }

    #[test]
    fn small_backward_jump_keeps_issuing_from_the_last_tick() {
        let l = layout("classic");
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let a = g.next_id(&l, 0, 1000, &mut c).unwrap();
        c.ms -= 500;
        let b = g.next_id(&l, 0, 1000, &mut c).unwrap();
        assert!(b > a);
        assert_eq!(l.decode(b).unwrap().ticks, l.tick_at(NOW));
        assert_eq!(g.clock_backward, 1);
        assert_eq!(g.drift_at(l.tick_at(c.ms)), 500);
    }

    #[test]
    fn large_backward_jump_is_refused_until_the_clock_catches_up() {
        let l = layout("classic");
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let a = g.next_id(&l, 0, 1000, &mut c).unwrap();
        c.ms -= 5000;
        let before = g;
        assert_eq!(
            g.next_id(&l, 0, 1000, &mut c),
            Err(GenError::ClockBehind {
                behind: 5000,
                bound: 1000
            })
        );
        assert_eq!(g.last_tick, before.last_tick);
        assert_eq!(g.sequence, before.sequence);
        // Still refused while more than the bound behind ...
        c.ms += 3999;
        assert!(g.next_id(&l, 0, 1000, &mut c).is_err());
        // ... and fine within it, or with a larger bound.
        c.ms += 1;
        assert!(g.next_id(&l, 0, 1000, &mut c).unwrap() > a);
        c.ms -= 10_000;
        assert!(g.next_id(&l, 0, 20_000, &mut c).unwrap() > a);
        assert_eq!(g.clock_backward, 2);
    }

    #[test]
    fn zero_drift_bound_waits_for_the_next_tick() {
        let l = layout("js53");
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        for _ in 0..65 {
            g.next_id(&l, 0, 0, &mut c).unwrap();
        }
        assert_eq!(c.slept, 1);
        assert_eq!(g.max_drift, 0);
    }

    /// A [`FakeClock`] on which a sleep can be interrupted: once `interrupt`
    /// is set, the next sleep leaves an interrupt pending until the caller
    /// handles it (clears `pending`), as a cancel does in a backend.
    struct InterruptibleClock {
        clock: FakeClock,
        interrupt: bool,
        pending: bool,
        sleeps: u32,
    }

    impl Clock for InterruptibleClock {
        fn now_ms(&mut self) -> i64 {
            self.clock.now_ms()
        }
        fn sleep_ms(&mut self, ms: i64) {
            self.clock.sleep_ms(ms);
            self.sleeps += 1;
            self.pending |= std::mem::take(&mut self.interrupt);
        }
        fn interrupted(&mut self) -> bool {
            self.pending
        }
    }

    #[test]
    fn an_interrupted_wait_issues_nothing_and_a_later_call_continues() {
        let l = layout("js53"); // 64 IDs per millisecond
        let mut g = GeneratorState::new(&l);
        let mut c = InterruptibleClock {
            clock: FakeClock { ms: NOW, slept: 0 },
            interrupt: true,
            pending: false,
            sleeps: 0,
        };
        let position = std::cell::Cell::new(g.word(&l));
        // With no drift allowed, one tick's IDs come without a sleep ...
        let mut last = -1;
        for _ in 0..64 {
            let id = g.next_shared(&l, 3, 0, &mut c, &position).unwrap();
            assert!(id > last);
            last = id;
        }
        assert_eq!((c.sleeps, c.pending), (0, false));
        // ... the next one waits for the clock, and the wait is interrupted.
        let before = g;
        assert_eq!(
            g.next_shared(&l, 3, 0, &mut c, &position),
            Err(GenError::Interrupted)
        );
        assert_eq!(c.sleeps, 1);
        // Nothing was issued: the position and the counters did not move.
        assert_eq!(position.get(), before.word(&l));
        assert_eq!(
            (g.last_tick, g.sequence),
            (before.last_tick, before.sequence)
        );
        assert_eq!(g.ids_issued, before.ids_issued);
        assert_eq!(g.sequence_exhausted, before.sequence_exhausted);
        // The caller handled the interrupt (it did not raise): the next call
        // goes on above the last ID, in the tick the clock has reached.
        c.pending = false;
        let id = g.next_shared(&l, 3, 0, &mut c, &position).unwrap();
        assert!(id > last);
        let p = l.decode(id).unwrap();
        assert_eq!(
            (p.ticks, p.worker_id, p.sequence),
            (l.tick_at(NOW) + 1, 3, 0)
        );
        assert_eq!(p.ticks, l.tick_at(c.clock.ms));
        assert_eq!(g.ids_issued, before.ids_issued + 1);
        assert_eq!(position.get(), g.word(&l));
        assert_eq!(c.sleeps, 1, "the clock had reached the tick: no new wait");
        // And it keeps going: the rest of that tick, then a wait that is not
        // interrupted.
        last = id;
        for _ in 0..64 {
            let id = g.next_shared(&l, 3, 0, &mut c, &position).unwrap();
            assert!(id > last);
            last = id;
        }
        assert_eq!((c.sleeps, c.pending), (2, false));
        assert_eq!(l.decode(last).unwrap().ticks, l.tick_at(NOW) + 2);
        assert_eq!(g.max_drift, 0);
    }

    #[test]
    fn floor_puts_the_next_id_above_every_id_of_the_floor_tick() {
        let l = layout("classic");
        let floor = l.tick_at(NOW) + 100;
        let max_at_floor = l.compose(floor, 5, l.max_sequence()).unwrap();
        let mut g = GeneratorState::starting_above(floor, &l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let id = g.next_id(&l, 5, 1000, &mut c).unwrap();
        assert!(id > max_at_floor);
        let mut h = GeneratorState::new(&l);
        h.next_id(&l, 5, 1000, &mut c).unwrap();
        h.raise_floor(floor, &l);
        assert!(h.next_id(&l, 5, 1000, &mut c).unwrap() > max_at_floor);
        // A lower floor changes nothing.
        let before = h;
        h.raise_floor(floor - 10, &l);
        assert_eq!(h, before);
    }

    #[test]
    fn end_of_the_layout_is_an_error_not_a_wraparound() {
        let l = layout("classic");
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock {
            ms: l.end_unix_ms(),
            slept: 0,
        };
        let last = g.next_id(&l, 0, 1000, &mut c).unwrap();
        assert_eq!(l.decode(last).unwrap().ticks, l.max_ticks());
        c.ms += 1;
        assert!(matches!(
            g.next_id(&l, 0, 1000, &mut c),
            Err(GenError::LayoutExhausted { .. })
        ));
    }

    #[test]
    fn clock_before_the_epoch_is_a_clock_behind_error() {
        let l = layout("classic");
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock {
            ms: DEFAULT_EPOCH_MS - 5000,
            slept: 0,
        };
        assert!(matches!(
            g.next_id(&l, 0, 1000, &mut c),
            Err(GenError::ClockBehind { .. })
        ));
        // The first ID of a fresh generator can be at tick 0.
        c.ms = DEFAULT_EPOCH_MS;
        assert_eq!(g.next_id(&l, 0, 1000, &mut c), Ok(0));
    }

    /// A fake clock shared by several generators of one "server".
    struct ServerClock<'a> {
        ms: i64,
        newest: &'a std::cell::Cell<i64>,
        reads: u32,
    }

    impl Clock for ServerClock<'_> {
        fn now_ms(&mut self) -> i64 {
            self.ms
        }
        fn sleep_ms(&mut self, ms: i64) {
            self.ms += ms;
        }
        fn server_newest_tick(&mut self) -> i64 {
            self.reads += 1;
            self.newest.get()
        }
        fn publish_newest_tick(&mut self, tick: i64) {
            self.newest.set(self.newest.get().max(tick));
        }
    }

    #[test]
    fn after_a_step_back_every_generator_continues_from_the_servers_newest_tick() {
        let l = layout("classic");
        let newest = std::cell::Cell::new(i64::MIN);
        let mut old = GeneratorState::new(&l);
        let mut busy = GeneratorState::new(&l);
        let mut c = ServerClock {
            ms: NOW,
            newest: &newest,
            reads: 0,
        };
        old.next_id(&l, 1, 60_000, &mut c).unwrap();
        c.ms += 5;
        let top = busy.next_id(&l, 2, 60_000, &mut c).unwrap();
        assert_eq!(newest.get(), l.tick_at(NOW + 5));
        // The clock steps back 10 s: the idle generator, and a fresh one,
        // stamp their next IDs at the server's newest tick, not below.
        c.ms -= 10_000;
        let a = old.next_id(&l, 1, 60_000, &mut c).unwrap();
        let mut fresh = GeneratorState::new(&l);
        let b = fresh.next_id(&l, 3, 60_000, &mut c).unwrap();
        for id in [a, b] {
            assert_eq!(l.decode(id).unwrap().ticks, l.decode(top).unwrap().ticks);
        }
        // Beyond max_drift it is refused, by the server-wide lead.
        let mut other = GeneratorState::new(&l);
        assert_eq!(
            other.next_id(&l, 4, 1000, &mut c),
            Err(GenError::ClockBehind {
                behind: 10_000,
                bound: 1000
            })
        );
    }

    /// A clock of a server where the generator is preempted right after
    /// its clock reading, while others issue IDs at the time it resumes.
    struct PreemptedAfterClock {
        ms: i64,
        preempt_ms: i64,
        newest_reads: u32,
        layout: Layout,
    }

    impl Clock for PreemptedAfterClock {
        fn now_ms(&mut self) -> i64 {
            self.ms
        }
        fn sleep_ms(&mut self, ms: i64) {
            self.ms += ms;
        }
        fn server_newest_tick(&mut self) -> i64 {
            self.newest_reads += 1;
            self.ms += std::mem::take(&mut self.preempt_ms);
            self.layout.tick_at(self.ms)
        }
    }

    #[test]
    fn a_generator_preempted_after_its_clock_reading_is_not_behind_the_server() {
        // Regression (hot-path attack, max_drift 0 and 2 ms, 8 sessions on
        // two busy CPUs): the server's newest tick, read after the clock,
        // was compared with a clock reading made stale by preemption, and
        // the call failed with "system clock is 1 ms behind the newest
        // snowflake ID issued on this server".
        let l = layout("classic");
        for (drift_ms, preempt_ms) in [(0, 1), (0, 30), (2, 3), (2, 500)] {
            let mut c = PreemptedAfterClock {
                ms: NOW,
                preempt_ms,
                newest_reads: 0,
                layout: l,
            };
            let mut g = GeneratorState::new(&l);
            let position = std::cell::Cell::new(-1);
            let id = g.next_shared(&l, 7, drift_ms, &mut c, &position);
            let id = id.expect("the clock read again after the newest tick is not behind it");
            assert_eq!(l.decode(id).unwrap().ticks, l.tick_at(NOW + preempt_ms));
            // The newest tick was read once: the second attempt decides on it.
            assert_eq!(c.newest_reads, 1);
            assert_eq!(g.clock_backward, 0);
        }
        // A clock that really is behind the server's newest ID is still
        // refused, after one more reading.
        let mut c = ServerClock {
            ms: NOW - 10,
            newest: &std::cell::Cell::new(l.tick_at(NOW)),
            reads: 0,
        };
        let mut g = GeneratorState::new(&l);
        assert_eq!(
            g.next_shared(&l, 7, 2, &mut c, &std::cell::Cell::new(-1)),
            Err(GenError::ClockBehind {
                behind: 10,
                bound: 2
            })
        );
        assert_eq!(c.reads, 1);
    }

    #[test]
    fn ids_within_one_tick_do_not_read_the_servers_newest_tick() {
        let l = layout("classic");
        let newest = std::cell::Cell::new(i64::MIN);
        let mut g = GeneratorState::new(&l);
        let mut c = ServerClock {
            ms: NOW,
            newest: &newest,
            reads: 0,
        };
        for _ in 0..100 {
            g.next_id(&l, 1, 60_000, &mut c).unwrap();
        }
        assert_eq!(c.reads, 1, "read once, when moving to the new tick");
        c.ms += 1;
        g.next_id(&l, 1, 60_000, &mut c).unwrap();
        assert_eq!(c.reads, 2);
        assert_eq!(newest.get(), l.tick_at(NOW + 1));
    }

    #[test]
    fn a_generator_that_loses_the_swap_starts_over_from_the_new_word() {
        let l = layout("classic");
        let position = std::cell::Cell::new(-1);
        let mut a = GeneratorState::new(&l);
        let mut b = GeneratorState::new(&l);
        let now = l.tick_at(NOW);
        // Both read the fresh word and would issue (now, 0).
        let current = position.get();
        let (sa, na) = a.attempt(&l, 3, current, now, 1000, || i64::MIN);
        let (sb, nb) = b.attempt(&l, 3, current, now, 1000, || i64::MIN);
        assert_eq!(sa, sb);
        assert_eq!(sa, Ok(Step::Issue(l.compose(now, 3, 0).unwrap())));
        // a publishes first; b's swap fails and leaves the word alone.
        assert!(position.compare_exchange(current, na.word(&l)));
        assert!(!position.compare_exchange(current, nb.word(&l)));
        assert_eq!(position.get(), pack(&l, now, 0));
        a = na;
        assert_eq!(a.ids_issued, 1);
        assert_eq!(b.ids_issued, 0, "a lost attempt counts nothing");
        // b starts over and gets the next sequence number.
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let id = b.next_shared(&l, 3, 1000, &mut c, &position).unwrap();
        assert_eq!(id, l.compose(now, 3, 1).unwrap());
        assert_eq!(position.get(), pack(&l, now, 1));
        assert_eq!((b.last_tick, b.sequence, b.ids_issued), (now, 1, 1));
        // And a, whose view is stale, continues above b.
        let id = a.next_shared(&l, 3, 1000, &mut c, &position).unwrap();
        assert_eq!(id, l.compose(now, 3, 2).unwrap());
    }

    /// A shared word whose every read happens "after a preemption": time
    /// jumps ahead and other sharers have moved the word as far as the new
    /// time allows (`max_drift` ahead of it).
    struct PreemptedWord<'a> {
        layout: &'a Layout,
        time_ms: &'a std::cell::Cell<i64>,
        word: std::cell::Cell<i64>,
        jump_ms: i64,
        drift_ticks: i64,
    }

    impl SharedPosition for PreemptedWord<'_> {
        fn load(&self) -> i64 {
            self.time_ms.set(self.time_ms.get() + self.jump_ms);
            let ahead = self.layout.tick_at(self.time_ms.get()) + self.drift_ticks;
            self.word.set(pack(self.layout, ahead, 0));
            self.word.get()
        }
        fn compare_exchange(&self, current: i64, new: i64) -> bool {
            let ok = self.word.get() == current;
            if ok {
                self.word.set(new);
            }
            ok
        }
    }

    struct SharedTimeClock<'a>(&'a std::cell::Cell<i64>);

    impl Clock for SharedTimeClock<'_> {
        fn now_ms(&mut self) -> i64 {
            self.0.get()
        }
        fn sleep_ms(&mut self, ms: i64) {
            self.0.set(self.0.get() + ms);
        }
    }

    #[test]
    fn a_sharer_preempted_between_its_reads_does_not_see_its_clock_behind() {
        // Regression: the clock was read before the word, so a generator
        // preempted between the two reads compared the others' positions
        // (up to max_drift ahead of *their* later clocks) with its stale
        // clock and failed with ClockBehind under load.
        let l = layout("classic");
        let time = std::cell::Cell::new(NOW);
        let word = PreemptedWord {
            layout: &l,
            time_ms: &time,
            word: std::cell::Cell::new(-1),
            jump_ms: 200,
            drift_ticks: 50,
        };
        let mut g = GeneratorState::new(&l);
        let mut c = SharedTimeClock(&time);
        let id = g.next_shared(&l, 4, 50, &mut c, &word);
        let id = id.expect("the word is within max_drift of the clock read after it");
        assert!(l.decode(id).unwrap().ticks > l.tick_at(NOW + 200));
    }

    #[test]
    fn sharers_fill_a_tick_together_then_borrow_and_wait() {
        let l = layout("js53"); // 64 IDs per ms
        let position = std::cell::Cell::new(-1);
        let mut gens = [GeneratorState::new(&l); 3];
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let mut ids = Vec::new();
        // 2 ms of drift: 3 ticks' worth of IDs before anyone waits.
        for i in 0..3 * 64 {
            ids.push(
                gens[i % 3]
                    .next_shared(&l, 1, 2, &mut c, &position)
                    .unwrap(),
            );
        }
        assert_eq!(c.slept, 0);
        let next = gens[0].next_shared(&l, 1, 2, &mut c, &position).unwrap();
        assert_eq!(c.slept, 1);
        ids.push(next);
        assert!(ids.windows(2).all(|w| w[0] < w[1]));
        let exhausted: u64 = gens.iter().map(|g| g.sequence_exhausted).sum();
        assert_eq!(exhausted, 3);
        assert_eq!(gens.iter().map(|g| g.max_drift).max(), Some(2));
    }

    #[test]
    fn pack_orders_like_ids_and_a_fresh_position_is_minus_one() {
        let l = layout("classic");
        assert_eq!(GeneratorState::new(&l).word(&l), -1);
        assert_eq!(unpack(&l, -1), (-1, l.max_sequence()));
        assert!(pack(&l, 5, 0) > pack(&l, 4, l.max_sequence()));
        assert_eq!(unpack(&l, pack(&l, 123, 45)), (123, 45));
        // A floor never lowers a fresh position, nor passes the layout.
        assert_eq!(floor_word(&l, i64::MIN / 2), -1);
        assert_eq!(
            floor_word(&l, i64::MAX / 2),
            pack(&l, l.max_ticks(), l.max_sequence())
        );
    }

    /// `next_ahead` with sequence numbers taken ahead, then `next_held`
    /// while the clock stays in the tick, as `claims` runs them.
    #[allow(clippy::too_many_arguments)]
    fn next_fast(
        g: &mut GeneratorState,
        held: &mut u32,
        l: &Layout,
        worker: u32,
        max_drift_ms: i64,
        c: &mut impl Clock,
        position: &impl SharedPosition,
        ahead: u32,
    ) -> Result<i64, GenError> {
        let word = position.load();
        let now_ms = c.now_ms();
        if let Some(sequence) = g.next_held(l.tick_at(now_ms), *held, l.whole_ticks(max_drift_ms)) {
            return Ok(l.compose_unchecked(g.last_tick, worker, sequence));
        }
        let made = g.next_ahead(
            l,
            worker,
            max_drift_ms,
            c,
            position,
            Some((word, now_ms)),
            ahead,
        );
        *held = made.map_or(0, |(_, h)| h);
        made.map(|(id, _)| id)
    }

    #[test]
    fn held_ids_are_the_ids_the_word_would_have_made() {
        // Alone on a worker id, taking sequence numbers ahead changes no ID
        // and no counter: only how often the word is written.
        // 40 IDs per ms: within a js53 tick; 97: js53 borrows ticks ahead
        // (and, with 5 ms of drift allowed, waits).
        for (name, per_ms) in [("classic", 40), ("js53", 40), ("classic", 97), ("js53", 97)] {
            let l = layout(name);
            let mut plain = GeneratorState::new(&l);
            let mut fast = GeneratorState::new(&l);
            let mut held = 0;
            let position = std::cell::Cell::new(-1);
            let mut c1 = FakeClock { ms: NOW, slept: 0 };
            let mut c2 = FakeClock { ms: NOW, slept: 0 };
            let mut writes = 0;
            for i in 0..5000 {
                if i % per_ms == 0 {
                    c1.ms += 1;
                    c2.ms += 1;
                }
                let a = plain.next_id(&l, 2, 5, &mut c1).unwrap();
                let before = position.get();
                let b = next_fast(&mut fast, &mut held, &l, 2, 5, &mut c2, &position, 7).unwrap();
                writes += u32::from(position.get() != before);
                assert_eq!(a, b, "{name}, ID {i}");
                assert_eq!(plain, fast, "{name}, ID {i}");
                assert_eq!(c1.ms, c2.ms);
                // The word holds at least the last ID, never a tick's last
                // sequence number that was not issued.
                assert!(position.get() >= plain.word(&l));
                let (_, s) = unpack(&l, position.get());
                assert!(s < l.max_sequence() || plain.sequence == l.max_sequence());
            }
            assert!(writes < 5000 / 4, "{name}: {writes} writes of the word");
        }
    }

    #[test]
    fn a_sharer_continues_above_the_ids_another_generator_holds() {
        let l = layout("js53"); // 64 IDs per ms
        let position = std::cell::Cell::new(-1);
        let mut a = GeneratorState::new(&l);
        let mut b = GeneratorState::new(&l);
        let (mut held_a, mut held_b) = (0, 0);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let first = next_fast(&mut a, &mut held_a, &l, 1, 2, &mut c, &position, 10).unwrap();
        assert_eq!(l.decode(first).unwrap().sequence, 0);
        assert_eq!(held_a, 10);
        // b starts sharing: its IDs go on above a's held ones, in the tick.
        let x = next_fast(&mut b, &mut held_b, &l, 1, 2, &mut c, &position, 0).unwrap();
        assert_eq!(l.decode(x).unwrap().sequence, 11);
        assert_eq!(held_b, 11, "with nothing ahead, nothing is held");
        // Both go on; every ID differs, each generator's increase.
        let mut ids = vec![first, x];
        let (mut last_a, mut last_b) = (first, x);
        for i in 0..300 {
            if i % 50 == 49 {
                c.ms += 1;
            }
            let id = next_fast(&mut a, &mut held_a, &l, 1, 2, &mut c, &position, 10).unwrap();
            assert!(id > last_a);
            last_a = id;
            ids.push(id);
            let id = next_fast(&mut b, &mut held_b, &l, 1, 2, &mut c, &position, 0).unwrap();
            assert!(id > last_b);
            last_b = id;
            ids.push(id);
        }
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "an ID twice");
    }

    #[test]
    fn nothing_is_held_after_an_error_or_in_another_tick() {
        let l = layout("classic");
        let position = std::cell::Cell::new(-1);
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        let (_, held) = g
            .next_ahead(&l, 1, 10, &mut c, &position, None, 20)
            .unwrap();
        assert_eq!(held, 20);
        // Another tick: through the word (a new tick, or the clock back).
        assert_eq!(g.next_held(l.tick_at(NOW + 1), held, 10), None);
        assert_eq!(g.next_held(l.tick_at(NOW - 1), held, 10), None);
        // The held ones, then no more.
        for s in 1..=20 {
            assert_eq!(g.next_held(l.tick_at(NOW), held, 10), Some(s));
        }
        assert_eq!(g.next_held(l.tick_at(NOW), held, 10), None);
        assert_eq!(g.ids_issued, 21);
        // An error leaves the word's position in the state: a stale `held`
        // must not be used (callers pass 0), and 0 holds nothing.
        c.ms -= 60_000;
        assert!(g
            .next_ahead(&l, 1, 10, &mut c, &position, None, 20)
            .is_err());
        assert_eq!(g.next_held(g.last_tick, 0, 10), None);
    }

    #[test]
    fn held_ids_in_a_borrowed_tick_keep_to_the_drift_bound() {
        let l = layout("js53"); // 64 IDs per ms
        let position = std::cell::Cell::new(-1);
        let mut g = GeneratorState::new(&l);
        let mut c = FakeClock { ms: NOW, slept: 0 };
        // Use up the clock's tick: the next ID borrows the next one.
        for _ in 0..64 {
            g.next_ahead(&l, 1, 10, &mut c, &position, None, 0).unwrap();
        }
        let (_, held) = g
            .next_ahead(&l, 1, 10, &mut c, &position, None, 20)
            .unwrap();
        let now = l.tick_at(NOW);
        assert_eq!(
            (g.last_tick, g.sequence, held, g.max_drift),
            (now + 1, 0, 20, 1)
        );
        // One tick ahead: within a bound of 1, not of 0.
        assert_eq!(g.next_held(now, held, 0), None);
        assert_eq!(g.next_held(now, held, 1), Some(1));
        // The clock reached the borrowed tick: no drift; then it went back.
        assert_eq!(g.next_held(now + 1, held, 0), Some(2));
        assert_eq!(g.next_held(now, held, 1), None, "the clock went back");
        assert_eq!((g.ids_issued, g.max_drift, g.clock_backward), (67, 1, 0));
    }

    #[test]
    fn threads_holding_ids_ahead_never_repeat_an_id() {
        let l = layout("js53"); // 64 IDs per ms: plenty of contention
        let position = Atomic(std::sync::atomic::AtomicI64::new(-1));
        let per_thread = 20_000;
        let all: Vec<Vec<i64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4u32)
                .map(|t| {
                    let (l, position) = (&l, &position);
                    scope.spawn(move || {
                        let mut g = GeneratorState::new(l);
                        let mut held = 0;
                        let mut c = SystemClock;
                        (0..per_thread)
                            .map(|i| {
                                // Some threads hold ahead, some not, some
                                // switch (a sharer arriving and leaving).
                                let ahead = if (t + i / 1000) % 2 == 0 { 13 } else { 0 };
                                next_fast(&mut g, &mut held, l, 9, 50, &mut c, position, ahead)
                                    .unwrap()
                            })
                            .collect::<Vec<i64>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_unique_and_increasing(&all, 4 * per_thread as usize);
    }

    /// Each thread's IDs strictly increase, no ID is made twice, and
    /// `total` were made.
    fn assert_unique_and_increasing(all: &[Vec<i64>], total: usize) {
        let mut every = std::collections::HashSet::new();
        for ids in all {
            assert!(ids.windows(2).all(|w| w[0] < w[1]), "each thread increases");
            for &id in ids {
                assert!(every.insert(id), "id {id} twice");
            }
        }
        assert_eq!(every.len(), total);
    }

    /// A real atomic shared by real threads on the real clock.
    struct Atomic(std::sync::atomic::AtomicI64);

    impl SharedPosition for Atomic {
        fn load(&self) -> i64 {
            self.0.load(std::sync::atomic::Ordering::Relaxed)
        }
        fn compare_exchange(&self, current: i64, new: i64) -> bool {
            self.0
                .compare_exchange(
                    current,
                    new,
                    std::sync::atomic::Ordering::Relaxed,
                    std::sync::atomic::Ordering::Relaxed,
                )
                .is_ok()
        }
    }

    struct SystemClock;

    impl Clock for SystemClock {
        fn now_ms(&mut self) -> i64 {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64)
        }
        fn sleep_ms(&mut self, ms: i64) {
            std::thread::sleep(std::time::Duration::from_millis(ms as u64));
        }
    }

    #[test]
    fn threads_sharing_one_atomic_word_never_repeat_an_id() {
        let l = layout("js53"); // 64 IDs per ms: plenty of contention
        let position = Atomic(std::sync::atomic::AtomicI64::new(-1));
        let per_thread = 20_000;
        let all: Vec<Vec<i64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|_| {
                    scope.spawn(|| {
                        let mut g = GeneratorState::new(&l);
                        let mut c = SystemClock;
                        (0..per_thread)
                            .map(|_| g.next_shared(&l, 9, 50, &mut c, &position).unwrap())
                            .collect::<Vec<i64>>()
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_unique_and_increasing(&all, 4 * per_thread);
        let max = *all.iter().flatten().max().unwrap();
        let p = l.decode(max).unwrap();
        assert_eq!(position.load(), pack(&l, p.ticks, p.sequence));
    }
}
