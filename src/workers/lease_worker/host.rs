//! The holder's `Host`: the lease state put into this server's slots in
//! shared memory.

use super::*;

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
    fn activate(&mut self, block: u32, floor_ms: i64, high_ms: i64) {
        let floor = floor_word(self.layout, self.layout.tick_at(floor_ms));
        let limit = self.layout.tick_at(high_ms);
        let slots = self.block_slots(block);
        let _guard = self.header.lock(true);
        for slot in slots {
            // Above every ID of the block's earlier holders, also for a
            // session still on it from an earlier lease (the position only
            // grows; sharers' compare-and-swap starts from the new value).
            slot.position.fetch_max(floor, Relaxed);
            slot.set_lease(limit);
        }
        self.header.lease.changes.fetch_add(1, Relaxed);
    }

    fn raise(&mut self, block: u32, high_ms: i64) {
        let limit = self.layout.tick_at(high_ms);
        for slot in self.block_slots(block) {
            slot.limit_tick.fetch_max(limit, AcqRel);
        }
    }

    fn revoke(&mut self, block: u32) {
        let slots = self.block_slots(block);
        let _guard = self.header.lock(true);
        for slot in slots {
            slot.set_lease(NO_LEASE);
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
                slot.set_lease(NO_LEASE);
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
