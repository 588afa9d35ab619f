//! [`RawBiased`]: the shards' read-write lock, biased to readers. A thread
//! taking the read side marks a flag of its own, on a cache line of its
//! own, instead of adding to a count that every reader shares: two threads
//! reading one shard (two `try` decisions on one key) then pass no line
//! back and forth for the lock, only the state they both update.
//!
//! Each of the first [`OWNED`] threads alive at once has a reader flag per
//! lock ([`owned_stripe`]). A reader sets its flag, then looks whether a
//! writer is in; a writer takes the underlying lock, says it is in, then
//! waits until no flag is set. Both steps are sequentially consistent, so
//! of a reader and a writer arriving together at least one sees the other
//! (the reader then backs off to the underlying lock). Threads beyond the
//! owned ones, and readers that met a writer, read through the underlying
//! lock. Writers pay for the bias: they look at every flag.
//!
//! As with `std`'s lock, a thread must not take the read side again while
//! it holds it: a thread without a flag would wait behind a waiting writer
//! (the table never does).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use broker_core::striped::{owned_stripe, OWNED};
use lock_api::{GuardNoSend, RawRwLock};

use crate::backoff::Backoff;

/// A read-write lock biased to readers (see the module).
pub(crate) type BiasedRwLock<T> = lock_api::RwLock<RawBiased, T>;

/// The raw lock of [`BiasedRwLock`].
pub(crate) struct RawBiased {
    /// Taken by writers, and by readers without a flag of their own.
    inner: parking_lot::RawRwLock,
    /// A writer holds `inner` and is in or waiting for the flagged
    /// readers to leave.
    writing: AtomicBool,
    /// How many read locks each owned stripe's thread holds through its
    /// flag (only that thread writes it).
    readers: [Flag; OWNED],
}

/// One thread's reader count, alone on its cache line pair.
#[repr(align(128))]
struct Flag(AtomicU32);

impl RawBiased {
    /// Waits until no thread holds the lock through its flag.
    fn wait_for_readers(&self) {
        for flag in &self.readers {
            let mut backoff = Backoff::default();
            while flag.0.load(Ordering::SeqCst) != 0 {
                backoff.snooze();
            }
        }
    }

    /// Takes the read side through this thread's flag; false when the
    /// thread has none or a writer is in (then the flag is left as it was).
    #[inline]
    fn lock_flagged(&self) -> bool {
        let Some(i) = owned_stripe() else {
            return false;
        };
        let flag = &self.readers[i].0;
        let held = flag.load(Ordering::Relaxed);
        flag.swap(held + 1, Ordering::SeqCst);
        // A read lock already held through the flag keeps writers out: a
        // nested one needs no look at `writing`.
        if held > 0 || !self.writing.load(Ordering::SeqCst) {
            return true;
        }
        flag.store(held, Ordering::Release);
        false
    }
}

// SAFETY: the read side is held either through `inner` (shared) or through
// the thread's flag; the write side holds `inner` exclusively and enters
// only once every flag is clear, after saying it is in, and a reader
// setting its flag looks for a writer after setting it (both steps
// sequentially consistent), so no reader holds its flag while a writer is
// in. `unlock_shared` is called on the thread that locked (the guards are
// not `Send`), whose flag count then covers exactly the read locks it took
// through the flag, and `inner`'s shared count the others.
unsafe impl RawRwLock for RawBiased {
    #[allow(clippy::declare_interior_mutable_const)]
    const INIT: Self = Self {
        inner: <parking_lot::RawRwLock as RawRwLock>::INIT,
        writing: AtomicBool::new(false),
        readers: [const { Flag(AtomicU32::new(0)) }; OWNED],
    };

    type GuardMarker = GuardNoSend;

    #[inline]
    fn lock_shared(&self) {
        if !self.lock_flagged() {
            self.inner.lock_shared();
        }
    }

    #[inline]
    fn try_lock_shared(&self) -> bool {
        self.lock_flagged() || self.inner.try_lock_shared()
    }

    #[inline]
    unsafe fn unlock_shared(&self) {
        if let Some(i) = owned_stripe() {
            let flag = &self.readers[i].0;
            let held = flag.load(Ordering::Relaxed);
            if held > 0 {
                flag.store(held - 1, Ordering::Release);
                return;
            }
        }
        // The read side was taken through `inner` only if this thread had
        // no flag then, or met a writer: a thread keeps its stripe while
        // it runs, and no read guard outlives the thread's stripe (guards
        // stay inside the table's calls, none is held by a thread-local).
        debug_assert!(self.inner.is_locked(), "a read unlock without a read lock");
        // SAFETY: this thread holds the read side, not through its flag,
        // so through `inner`.
        unsafe { self.inner.unlock_shared() }
    }

    fn lock_exclusive(&self) {
        self.inner.lock_exclusive();
        self.writing.store(true, Ordering::SeqCst);
        self.wait_for_readers();
    }

    fn try_lock_exclusive(&self) -> bool {
        if !self.inner.try_lock_exclusive() {
            return false;
        }
        self.writing.store(true, Ordering::SeqCst);
        if self.readers.iter().all(|f| f.0.load(Ordering::SeqCst) == 0) {
            return true;
        }
        // A flagged reader is in: give up rather than wait.
        self.writing.store(false, Ordering::Release);
        // SAFETY: taken on `inner` just above, by this thread.
        unsafe { self.inner.unlock_exclusive() };
        false
    }

    unsafe fn unlock_exclusive(&self) {
        self.writing.store(false, Ordering::Release);
        // SAFETY: this thread holds the write side, taken on `inner`.
        unsafe { self.inner.unlock_exclusive() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn writers_and_readers_never_overlap() {
        // A pair that writers change together and readers check together:
        // a reader in while a writer is would see them differ. Readers
        // beyond the owned stripes read through the underlying lock.
        let lock = BiasedRwLock::new((0u64, 0u64));
        let threads = OWNED + 4;
        let start = Barrier::new(threads);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (lock, start) = (&lock, &start);
                s.spawn(move || {
                    start.wait();
                    for n in 0..20_000u64 {
                        if t % 4 == 0 && n % 8 == 0 {
                            let mut w = lock.write();
                            w.0 += 1;
                            std::hint::black_box(&mut *w);
                            w.1 += 1;
                        } else {
                            let r = lock.read();
                            assert_eq!(r.0, r.1, "a reader saw a write half done");
                            // A nested read, on a thread with a flag.
                            if n % 16 == 1 && owned_stripe().is_some() {
                                assert_eq!(lock.read().0, r.0);
                            }
                        }
                    }
                });
            }
        });
        let writers = (0..threads).filter(|t| t % 4 == 0).count() as u64;
        assert_eq!(*lock.read(), (writers * 2_500, writers * 2_500));
    }

    #[test]
    fn a_try_for_the_write_side_fails_while_a_flagged_reader_is_in() {
        let lock = BiasedRwLock::new(0u32);
        let read = lock.read();
        std::thread::scope(|s| {
            s.spawn(|| assert!(lock.try_write().is_none()));
        });
        drop(read);
        *lock.try_write().expect("no reader left") += 1;
        assert_eq!(*lock.read(), 1);
    }

    #[test]
    fn a_writer_waits_for_a_flagged_reader() {
        let lock = BiasedRwLock::new(0u32);
        let read = lock.read();
        std::thread::scope(|s| {
            let w = s.spawn(|| *lock.write() += 1);
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(*read, 0, "the writer came in under a read lock");
            assert!(!w.is_finished());
            drop(read);
            w.join().unwrap();
        });
        assert_eq!(*lock.read(), 1);
    }
}
