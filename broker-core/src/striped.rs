//! `Striped`: a counter bumped on every decision, from every thread,
//! without the threads contending on one atomic.
//!
//! Each of the first [`OWNED`] threads alive at once owns one stripe of
//! every striped counter: only that thread writes it, so its bump is a
//! plain load and store. A thread hands its stripe back when it exits, and
//! the next new thread takes it over; the hand-over goes through a mutex,
//! so the new owner sees the old owner's last store. Threads beyond that
//! share the `SHARED` stripes and add with an atomic read-modify-write.
//! Nothing is lost either way: the value is the sum of the stripes.
//!
//! The stripe index is the crate's to share: [`owned_stripe`] gives it to
//! other per-thread structures.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// Stripes owned by one thread each: the first `OWNED` threads alive at
/// once have an index of their own below it.
pub const OWNED: usize = 16;
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
            // A thread beyond the owned stripes, or one whose stripe was
            // handed back as it exits.
            Some(i) => self.add_shared(i),
            None => self.add_shared(0),
        }
    }

    fn add_shared(&self, i: usize) {
        self.shared[i % SHARED].0.fetch_add(1, Ordering::Relaxed);
    }

    /// The sum of the stripes.
    pub(crate) fn get(&self) -> u64 {
        self.owned
            .iter()
            .chain(&self.shared)
            .fold(0u64, |sum, s| sum.wrapping_add(s.0.load(Ordering::Relaxed)))
    }
}

/// This thread's stripe index, if it owns one: `Some(i)` with
/// `i < OWNED`, which no other thread alive now has. `None` for a thread
/// beyond the first [`OWNED`] alive at once, and for a thread whose
/// thread-locals are being destroyed (its index already handed back).
///
/// ```
/// use broker_core::striped::{owned_stripe, OWNED};
/// let mine = owned_stripe();
/// assert!(mine.is_none_or(|i| i < OWNED));
/// assert_eq!(owned_stripe(), mine, "a thread keeps its index");
/// ```
pub fn owned_stripe() -> Option<usize> {
    stripe_index().filter(|&i| i < OWNED)
}

/// This thread's stripe index, claimed on first use; `None` once its
/// thread-locals are being destroyed. The common case reads `INDEX`, a
/// cell without a destructor, so no check of the thread-local's state
/// comes before it.
fn stripe_index() -> Option<usize> {
    match INDEX.get() {
        UNCLAIMED => claimed_index(),
        i => Some(i),
    }
}

/// [`stripe_index`] before the thread's first claim, or as it exits.
fn claimed_index() -> Option<usize> {
    let i = STRIPE.try_with(Stripe::index).ok()?;
    INDEX.set(i);
    Some(i)
}

/// Stripe indices handed back by exited threads.
static FREE: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// The next index never handed out.
static NEXT: AtomicUsize = AtomicUsize::new(0);

/// This thread's stripe index, taken on its first bump and handed back
/// when it exits.
struct Stripe(Cell<usize>);

/// Not taken yet.
const UNCLAIMED: usize = usize::MAX;

thread_local! {
    static STRIPE: Stripe = const { Stripe(Cell::new(UNCLAIMED)) };
    /// `STRIPE`'s index once claimed, and `UNCLAIMED` again once it is
    /// handed back.
    static INDEX: Cell<usize> = const { Cell::new(UNCLAIMED) };
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
        // Later calls on this thread (from other thread-locals'
        // destructors) find no index, and use a shared stripe.
        INDEX.set(UNCLAIMED);
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
        // Waves of threads, more at once than there are stripes, started
        // together so that they run at once: stripes are handed back and
        // taken over between the waves, and the threads beyond the owned
        // stripes share the others.
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
