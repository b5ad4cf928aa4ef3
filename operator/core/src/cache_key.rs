//! Tenant-scoped prefix-cache identity: HMAC-SHA256 over a length-prefixed compatibility tuple.
//!
//! * [`derive_tenant_key`]: HKDF-SHA256 (salt [`TENANT_KEY_SALT`]) from a [`MasterKey`], with the
//!   tenant id and an epoch number in the `info` input. Bumping a tenant's epoch revokes every key
//!   (and therefore every cache entry) of that tenant at once.
//! * [`compute_cache_key`]: `HMAC-SHA256(tenant_key, encode(tuple))`, where the tuple holds every
//!   compatibility dimension of spec §17.9 that Strata knows (tenant, privacy scope, provider,
//!   model, tokenizer, system-policy hash, tool-contract hash, stable-context hash,
//!   canonicalisation version). Every field is preceded by its byte length as a big-endian u64,
//!   so `("ab", "c")` and `("a", "bc")` encode differently.
//!
//! * [`bind_runtime`]: what the gateway sends upstream as the cache hint. It binds the controller's
//!   key to what only the serving side knows and may change without a pod roll (spec §17.10): the
//!   effective-policy version in force, the provider adapter and the runtime that render the
//!   prompt, the authorization (a fingerprint of the upstream credential), and again tenant,
//!   privacy scope, model and tokenizer (so a hand-written key is bound to them too).
//!
//! Keyed hashing means equal text in two tenants never yields equal keys (spec §17.19.1).
//! Key material is never printed by `Debug` and is overwritten with zeros on drop.

use hkdf::Hkdf;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::prefix::{SectionClass, StablePrefixManifest};
use crate::tokens::TokenizerKind;

/// HKDF salt: domain separation for tenant cache keys.
pub const TENANT_KEY_SALT: &[u8] = b"strata.cache-key.tenant/v1";
/// Domain tag hashed before the tuple, so the MAC cannot collide with other uses of the key.
pub const CACHE_KEY_DOMAIN: &[u8] = b"strata.cache-key.tuple/v1";
/// Domain tag of [`bind_runtime`].
pub const RUNTIME_BINDING_DOMAIN: &[u8] = b"strata.cache-key.runtime/v1";
/// Shortest accepted master key.
pub const MIN_MASTER_KEY_BYTES: usize = 32;
/// Length of a derived tenant key.
pub const TENANT_KEY_BYTES: usize = 32;
/// Hex characters in [`CacheKey::short`] (fits a Kubernetes label value).
pub const SHORT_KEY_HEX_CHARS: usize = 16;

/// Failure to derive or use cache keys.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheKeyError {
    /// The master key is too short to be a secret.
    #[error("master key has {actual} bytes; at least {MIN_MASTER_KEY_BYTES} are required")]
    MasterKeyTooShort {
        /// Bytes supplied.
        actual: usize,
    },
    /// A tenant id must not be empty.
    #[error("tenant id is empty; a tenant key needs a tenant id")]
    EmptyTenantId,
    /// The tenant key belongs to another tenant than the tuple names.
    #[error("tenant key was derived for tenant `{key_tenant}` but the cache tuple names `{tuple_tenant}`")]
    TenantMismatch {
        /// Tenant the key was derived for.
        key_tenant: String,
        /// Tenant named by the tuple.
        tuple_tenant: String,
    },
    /// A stable-prefix manifest lacks a section the identity needs.
    #[error("stable-prefix manifest has no `{section}` section")]
    MissingSection {
        /// The missing section.
        section: SectionClass,
    },
    /// HKDF refused the output length (cannot happen for 32 bytes; reported, not panicked).
    #[error("HKDF expansion failed: {0}")]
    Derivation(String),
}

/// Overwrites `bytes` with zeros in a way the optimiser keeps.
fn wipe(bytes: &mut [u8]) {
    bytes.fill(0);
    std::hint::black_box(bytes);
}

/// The operator's root secret. `Debug` prints only its length; bytes are wiped on drop.
pub struct MasterKey {
    bytes: Vec<u8>,
}

impl MasterKey {
    /// Wraps secret bytes, which must be at least [`MIN_MASTER_KEY_BYTES`] long.
    pub fn new(bytes: Vec<u8>) -> Result<Self, CacheKeyError> {
        if bytes.len() < MIN_MASTER_KEY_BYTES {
            let actual = bytes.len();
            let mut rejected = bytes;
            wipe(&mut rejected);
            return Err(CacheKeyError::MasterKeyTooShort { actual });
        }
        Ok(Self { bytes })
    }
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MasterKey(<redacted {} bytes>)", self.bytes.len())
    }
}

impl Drop for MasterKey {
    fn drop(&mut self) {
        wipe(&mut self.bytes);
    }
}

/// A tenant's cache-key secret for one epoch. `Debug` shows tenant and epoch only.
pub struct TenantKey {
    tenant_id: String,
    epoch: u64,
    bytes: [u8; TENANT_KEY_BYTES],
}

impl TenantKey {
    /// Tenant the key belongs to.
    pub fn tenant_id(&self) -> &str {
        &self.tenant_id
    }

    /// Epoch the key was derived for.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
}

impl std::fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantKey")
            .field("tenant_id", &self.tenant_id)
            .field("epoch", &self.epoch)
            .field("bytes", &"<redacted>")
            .finish()
    }
}

impl Drop for TenantKey {
    fn drop(&mut self) {
        wipe(&mut self.bytes);
    }
}

/// Appends `field` as `u64 big-endian length || bytes`.
fn push_field(encoded: &mut Vec<u8>, field: &[u8]) {
    encoded.extend_from_slice(&(field.len() as u64).to_be_bytes());
    encoded.extend_from_slice(field);
}

/// Derives the key of `tenant_id` for `epoch` from `master`.
pub fn derive_tenant_key(
    master: &MasterKey,
    tenant_id: &str,
    epoch: u64,
) -> Result<TenantKey, CacheKeyError> {
    if tenant_id.is_empty() {
        return Err(CacheKeyError::EmptyTenantId);
    }
    let mut info = Vec::with_capacity(tenant_id.len() + 32);
    push_field(&mut info, tenant_id.as_bytes());
    info.extend_from_slice(&epoch.to_be_bytes());
    let hkdf = Hkdf::<Sha256>::new(Some(TENANT_KEY_SALT), &master.bytes);
    let mut bytes = [0u8; TENANT_KEY_BYTES];
    hkdf.expand(&info, &mut bytes).map_err(|error| CacheKeyError::Derivation(error.to_string()))?;
    Ok(TenantKey { tenant_id: tenant_id.to_owned(), epoch, bytes })
}

/// Every compatibility dimension of a prefix-cache entry.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CacheKeyInputs {
    /// Tenant (must match the tenant key).
    pub tenant: String,
    /// Privacy scope (e.g. user or workspace scope).
    pub privacy_scope: String,
    /// Provider (e.g. `anthropic`, `openai`).
    pub provider: String,
    /// Model id.
    pub model: String,
    /// Tokenizer name (see [`TokenizerKind::as_str`]).
    pub tokenizer: String,
    /// Hash of the system/policy section.
    pub system_policy_hash: String,
    /// Hash of the tool contracts exposed in the prefix.
    pub tool_contract_hash: String,
    /// Hash of the whole stable prefix.
    pub stable_context_hash: String,
    /// Canonicalisation version of the prefix.
    pub canonicalization_version: String,
}

impl CacheKeyInputs {
    /// Inputs for a built stable prefix: policy and tool hashes come from the manifest's `system`
    /// and `tools` sections, the stable-context hash is its prefix hash.
    pub fn for_prefix(
        tenant: &str,
        privacy_scope: &str,
        provider: &str,
        model: &str,
        tokenizer: TokenizerKind,
        manifest: &StablePrefixManifest,
    ) -> Result<Self, CacheKeyError> {
        let section_hash = |section: SectionClass| {
            manifest.section_hash(section).map(str::to_owned).ok_or(CacheKeyError::MissingSection { section })
        };
        Ok(Self {
            tenant: tenant.to_owned(),
            privacy_scope: privacy_scope.to_owned(),
            provider: provider.to_owned(),
            model: model.to_owned(),
            tokenizer: tokenizer.as_str().to_owned(),
            system_policy_hash: section_hash(SectionClass::System)?,
            tool_contract_hash: section_hash(SectionClass::Tools)?,
            stable_context_hash: manifest.prefix_hash.clone(),
            canonicalization_version: manifest.canonicalization_version.clone(),
        })
    }

    /// The unambiguous byte encoding of the tuple (domain tag, then length-prefixed fields in
    /// declaration order).
    pub fn encode(&self) -> Vec<u8> {
        let fields = [
            &self.tenant,
            &self.privacy_scope,
            &self.provider,
            &self.model,
            &self.tokenizer,
            &self.system_policy_hash,
            &self.tool_contract_hash,
            &self.stable_context_hash,
            &self.canonicalization_version,
        ];
        let capacity = fields.iter().map(|field| field.len() + 8).sum::<usize>() + 40;
        let mut encoded = Vec::with_capacity(capacity);
        push_field(&mut encoded, CACHE_KEY_DOMAIN);
        for field in fields {
            push_field(&mut encoded, field.as_bytes());
        }
        encoded
    }
}

/// A prefix-cache identity (lowercase hex of the HMAC-SHA256 tag).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CacheKey(String);

impl CacheKey {
    /// Full 64-character hex form.
    pub fn as_hex(&self) -> &str {
        &self.0
    }

    /// First [`SHORT_KEY_HEX_CHARS`] hex characters, for Kubernetes labels.
    pub fn short(&self) -> &str {
        self.0.get(..SHORT_KEY_HEX_CHARS).unwrap_or(&self.0)
    }
}

impl std::fmt::Display for CacheKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `HMAC-SHA256(tenant_key, inputs.encode())`. The key must belong to `inputs.tenant`.
pub fn compute_cache_key(tenant_key: &TenantKey, inputs: &CacheKeyInputs) -> Result<CacheKey, CacheKeyError> {
    if tenant_key.tenant_id != inputs.tenant {
        return Err(CacheKeyError::TenantMismatch {
            key_tenant: tenant_key.tenant_id.clone(),
            tuple_tenant: inputs.tenant.clone(),
        });
    }
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&tenant_key.bytes)
        .map_err(|error| CacheKeyError::Derivation(error.to_string()))?;
    mac.update(&inputs.encode());
    Ok(CacheKey(hex::encode(mac.finalize().into_bytes())))
}

/// The serving side's compatibility dimensions, bound to the controller's key by [`bind_runtime`].
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeBinding {
    /// Tenant the gateway serves.
    pub tenant: String,
    /// Privacy scope of the agent.
    pub privacy_scope: String,
    /// Model id sent upstream.
    pub model: String,
    /// Tokenizer name.
    pub tokenizer: String,
    /// Version of the effective policy in force (its hash).
    pub policy_version: String,
    /// The provider adapter that renders the upstream body (e.g. `openai-chat/v1`).
    pub adapter: String,
    /// The runtime serving the agent (e.g. `strata-gateway/0.1.0`).
    pub runtime: String,
    /// Fingerprint of the upstream authorization (SHA-256 of the credential), or `none`.
    pub authorization: String,
    /// The tenant's cache epoch (also in the controller's key; bound again so a hand-written key
    /// is revoked by an epoch bump too).
    pub epoch: u64,
}

impl RuntimeBinding {
    /// The unambiguous byte encoding (domain tag, then length-prefixed fields in declaration order).
    pub fn encode(&self) -> Vec<u8> {
        let fields = [
            &self.tenant,
            &self.privacy_scope,
            &self.model,
            &self.tokenizer,
            &self.policy_version,
            &self.adapter,
            &self.runtime,
            &self.authorization,
        ];
        let mut encoded = Vec::with_capacity(fields.iter().map(|field| field.len() + 8).sum::<usize>() + 40);
        push_field(&mut encoded, RUNTIME_BINDING_DOMAIN);
        for field in fields {
            push_field(&mut encoded, field.as_bytes());
        }
        encoded.extend_from_slice(&self.epoch.to_be_bytes());
        encoded
    }
}

/// Fingerprint of an upstream credential for [`RuntimeBinding::authorization`]: SHA-256 hex, or
/// `none` without one. It only ever enters the keyed MAC of [`bind_runtime`].
pub fn authorization_fingerprint(credential: Option<&str>) -> String {
    match credential {
        Some(credential) => hex::encode(sha2::Sha256::digest(credential.as_bytes())),
        None => "none".to_owned(),
    }
}

/// `HMAC-SHA256(base, binding.encode())`: the controller's key `base` (its text as written in
/// `gateway.json`) bound to the serving side's dimensions. Two tenants never share a base key, so
/// they never share a bound key either; any change of a binding field gives another key.
pub fn bind_runtime(base: &str, binding: &RuntimeBinding) -> CacheKey {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(base.as_bytes())
        .expect("HMAC-SHA256 accepts keys of every length");
    mac.update(&binding.encode());
    CacheKey(hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn master() -> MasterKey {
        MasterKey::new(vec![7u8; 32]).unwrap()
    }

    fn inputs(tenant: &str) -> CacheKeyInputs {
        CacheKeyInputs {
            tenant: tenant.to_owned(),
            privacy_scope: "workspace:alpha".to_owned(),
            provider: "anthropic".to_owned(),
            model: "claude-sonnet-4-5".to_owned(),
            tokenizer: TokenizerKind::Approximate.as_str().to_owned(),
            system_policy_hash: "aa".repeat(32),
            tool_contract_hash: "bb".repeat(32),
            stable_context_hash: "cc".repeat(32),
            canonicalization_version: crate::prefix::CANONICALIZATION_VERSION.to_owned(),
        }
    }

    fn key(tenant: &str, epoch: u64, inputs: &CacheKeyInputs) -> CacheKey {
        let tenant_key = derive_tenant_key(&master(), tenant, epoch).unwrap();
        compute_cache_key(&tenant_key, inputs).unwrap()
    }

    #[test]
    fn key_is_deterministic_hex_with_short_form() {
        let first = key("acme", 1, &inputs("acme"));
        let second = key("acme", 1, &inputs("acme"));
        assert_eq!(first, second);
        assert_eq!(first.as_hex().len(), 64);
        assert!(first.as_hex().chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_eq!(first.short(), &first.as_hex()[..16]);
    }

    #[test]
    fn matches_an_independent_hkdf_hmac_computation() {
        let mut info = Vec::new();
        info.extend_from_slice(&4u64.to_be_bytes());
        info.extend_from_slice(b"acme");
        info.extend_from_slice(&1u64.to_be_bytes());
        let mut okm = [0u8; 32];
        Hkdf::<Sha256>::new(Some(TENANT_KEY_SALT), &[7u8; 32]).expand(&info, &mut okm).unwrap();
        let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(&okm).unwrap();
        mac.update(&inputs("acme").encode());
        let expected = hex::encode(mac.finalize().into_bytes());
        assert_eq!(key("acme", 1, &inputs("acme")).as_hex(), expected);
    }

    #[test]
    fn encoding_is_length_prefixed() {
        let mut ab_c = inputs("t");
        ab_c.provider = "ab".to_owned();
        ab_c.model = "c".to_owned();
        let mut a_bc = inputs("t");
        a_bc.provider = "a".to_owned();
        a_bc.model = "bc".to_owned();
        assert_ne!(ab_c.encode(), a_bc.encode());
    }

    #[test]
    fn epoch_bump_revokes_keys() {
        assert_ne!(key("acme", 1, &inputs("acme")), key("acme", 2, &inputs("acme")));
    }

    #[test]
    fn rejects_foreign_tenant_key_short_master_and_empty_tenant() {
        let tenant_key = derive_tenant_key(&master(), "acme", 1).unwrap();
        assert!(matches!(
            compute_cache_key(&tenant_key, &inputs("globex")),
            Err(CacheKeyError::TenantMismatch { .. })
        ));
        assert_eq!(MasterKey::new(vec![1; 31]).unwrap_err(), CacheKeyError::MasterKeyTooShort { actual: 31 });
        assert_eq!(derive_tenant_key(&master(), "", 1).unwrap_err(), CacheKeyError::EmptyTenantId);
    }

    fn binding() -> RuntimeBinding {
        RuntimeBinding {
            tenant: "acme".to_owned(),
            privacy_scope: "tenant".to_owned(),
            model: "gpt-5".to_owned(),
            tokenizer: TokenizerKind::O200kBase.as_str().to_owned(),
            policy_version: "aa".repeat(32),
            adapter: "openai-chat/v1".to_owned(),
            runtime: "strata-gateway/0.1.0".to_owned(),
            authorization: authorization_fingerprint(Some("sk-1")),
            epoch: 1,
        }
    }

    #[test]
    fn every_runtime_dimension_and_the_base_key_change_the_bound_key() {
        let base = key("acme", 1, &inputs("acme"));
        let bound = bind_runtime(base.as_hex(), &binding());
        assert_eq!(bound, bind_runtime(base.as_hex(), &binding()), "deterministic");
        let edits: [fn(&mut RuntimeBinding); 9] = [
            |b| b.tenant.push('x'),
            |b| b.privacy_scope = "user:ana".to_owned(),
            |b| b.model = "gpt-5-mini".to_owned(),
            |b| b.tokenizer = TokenizerKind::Cl100kBase.as_str().to_owned(),
            |b| b.policy_version = "bb".repeat(32),
            |b| b.adapter = "openai-compatible-chat/v1".to_owned(),
            |b| b.runtime = "strata-gateway/0.2.0".to_owned(),
            |b| b.authorization = authorization_fingerprint(Some("sk-2")),
            |b| b.epoch = 2,
        ];
        for (index, edit) in edits.into_iter().enumerate() {
            let mut changed = binding();
            edit(&mut changed);
            assert_ne!(bind_runtime(base.as_hex(), &changed), bound, "field {index} is not bound");
        }
        let next_epoch = key("acme", 2, &inputs("acme"));
        assert_ne!(
            bind_runtime(next_epoch.as_hex(), &binding()),
            bound,
            "the epoch is bound through the base"
        );
        assert_ne!(authorization_fingerprint(None), authorization_fingerprint(Some("")));
    }

    #[test]
    fn debug_never_prints_key_bytes() {
        let master = MasterKey::new(vec![0xAB; 32]).unwrap();
        let printed = format!("{master:?}");
        assert_eq!(printed, "MasterKey(<redacted 32 bytes>)");
        let tenant_key = derive_tenant_key(&master, "acme", 3).unwrap();
        let printed = format!("{tenant_key:?}");
        assert_eq!(printed, r#"TenantKey { tenant_id: "acme", epoch: 3, bytes: "<redacted>" }"#);
    }
}
