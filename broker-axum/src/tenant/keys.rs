//! The keys tenants are stored and logged under: a keyed fingerprint of the
//! id (see [`crate::Pressure::with_tenant_secret`]), or with
//! `perTenant.clearIds` a plain id.

use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::Tenant;

/// Longest tenant id kept in clear with `perTenant.clearIds`.
const MAX_TENANT_LEN: usize = 64;

/// Whether `id` may be kept in clear: 1..=[`MAX_TENANT_LEN`] bytes of
/// `[A-Za-z0-9._@+-]` (never `~`, which starts a fingerprint).
fn plain(id: &str) -> bool {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-_.@+".contains(&b);
    !id.is_empty() && id.len() <= MAX_TENANT_LEN && id.bytes().all(allowed)
}

/// The public key of fingerprints when the application sets none.
const BUILT_IN_SECRET: &[u8] = b"resource-broker tenant fingerprint v1";

/// Tenant ids as sub-keys: `~` and 128 bits of an HMAC-SHA256 of the id
/// tagged text or bytes, or with `clear` a plain text id.
#[derive(Debug, Clone)]
pub(crate) struct TenantKeys {
    mac: Hmac<Sha256>,
    pub(crate) clear: bool,
}

impl TenantKeys {
    /// Fingerprints keyed with `secret` (the built-in key if `None`), and
    /// plain text ids in clear if `clear`.
    pub(crate) fn new(secret: Option<&[u8]>, clear: bool) -> Self {
        let secret = secret.unwrap_or(BUILT_IN_SECRET);
        let mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
        Self { mac, clear }
    }

    /// The sub-key of `tenant`.
    pub(crate) fn key(&self, tenant: &Tenant<'_>) -> String {
        let (tag, bytes): (&[u8], &[u8]) = match tenant {
            Tenant::Text(text) if self.clear && plain(text) => return text.to_string(),
            Tenant::Text(text) => (b"t", text.as_bytes()),
            Tenant::Bytes(bytes) => (b"b", bytes),
        };
        let mut mac = self.mac.clone();
        mac.update(tag);
        mac.update(bytes);
        let digest = mac.finalize().into_bytes();
        let half: [u8; 16] = digest[..16].try_into().expect("SHA-256 has 32 bytes");
        format!("~{:032x}", u128::from_be_bytes(half))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Length of a fingerprint: `~` and 32 hex digits.
    const FINGERPRINT_LEN: usize = 33;
    use std::borrow::Cow;

    fn key(keys: &TenantKeys, tenant: impl Into<Tenant<'static>>) -> String {
        keys.key(&tenant.into()).as_str().to_owned()
    }

    #[test]
    fn every_id_is_a_fingerprint_unless_clear_ids_are_asked_for() {
        let keys = TenantKeys::new(None, false);
        for id in [
            "acme-42",
            "sk_live_4eC39HqLyjWDarjtT1zdp7dc",
            "",
            "a:b{c}\n",
        ] {
            let k = key(&keys, id);
            assert!(k.starts_with('~') && k.len() == FINGERPRINT_LEN, "{k}");
            if !id.is_empty() {
                assert!(!k.contains(id), "{k}");
            }
        }
        let clear = TenantKeys::new(None, true);
        assert_eq!(key(&clear, "acme-42"), "acme-42");
        assert_eq!(key(&clear, "a:b"), key(&keys, "a:b"));
        assert_eq!(key(&clear, "z".repeat(65)), key(&keys, "z".repeat(65)));
        assert_eq!(key(&clear, "x".repeat(10_000)).len(), FINGERPRINT_LEN);
    }

    #[test]
    fn the_secret_keys_every_fingerprint() {
        let built_in = TenantKeys::new(None, false);
        let set = TenantKeys::new(Some(b"replica secret"), false);
        assert_eq!(
            key(&built_in, "acme"),
            key(&TenantKeys::new(None, false), "acme")
        );
        assert_ne!(key(&built_in, "acme"), key(&set, "acme"));
        assert_eq!(
            key(&set, "acme"),
            key(&TenantKeys::new(Some(b"replica secret"), false), "acme")
        );
    }

    #[test]
    fn distinct_ids_get_distinct_keys() {
        let keys = TenantKeys::new(None, true);
        assert_ne!(key(&keys, "a b"), key(&keys, "a  b"));
        assert_ne!(key(&keys, ""), key(&keys, " "));
        // A clear id never looks like a fingerprint: `~` is not plain.
        let fingerprint = key(&keys, "not plain!");
        assert_ne!(key(&keys, fingerprint.clone()), fingerprint);
    }

    #[test]
    fn text_and_bytes_never_share_a_key() {
        let keys = TenantKeys::new(None, true);
        let bytes: &[u8] = &[0xff, 0xfe, b'a'];
        let of_bytes = keys.key(&Tenant::Bytes(bytes.into())).as_str().to_owned();
        assert_ne!(key(&keys, of_bytes.clone()), of_bytes);
        let lossy = String::from_utf8_lossy(bytes).into_owned();
        assert_ne!(key(&keys, lossy), of_bytes);
        let ascii = keys
            .key(&Tenant::Bytes(Cow::Borrowed(b"acme")))
            .as_str()
            .to_owned();
        assert_ne!(ascii, key(&keys, "acme"));
        assert_ne!(ascii, key(&TenantKeys::new(None, false), "acme"));
    }
}
