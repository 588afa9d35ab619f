//! Local penalties: after a 429 or an exhausted upstream counter, the
//! attempts this process booked before the news wait until it ends.

use std::collections::HashMap;

use parking_lot::Mutex;
use tokio::time::Instant;

/// The penalties of one resource, by state key. Expired ones are swept
/// when the map has doubled since the last sweep.
#[derive(Debug, Default)]
pub(crate) struct Penalties {
    until: Mutex<Map>,
}

#[derive(Debug, Default)]
struct Map {
    ends: HashMap<String, Instant>,
    /// The length after the last sweep.
    swept: usize,
}

impl Penalties {
    /// Penalizes `key` until `until` (never shortens a longer penalty).
    pub(crate) fn penalize(&self, key: &str, until: Instant) {
        let mut map = self.until.lock();
        if map.ends.len() >= 2 * map.swept.max(16) {
            let now = Instant::now();
            map.ends.retain(|_, t| *t > now);
            map.swept = map.ends.len();
        }
        let t = map.ends.entry(key.to_owned()).or_insert(until);
        *t = (*t).max(until);
    }

    /// The end of the penalty on `key`, if it is still in force.
    pub(crate) fn until(&self, key: &str) -> Option<Instant> {
        let map = self.until.lock();
        map.ends.get(key).copied().filter(|t| *t > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_penalty_is_never_shortened_and_expires() {
        let p = Penalties::default();
        let now = Instant::now();
        p.penalize("k", now + Duration::from_secs(10));
        p.penalize("k", now + Duration::from_secs(2));
        assert_eq!(p.until("k"), Some(now + Duration::from_secs(10)));
        assert_eq!(p.until("other"), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(p.until("k"), None);
    }

    /// Many keys penalized, most expired: the map, swept as it doubles, keeps
    /// fewer than twice the live penalties.
    #[tokio::test(start_paused = true)]
    async fn expired_penalties_are_swept_as_the_map_doubles() {
        let p = Penalties::default();
        for round in 0..50 {
            let now = Instant::now();
            for i in 0..1000 {
                p.penalize(&format!("k{round}-{i}"), now + Duration::from_secs(1));
            }
            tokio::time::advance(Duration::from_secs(2)).await;
        }
        let map = p.until.lock();
        assert!(
            map.ends.len() <= 2 * 1000 + 16,
            "{} penalties",
            map.ends.len()
        );
    }
}
