//! The cache-key master key: a Secret in the operator's namespace, created with 32 random bytes on
//! first start. Every tenant key is derived from it (HKDF with the namespace UID and epoch).

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use strata_core::cache_key::{MIN_MASTER_KEY_BYTES, MasterKey};

use crate::controller::error::{Error, Result};
use crate::controller::labels::{LABEL_MANAGED_BY, MANAGED_BY};

/// Name of the master key Secret.
pub const MASTER_KEY_SECRET: &str = "strata-cache-master-key";
/// Key of the master key inside the Secret.
pub const MASTER_KEY_FIELD: &str = "master-key";

/// Read the master key, creating it if absent.
pub async fn ensure_master_key(client: Client, namespace: &str) -> Result<MasterKey> {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    let action = |verb: &str| format!("{verb} Secret {namespace}/{MASTER_KEY_SECRET}");
    let existing = api.get_opt(MASTER_KEY_SECRET).await.map_err(|e| Error::kube(action("reading"), e))?;
    let secret = match existing {
        Some(secret) => secret,
        None => {
            let mut bytes = vec![0u8; MIN_MASTER_KEY_BYTES];
            getrandom::fill(&mut bytes)
                .map_err(|e| master_key_error(namespace, format!("no randomness: {e}")))?;
            let secret = Secret {
                metadata: ObjectMeta {
                    name: Some(MASTER_KEY_SECRET.into()),
                    namespace: Some(namespace.into()),
                    labels: Some([(LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string())].into()),
                    ..ObjectMeta::default()
                },
                data: Some([(MASTER_KEY_FIELD.to_string(), ByteString(bytes))].into()),
                immutable: Some(true),
                type_: Some("Opaque".into()),
                ..Secret::default()
            };
            match api.create(&PostParams::default(), &secret).await {
                Ok(created) => created,
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    api.get(MASTER_KEY_SECRET).await.map_err(|e| Error::kube(action("re-reading"), e))?
                }
                Err(e) => return Err(Error::kube(action("creating"), e)),
            }
        }
    };
    master_key_from(&secret, namespace)
}

fn master_key_error(namespace: &str, message: String) -> Error {
    Error::MasterKey { namespace: namespace.into(), name: MASTER_KEY_SECRET.into(), message }
}

/// The key in `secret`.
pub fn master_key_from(secret: &Secret, namespace: &str) -> Result<MasterKey> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(MASTER_KEY_FIELD))
        .ok_or_else(|| master_key_error(namespace, format!("it has no {MASTER_KEY_FIELD:?} key")))?;
    MasterKey::new(bytes.0.clone()).map_err(|e| master_key_error(namespace, e.to_string()))
}
