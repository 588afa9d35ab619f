//! Reading what is stored, for tests and operators.

use std::collections::HashMap;

use broker_core::bucket::BucketState;
use broker_core::state::{Lease, ResourceState};
use broker_core::{BackendError, Micros};

use crate::connection::redis_error;
use crate::RedisBackend;

/// # Inspection
impl RedisBackend {
    /// The server's `maxmemory-policy` as read at connect (`None` if the
    /// store refused `CONFIG`); any but `noeviction` may evict a bucket
    /// mid-window (a warning was logged).
    pub fn maxmemory_policy(&self) -> Option<&str> {
        self.inner.maxmemory_policy.as_deref()
    }

    /// The Redis key of the bucket hash of state `key`.
    pub fn bucket_key(&self, key: &str) -> Result<String, BackendError> {
        Ok(self.keys(key)?.buckets)
    }

    /// The state of `key` as stored: `None` when neither key exists (a
    /// fresh state); `buckets` is empty when only leases exist. Not atomic
    /// with other calls.
    pub async fn state(&self, key: &str) -> Result<Option<ResourceState>, BackendError> {
        let keys = self.keys(key)?;
        let (conn, timeout) = (&self.inner.conn, self.inner.set.response_timeout);
        let mut hash = redis::cmd("HGETALL");
        hash.arg(&keys.buckets);
        let hash: HashMap<String, String> =
            conn.query(&hash, timeout).await.map_err(redis_error)?;
        let mut leases = redis::cmd("ZRANGE");
        leases.arg(&keys.leases).arg(0).arg(-1).arg("WITHSCORES");
        let leases: Vec<(String, f64)> = conn.query(&leases, timeout).await.map_err(redis_error)?;
        if hash.is_empty() && leases.is_empty() {
            return Ok(None);
        }
        let num = |name: &str| hash.get(name).and_then(|v| v.parse::<f64>().ok());
        let field = |name: &str, i: usize| {
            num(&format!("{name}:{i}"))
                .ok_or_else(|| BackendError::new(format!("bucket field {name}:{i} missing")))
        };
        let n = num("n").unwrap_or(0.0) as usize;
        let buckets = (1..=n).map(|i| {
            Ok(BucketState {
                tokens: field("tokens", i)?,
                ts: field("ts", i)? as Micros,
                nb: field("nb", i)? as Micros,
            })
        });
        let buckets = buckets.collect::<Result<_, BackendError>>()?;
        // With no bucket, the field `hold` keeps the end of a penalty.
        let penalty = num("hold").filter(|_| n == 0).map_or(0, |h| h as Micros);
        let leases = leases.into_iter().filter_map(|(id, expires)| {
            let (id, expires) = (id.parse().ok()?, expires as Micros);
            Some(Lease { id, expires })
        });
        Ok(Some(ResourceState {
            buckets,
            leases: leases.collect(),
            penalty,
        }))
    }
}
