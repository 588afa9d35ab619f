//! A strict upstream quota model, independent of broker-core's bucket: the
//! budget is kept exactly in integers (tokens × period), no debt, no
//! not-before.

/// An upstream that admits a request only if a whole token is there when it
/// is received; otherwise it answers 429 and consumes nothing.
#[derive(Debug, Clone)]
pub struct StrictServer {
    /// Capacity in units of 1/period_us token.
    capacity: u128,
    amount: u128,
    period_us: u128,
    /// Current level in units of 1/period_us token.
    level: u128,
    last_us: u64,
}

/// Counts of answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// 200 answers.
    pub ok: u32,
    /// 429 answers.
    pub rejected: u32,
}

impl StrictServer {
    /// `amount` per `period_us` microseconds, at most `capacity` at once.
    pub fn new(capacity: u64, amount: u64, period_us: u64) -> Self {
        Self {
            capacity: capacity as u128 * period_us as u128,
            amount: amount as u128,
            period_us: period_us as u128,
            level: capacity as u128 * period_us as u128,
            last_us: 0,
        }
    }

    /// Receives one request at `at_us`; true for 200, false for 429.
    /// Times must not decrease.
    pub fn receive(&mut self, at_us: u64) -> bool {
        assert!(at_us >= self.last_us, "receive times must not decrease");
        let elapsed = (at_us - self.last_us) as u128;
        self.level = (self.level + elapsed * self.amount).min(self.capacity);
        self.last_us = at_us;
        if self.level >= self.period_us {
            self.level -= self.period_us;
            true
        } else {
            false
        }
    }

    /// Receives requests at the given times (sorted first) and counts.
    pub fn replay(&mut self, times_us: &[u64]) -> Tally {
        let mut sorted = times_us.to_vec();
        sorted.sort_unstable();
        let mut tally = Tally::default();
        for t in sorted {
            if self.receive(t) {
                tally.ok += 1;
            } else {
                tally.rejected += 1;
            }
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_burst_then_refill_rate() {
        let mut s = StrictServer::new(3, 2, 1_000_000);
        assert_eq!(s.replay(&[0, 0, 0, 0]), Tally { ok: 3, rejected: 1 });
        assert!(s.receive(500_000));
        assert!(!s.receive(600_000));
    }
}
