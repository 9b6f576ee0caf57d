//! The checker: the ID time each server used in each block (the
//! simulation gives each block one worker id, so two servers that make IDs
//! of one block at one tick make the same IDs), and whether each server's
//! IDs of a block increase.
//!
//! A server's sessions make an ID every simulated step, but a busy server
//! makes one every tick of the layout: so the checker counts every tick
//! between two IDs of a run (no more than [`GAP`] apart) as used, and two
//! servers whose runs in a block overlap by one tick made the same ID.

use std::collections::HashMap;

/// The longest gap between two IDs of one run, in ticks.
pub const GAP: i64 = 25;

#[derive(Clone, Copy, Debug)]
struct Run {
    who: u32,
    first: i64,
    last: i64,
}

#[derive(Default)]
pub struct Checker {
    /// Per block, every run of every server (the open one last for each).
    runs: HashMap<u32, Vec<Run>>,
    /// (server, block) -> index of its open run in `runs`, and its last
    /// (tick, sequence).
    open: HashMap<(u32, u32), (usize, (i64, u32))>,
    pub ids: u64,
    pub duplicates: u64,
    pub violation: Option<String>,
    pub at_ms: Option<i64>,
}

impl Checker {
    /// Server `who` made an ID of `block` at `tick` with `sequence`, at
    /// simulated `now`.
    pub fn made(&mut self, who: u32, block: u32, tick: i64, sequence: u32, now: i64) {
        self.ids += 1;
        let runs = self.runs.entry(block).or_default();
        let (span, last) = match self.open.get(&(who, block)).copied() {
            Some((i, last)) if tick >= runs[i].last && tick - runs[i].last <= GAP => {
                let from = runs[i].last;
                runs[i].last = tick;
                ((from, tick, i), Some(last))
            }
            open => {
                runs.push(Run {
                    who,
                    first: tick,
                    last: tick,
                });
                ((tick, tick, runs.len() - 1), open.map(|o| o.1))
            }
        };
        self.open.insert((who, block), (span.2, (tick, sequence)));
        if let Some(last) = last.filter(|&l| (tick, sequence) <= l) {
            self.fail(
                now,
                format!(
                    "server {who} block {block}: (tick, sequence) {:?} after {last:?}",
                    (tick, sequence)
                ),
            );
        }
        let clash = self.runs[&block]
            .iter()
            .find(|r| r.who != who && r.first <= span.1 && span.0 <= r.last)
            .copied();
        if let Some(r) = clash {
            self.duplicates += 1;
            self.fail(
                now,
                format!(
                    "block {block}: server {who} used ticks {}..={} and server {} used {}..={}",
                    span.0, span.1, r.who, r.first, r.last
                ),
            );
        }
    }

    /// A bound the registry promises was broken (the lease role's: one
    /// node per session, its blocks within `max_blocks_per_role`).
    pub fn broken(&mut self, now: i64, what: String) {
        self.fail(now, what);
    }

    fn fail(&mut self, now: i64, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
            self.at_ms = Some(now);
        }
    }
}
