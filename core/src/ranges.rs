//! Worker id ranges such as `0-15,32,40-47`: pure parsing, no PostgreSQL.

use std::fmt;

/// Why a worker-id range text was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RangeError {
    /// A part is not a number or a range of numbers.
    NotAnId { part: String },
    /// A number does not fit a worker id.
    TooLarge { part: String },
    /// A range's start is after its end.
    Empty { part: String },
    /// A range goes beyond the layout's largest worker id.
    BeyondLayout { part: String, max: u32 },
    /// Two ranges overlap.
    Overlap {
        first: (u32, u32),
        second: (u32, u32),
    },
}

impl fmt::Display for RangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RangeError::NotAnId { part } => write!(
                f,
                "\"{part}\" is not a worker id or a range of them (write e.g. 0-15,32,40-47)"
            ),
            RangeError::TooLarge { part } => write!(f, "\"{part}\" is too large for a worker id"),
            RangeError::Empty { part } => write!(
                f,
                "\"{part}\" is an empty range (its start is after its end)"
            ),
            RangeError::BeyondLayout { part, max } => write!(
                f,
                "\"{part}\" goes beyond the largest worker id of the layout, {max}"
            ),
            RangeError::Overlap { first, second } => write!(
                f,
                "the ranges {}-{} and {}-{} overlap",
                first.0, first.1, second.0, second.1
            ),
        }
    }
}

/// A set of worker ids, as sorted, non-overlapping inclusive ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerRanges(Vec<(u32, u32)>);

impl WorkerRanges {
    /// Every id from 0 to `max`.
    pub fn all(max: u32) -> Self {
        WorkerRanges(vec![(0, max)])
    }

    /// Parses `text` (empty means every id of the layout) and checks it
    /// against the largest worker id, `max`.
    pub fn parse(text: &str, max: u32) -> Result<Self, RangeError> {
        let text = text.trim();
        if text.is_empty() {
            return Ok(Self::all(max));
        }
        let mut ranges = Vec::new();
        for part in text.split(',') {
            let part = part.trim();
            let (lo, hi) = match part.split_once('-') {
                Some((a, b)) => (number(a, part)?, number(b, part)?),
                None => {
                    let n = number(part, part)?;
                    (n, n)
                }
            };
            if lo > hi {
                return Err(RangeError::Empty { part: part.into() });
            }
            if hi > max {
                return Err(RangeError::BeyondLayout {
                    part: part.into(),
                    max,
                });
            }
            ranges.push((lo, hi));
        }
        ranges.sort_unstable();
        for w in ranges.windows(2) {
            if w[1].0 <= w[0].1 {
                return Err(RangeError::Overlap {
                    first: w[0],
                    second: w[1],
                });
            }
        }
        Ok(WorkerRanges(ranges))
    }

    /// How many ids the set holds.
    pub fn len(&self) -> u64 {
        self.0.iter().map(|&(lo, hi)| u64::from(hi - lo) + 1).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains(&self, id: u32) -> bool {
        self.0.iter().any(|&(lo, hi)| (lo..=hi).contains(&id))
    }

    /// The ids of `self` that are not in `other`.
    pub fn without(&self, other: &WorkerRanges) -> WorkerRanges {
        let mut out = Vec::new();
        for &(lo, hi) in &self.0 {
            // The next id of [lo, hi] not yet placed; None: none is left.
            let mut start = Some(lo);
            for &(olo, ohi) in &other.0 {
                let Some(from) = start else { break };
                if ohi < from || olo > hi {
                    continue;
                }
                if olo > from {
                    out.push((from, olo - 1));
                }
                start = ohi.checked_add(1).filter(|&next| next <= hi);
            }
            if let Some(from) = start {
                out.push((from, hi));
            }
        }
        WorkerRanges(out)
    }

    /// Whether an id is in both sets.
    pub fn overlaps(&self, other: &WorkerRanges) -> bool {
        self.0
            .iter()
            .any(|&(lo, hi)| other.0.iter().any(|&(olo, ohi)| olo <= hi && lo <= ohi))
    }

    /// The ranges, sorted, as inclusive `(first, last)` pairs.
    pub fn ranges(&self) -> &[(u32, u32)] {
        &self.0
    }

    /// Every id, in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.0.iter().flat_map(|&(lo, hi)| lo..=hi)
    }
}

impl fmt::Display for WorkerRanges {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, &(lo, hi)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            if lo == hi {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

fn number(s: &str, part: &str) -> Result<u32, RangeError> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(RangeError::NotAnId { part: part.into() });
    }
    s.parse::<u32>()
        .map_err(|_| RangeError::TooLarge { part: part.into() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lists_and_ranges() {
        let r = WorkerRanges::parse(" 32, 0-3 ,40-41", 1023).unwrap();
        assert_eq!(r.iter().collect::<Vec<_>>(), vec![0, 1, 2, 3, 32, 40, 41]);
        assert_eq!(r.len(), 7);
        assert!(r.contains(41) && !r.contains(4));
        assert_eq!(r.to_string(), "0-3,32,40-41");
        assert_eq!(WorkerRanges::parse("", 63).unwrap(), WorkerRanges::all(63));
        assert_eq!(WorkerRanges::all(1023).len(), 1024);
    }

    #[test]
    fn without_and_overlaps() {
        let all = WorkerRanges::all(1023);
        let bf = WorkerRanges::parse("1020-1023", 1023).unwrap();
        assert_eq!(all.without(&bf).to_string(), "0-1019");
        assert!(all.overlaps(&bf));
        let r = WorkerRanges::parse("0-15,32-47", 1023).unwrap();
        let cut = WorkerRanges::parse("3,10-33,47", 1023).unwrap();
        assert_eq!(r.without(&cut).to_string(), "0-2,4-9,34-46");
        assert!(!r.without(&cut).overlaps(&cut));
        assert!(!WorkerRanges::parse("0-9", 1023).unwrap().overlaps(&bf));
        let top = WorkerRanges::parse("4294967295", u32::MAX).unwrap();
        assert_eq!(
            WorkerRanges::all(u32::MAX).without(&top).to_string(),
            "0-4294967294"
        );
        assert!(all.without(&all).is_empty());
    }

    #[test]
    fn rejects_bad_text_and_ids_outside_the_layout() {
        for bad in [
            "x",
            "1-",
            "-1",
            "3-1",
            "0-1024",
            "1,,2",
            "0-5,5-6",
            "99999999999",
        ] {
            assert!(WorkerRanges::parse(bad, 1023).is_err(), "{bad}");
        }
        let e = WorkerRanges::parse("0-1023", 63).unwrap_err();
        assert_eq!(
            e,
            RangeError::BeyondLayout {
                part: "0-1023".into(),
                max: 63
            }
        );
        assert!(
            e.to_string()
                .contains("largest worker id of the layout, 63"),
            "{e}"
        );
    }
}
