//! A tiny deterministic generator for test arrival, give-up and drop times.

/// A linear congruential generator: the same seed gives the same sequence.
///
/// ```
/// let mut rng = broker_testkit::Lcg(7);
/// assert!(rng.next(10) < 10);
/// ```
pub struct Lcg(pub u64);

impl Lcg {
    /// The next number below `bound`.
    pub fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}
