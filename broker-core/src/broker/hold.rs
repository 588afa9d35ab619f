//! Local holds: after a 429 or an exhausted upstream counter, the attempts
//! this process booked *before* the news (and is sleeping until their send
//! time) must not go out either. The bucket's `nb` stops new bookings;
//! a hold stops the ones already booked, which keep their place in the
//! bucket and go out when the hold ends.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

/// The holds of one resource, by state key. Expired holds are dropped
/// when the map has doubled since the last sweep (each write pays a share
/// of it, not a pass over the whole map), so the map holds fewer than
/// twice the keys held at that sweep (32 at least).
#[derive(Debug, Default)]
pub(crate) struct Holds {
    until: Mutex<Map>,
}

#[derive(Debug, Default)]
struct Map {
    holds: HashMap<String, Instant>,
    /// The length after the last sweep.
    swept: usize,
}

impl Holds {
    /// Holds `key` until `until` (never shortens a longer hold).
    pub(crate) fn hold(&self, key: &str, until: Instant) {
        let mut map = self.until.lock().unwrap_or_else(|p| p.into_inner());
        if map.holds.len() >= 2 * map.swept.max(16) {
            let now = Instant::now();
            map.holds.retain(|_, t| *t > now);
            map.swept = map.holds.len();
        }
        let t = map.holds.entry(key.to_owned()).or_insert(until);
        *t = (*t).max(until);
    }

    /// The end of the hold on `key`, if it is still held.
    pub(crate) fn until(&self, key: &str) -> Option<Instant> {
        let map = self.until.lock().unwrap_or_else(|p| p.into_inner());
        map.holds.get(key).copied().filter(|t| *t > Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_hold_is_never_shortened_and_expires() {
        let h = Holds::default();
        let now = Instant::now();
        h.hold("k", now + Duration::from_secs(10));
        h.hold("k", now + Duration::from_secs(2));
        assert_eq!(h.until("k"), Some(now + Duration::from_secs(10)));
        assert_eq!(h.until("other"), None);
        tokio::time::advance(Duration::from_secs(10)).await;
        assert_eq!(h.until("k"), None);
    }

    /// Holds on many distinct keys, most expired: the map is swept as it
    /// doubles, so it keeps fewer than twice the live holds, not every key
    /// ever held (and each write does not pass over the whole map).
    #[tokio::test(start_paused = true)]
    async fn expired_holds_are_swept_as_the_map_doubles() {
        let h = Holds::default();
        for round in 0..50 {
            let now = Instant::now();
            for i in 0..1000 {
                h.hold(&format!("k{round}-{i}"), now + Duration::from_secs(1));
            }
            tokio::time::advance(Duration::from_secs(2)).await;
        }
        let map = h.until.lock().unwrap();
        assert!(
            map.holds.len() <= 2 * 1000 + 16,
            "{} holds",
            map.holds.len()
        );
    }
}
