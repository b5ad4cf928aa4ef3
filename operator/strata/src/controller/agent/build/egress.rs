//! An Agent's `spec.model.egress` as a container that calls the model sees it: the proxy's URL and
//! the trusted authorities mounted as files, and the variables that name them.

use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, EnvVar, KeyToPath, Volume, VolumeMount};
use strata_api::agent::EgressSpec;

use super::stateful_set::{mount, plain_env, secret_file_volume};
use crate::gateway::connector::{PROXY_URL_FILE_ENV, TRUSTED_CA_FILE_ENV};

/// Where the proxy's URL is mounted, as the file `url`.
const PROXY_DIR: &str = "/etc/strata/egress-proxy";
/// Where the trusted authorities are mounted, as the file `ca.pem`.
const TRUSTED_CA_DIR: &str = "/etc/strata/trusted-ca";
const PROXY_VOLUME: &str = "egress-proxy";
const TRUSTED_CA_VOLUME: &str = "trusted-ca";

/// The variables, mounts and volumes a container needs for its egress settings; all empty when the
/// Agent has none.
#[derive(Debug, Default)]
pub(crate) struct EgressMounts {
    pub env: Vec<EnvVar>,
    pub mounts: Vec<VolumeMount>,
    pub volumes: Vec<Volume>,
}

/// What `egress` asks of a container that calls the model: the gateway sidecar or a compaction Job.
pub(crate) fn egress_mounts(egress: Option<&EgressSpec>) -> EgressMounts {
    let mut out = EgressMounts::default();
    let Some(egress) = egress else { return out };
    if let Some(proxy) = &egress.proxy_secret_ref {
        out.volumes.push(secret_file_volume(PROXY_VOLUME, proxy, "url"));
        out.mounts.push(mount(PROXY_VOLUME, PROXY_DIR, true));
        out.env.push(plain_env(PROXY_URL_FILE_ENV, &format!("{PROXY_DIR}/url")));
        if let Some(hosts) = egress.no_proxy.as_ref().filter(|hosts| !hosts.is_empty()) {
            out.env.push(plain_env("NO_PROXY", &hosts.join(",")));
        }
    }
    if let Some(authorities) = &egress.trusted_ca_config_map_ref {
        out.volumes.push(Volume {
            name: TRUSTED_CA_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: authorities.name.clone(),
                items: Some(vec![KeyToPath {
                    key: authorities.key.clone(),
                    path: "ca.pem".into(),
                    mode: None,
                }]),
                optional: Some(false),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        });
        out.mounts.push(mount(TRUSTED_CA_VOLUME, TRUSTED_CA_DIR, true));
        out.env.push(plain_env(TRUSTED_CA_FILE_ENV, &format!("{TRUSTED_CA_DIR}/ca.pem")));
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use strata_api::refs::LocalKeyRef;

    fn key(name: &str, key: &str) -> LocalKeyRef {
        LocalKeyRef { name: name.into(), key: key.into() }
    }

    #[test]
    fn no_egress_asks_for_nothing() {
        let none = egress_mounts(None);
        assert!(none.env.is_empty() && none.mounts.is_empty() && none.volumes.is_empty());
    }

    #[test]
    fn the_proxy_and_the_authorities_are_files_the_variables_name() {
        let egress = EgressSpec {
            proxy_secret_ref: Some(key("egress", "proxy-url")),
            no_proxy: Some(vec![".svc.cluster.local".into(), "10.0.0.0/8".into()]),
            trusted_ca_config_map_ref: Some(key("corporate-ca", "bundle.pem")),
        };
        let mounts = egress_mounts(Some(&egress));
        let variables: Vec<(String, String)> =
            mounts.env.iter().map(|e| (e.name.clone(), e.value.clone().unwrap())).collect();
        assert_eq!(
            variables,
            [
                (PROXY_URL_FILE_ENV.into(), "/etc/strata/egress-proxy/url".into()),
                ("NO_PROXY".into(), ".svc.cluster.local,10.0.0.0/8".into()),
                (TRUSTED_CA_FILE_ENV.into(), "/etc/strata/trusted-ca/ca.pem".into()),
            ]
        );
        let secret = mounts.volumes[0].secret.as_ref().unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("egress"));
        assert_eq!(secret.items.as_ref().unwrap()[0].key, "proxy-url");
        assert_eq!(secret.default_mode, Some(0o440), "the URL may carry credentials");
        let config_map = mounts.volumes[1].config_map.as_ref().unwrap();
        assert_eq!(config_map.name, "corporate-ca");
        assert_eq!(config_map.items.as_ref().unwrap()[0].key, "bundle.pem");
        assert!(mounts.mounts.iter().all(|mount| mount.read_only == Some(true)));
    }
}
