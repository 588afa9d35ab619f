//! [`BucketCell`]: a one-bucket state that deciding threads update at
//! once, without a lock of their own: threads holding the shard's read
//! lock, or, for a resource's own state, the registration's decisions
//! through its pin (see [`crate::pinned`]).
//!
//! The cell is a sequence lock whose writers are the `try` decisions
//! themselves. A decision reads the bucket, runs broker-core's reference
//! transition ([`state::try_take_one`]) on the copy, then:
//! - taken: claims the cell by moving its sequence from the even number it
//!   read to the next odd one (one compare-and-swap, which fails if any
//!   other decision wrote in between), stores the new bucket and moves the
//!   sequence on to even again;
//! - denied: checks that the sequence has not moved since it read the
//!   bucket, and writes nothing. A denial leaves the cell's cache line
//!   shared, so two threads denied on one key do not pass it back and forth.
//!
//! Every other transition runs either under the shard's write lock, with
//! no decision in flight, through `&mut` (plain loads and stores), or, on a
//! pinned state, through [`BucketCell::update`], which claims the cell as a
//! taking decision does. A pinned cell the table stops holding is retired
//! ([`BucketCell::retire`]) under such a claim: from then on no decision
//! takes from it, and the decisions through the pin go to the table.

use std::sync::atomic::{fence, AtomicU64, Ordering};

use broker_core::bucket::{BucketParams, BucketState, Shortfall};
use broker_core::state;
use broker_core::{Cost, Micros, Unit};

use crate::backoff::Backoff;

/// Set in the sequence of a retired cell (with the sequence even). The
/// sequence moves by 2 per write and would reach this bit after 2^62
/// writes, centuries of decisions at any rate one cell sees.
const RETIRED: u64 = 1 << 63;

/// One bucket, updated in place by concurrent decisions.
#[derive(Debug)]
pub(crate) struct BucketCell {
    /// Even: the bucket is whole; odd: a decision is storing a new one.
    seq: AtomicU64,
    /// `tokens`, as its bits.
    tokens: AtomicU64,
    ts: AtomicU64,
    /// Changed by other transitions only, never by a decision.
    nb: AtomicU64,
}

impl BucketCell {
    pub(crate) fn new(b: BucketState) -> Self {
        Self {
            seq: AtomicU64::new(0),
            tokens: AtomicU64::new(b.tokens.to_bits()),
            ts: AtomicU64::new(b.ts),
            nb: AtomicU64::new(b.nb),
        }
    }

    /// The bucket, read with no decision in flight (through `&mut`).
    #[inline]
    pub(crate) fn get(&mut self) -> BucketState {
        BucketState {
            tokens: f64::from_bits(*self.tokens.get_mut()),
            ts: *self.ts.get_mut(),
            nb: *self.nb.get_mut(),
        }
    }

    /// Replaces the bucket, with no decision in flight (through `&mut`).
    #[inline]
    pub(crate) fn set(&mut self, b: BucketState) {
        *self.tokens.get_mut() = b.tokens.to_bits();
        *self.ts.get_mut() = b.ts;
        *self.nb.get_mut() = b.nb;
    }

    /// Runs `f` on the bucket while decisions may be in flight: claims the
    /// cell (decisions wait, or retry on what `f` stored), then stores what
    /// `f` left. Should `f` panic, the claim is let go with the bucket as
    /// it was.
    pub(crate) fn update<R>(&self, f: impl FnOnce(&mut BucketState) -> R) -> R {
        let claimed = self.claim_any();
        let mut b = self.bucket();
        let r = f(&mut b);
        self.tokens.store(b.tokens.to_bits(), Ordering::Relaxed);
        self.ts.store(b.ts, Ordering::Relaxed);
        self.nb.store(b.nb, Ordering::Relaxed);
        drop(claimed);
        r
    }

    /// Retires the cell: no decision takes from it from now on (each goes
    /// to the table instead, see [`BucketCell::try_take`]), and the
    /// bucket as of the last one is returned.
    pub(crate) fn retire(&self) -> BucketState {
        let mut claimed = self.claim_any();
        claimed.retire = true;
        self.bucket()
    }

    /// Claims the cell once no decision is storing, whatever it read.
    fn claim_any(&self) -> Claimed<'_> {
        let mut backoff = Backoff::default();
        loop {
            let seq = self.seq.load(Ordering::Relaxed);
            if seq & 1 == 0 && self.claim(seq) {
                return Claimed {
                    cell: self,
                    seq,
                    retire: false,
                };
            }
            backoff.snooze();
        }
    }

    /// The bucket's fields as loaded now: one whole bucket with the cell
    /// claimed, or once [`BucketCell::unchanged`] confirms the sequence
    /// read before them.
    #[inline(always)]
    fn bucket(&self) -> BucketState {
        BucketState {
            tokens: f64::from_bits(self.tokens.load(Ordering::Relaxed)),
            ts: self.ts.load(Ordering::Relaxed),
            nb: self.nb.load(Ordering::Relaxed),
        }
    }

    /// The bucket as of one moment, read while decisions may be in flight.
    pub(crate) fn load(&self) -> BucketState {
        let mut backoff = Backoff::default();
        loop {
            if let Some((b, seq)) = self.read() {
                if self.unchanged(seq) {
                    return b;
                }
            }
            backoff.snooze();
        }
    }

    /// [`state::try_take_one`] on the bucket, while other decisions may be
    /// in flight: the same decision as under a lock, one at a time; `None`
    /// once the cell is retired. Inlined into each caller (the table's
    /// path and the pin's), which it is most of.
    #[inline(always)]
    pub(crate) fn try_take(
        &self,
        unit: Unit,
        params: &BucketParams,
        now: Micros,
        cost: Cost,
    ) -> Option<Result<(), Shortfall>> {
        let mut backoff = Backoff::default();
        loop {
            if let Some((mut b, seq)) = self.read() {
                if seq & RETIRED != 0 {
                    return None;
                }
                match state::try_take_one(&mut b, unit, params, now, cost) {
                    Ok(()) => {
                        if self.claim(seq) {
                            self.tokens.store(b.tokens.to_bits(), Ordering::Relaxed);
                            self.ts.store(b.ts, Ordering::Relaxed);
                            self.seq.store(seq.wrapping_add(2), Ordering::Release);
                            return Some(Ok(()));
                        }
                    }
                    Err(short) => {
                        if self.unchanged(seq) {
                            return Some(Err(short));
                        }
                    }
                }
                // Another decision stored since the read: once it is done
                // (the sequence even again), decide again at once, on the
                // line the failed check just fetched, as a compare-and-swap
                // loop does; wait only while one is storing.
                if self.seq.load(Ordering::Relaxed) & 1 == 0 {
                    continue;
                }
            }
            backoff.snooze();
        }
    }

    /// The bucket and the sequence it was read at; `None` while a decision
    /// is storing.
    #[inline]
    fn read(&self) -> Option<(BucketState, u64)> {
        let seq = self.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            return None;
        }
        Some((self.bucket(), seq))
    }

    /// Whether no decision stored since the sequence read `seq` (the reads
    /// of the bucket before this call saw one whole bucket).
    #[inline]
    fn unchanged(&self, seq: u64) -> bool {
        fence(Ordering::Acquire);
        self.seq.load(Ordering::Relaxed) == seq
    }

    /// Claims the cell for a store, if no decision stored since `seq`.
    #[inline]
    fn claim(&self, seq: u64) -> bool {
        let claimed = self
            .seq
            .compare_exchange(seq, seq | 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok();
        // A reader that sees one of the stores after this fence also sees
        // the odd sequence, and so discards what it read.
        fence(Ordering::Release);
        claimed
    }
}

/// The cell claimed by [`BucketCell::update`] or [`BucketCell::retire`]:
/// let go on drop, also when unwinding (the sequence moves on to even
/// again, retired if asked).
struct Claimed<'a> {
    cell: &'a BucketCell,
    /// The even sequence the claim started from.
    seq: u64,
    retire: bool,
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        let mut next = self.seq.wrapping_add(2);
        if self.retire {
            next |= RETIRED;
        }
        self.cell.seq.store(next, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    fn params(capacity: f64) -> BucketParams {
        BucketParams::new(capacity, 1.0, 1_000_000.0)
    }

    #[test]
    fn concurrent_decisions_take_exactly_the_tokens_there_are() {
        // A bucket of 20,000 tokens that does not refill within the test's
        // frozen `now`: four threads each try 10,000 times; exactly 20,000
        // are taken, and the bucket ends at zero.
        let p = params(20_000.0);
        let cell = Arc::new(BucketCell::new(BucketState::fresh(&p, 5)));
        let taken = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (cell, taken) = (cell.clone(), taken.clone());
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if cell
                            .try_take(Unit::Requests, &p, 5, Cost::requests(1))
                            .is_some_and(|taken| taken.is_ok())
                        {
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(taken.load(Ordering::Relaxed), 20_000);
        let mut cell = Arc::into_inner(cell).unwrap();
        assert_eq!(cell.get().tokens, 0.0);
        assert_eq!(cell.get().ts, 5);
    }

    #[test]
    fn a_decision_matches_the_reference_on_a_copy() {
        let p = params(3.0);
        let mut reference = BucketState::fresh(&p, 0);
        let cell = BucketCell::new(reference);
        for now in [0, 0, 0, 0, 400_000, 1_000_000, 1_000_000, 2_500_000] {
            let want =
                state::try_take_one(&mut reference, Unit::Requests, &p, now, Cost::requests(1));
            let got = cell.try_take(Unit::Requests, &p, now, Cost::requests(1));
            assert_eq!(
                got.map(|got| got.map_err(Shortfall::micros)),
                Some(want.map_err(Shortfall::micros))
            );
            assert_eq!(cell.load(), reference);
        }
    }

    #[test]
    fn a_penalty_set_through_mut_holds_later_decisions() {
        let p = params(3.0);
        let mut cell = BucketCell::new(BucketState::fresh(&p, 0));
        let mut b = cell.get();
        b.nb = 700;
        cell.set(b);
        let wait = cell.try_take(Unit::Requests, &p, 200, Cost::requests(1));
        assert_eq!(wait.map(|w| w.map_err(Shortfall::micros)), Some(Err(500)));
        assert_eq!(cell.load().tokens, 3.0);
    }

    /// Threads taking while another thread updates (gives a token back
    /// each time) and then retires the cell: every token given back is
    /// taken or left, and no decision takes from the retired cell.
    #[test]
    fn updates_and_retirement_lose_no_decision() {
        let p = params(1_000_000.0);
        let mut drained = BucketState::fresh(&p, 5);
        drained.tokens = 0.0;
        let cell = BucketCell::new(drained);
        let taken = AtomicUsize::new(0);
        let after_retirement = AtomicUsize::new(0);
        let retired = std::sync::atomic::AtomicBool::new(false);
        let left = std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| loop {
                    let was_retired = retired.load(Ordering::Acquire);
                    match cell.try_take(Unit::Requests, &p, 5, Cost::requests(1)) {
                        Some(Ok(())) => {
                            taken.fetch_add(1, Ordering::Relaxed);
                            if was_retired {
                                after_retirement.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Some(Err(_)) => {}
                        None => break,
                    }
                });
            }
            for _ in 0..5_000 {
                cell.update(|b| b.tokens += 1.0);
            }
            let left = cell.retire();
            retired.store(true, Ordering::Release);
            left
        });
        assert_eq!(taken.load(Ordering::Relaxed) as f64 + left.tokens, 5_000.0);
        assert_eq!(after_retirement.load(Ordering::Relaxed), 0);
        assert!(cell
            .try_take(Unit::Requests, &p, 5, Cost::requests(1))
            .is_none());
    }

    /// An update whose transition panics lets the cell go as it was.
    #[test]
    fn a_panicking_update_leaves_the_cell_usable() {
        let p = params(3.0);
        let cell = BucketCell::new(BucketState::fresh(&p, 0));
        let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            cell.update(|b| {
                b.tokens = 0.0;
                panic!("a transition that fails");
            })
        }));
        assert!(panicked.is_err());
        assert_eq!(cell.load().tokens, 3.0);
        let taken = cell.try_take(Unit::Requests, &p, 0, Cost::requests(1));
        assert_eq!(taken.map(|t| t.is_ok()), Some(true));
    }
}
