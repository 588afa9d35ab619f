//! [`Backoff`]: how a thread waits for another one's few stores (a
//! decision storing a bucket, a reader leaving a shard): spins first, then
//! yields the core, then sleeps, so a thread that waits on a descheduled
//! one does not burn its core for long (and makes progress even where
//! yielding does not let the other run, as under a real-time policy).

use std::time::Duration;

/// Waits with exponential spinning, then yields, then short sleeps.
#[derive(Default)]
pub(crate) struct Backoff(u32);

/// Rounds of spinning (1, 2, 4, ... spins), then of yielding.
const SPIN_ROUNDS: u32 = 6;
const YIELD_ROUNDS: u32 = 16;
/// The sleep once spinning and yielding have not been enough.
const NAP: Duration = Duration::from_micros(50);

impl Backoff {
    /// Waits a little longer than the last time.
    #[cold]
    pub(crate) fn snooze(&mut self) {
        if self.0 < SPIN_ROUNDS {
            for _ in 0..(1u32 << self.0) {
                std::hint::spin_loop();
            }
        } else if self.0 < SPIN_ROUNDS + YIELD_ROUNDS {
            std::thread::yield_now();
        } else {
            std::thread::sleep(NAP);
        }
        self.0 = self.0.saturating_add(1);
    }
}
