//! Whether a lone call on the direct connection busy-polls for its reply.
//!
//! Polling pays when the reply comes within the budget (Redis on the same
//! host): the call finds it without sleeping. When the round trip is
//! longer (Redis on another host), every poll runs out of budget without
//! the reply, a *miss*, and spends the whole budget of CPU for nothing. So
//! after a miss the next lone call does not poll, after two misses in a
//! row the next two do not, then four, and so on up to [`MAX_SKIP`]; a
//! poll that finds its reply, a *hit*, makes every call poll again.
//!
//! - With Redis on the same host nearly every lone call polls: a miss (a
//!   slow reply now and then) costs one call without polling.
//! - With Redis on another host one lone call in `MAX_SKIP + 1` polls (a
//!   probe), so polling costs on average `budget / (MAX_SKIP + 1)` of CPU
//!   per call.
//! - Only a poll tells whether polling pays: a call that does not poll
//!   sleeps until its reply, and the wake-up is part of the time it waits,
//!   so that time does not say whether the reply would have come within
//!   the budget. The probes are what learns again when the round trip
//!   shortens (at most `MAX_SKIP` calls late).
//!
//! The guard belongs to one connection, used by one call at a time; it has
//! no clock: the caller tells it what each poll found.

/// The most lone calls that go without polling after a run of misses.
pub(crate) const MAX_SKIP: u32 = 1024;

/// What the polls of one connection found so far.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct PollGuard {
    /// Lone calls still to go without polling.
    skip: u32,
    /// The calls skipped after the last miss; zero until a miss, and again
    /// after a hit.
    backoff: u32,
}

impl PollGuard {
    /// Whether the lone call that starts now polls; if it does not, it
    /// counts as one of the calls to skip.
    pub(crate) fn should_poll(&mut self) -> bool {
        if self.skip == 0 {
            return true;
        }
        self.skip -= 1;
        false
    }

    /// The poll found the reply within the budget: the next calls poll.
    pub(crate) fn hit(&mut self) {
        self.skip = 0;
        self.backoff = 0;
    }

    /// The poll ran out of budget without the reply: the next calls skip
    /// polling, twice as many as after the previous miss (one after a
    /// first miss), at most [`MAX_SKIP`].
    pub(crate) fn miss(&mut self) {
        self.backoff = (self.backoff.saturating_mul(2)).clamp(1, MAX_SKIP);
        self.skip = self.backoff;
    }

    /// Lone calls still to go without polling.
    #[cfg(test)]
    fn skipping(&self) -> u32 {
        self.skip
    }
}

#[cfg(test)]
mod tests {
    use super::{PollGuard, MAX_SKIP};

    /// How many lone calls go without polling before the next one polls.
    fn skipped_before_next_poll(g: &mut PollGuard) -> u32 {
        let mut skipped = 0;
        while !g.should_poll() {
            skipped += 1;
            assert!(skipped <= MAX_SKIP, "never polls again");
        }
        skipped
    }

    #[test]
    fn a_new_guard_polls_every_call() {
        let mut g = PollGuard::default();
        for _ in 0..10 {
            assert!(g.should_poll());
        }
        assert_eq!(g, PollGuard::default());
    }

    #[test]
    fn misses_in_a_row_double_the_calls_skipped_up_to_the_cap() {
        let mut g = PollGuard::default();
        let mut seen = Vec::new();
        for _ in 0..14 {
            assert!(g.should_poll(), "a probe");
            g.miss();
            seen.push(skipped_before_next_poll(&mut g));
        }
        assert_eq!(
            seen,
            [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1024, 1024, 1024]
        );
    }

    #[test]
    fn skipped_calls_count_down_one_by_one() {
        let mut g = PollGuard::default();
        g.miss();
        g.miss();
        g.miss();
        assert_eq!(g.skipping(), 4);
        for left in (0..4).rev() {
            assert!(!g.should_poll());
            assert_eq!(g.skipping(), left);
        }
        assert!(g.should_poll());
        assert!(g.should_poll(), "polls until the next miss");
    }

    #[test]
    fn a_hit_resets_the_backoff() {
        let mut g = PollGuard::default();
        for _ in 0..20 {
            g.miss();
        }
        assert_eq!(g.skipping(), MAX_SKIP);
        assert_eq!(skipped_before_next_poll(&mut g), MAX_SKIP);
        g.hit();
        assert_eq!(g, PollGuard::default());
        assert!(g.should_poll());
        g.miss();
        assert_eq!(skipped_before_next_poll(&mut g), 1, "back to one");
    }

    #[test]
    fn a_hit_while_skipping_polls_at_once() {
        // Not reached from the direct connection (a skipped call does not
        // poll, so it neither hits nor misses), but the state stays sound.
        let mut g = PollGuard::default();
        g.miss();
        g.miss();
        g.hit();
        assert!(g.should_poll());
    }

    #[test]
    fn the_cap_holds_after_any_number_of_misses() {
        let mut g = PollGuard::default();
        for _ in 0..100_000 {
            g.miss();
            assert!(g.skipping() >= 1 && g.skipping() <= MAX_SKIP);
        }
        assert_eq!(g.skipping(), MAX_SKIP);
    }
}
