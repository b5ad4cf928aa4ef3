//! The real `strata gateway` in front of an `https` upstream, as a deployment meets one: a
//! certificate from a private authority that the gateway is told to trust (`SSL_CERT_FILE`), HTTP/2
//! when the upstream offers it, a certificate from an authority it does not trust refused with a 502
//! that says what to do, and an egress proxy reached by a `CONNECT` tunnel that carries the proxy's
//! credentials, and the operator's egress files picked up again when they are rotated. The
//! authorities and certificates are made at run time; no key is checked in.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod gateway_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use gateway_support::process::GatewayProcess;
use gateway_support::{FakeUpstream, config, write_config};
use serde_json::{Value, json};
use strata_api::agent::Provider;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A certificate authority made for one test, and its certificate in PEM.
struct Authority {
    params: rcgen::CertificateParams,
    key: rcgen::KeyPair,
    pem: String,
}

impl Authority {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        let pem = params.self_signed(&key).unwrap().pem();
        Self { params, key, pem }
    }

    /// A TLS server config for `127.0.0.1` with a certificate this authority signed, offering
    /// HTTP/2 and HTTP/1.1 by ALPN.
    fn server_config(&self) -> rustls::ServerConfig {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()]).unwrap();
        let issuer = rcgen::Issuer::from_params(&self.params, &self.key);
        let certificate = params.signed_by(&key, &issuer).unwrap();
        let private = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![certificate.der().clone()], private)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config
    }

    /// Writes the authority's certificate, as a bundle for `SSL_CERT_FILE`.
    fn write_bundle(&self, dir: &Path, name: &str) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, &self.pem).unwrap();
        path
    }
}

/// A gateway process in front of `fake` at `endpoint`, with `env` in its environment.
async fn gateway(
    dir: &Path,
    fake: &FakeUpstream,
    endpoint: String,
    env: &[(&str, &str)],
) -> (GatewayProcess, reqwest::Client) {
    let mut gateway_config = config(fake, Provider::OpenAI, dir);
    gateway_config.upstream.endpoint = endpoint;
    let config_path = dir.join("gateway.json");
    write_config(&config_path, &gateway_config);
    // The program the operator's sidecars run.
    let binary = Path::new(env!("CARGO_BIN_EXE_strata-gateway"));
    let log = dir.join("gateway.log");
    let mut process =
        GatewayProcess::spawn_with_env(binary, &config_path, &dir.join("data"), Some(&log), env);
    // The test's own HTTP client needs a TLS provider chosen, as the gateway chooses ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = reqwest::Client::new();
    process.wait_ready(&client, Duration::from_secs(30)).await.unwrap();
    (process, client)
}

async fn chat(client: &reqwest::Client, gateway: &GatewayProcess, text: &str) -> (u16, Value) {
    let body = json!({"messages": [{"role": "user", "content": text}]});
    let response = client
        .post(format!("http://{}/v1/chat/completions", gateway.address))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn tls_upstream(authority: &Authority) -> FakeUpstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    FakeUpstream::serve_tls(listener, authority.server_config())
}

/// An upstream serving TLS with a certificate from a fresh private authority, that authority's
/// bundle written in `dir`, and the upstream's `https` endpoint.
async fn trusted_tls_upstream(dir: &Path) -> (FakeUpstream, PathBuf, String) {
    let authority = Authority::new("strata test authority");
    let bundle = authority.write_bundle(dir, "ca.pem");
    let fake = tls_upstream(&authority).await;
    let endpoint = format!("https://{}/v1", fake.address);
    (fake, bundle, endpoint)
}

#[tokio::test]
async fn an_https_upstream_from_a_trusted_private_authority_is_spoken_to_in_http2() {
    let dir = tempfile::tempdir().unwrap();
    let (fake, bundle, endpoint) = trusted_tls_upstream(dir.path()).await;
    let (gateway, client) =
        gateway(dir.path(), &fake, endpoint, &[("SSL_CERT_FILE", bundle.to_str().unwrap())]).await;

    for text in ["first over TLS", "second over TLS"] {
        let (status, answer) = chat(&client, &gateway, text).await;
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["choices"][0]["message"]["content"], "ok");
    }
    let seen = fake.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].raw.contains("second over TLS"));
    assert_eq!(
        seen[0].headers.get("authorization").unwrap(),
        &format!("Bearer {}", gateway_support::API_KEY),
        "the key went with the request"
    );
    assert_eq!(
        *fake.negotiated.lock().unwrap(),
        vec!["h2".to_owned()],
        "one HTTP/2 connection, agreed by ALPN, carried both requests"
    );
}

#[tokio::test]
async fn an_upstream_certificate_from_an_untrusted_authority_is_refused_with_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let authority = Authority::new("the upstream's authority");
    // The gateway trusts another authority only, so the upstream's issuer is unknown to it.
    let other = Authority::new("another authority").write_bundle(dir.path(), "other.pem");
    let fake = tls_upstream(&authority).await;
    let endpoint = format!("https://{}/v1", fake.address);
    let (gateway, client) =
        gateway(dir.path(), &fake, endpoint, &[("SSL_CERT_FILE", other.to_str().unwrap())]).await;

    let (status, answer) = chat(&client, &gateway, "hello").await;
    assert_eq!(status, 502, "{answer}");
    let error = &answer["error"];
    assert_eq!(error["type"], "upstream_error", "in OpenAI's error shape: {answer}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains("certificate"), "the message names the certificate: {message}");
    assert!(message.contains("SSL_CERT_FILE"), "and says how to trust a private authority: {message}");
    assert!(fake.seen().is_empty(), "nothing was sent to an upstream that was not verified");
    let log = std::fs::read_to_string(dir.path().join("gateway.log")).unwrap();
    assert!(!log.contains("trying again"), "a refused certificate is not tried again: {log}");
}

/// What a fake egress proxy saw: the head of each `CONNECT` request.
type ConnectHeads = Arc<Mutex<Vec<String>>>;

/// A fake egress proxy: reads a `CONNECT` request's head, records it, answers 200 and then relays
/// bytes both ways to the target it named.
async fn connect_proxy() -> (SocketAddr, ConnectHeads) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let heads: ConnectHeads = Arc::default();
    let seen = Arc::clone(&heads);
    tokio::spawn(async move {
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    if client.read(&mut byte).await.unwrap() == 0 {
                        return;
                    }
                    head.push(byte[0]);
                }
                let head = String::from_utf8(head).unwrap();
                let target = head.split_whitespace().nth(1).unwrap().to_owned();
                seen.lock().unwrap().push(head);
                let mut upstream = tokio::net::TcpStream::connect(target).await.unwrap();
                client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (address, heads)
}

/// Sends one chat through a gateway in front of a TLS upstream, whose environment `env_for` makes
/// from the upstream authority's bundle, the fake proxy's address and a scratch directory; then
/// checks that it went through one tunnel with the proxy's credentials.
async fn chat_through_a_proxy(
    text: &str,
    env_for: impl FnOnce(&Path, SocketAddr, &Path) -> Vec<(&'static str, String)>,
) {
    let dir = tempfile::tempdir().unwrap();
    let (fake, bundle, endpoint) = trusted_tls_upstream(dir.path()).await;
    let (proxy, heads) = connect_proxy().await;
    let env = env_for(&bundle, proxy, dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(name, value)| (*name, value.as_str())).collect();
    let (gateway, client) = gateway(dir.path(), &fake, endpoint, &env).await;

    let (status, answer) = chat(&client, &gateway, text).await;
    assert_eq!(status, 200, "{answer}");
    assert!(fake.seen()[0].raw.contains(text));
    assert_one_tunnel_with_credentials(&heads, &fake);
}

#[tokio::test]
async fn an_https_upstream_behind_an_egress_proxy_is_reached_through_a_tunnel_with_credentials() {
    chat_through_a_proxy("through the proxy", |bundle, proxy, _| {
        vec![
            ("SSL_CERT_FILE", bundle.display().to_string()),
            ("HTTPS_PROXY", format!("http://agent:s3cret@{proxy}")),
        ]
    })
    .await;
}

/// What the operator gives a sidecar for `spec.model.egress`: the proxy's URL in a mounted file
/// (`STRATA_PROXY_URL_FILE`), and a private authority trusted beside the system's
/// (`STRATA_TRUSTED_CA_FILE`), not in place of them.
#[tokio::test]
async fn the_operators_egress_files_give_the_proxy_and_a_private_authority() {
    chat_through_a_proxy("through the operator's proxy", |bundle, proxy, dir| {
        let proxy_file = dir.join("proxy-url");
        std::fs::write(&proxy_file, format!("http://agent:s3cret@{proxy}\n")).unwrap();
        vec![
            ("STRATA_TRUSTED_CA_FILE", bundle.display().to_string()),
            ("STRATA_PROXY_URL_FILE", proxy_file.display().to_string()),
        ]
    })
    .await;
}

/// A trusted-authorities ConfigMap updated in place (the kubelet swaps the new file in) is used for
/// new connections within seconds, without a restart; a bundle that turns unusable is refused and
/// the client built from the earlier one keeps serving.
#[tokio::test]
async fn a_rotated_trusted_authorities_file_is_used_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let retired = Authority::new("retired authority");
    let bundle = retired.write_bundle(dir.path(), "ca.pem");
    let current = Authority::new("current authority");
    let fake = tls_upstream(&current).await;
    let endpoint = format!("https://{}/v1", fake.address);
    let env = [("STRATA_TRUSTED_CA_FILE", bundle.to_str().unwrap())];
    let (gateway, client) = gateway(dir.path(), &fake, endpoint, &env).await;
    let (code, answer) = chat(&client, &gateway, "before the rotation").await;
    assert_eq!(code, 502, "the upstream's authority is not trusted yet: {answer}");

    let swap_in = |text: &str| {
        let fresh = dir.path().join("ca.pem.new");
        std::fs::write(&fresh, text).unwrap();
        std::fs::rename(&fresh, &bundle).unwrap();
    };
    swap_in(&current.pem);
    let mut code = 0;
    for attempt in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        (code, _) = chat(&client, &gateway, &format!("after the rotation {attempt}")).await;
        if code == 200 {
            break;
        }
    }
    assert_eq!(code, 200, "the rotated bundle was not picked up");

    swap_in("not a certificate\n");
    assert!(rejected_becomes(&client, &gateway, 1.0).await, "an unusable bundle is counted");
    let egress = status(&client, &gateway).await["egress"].clone();
    assert_eq!(egress["inForce"], "previous", "{egress}");
    let error = egress["error"].as_str().unwrap_or_default();
    assert!(error.contains(bundle.to_str().unwrap()) && error.contains("no PEM certificate"), "{error}");
    let (code, answer) = chat(&client, &gateway, "with the earlier client").await;
    assert_eq!(code, 200, "the client built from the earlier bundle keeps serving: {answer}");
    swap_in(&current.pem);
    assert!(rejected_becomes(&client, &gateway, 0.0).await, "a usable bundle clears the count");
    assert!(status(&client, &gateway).await["egress"].is_null(), "and the status's problem");
    let (code, answer) = chat(&client, &gateway, "with the bundle fixed").await;
    assert_eq!(code, 200, "{answer}");
}

/// Whether `strata_gateway_egress_rejected` reads `value` within ten seconds.
async fn rejected_becomes(client: &reqwest::Client, gateway: &GatewayProcess, value: f64) -> bool {
    for _ in 0..100 {
        if rejected(client, gateway).await == value {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// The gateway's `/strata/v1/status`.
async fn status(client: &reqwest::Client, gateway: &GatewayProcess) -> Value {
    let url = format!("http://{}/strata/v1/status", gateway.address);
    client.get(url).send().await.unwrap().json().await.unwrap()
}

/// `strata_gateway_egress_rejected` as the gateway's metrics endpoint reports it.
async fn rejected(client: &reqwest::Client, gateway: &GatewayProcess) -> f64 {
    let url = format!("http://{}/metrics", gateway.metrics_address);
    let text = client.get(url).send().await.unwrap().text().await.unwrap();
    text.lines()
        .find_map(|line| line.strip_prefix("strata_gateway_egress_rejected "))
        .and_then(|value| value.trim().parse().ok())
        .expect("the metric is exported")
}

/// A trusted-authorities file that holds no certificate stops the gateway at startup, with the
/// file and the problem named, instead of running without the authority.
#[tokio::test]
async fn a_trusted_authorities_file_without_a_certificate_stops_the_gateway_with_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let fake = FakeUpstream::start().await;
    let gateway_config = config(&fake, Provider::OpenAI, dir.path());
    let config_path = dir.path().join("gateway.json");
    write_config(&config_path, &gateway_config);
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, "not a certificate\n").unwrap();
    let data_dir = dir.path().join("data");
    let run = {
        let bundle = bundle.clone();
        tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_strata-gateway"))
                .arg("--config")
                .arg(&config_path)
                .arg("--data-dir")
                .arg(&data_dir)
                .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
                .env("STRATA_TRUSTED_CA_FILE", &bundle)
                .output()
        })
    };
    let output = tokio::time::timeout(Duration::from_secs(60), run).await.unwrap().unwrap().unwrap();
    assert!(!output.status.success(), "the gateway must not start without the authority it was given");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(bundle.to_str().unwrap()), "the message names the file: {stderr}");
    assert!(stderr.contains("no PEM certificate"), "and what is wrong with it: {stderr}");
}

/// The fake proxy saw one `CONNECT` to the upstream, carrying the proxy's credentials and not the
/// provider's key, and TLS with ALPN ran end to end through it.
fn assert_one_tunnel_with_credentials(heads: &ConnectHeads, fake: &FakeUpstream) {
    let heads = heads.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "one tunnel: {heads:?}");
    let head = heads[0].to_ascii_lowercase();
    assert!(head.starts_with(&format!("connect {} http/1.1\r\n", fake.address)), "{head}");
    // base64("agent:s3cret")
    assert!(head.contains("proxy-authorization: basic ywdlbnq6cznjcmv0\r\n"), "{head}");
    assert!(!head.contains("authorization: bearer"), "the upstream's key stays inside the tunnel: {head}");
    assert_eq!(*fake.negotiated.lock().unwrap(), vec!["h2".to_owned()], "TLS and ALPN end to end");
}
