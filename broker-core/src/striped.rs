//! `Striped`: a counter bumped from every thread without contention. Each of
//! the first `OWNED` live threads owns a stripe only it writes (handed over
//! through a mutex when it exits); others share `SHARED` atomic stripes.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Stripes owned by one thread each.
pub(crate) const OWNED: usize = 16;
/// Stripes shared, with atomic adds, by the threads beyond [`OWNED`].
pub(crate) const SHARED: usize = 4;

/// One stripe, padded so that no two threads write the same line.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded(AtomicU64);

/// A monotonic counter bumped by many threads at once (see the module).
#[derive(Debug, Default)]
pub(crate) struct Striped {
    owned: [Padded; OWNED],
    shared: [Padded; SHARED],
}

impl Striped {
    /// Adds one.
    pub(crate) fn bump(&self) {
        match stripe_index() {
            Some(i) if i < OWNED => {
                // Only this thread writes this stripe.
                let c = &self.owned[i].0;
                c.store(c.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
            }
            // Beyond the owned stripes, or exiting (stripe handed back).
            i => {
                let shared = &self.shared[i.unwrap_or(0) % SHARED].0;
                shared.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// The sum of the stripes.
    pub(crate) fn get(&self) -> u64 {
        self.owned
            .iter()
            .chain(&self.shared)
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// This thread's stripe index, claimed on first use; `None` once its
/// thread-locals are being destroyed.
fn stripe_index() -> Option<usize> {
    STRIPE.try_with(Stripe::index).ok()
}

/// Stripe indices handed back by exited threads.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The next index never handed out.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// This thread's stripe index, handed back when it exits.
struct Stripe(Cell<usize>);

/// Not taken yet.
const UNCLAIMED: usize = usize::MAX;

thread_local! {
    static STRIPE: Stripe = const { Stripe(Cell::new(UNCLAIMED)) };
}

impl Stripe {
    fn index(&self) -> usize {
        match self.0.get() {
            UNCLAIMED => self.claim(),
            i => i,
        }
    }

    fn claim(&self) -> usize {
        let freed = FREE.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let i = freed.unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed));
        self.0.set(i);
        i
    }
}

impl Drop for Stripe {
    fn drop(&mut self) {
        let i = self.0.get();
        if i < OWNED {
            FREE.lock().unwrap_or_else(PoisonError::into_inner).push(i);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_bump_is_counted_while_threads_come_and_go() {
        const BUMPS: u64 = 100_000;
        let c = Striped::default();
        // Waves of more threads than stripes: stripes change hands between waves.
        let per_wave = OWNED + SHARED + 3;
        for _ in 0..3 {
            let start = std::sync::Barrier::new(per_wave);
            std::thread::scope(|s| {
                for _ in 0..per_wave {
                    s.spawn(|| {
                        start.wait();
                        for _ in 0..BUMPS {
                            c.bump();
                        }
                    });
                }
            });
        }
        assert_eq!(c.get(), 3 * per_wave as u64 * BUMPS);
    }

    #[test]
    fn threads_alive_at_once_never_own_the_same_stripe() {
        let c = Striped::default();
        let per_wave = OWNED + SHARED + 3;
        for _ in 0..3 {
            let all_alive = std::sync::Barrier::new(per_wave);
            let owned = Mutex::new(Vec::new());
            std::thread::scope(|s| {
                for _ in 0..per_wave {
                    s.spawn(|| {
                        c.bump();
                        let i = STRIPE.with(Stripe::index);
                        // Every thread of the wave holds its index now.
                        all_alive.wait();
                        if i < OWNED {
                            owned.lock().unwrap().push(i);
                        }
                    });
                }
            });
            let mut owned = owned.into_inner().unwrap();
            let taken = owned.len();
            owned.sort_unstable();
            owned.dedup();
            assert_eq!(owned.len(), taken, "an owned stripe held by two threads");
        }
        assert_eq!(c.get(), 3 * per_wave as u64);
    }
}
