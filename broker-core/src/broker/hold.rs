//! Local holds: after a 429 or an exhausted upstream counter, the attempts
//! this process booked *before* the news (and is sleeping until their send
//! time) must not go out either. The bucket's `nb` stops new reservations;
//! a hold stops the ones already booked, which keep their place in the
//! bucket and go out when the hold ends.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::time::Instant;

/// The holds of one resource, by state key. Expired holds are dropped on
/// the next write, so the map holds only keys held now.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    until: Mutex<HashMap<String, Instant>>,
}

impl Holds {
    /// Holds `key` until `until` (never shortens a longer hold).
    pub(crate) fn hold(&self, key: &str, until: Instant) {
        let now = Instant::now();
        let mut map = self.until.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, t| *t > now);
        let t = map.entry(key.to_owned()).or_insert(until);
        *t = (*t).max(until);
    }

    /// The end of the hold on `key`, if it is still held.
    pub(crate) fn until(&self, key: &str) -> Option<Instant> {
        let map = self.until.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key).copied().filter(|t| *t > Instant::now())
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
}
