//! Shared memory as the lease worker sees it: the holder's `Host` (the
//! lease state put into this server's slots), the slots' usage it reads,
//! and the lease state it publishes for backends and `snowflake_config()`.

use super::file::{save_lease_file, FileContext};
use super::Worker;

use crate::clock;
use crate::shmem::{self, Header, NO_LEASE};
use snowflake_core::generator::{floor_word, unpack};
use snowflake_core::holder::{self, Holder};
use snowflake_core::layout::Layout;
use snowflake_core::lease::{self, Usage};
use std::sync::atomic::Ordering::{Relaxed, Release};

/// The slots of this server, as the holder changes them.
pub(super) struct ShmHost<'a> {
    pub(super) header: &'static Header,
    pub(super) layout: &'a Layout,
    pub(super) file: &'a mut FileContext,
}

impl<'a> ShmHost<'a> {
    pub(super) fn new(
        header: &'static Header,
        layout: &'a Layout,
        file: &'a mut FileContext,
    ) -> ShmHost<'a> {
        ShmHost {
            header,
            layout,
            file,
        }
    }

    fn block_slots(&self, block: u32) -> &'static [shmem::Slot] {
        let size = lease::block_size(self.layout.max_worker_id());
        let (first, last) = lease::block_ids(block, size, self.layout.max_worker_id());
        &self.header.slots()[first as usize..=last as usize]
    }
}

impl holder::Host for ShmHost<'_> {
    fn activate(&mut self, block: u32, floor_ms: i64, high_ms: i64, stop_ms: i64) {
        let floor = floor_word(self.layout, self.layout.tick_at(floor_ms));
        let limit = self.layout.tick_at(high_ms);
        let slots = self.block_slots(block);
        let _guard = self.header.lock(true);
        for slot in slots {
            // Above every ID of the block's earlier holders, also for a
            // session still on it from an earlier lease (the position only
            // grows; sharers' compare-and-swap starts from the new value).
            slot.position.fetch_max(floor, Relaxed);
            slot.set_lease(limit, stop_ms);
        }
        self.header.lease.changes.fetch_add(1, Relaxed);
    }

    fn raise(&mut self, block: u32, high_ms: i64, stop_ms: i64) {
        let limit = self.layout.tick_at(high_ms);
        for slot in self.block_slots(block) {
            slot.raise_lease(limit, stop_ms);
        }
    }

    fn revoke(&mut self, block: u32) {
        let slots = self.block_slots(block);
        let _guard = self.header.lock(true);
        for slot in slots {
            slot.set_lease(NO_LEASE, NO_LEASE);
        }
        self.header.lease.changes.fetch_add(1, Relaxed);
    }

    fn stop_if_idle(&mut self, block: u32) -> Option<Option<i64>> {
        let slots = self.block_slots(block);
        let newest = {
            let _guard = self.header.lock(true);
            if slots.iter().any(|s| s.sessions.load(Relaxed) != 0) {
                return None;
            }
            for slot in slots {
                slot.set_lease(NO_LEASE, NO_LEASE);
            }
            self.header.lease.changes.fetch_add(1, Relaxed);
            slots
                .iter()
                .map(|s| unpack(self.layout, s.position.load(Relaxed)).0)
                .max()
        };
        Some(
            newest
                .filter(|&t| t >= 0)
                .map(|t| self.layout.tick_start_unix_ms(t)),
        )
    }

    fn save(&mut self, holder: &Holder) {
        save_lease_file(self.file, holder);
    }
}

/// Gives every slot the limit `limit` (`NO_LEASE`: none may be used;
/// `i64::MAX`: this server's own worker ids, no lease), and the same stop.
pub(super) fn set_all_limits(header: &Header, limit: i64) {
    let _guard = header.lock(true);
    for slot in header.slots() {
        slot.set_lease(limit, limit);
    }
    header.lease.changes.fetch_add(1, Relaxed);
}

/// What the worker reads from and publishes to shared memory.
impl Worker {
    /// How many ids of each held block this server may use, and how many
    /// have sessions.
    pub(super) fn usage(&self) -> Vec<Usage> {
        let (ranges, _) = crate::settings::worker_ranges();
        let slots = self.header.slots();
        let max = self.layout.max_worker_id();
        let size = self.holder.id().block_size;
        let mut out = Vec::with_capacity(self.holder.held().len());
        let _guard = self.header.lock(false);
        for h in self.holder.held() {
            let (first, last) = lease::block_ids(h.block, size, max);
            let mut u = Usage {
                block: h.block,
                ids: 0,
                busy: 0,
            };
            for id in (first..=last).filter(|id| ranges.contains(*id)) {
                u.ids += 1;
                if slots[id as usize].sessions.load(Relaxed) != 0 {
                    u.busy += 1;
                }
            }
            out.push(u);
        }
        out
    }

    /// Publishes what backends and `snowflake_config()` report.
    pub(super) fn publish(&self) {
        let lease = &self.header.lease;
        let active: Vec<_> = self.holder.held().iter().filter(|h| h.active).collect();
        lease.blocks_held.store(active.len() as u32, Release);
        let now_mono = self.mono_ms();
        // With nothing held, the last deadline stays: messages say when
        // the leases ran out.
        if let Some(d) = active.iter().map(|h| h.deadline_mono_ms).min() {
            lease
                .deadline_ms
                .store(clock::unix_ms() + (d - now_mono), Release);
        }
    }
}
