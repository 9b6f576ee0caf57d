//! Micro-benchmarks of the pure core: the cost of the clock and sequence rules
//! and of the public-ID cipher, without PostgreSQL. `cargo bench -p
//! snowflake_core`. The end-to-end cost of an ID inside PostgreSQL is
//! measured by bench/ (case 1), side by side with the baselines.

use snowflake_core::generator::{Clock, GeneratorState};
use snowflake_core::layout::PRESETS;
use snowflake_core::public_id::Codec;

fn main() {
    divan::main();
}

/// A clock that advances one millisecond every 4,096 readings: the
/// sequence fills as it does at about 4 million IDs a second.
struct SteppingClock {
    ms: i64,
    reads: u32,
}

impl Clock for SteppingClock {
    fn now_ms(&mut self) -> i64 {
        self.reads += 1;
        if self.reads.is_multiple_of(4096) {
            self.ms += 1;
        }
        self.ms
    }
    fn sleep_ms(&mut self, ms: i64) {
        self.ms += ms;
    }
}

const NOW_MS: i64 = 1_790_000_000_000;

#[divan::bench(args = ["classic", "sonyflake", "js53"])]
fn next_id(bencher: divan::Bencher, preset: &str) {
    let Some(preset) = PRESETS.iter().find(|p| p.name == preset) else {
        return;
    };
    let Ok(layout) = preset.layout(NOW_MS - 1000, NOW_MS) else {
        return;
    };
    let mut state = GeneratorState::new(&layout);
    let mut clock = SteppingClock {
        ms: NOW_MS,
        reads: 0,
    };
    bencher.bench_local(|| state.next_id(&layout, 7, 1000, &mut clock));
}

#[divan::bench]
fn public_id_encode(bencher: divan::Bencher) {
    let codec = Codec::new(&[[7u8; 16]], 63);
    let mut id: u64 = 1 << 40;
    bencher.bench_local(|| {
        id += 1;
        codec.encode(divan::black_box(id))
    });
}
