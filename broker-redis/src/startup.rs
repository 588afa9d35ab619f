//! The startup check of `maxmemory-policy`: any policy but `noeviction`
//! may evict a bucket mid-window (every key has a TTL, so `volatile-*`
//! ones too), and an evicted bucket reads as a full one.

use std::collections::HashMap;

use redis::RedisResult;

use crate::builder::RedisBackendBuilder;
use crate::connection::Conn;

/// Reads `maxmemory-policy` (on every given node of a cluster), warns on
/// any policy that evicts, and returns the first policy read.
pub(crate) async fn check_maxmemory_policy(
    conn: &Conn,
    builder: &RedisBackendBuilder,
) -> Option<String> {
    let mut cmd = redis::cmd("CONFIG");
    cmd.arg("GET").arg("maxmemory-policy");
    if !builder.cluster {
        let policy = conn.query(&cmd, builder.timeouts.response).await;
        return note(&builder.urls[0], policy);
    }
    let mut found = None;
    for url in &builder.urls {
        let policy = async {
            let client = redis::Client::open(url.as_str())?;
            let mut c = client.get_multiplexed_async_connection().await?;
            cmd.query_async(&mut c).await
        };
        found = found.or(note(url, policy.await));
    }
    found
}

fn note(url: &str, policy: RedisResult<HashMap<String, String>>) -> Option<String> {
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
            // Managed services often refuse CONFIG.
            tracing::debug!(url, error = %e, "cannot read maxmemory-policy (CONFIG refused?)");
            None
        }
    }
}

/// The url without its password, for logs.
pub(crate) fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

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
