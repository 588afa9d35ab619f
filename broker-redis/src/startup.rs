//! The startup check of `maxmemory-policy`: any policy but `noeviction`
//! may evict a bucket in the middle of its window (`volatile-*` ones too:
//! every bucket and lease key has a TTL, and `volatile-ttl` takes the
//! shortest first), and an evicted bucket reads as a fresh, full one.

use std::collections::HashMap;

use crate::builder::RedisBackendBuilder;
use crate::connection::Conn;

/// Reads `maxmemory-policy` (on every given node for a cluster), warns on
/// any policy that evicts, and returns the first policy read. A store that refuses
/// `CONFIG` (managed services often do) is noted at debug level.
pub(crate) async fn check_maxmemory_policy(
    conn: &Conn,
    builder: &RedisBackendBuilder,
) -> Option<String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    let mut found = None;
    if builder.cluster {
        for url in &builder.urls {
            let policy = async {
                let client = redis::Client::open(url.as_str())?;
                let mut c = client.get_multiplexed_async_connection().await?;
                cmd.query_async::<HashMap<String, String>>(&mut c).await
            }
            .await;
            found = found.or(note(url, policy));
        }
    } else {
        let timeout = builder.timeouts.response;
        let policy = conn
            .query(&cmd, timeout)
            .await
            .and_then(|v| Ok(redis::from_redis_value::<HashMap<String, String>>(v)?));
        found = note(&builder.urls[0], policy);
    }
    found
}

fn note(url: &str, policy: redis::RedisResult<HashMap<String, String>>) -> Option<String> {
    let url = redacted(url);
    match policy {
        Ok(map) => {
            let policy = map.get("maxmemory-policy").cloned()?;
            if evicts(&policy) {
                tracing::warn!(
                    url,
                    policy,
                    "redis maxmemory-policy may evict bucket keys mid-window (an evicted bucket \
                     reads as full; they all have a TTL, so volatile-* policies evict them too); \
                     use noeviction"
                );
            }
            Some(policy)
        }
        Err(e) => {
            tracing::debug!(url, error = %e, "cannot read maxmemory-policy (CONFIG refused?)");
            None
        }
    }
}

/// The url without its password, for logs.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// Whether `policy` may evict the broker's keys: every policy but
/// `noeviction`.
pub(crate) fn evicts(policy: &str) -> bool {
    policy != "noeviction"
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_never_reach_the_log() {
        assert_eq!(
            super::redacted("redis://user:secret@host:6379/"),
            "redis://***@host:6379/"
        );
        assert_eq!(super::redacted("redis://host/"), "redis://host/");
    }
}
