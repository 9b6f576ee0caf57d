//! The bit layout of an ID: pure arithmetic, no PostgreSQL calls.
//!
//! ```text
//!  63 (sign, always 0)
//!  |  time: ticks since the epoch     worker id        sequence
//!  0 | tttttttttttttttttttt...ttttt | wwwwwwwwww | ssssssssssss
//!      time_bits                      worker_bits  sequence_bits
//! ```
//!
//! `total_bits` (63 by default, 53 for JavaScript-safe IDs) is the number of
//! low bits an ID may use; the time field gets whatever the worker and
//! sequence fields leave. A *tick* is one time unit (`unit_ms` milliseconds)
//! since the epoch.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The largest worker field we allocate shared-memory slots for (65,536 ids).
pub const MAX_WORKER_BITS: u32 = 16;
/// The widest sequence field (it must fit a SQL `int`).
pub const MAX_SEQUENCE_BITS: u32 = 30;
/// Milliseconds in a (Julian) year.
pub const MS_PER_YEAR: i64 = 36_525 * 86_400_000 / 100;
/// Milliseconds in ten years: a layout must last at least this long.
pub const MIN_LIFETIME_MS: i64 = 10 * MS_PER_YEAR;
/// Default epoch: 2024-01-01T00:00:00Z, in Unix milliseconds.
pub const DEFAULT_EPOCH_MS: i64 = 1_704_067_200_000;
/// pgEdge snowflake's epoch: 2023-01-01T00:00:00Z, in Unix milliseconds.
pub const PGEDGE_EPOCH_MS: i64 = 1_672_531_200_000;

/// A named starting point for the layout settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Preset {
    pub name: &'static str,
    /// The epoch `snowflake_id.epoch` defaults to with this preset.
    pub epoch_ms: i64,
    pub unit_ms: i64,
    pub total_bits: u32,
    pub worker_bits: u32,
    pub sequence_bits: u32,
}

impl Preset {
    /// This preset's layout with the given epoch, validated at `now_ms`.
    pub fn layout(&self, epoch_ms: i64, now_ms: i64) -> Result<Layout, LayoutError> {
        Layout::new(
            epoch_ms,
            self.unit_ms,
            self.total_bits,
            self.worker_bits,
            self.sequence_bits,
            now_ms,
        )
    }
}

/// The presets, in the order of the `snowflake_id.layout` setting.
pub const PRESETS: [Preset; 4] = [
    // Twitter snowflake: 41 bits of milliseconds, 10 worker bits, 12 sequence bits.
    Preset {
        name: "classic",
        epoch_ms: DEFAULT_EPOCH_MS,
        unit_ms: 1,
        total_bits: 63,
        worker_bits: 10,
        sequence_bits: 12,
    },
    // Sonyflake: 39 bits of 10 ms, 16 machine bits, 8 sequence bits.
    Preset {
        name: "sonyflake",
        epoch_ms: DEFAULT_EPOCH_MS,
        unit_ms: 10,
        total_bits: 63,
        worker_bits: 16,
        sequence_bits: 8,
    },
    // Yitter-style IDs below 2^53, exact in a JavaScript number.
    Preset {
        name: "js53",
        epoch_ms: DEFAULT_EPOCH_MS,
        unit_ms: 1,
        total_bits: 53,
        worker_bits: 6,
        sequence_bits: 6,
    },
    // pgEdge snowflake (`snowflake.nextval()`): classic's fields (time, then
    // node as the worker id, then count as the sequence) from 2023-01-01,
    // so that its IDs decode to their time, node and count.
    Preset {
        name: "pgedge",
        epoch_ms: PGEDGE_EPOCH_MS,
        unit_ms: 1,
        total_bits: 63,
        worker_bits: 10,
        sequence_bits: 12,
    },
];

/// The fields of an ID.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    pub ticks: i64,
    pub worker_id: u32,
    pub sequence: u32,
}

/// Why a layout or a value does not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// A setting is outside what any layout allows.
    Setting {
        name: &'static str,
        value: i64,
        allowed: String,
    },
    /// The bits do not add up.
    Bits {
        total: u32,
        worker: u32,
        sequence: u32,
    },
    /// The epoch lies after the current time.
    EpochInFuture { epoch_ms: i64, now_ms: i64 },
    /// The time field has run out: no ID can be made any more.
    Ended { end_ms: i64, now_ms: i64 },
    /// The time field lasts less than ten years from the epoch.
    Lifetime { end_ms: i64, epoch_ms: i64 },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::Setting {
                name,
                value,
                allowed,
            } => write!(f, "{name} = {value} is out of range ({allowed})"),
            LayoutError::Bits {
                total,
                worker,
                sequence,
            } => write!(
                f,
                "worker_bits ({worker}) + sequence_bits ({sequence}) must leave at least 1 time bit \
                 within total_bits ({total})"
            ),
            LayoutError::EpochInFuture { epoch_ms, now_ms } => write!(
                f,
                "the epoch ({}) is in the future (now is {})",
                format_unix_ms(*epoch_ms),
                format_unix_ms(*now_ms)
            ),
            LayoutError::Ended { end_ms, now_ms } => write!(
                f,
                "the layout's time field ran out at {} (now is {})",
                format_unix_ms(*end_ms),
                format_unix_ms(*now_ms)
            ),
            LayoutError::Lifetime { end_ms, epoch_ms } => write!(
                f,
                "the time field runs out at {}, less than 10 years after the epoch ({})",
                format_unix_ms(*end_ms),
                format_unix_ms(*epoch_ms)
            ),
        }
    }
}

/// A validated layout. Construct it with [`Layout::new`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// Unix milliseconds of tick 0.
    pub epoch_ms: i64,
    /// Milliseconds per tick.
    pub unit_ms: i64,
    pub total_bits: u32,
    pub worker_bits: u32,
    pub sequence_bits: u32,
}

impl Layout {
    /// Validates the settings. `now_ms` is the current Unix time, used to
    /// reject an epoch in the future and a layout that would run out within
    /// ten years: [`Layout::from_settings`] then [`Layout::time_problem`].
    pub fn new(
        epoch_ms: i64,
        unit_ms: i64,
        total_bits: u32,
        worker_bits: u32,
        sequence_bits: u32,
        now_ms: i64,
    ) -> Result<Layout, LayoutError> {
        let layout = Layout::checked(epoch_ms, unit_ms, total_bits, worker_bits, sequence_bits)?;
        match layout.time_problem(now_ms) {
            Some(problem) => Err(problem),
            None => Ok(layout),
        }
    }

    /// Validates the settings without looking at the clock: the ranges, the
    /// bits adding up, and a time field that lasts at least ten years from
    /// the epoch. What the current time allows is [`Layout::time_problem`],
    /// checked when IDs are made, so that a clock set wrong never stops the
    /// server from starting.
    pub fn from_settings(
        epoch_ms: i64,
        unit_ms: i64,
        total_bits: u32,
        worker_bits: u32,
        sequence_bits: u32,
    ) -> Result<Layout, LayoutError> {
        let layout = Layout::checked(epoch_ms, unit_ms, total_bits, worker_bits, sequence_bits)?;
        let end_ms = layout.end_unix_ms();
        if end_ms < epoch_ms.saturating_add(MIN_LIFETIME_MS) {
            return Err(LayoutError::Lifetime { end_ms, epoch_ms });
        }
        Ok(layout)
    }

    /// The ranges and the bits adding up, for a layout read back from a
    /// file rather than built from settings.
    pub fn check_ranges(&self) -> Result<(), LayoutError> {
        Layout::checked(
            self.epoch_ms,
            self.unit_ms,
            self.total_bits,
            self.worker_bits,
            self.sequence_bits,
        )
        .map(|_| ())
    }

    /// The ranges and the bits adding up.
    fn checked(
        epoch_ms: i64,
        unit_ms: i64,
        total_bits: u32,
        worker_bits: u32,
        sequence_bits: u32,
    ) -> Result<Layout, LayoutError> {
        let range = |name: &'static str, value: i64, lo: i64, hi: i64| {
            if (lo..=hi).contains(&value) {
                Ok(())
            } else {
                Err(LayoutError::Setting {
                    name,
                    value,
                    allowed: format!("{lo} to {hi}"),
                })
            }
        };
        range("time_unit_ms", unit_ms, 1, 86_400_000)?;
        range("total_bits", total_bits.into(), 2, 63)?;
        range("worker_bits", worker_bits.into(), 0, MAX_WORKER_BITS.into())?;
        range(
            "sequence_bits",
            sequence_bits.into(),
            1,
            MAX_SEQUENCE_BITS.into(),
        )?;
        if worker_bits + sequence_bits >= total_bits {
            return Err(LayoutError::Bits {
                total: total_bits,
                worker: worker_bits,
                sequence: sequence_bits,
            });
        }
        Ok(Layout {
            epoch_ms,
            unit_ms,
            total_bits,
            worker_bits,
            sequence_bits,
        })
    }

    /// Why this layout cannot make IDs at `now_ms`, if it cannot: the epoch
    /// lies in the future, or the time field has run out. (A layout that
    /// ends soon still makes IDs: [`Layout::years_left`] is for warnings.)
    pub fn time_problem(&self, now_ms: i64) -> Option<LayoutError> {
        if self.epoch_ms > now_ms {
            return Some(LayoutError::EpochInFuture {
                epoch_ms: self.epoch_ms,
                now_ms,
            });
        }
        if self.ended(now_ms) {
            return Some(LayoutError::Ended {
                end_ms: self.end_unix_ms(),
                now_ms,
            });
        }
        None
    }

    /// Whether the time field has run out at `now_ms`.
    pub fn ended(&self, now_ms: i64) -> bool {
        self.end_unix_ms() <= now_ms
    }

    /// Years (of 365.25 days) from `now_ms` until the time field runs out;
    /// negative once it has.
    pub fn years_left(&self, now_ms: i64) -> f64 {
        (self.end_unix_ms() as f64 - now_ms as f64) / MS_PER_YEAR as f64
    }

    /// Whether the time field runs out less than `years` from `now_ms`
    /// (`years` 0: never warn).
    pub fn ends_within(&self, now_ms: i64, years: u32) -> bool {
        years > 0 && self.years_left(now_ms) < f64::from(years)
    }

    /// The settings that differ from `current`, each as
    /// `snowflake_id.NAME SELF (recorded) vs CURRENT (now)`, for the
    /// layout-changed error.
    pub fn differences(&self, current: &Layout) -> Vec<String> {
        let mut out = Vec::new();
        let mut cmp = |name: &str, recorded: String, now: String| {
            if recorded != now {
                out.push(format!(
                    "snowflake_id.{name} {recorded} (recorded) vs {now} (now)"
                ));
            }
        };
        cmp(
            "epoch",
            format_unix_ms(self.epoch_ms),
            format_unix_ms(current.epoch_ms),
        );
        cmp(
            "time_unit_ms",
            self.unit_ms.to_string(),
            current.unit_ms.to_string(),
        );
        cmp(
            "total_bits",
            self.total_bits.to_string(),
            current.total_bits.to_string(),
        );
        cmp(
            "worker_bits",
            self.worker_bits.to_string(),
            current.worker_bits.to_string(),
        );
        cmp(
            "sequence_bits",
            self.sequence_bits.to_string(),
            current.sequence_bits.to_string(),
        );
        out
    }

    pub fn time_bits(&self) -> u32 {
        self.total_bits - self.worker_bits - self.sequence_bits
    }

    pub fn max_ticks(&self) -> i64 {
        (1i64 << self.time_bits()) - 1
    }

    pub fn max_worker_id(&self) -> u32 {
        ((1u64 << self.worker_bits) - 1) as u32
    }

    pub fn max_sequence(&self) -> u32 {
        (1u32 << self.sequence_bits) - 1
    }

    /// The largest ID this layout can produce.
    pub fn max_id(&self) -> i64 {
        // total_bits <= 63, so this never overflows.
        ((1u64 << self.total_bits) - 1) as i64
    }

    /// Builds an ID. Out-of-range parts are an error naming the part.
    pub fn compose(&self, ticks: i64, worker_id: u32, sequence: u32) -> Result<i64, PartError> {
        if !(0..=self.max_ticks()).contains(&ticks) {
            return Err(PartError::Ticks {
                value: ticks,
                max: self.max_ticks(),
            });
        }
        if worker_id > self.max_worker_id() {
            return Err(PartError::Worker {
                value: worker_id.into(),
                max: self.max_worker_id(),
            });
        }
        if sequence > self.max_sequence() {
            return Err(PartError::Sequence {
                value: sequence.into(),
                max: self.max_sequence(),
            });
        }
        Ok(self.compose_unchecked(ticks, worker_id, sequence))
    }

    /// Builds an ID from parts already known to be in range (the generator's
    /// hot path).
    #[inline]
    pub fn compose_unchecked(&self, ticks: i64, worker_id: u32, sequence: u32) -> i64 {
        debug_assert!((0..=self.max_ticks()).contains(&ticks));
        debug_assert!(worker_id <= self.max_worker_id());
        debug_assert!(sequence <= self.max_sequence());
        (ticks << (self.worker_bits + self.sequence_bits))
            | (i64::from(worker_id) << self.sequence_bits)
            | i64::from(sequence)
    }

    /// Splits an ID into its fields. Negative IDs and IDs wider than
    /// `total_bits` are not IDs of this layout.
    pub fn decode(&self, id: i64) -> Result<Parts, PartError> {
        if !(0..=self.max_id()).contains(&id) {
            return Err(PartError::Id {
                value: id,
                max: self.max_id(),
            });
        }
        Ok(Parts {
            ticks: id >> (self.worker_bits + self.sequence_bits),
            worker_id: ((id >> self.sequence_bits) & i64::from(self.max_worker_id())) as u32,
            sequence: (id & ((1i64 << self.sequence_bits) - 1)) as u32,
        })
    }

    /// Unix milliseconds at the start of a tick.
    pub fn tick_start_unix_ms(&self, ticks: i64) -> i64 {
        self.epoch_ms
            .saturating_add(ticks.saturating_mul(self.unit_ms))
    }

    /// The tick containing a Unix millisecond (negative before the epoch).
    #[inline]
    pub fn tick_at(&self, unix_ms: i64) -> i64 {
        let ms = unix_ms.saturating_sub(self.epoch_ms);
        // Millisecond ticks (most layouts) skip the division (hot path).
        if self.unit_ms == 1 {
            ms
        } else {
            ms.div_euclid(self.unit_ms)
        }
    }

    /// [`Self::tick_at`] of a reading of the system clock, for the hot
    /// path: wrapping instead of saturating arithmetic, which is the same
    /// tick for every reading within 2^62 ms of the epoch (any clock's),
    /// and cannot panic either.
    #[inline(always)]
    pub fn clock_tick(&self, unix_ms: i64) -> i64 {
        let ms = unix_ms.wrapping_sub(self.epoch_ms);
        if self.unit_ms == 1 {
            ms
        } else {
            ms.div_euclid(self.unit_ms)
        }
    }

    /// Whole ticks in `ms` milliseconds (rounded down, `ms` >= 0).
    #[inline]
    pub fn whole_ticks(&self, ms: i64) -> i64 {
        if self.unit_ms == 1 {
            ms
        } else {
            ms / self.unit_ms
        }
    }

    /// The last Unix millisecond the time field can express.
    pub fn end_unix_ms(&self) -> i64 {
        self.tick_start_unix_ms(self.max_ticks())
            .saturating_add(self.unit_ms - 1)
    }

    /// The first tick of this layout whose IDs are all larger than every ID
    /// `old` can have issued up to `old_until_ms`; `None` when this layout
    /// cannot get above them.
    pub fn first_tick_above(&self, old: &Layout, old_until_ms: i64) -> Option<i64> {
        let old_tick = old.tick_at(old_until_ms).min(old.max_ticks());
        if old_tick < 0 {
            return Some(0);
        }
        let old_max = old.compose_unchecked(old_tick, old.max_worker_id(), old.max_sequence());
        let tick = (old_max >> (self.worker_bits + self.sequence_bits)) + 1;
        (tick <= self.max_ticks()).then_some(tick)
    }

    /// The smallest ID that can be made at a Unix millisecond (worker and
    /// sequence zero).
    pub fn first_id_at(&self, unix_ms: i64) -> Result<i64, PartError> {
        self.compose(self.tick_at(unix_ms), 0, 0)
    }
}

/// A value that does not fit its field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PartError {
    Ticks { value: i64, max: i64 },
    Worker { value: i64, max: u32 },
    Sequence { value: i64, max: u32 },
    Id { value: i64, max: i64 },
}

impl fmt::Display for PartError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PartError::Ticks { value, max } => {
                write!(f, "time {value} ticks since the epoch is outside 0..{max}")
            }
            PartError::Worker { value, max } => {
                write!(f, "worker id {value} is outside 0..{max}")
            }
            PartError::Sequence { value, max } => {
                write!(f, "sequence {value} is outside 0..{max}")
            }
            PartError::Id { value, max } => {
                write!(f, "{value} is not an ID of this layout (IDs are 0..{max})")
            }
        }
    }
}

/// Why an epoch text was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EpochError {
    /// Digits only, but more than an `i64` holds.
    TooLarge(String),
    /// Neither a date, a date and time, nor Unix milliseconds.
    Malformed(String),
}

impl fmt::Display for EpochError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EpochError::TooLarge(text) => write!(f, "\"{text}\" is too large for Unix milliseconds"),
            EpochError::Malformed(text) => write!(
                f,
                "\"{text}\" is not a UTC date (YYYY-MM-DD), date and time (YYYY-MM-DD HH:MM:SS[.fff][Z]) \
                 or Unix milliseconds"
            ),
        }
    }
}

/// Parses an epoch: Unix milliseconds (`1704067200000`), a date
/// (`2024-01-01`) or a UTC date and time (`2024-01-01 00:00:00`, `T` also
/// accepted, optional `Z`, `+00` or `+00:00`, optional fraction of a second).
pub fn parse_epoch(text: &str) -> Result<i64, EpochError> {
    let s = text.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s
            .parse::<i64>()
            .map_err(|_| EpochError::TooLarge(text.into()));
    }
    let bad = || EpochError::Malformed(text.into());
    let mut rest = s;
    for suffix in ["Z", "z", "+00:00", "+00", "+0000"] {
        if let Some(r) = rest.strip_suffix(suffix) {
            rest = r;
            break;
        }
    }
    let (date, time) = match rest.find([' ', 'T']) {
        Some(i) => (&rest[..i], Some(&rest[i + 1..])),
        None => (rest, None),
    };
    let num = |t: &str, len: usize| -> Result<i64, EpochError> {
        if t.len() == len && t.bytes().all(|b| b.is_ascii_digit()) {
            t.parse::<i64>().map_err(|_| bad())
        } else {
            Err(bad())
        }
    };
    let d: Vec<&str> = date.split('-').collect();
    if d.len() != 3 {
        return Err(bad());
    }
    let (y, m, day) = (num(d[0], 4)?, num(d[1], 2)?, num(d[2], 2)?);
    if !(1..=12).contains(&m) || day < 1 || day > days_in_month(y, m) {
        return Err(bad());
    }
    let mut ms = days_from_civil(y, m, day) * 86_400_000;
    if let Some(t) = time {
        let (hms, frac) = match t.split_once('.') {
            Some((a, b)) => (a, Some(b)),
            None => (t, None),
        };
        let p: Vec<&str> = hms.split(':').collect();
        if p.len() != 3 {
            return Err(bad());
        }
        let (h, mi, sec) = (num(p[0], 2)?, num(p[1], 2)?, num(p[2], 2)?);
        if h > 23 || mi > 59 || sec > 59 {
            return Err(bad());
        }
        ms += ((h * 60 + mi) * 60 + sec) * 1000;
        if let Some(f) = frac {
            if f.is_empty() || f.len() > 3 || !f.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let scale = [100, 10, 1][f.len() - 1];
            ms += f.parse::<i64>().map_err(|_| bad())? * scale;
        }
    }
    Ok(ms)
}

/// Formats Unix milliseconds as `YYYY-MM-DD HH:MM:SS.fffZ` (UTC).
pub fn format_unix_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rem = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3_600_000,
        rem / 60_000 % 60,
        rem / 1000 % 60,
        rem % 1000
    )
}

fn is_leap(y: i64) -> bool {
    (y % 4 == 0 && y % 100 != 0) || y % 400 == 0
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's days_from_civil / civil_from_days (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (
        if m <= 2 {
            yoe + era * 400 + 1
        } else {
            yoe + era * 400
        },
        m,
        d,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_795_305_600_000; // 2026-11-22T00:00:00Z

    fn preset(name: &str) -> Layout {
        let p = PRESETS.iter().find(|p| p.name == name).unwrap();
        p.layout(DEFAULT_EPOCH_MS, NOW).unwrap()
    }

    #[test]
    fn classic_has_41_time_bits_and_composes_like_twitter() {
        let l = preset("classic");
        assert_eq!(l.time_bits(), 41);
        let id = l.compose(5, 3, 7).unwrap();
        assert_eq!(id, (5 << 22) | (3 << 12) | 7);
        assert_eq!(
            l.decode(id).unwrap(),
            Parts {
                ticks: 5,
                worker_id: 3,
                sequence: 7
            }
        );
    }

    #[test]
    fn pgedge_decodes_ids_packed_as_pgedge_packs_them() {
        // pgEdge snowflake 2.6 packs msec << 22 | node << 12 | count, msec
        // since 2023-01-01 (an independent packing, for this test).
        let p = PRESETS.iter().find(|p| p.name == "pgedge").unwrap();
        let l = p.layout(p.epoch_ms, NOW).unwrap();
        let msec: i64 = NOW - PGEDGE_EPOCH_MS;
        let (node, count) = (7_i64, 4095_i64);
        let id = (msec << 22) | (node << 12) | count;
        assert_eq!(
            l.decode(id).unwrap(),
            Parts {
                ticks: msec,
                worker_id: 7,
                sequence: 4095
            }
        );
        assert_eq!(l.tick_start_unix_ms(msec), NOW);
        assert_eq!(format_unix_ms(p.epoch_ms), "2023-01-01 00:00:00.000Z");
        // The other presets keep the default epoch.
        assert!(PRESETS
            .iter()
            .filter(|p| p.name != "pgedge")
            .all(|p| p.epoch_ms == DEFAULT_EPOCH_MS));
    }

    #[test]
    fn every_preset_is_valid_and_round_trips_its_extremes() {
        for p in PRESETS {
            let l = preset(p.name);
            let max = l
                .compose(l.max_ticks(), l.max_worker_id(), l.max_sequence())
                .unwrap();
            assert_eq!(max, l.max_id(), "{}", p.name);
            assert!((max as u64) < (1u64 << p.total_bits));
            assert_eq!(l.decode(max).unwrap().ticks, l.max_ticks());
        }
        assert!(preset("js53").max_id() < (1i64 << 53));
    }

    #[test]
    fn rejects_bad_combinations() {
        assert!(matches!(
            Layout::new(DEFAULT_EPOCH_MS, 1, 63, 10, 0, NOW),
            Err(LayoutError::Setting {
                name: "sequence_bits",
                ..
            })
        ));
        assert!(matches!(
            Layout::new(DEFAULT_EPOCH_MS, 1, 22, 10, 12, NOW),
            Err(LayoutError::Bits { .. })
        ));
        assert!(matches!(
            Layout::new(NOW + 1, 1, 63, 10, 12, NOW),
            Err(LayoutError::EpochInFuture { .. })
        ));
        // 30 time bits of milliseconds last 12 days: long over.
        assert!(matches!(
            Layout::new(DEFAULT_EPOCH_MS, 1, 52, 10, 12, NOW),
            Err(LayoutError::Ended { .. })
        ));
        assert!(matches!(
            Layout::new(DEFAULT_EPOCH_MS, 1, 63, 17, 12, NOW),
            Err(LayoutError::Setting {
                name: "worker_bits",
                ..
            })
        ));
    }

    #[test]
    fn settings_are_checked_without_the_clock() {
        // An epoch after "now" is a valid layout: only making IDs waits.
        let future = Layout::from_settings(NOW + 1, 1, 63, 10, 12).unwrap();
        assert!(matches!(
            future.time_problem(NOW),
            Some(LayoutError::EpochInFuture { .. })
        ));
        assert_eq!(future.time_problem(NOW + 1), None);
        // Classic layout near its end: still makes IDs (with a warning),
        // until its last millisecond; then none.
        let classic = Layout::from_settings(DEFAULT_EPOCH_MS, 1, 63, 10, 12).unwrap();
        assert_eq!(classic.time_problem(NOW), None);
        assert!(!classic.ends_within(NOW, 10));
        let late = classic.end_unix_ms() - MIN_LIFETIME_MS + 1;
        assert_eq!(classic.time_problem(late), None);
        assert!(classic.ends_within(late, 10));
        assert!(!classic.ends_within(late, 0));
        assert!(!classic.ends_within(late, 9));
        assert_eq!(classic.time_problem(classic.end_unix_ms() - 1), None);
        assert!(matches!(
            classic.time_problem(classic.end_unix_ms()),
            Some(LayoutError::Ended { .. })
        ));
        assert!(classic.years_left(classic.end_unix_ms() + MS_PER_YEAR) < 0.0);
        // A time field that can never last ten years is refused outright.
        assert!(matches!(
            Layout::from_settings(DEFAULT_EPOCH_MS, 1, 52, 10, 12),
            Err(LayoutError::Lifetime { .. })
        ));
        assert!(matches!(
            Layout::from_settings(DEFAULT_EPOCH_MS, 1, 22, 10, 12),
            Err(LayoutError::Bits { .. })
        ));
    }

    #[test]
    fn out_of_range_parts_are_errors() {
        let l = preset("classic");
        assert!(matches!(l.compose(-1, 0, 0), Err(PartError::Ticks { .. })));
        assert!(matches!(
            l.compose(0, 1024, 0),
            Err(PartError::Worker { .. })
        ));
        assert!(matches!(
            l.compose(0, 0, 4096),
            Err(PartError::Sequence { .. })
        ));
        assert!(matches!(l.decode(-1), Err(PartError::Id { .. })));
        let js = preset("js53");
        assert!(matches!(js.decode(1 << 53), Err(PartError::Id { .. })));
    }

    #[test]
    fn ticks_follow_the_unit_and_floor_before_the_epoch() {
        let l = preset("sonyflake");
        assert_eq!(l.tick_at(DEFAULT_EPOCH_MS + 25), 2);
        assert_eq!(l.tick_at(DEFAULT_EPOCH_MS - 1), -1);
        assert_eq!(l.tick_start_unix_ms(2), DEFAULT_EPOCH_MS + 20);
        assert_eq!(l.first_id_at(DEFAULT_EPOCH_MS + 25).unwrap(), 2 << 24);
        assert!(l.first_id_at(DEFAULT_EPOCH_MS - 1).is_err());
    }

    #[test]
    fn a_new_layout_starts_above_every_id_of_the_old_one() {
        let classic = preset("classic");
        let sony = preset("sonyflake");
        for (old, new) in [(classic, sony), (sony, classic)] {
            let until = NOW + 1234;
            let tick = new.first_tick_above(&old, until).unwrap();
            let old_max = old
                .compose(old.tick_at(until), old.max_worker_id(), old.max_sequence())
                .unwrap();
            assert!(new.compose(tick, 0, 0).unwrap() > old_max);
            // ... and it is the first such tick.
            assert!(new.compose(tick - 1, 0, 0).unwrap() <= old_max);
        }
        // js53 IDs are all below classic IDs made today: no way up.
        assert_eq!(preset("js53").first_tick_above(&classic, NOW), None);
        // Nothing issued before the old epoch: start anywhere.
        assert_eq!(sony.first_tick_above(&classic, i64::MIN), Some(0));
    }

    #[test]
    fn parses_and_formats_epochs() {
        assert_eq!(parse_epoch("2024-01-01").unwrap(), DEFAULT_EPOCH_MS);
        assert_eq!(
            parse_epoch("2024-01-01 00:00:00+00").unwrap(),
            DEFAULT_EPOCH_MS
        );
        assert_eq!(
            parse_epoch("2024-01-01T00:00:01.5Z").unwrap(),
            DEFAULT_EPOCH_MS + 1500
        );
        assert_eq!(parse_epoch("1288834974657").unwrap(), 1_288_834_974_657);
        assert_eq!(parse_epoch("2000-02-29").unwrap(), 951_782_400_000);
        for bad in [
            "",
            "2024-13-01",
            "2023-02-29",
            "2024-01-01 25:00:00",
            "yesterday",
            "2024-01-01+01",
        ] {
            assert!(parse_epoch(bad).is_err(), "{bad}");
        }
        assert_eq!(
            format_unix_ms(DEFAULT_EPOCH_MS + 1500),
            "2024-01-01 00:00:01.500Z"
        );
        assert_eq!(format_unix_ms(-1), "1969-12-31 23:59:59.999Z");
    }

    #[test]
    fn differences_name_each_changed_setting_recorded_vs_now() {
        let classic = preset("classic");
        assert!(classic.differences(&classic).is_empty());
        assert_eq!(
            classic.differences(&preset("js53")),
            vec![
                "snowflake_id.total_bits 63 (recorded) vs 53 (now)".to_string(),
                "snowflake_id.worker_bits 10 (recorded) vs 6 (now)".to_string(),
                "snowflake_id.sequence_bits 12 (recorded) vs 6 (now)".to_string(),
            ]
        );
        let mut later = classic;
        later.epoch_ms += 1000;
        later.unit_ms = 10;
        assert_eq!(
            classic.differences(&later),
            vec![
                "snowflake_id.epoch 2024-01-01 00:00:00.000Z (recorded) vs 2024-01-01 00:00:01.000Z (now)"
                    .to_string(),
                "snowflake_id.time_unit_ms 1 (recorded) vs 10 (now)".to_string(),
            ]
        );
    }
}
