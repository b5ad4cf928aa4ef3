//! How the gateway reaches its upstream: TCP with `TCP_NODELAY`, through the HTTP proxy the
//! environment names if any, and TLS with the platform's roots for `https` endpoints.
//!
//! The environment's proxy is read as curl reads it: `HTTPS_PROXY`, `HTTP_PROXY` and `ALL_PROXY`
//! (each also lower-case), with `NO_PROXY` exempting hosts. An `https` endpoint is reached through
//! a `CONNECT` tunnel; a plain `http` one by sending the request to the proxy in absolute form.
//! Credentials in the proxy's URL go with every request to it (`Proxy-Authorization: Basic`).
//!
//! The operator configures an Agent's egress through files rather than those variables (see
//! [`PROXY_URL_FILE_ENV`] and [`TRUSTED_CA_FILE_ENV`]), so a proxy's credentials sit in a mounted
//! Secret, not in the process environment.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::{HeaderValue, Uri};
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::proxy::Tunnel;
use hyper_util::client::legacy::connect::{Connected, Connection, HttpConnector};
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use rustls_platform_verifier::{ConfigVerifierExt, Verifier};
use tokio::net::TcpStream;
use tower::Service;

/// Time allowed to open a TCP connection (to the upstream or its proxy).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Idle connections kept per upstream host, by hyper-util's pool and by [`super::plain_http`].
pub(crate) const IDLE_CONNECTIONS_PER_HOST: usize = 1024;

/// Names a file holding the egress proxy's URL, credentials included if it needs them (the operator
/// mounts it from `spec.model.egress.proxySecretRef`). When set, it is the proxy for `http` and
/// `https` endpoints alike, in place of `HTTPS_PROXY`/`HTTP_PROXY`/`ALL_PROXY`; `NO_PROXY` still
/// exempts hosts.
pub const PROXY_URL_FILE_ENV: &str = "STRATA_PROXY_URL_FILE";

/// Names a PEM file of certificate authorities trusted in addition to the system's (the operator
/// mounts it from `spec.model.egress.trustedCAConfigMapRef`): for an endpoint, or a TLS-inspecting
/// proxy, whose certificate a private authority issued.
pub const TRUSTED_CA_FILE_ENV: &str = "STRATA_TRUSTED_CA_FILE";

/// A connection error of any layer.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The full connector: the proxy-aware TCP connector wrapped in TLS for `https` endpoints.
pub type UpstreamConnector = HttpsConnector<ProxiedConnector>;

/// Wraps `proxied` in TLS with the platform verifier's roots, and the authorities of the file
/// [`TRUSTED_CA_FILE_ENV`] names when set; HTTP/2 offered by ALPN.
pub fn upstream_connector(proxied: ProxiedConnector) -> Result<UpstreamConnector, String> {
    let extra_roots = match std::env::var_os(TRUSTED_CA_FILE_ENV) {
        Some(path) => trusted_authorities_file(Path::new(&path))?,
        None => Vec::new(),
    };
    let tls = tls_config(extra_roots)?;
    Ok(HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(proxied))
}

/// A client TLS config that verifies with the platform's roots plus `extra_roots`.
fn tls_config(extra_roots: Vec<CertificateDer<'static>>) -> Result<rustls::ClientConfig, String> {
    if extra_roots.is_empty() {
        return rustls::ClientConfig::with_platform_verifier()
            .map_err(|error| format!("loading the platform's TLS roots: {error}"));
    }
    let builder = rustls::ClientConfig::builder();
    let verifier = Verifier::new_with_extra_roots(extra_roots, Arc::clone(builder.crypto_provider()))
        .map_err(|error| format!("loading the platform's TLS roots and the trusted authorities: {error}"))?;
    Ok(builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier)).with_no_client_auth())
}

/// The certificates of the PEM file at `path`, read for [`TRUSTED_CA_FILE_ENV`].
fn trusted_authorities_file(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let text = std::fs::read(path).map_err(|error| {
        format!("reading the trusted authorities {} ({TRUSTED_CA_FILE_ENV}): {error}", path.display())
    })?;
    trusted_authorities(&text).map_err(|error| {
        format!("the trusted authorities {} ({TRUSTED_CA_FILE_ENV}): {error}", path.display())
    })
}

/// The certificates of a PEM bundle: at least one, and every `CERTIFICATE` block well formed.
/// Other blocks (a key pasted in by mistake) are skipped.
pub fn trusted_authorities(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("not a valid PEM bundle: {error}"))?;
    if certificates.is_empty() {
        return Err("it holds no PEM certificate (a -----BEGIN CERTIFICATE----- block)".into());
    }
    let mut parsed = rustls::RootCertStore::empty();
    for (index, certificate) in certificates.iter().enumerate() {
        parsed
            .add(certificate.clone())
            .map_err(|error| format!("certificate {} of the bundle cannot be used: {error}", index + 1))?;
    }
    Ok(certificates)
}

/// Opens TCP connections to the upstream, or to the proxy the environment names for it.
#[derive(Clone)]
pub struct ProxiedConnector {
    tcp: HttpConnector,
    proxies: Arc<Matcher>,
}

impl ProxiedConnector {
    /// A connector that honours the proxy in the file [`PROXY_URL_FILE_ENV`] names, or else the
    /// environment's proxy variables.
    pub fn from_environment() -> Result<Self, String> {
        let Some(path) = std::env::var_os(PROXY_URL_FILE_ENV) else {
            return Ok(Self::with_proxies(Matcher::from_env()));
        };
        let path = Path::new(&path);
        let url = std::fs::read_to_string(path).map_err(|error| {
            format!("reading the egress proxy's URL {} ({PROXY_URL_FILE_ENV}): {error}", path.display())
        })?;
        let no_proxy = ["NO_PROXY", "no_proxy"].into_iter().find_map(|name| std::env::var(name).ok());
        Self::through(url.trim(), no_proxy.as_deref().unwrap_or_default()).map_err(|error| {
            format!("the egress proxy in {} ({PROXY_URL_FILE_ENV}): {error}", path.display())
        })
    }

    /// A connector that sends every request through the proxy at `url`, except to the hosts of
    /// `no_proxy` (see [`proxy_matcher`]).
    pub(crate) fn through(url: &str, no_proxy: &str) -> Result<Self, String> {
        proxy_matcher(url, no_proxy).map(Self::with_proxies)
    }

    fn with_proxies(proxies: Matcher) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(CONNECT_TIMEOUT));
        Self { tcp, proxies: Arc::new(proxies) }
    }

    /// A connector that goes to every host directly.
    #[cfg(test)]
    pub(crate) fn direct() -> Self {
        Self::with_proxies(Matcher::builder().build())
    }

    /// Whether requests to `uri` go to it directly, through no proxy.
    pub fn is_direct(&self, uri: &Uri) -> bool {
        self.proxies.intercept(uri).is_none()
    }

    /// The `Proxy-Authorization` value for a plain-HTTP request to `uri` sent through a proxy with
    /// credentials, if that is how `uri` is reached.
    pub fn proxy_authorization(&self, uri: &Uri) -> Option<HeaderValue> {
        if uri.scheme_str() == Some("https") {
            return None;
        }
        self.proxies.intercept(uri).and_then(|proxy| proxy.basic_auth().cloned())
    }
}

/// The proxy `url` for `http` and `https` endpoints alike, with the hosts of `no_proxy` (as
/// `NO_PROXY` lists them) exempt. `url` must be an absolute `http` URL of a host; credentials in it
/// are sent to the proxy.
fn proxy_matcher(url: &str, no_proxy: &str) -> Result<Matcher, String> {
    let parsed: Uri = url.parse().map_err(|_| "it is not a URL: write it as http://host:port".to_owned())?;
    if parsed.scheme_str() != Some("http") || parsed.host().is_none_or(str::is_empty) {
        return Err("the proxy must be an http:// URL of a host, e.g. http://proxy.example:3128".into());
    }
    Ok(Matcher::builder().http(url.to_owned()).https(url.to_owned()).no(no_proxy.to_owned()).build())
}

/// A TCP connection to the upstream or to its proxy. `through_proxy` marks a plain-HTTP
/// connection to a proxy, to which requests go in absolute form.
pub struct ProxiedStream {
    io: TokioIo<TcpStream>,
    through_proxy: bool,
}

impl Service<Uri> for ProxiedConnector {
    type Response = ProxiedStream;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<ProxiedStream, BoxError>> + Send>>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Service::<Uri>::poll_ready(&mut self.tcp, context).map_err(Into::into)
    }

    fn call(&mut self, destination: Uri) -> Self::Future {
        let mut tcp = self.tcp.clone();
        let proxy = self.proxies.intercept(&destination);
        Box::pin(async move {
            match proxy {
                None => {
                    let io = tcp.call(destination).await?;
                    Ok(ProxiedStream { io, through_proxy: false })
                }
                Some(proxy) if destination.scheme_str() == Some("https") => {
                    let mut tunnel = Tunnel::new(proxy.uri().clone(), tcp);
                    if let Some(credentials) = proxy.basic_auth() {
                        tunnel = tunnel.with_auth(credentials.clone());
                    }
                    let io = tunnel.call(destination).await.map_err(|error| {
                        BoxError::from(format!("opening a tunnel through the proxy {}: {error}", proxy.uri()))
                    })?;
                    Ok(ProxiedStream { io, through_proxy: false })
                }
                Some(proxy) => {
                    let io = tcp.call(proxy.uri().clone()).await.map_err(|error| {
                        BoxError::from(format!("connecting to the proxy {}: {error}", proxy.uri()))
                    })?;
                    Ok(ProxiedStream { io, through_proxy: true })
                }
            }
        })
    }
}

impl Connection for ProxiedStream {
    fn connected(&self) -> Connected {
        self.io.inner().connected().proxy(self.through_proxy)
    }
}

impl Read for ProxiedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffer: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(context, buffer)
    }
}

impl Write for ProxiedStream {
    fn poll_write(self: Pin<&mut Self>, context: &mut Context<'_>, bytes: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(context, bytes)
    }

    fn poll_flush(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(context)
    }

    fn poll_shutdown(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(context)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(context, buffers)
    }
}

/// A pooled HTTP client over [`upstream_connector`] with the environment's proxy, and that proxy's
/// connector (which requests go through it, for their `Proxy-Authorization`).
///
/// Idle connections close after `idle_timeout`: without the pool's timer they stay open for good
/// (after a burst of 2,048 streams, that many sockets and their buffers). The client's own timer
/// runs HTTP/2's keep-alive. It follows no redirect: a followed 307 would resend the prompt, and a
/// provider's key header, to another host, so a redirect reaches the caller as the status it is.
pub(crate) fn pooled_client<B>(
    idle_timeout: Duration,
) -> Result<(Client<UpstreamConnector, B>, ProxiedConnector), String>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    let proxied = ProxiedConnector::from_environment()?;
    Ok((pooled_client_through(proxied.clone(), idle_timeout)?, proxied))
}

/// [`pooled_client`] over `proxied`.
pub(crate) fn pooled_client_through<B>(
    proxied: ProxiedConnector,
    idle_timeout: Duration,
) -> Result<Client<UpstreamConnector, B>, String>
where
    B: hyper::body::Body + Send,
    B::Data: Send,
{
    let _ = rustls::crypto::ring::default_provider().install_default();
    let connector = upstream_connector(proxied)?;
    let client = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(IDLE_CONNECTIONS_PER_HOST)
        .pool_idle_timeout(idle_timeout)
        .pool_timer(TokioTimer::new())
        .timer(TokioTimer::new())
        .build(connector);
    Ok(client)
}

/// Why a request to `peer` (for example "the upstream") failed: the error with every cause under
/// it, and what to do when the peer's certificate was refused.
pub(crate) fn request_failure(error: &hyper_util::client::legacy::Error, peer: &str) -> String {
    let mut reason = error_chain(error);
    if let Some(advice) = certificate_refusal(error) {
        reason.push_str(&format!("; {peer}'s TLS certificate was refused: {advice}"));
    }
    reason
}

/// An error with every cause under it (a transport error's own text names only its kind).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// What to do about a refused upstream certificate, when that is why a connection failed (the TLS
/// error sits somewhere in the chain, often inside an I/O error). A certificate does not change
/// between attempts, so such a failure is not worth trying again.
pub fn certificate_refusal(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut next = Some(error);
    while let Some(current) = next {
        if let Some(rustls::Error::InvalidCertificate(problem)) = current.downcast_ref::<rustls::Error>() {
            return Some(certificate_advice(problem));
        }
        // An I/O error's `source` skips the error it wraps (hyper-rustls wraps tokio-rustls's I/O
        // error, which wraps the TLS error), so the wrapped one is read directly.
        next = match current.downcast_ref::<io::Error>().and_then(io::Error::get_ref) {
            Some(wrapped) => Some(wrapped as &(dyn std::error::Error + 'static)),
            None => current.source(),
        };
    }
    None
}

fn certificate_advice(problem: &rustls::CertificateError) -> &'static str {
    use rustls::CertificateError as Problem;
    match problem {
        Problem::NotValidForName | Problem::NotValidForNameContext { .. } => {
            "the certificate is not for this host: check the host in upstream.endpoint"
        }
        Problem::Expired
        | Problem::ExpiredContext { .. }
        | Problem::NotValidYet
        | Problem::NotValidYetContext { .. } => {
            "the certificate is outside its validity period: renew it, or check the node's clock"
        }
        _ => {
            "the gateway trusts the system's certificate authorities, read from the PEM bundle that \
             SSL_CERT_FILE names (or the directory SSL_CERT_DIR names) when set: an upstream whose \
             certificate a private authority issued needs that authority's certificate there"
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Reads one request's head from `stream`, answers it `200` with `{}`, and returns the head.
    pub(in crate::gateway) async fn answer_once(stream: &mut TcpStream) -> String {
        let mut head = Vec::new();
        let mut buffer = [0u8; 4096];
        while !head.windows(4).any(|window| window == b"\r\n\r\n") {
            let read = stream.read(&mut buffer).await.unwrap();
            head.extend_from_slice(&buffer[..read]);
        }
        stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await.unwrap();
        String::from_utf8(head).unwrap()
    }

    #[test]
    fn a_refused_certificate_is_found_inside_an_io_error_with_what_to_do() {
        let refused = |problem| {
            let tls = rustls::Error::InvalidCertificate(problem);
            // As hyper-rustls reports it: tokio-rustls's I/O error inside another I/O error.
            let inner = io::Error::new(io::ErrorKind::InvalidData, tls);
            let wrapped: BoxError = Box::new(io::Error::other(inner));
            certificate_refusal(wrapped.as_ref())
        };
        let unknown = refused(rustls::CertificateError::UnknownIssuer).unwrap();
        assert!(unknown.contains("SSL_CERT_FILE"), "{unknown}");
        let wrong_host = refused(rustls::CertificateError::NotValidForName).unwrap();
        assert!(wrong_host.contains("upstream.endpoint"), "{wrong_host}");
        let expired = refused(rustls::CertificateError::Expired).unwrap();
        assert!(expired.contains("validity"), "{expired}");
        let refused_connection = io::Error::new(io::ErrorKind::ConnectionRefused, "connection refused");
        assert!(certificate_refusal(&refused_connection).is_none(), "not a certificate problem");
        let other_tls = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        assert!(certificate_refusal(&other_tls).is_none(), "a TLS failure that is not the certificate");
    }

    #[test]
    fn a_trusted_authorities_bundle_holds_certificates_and_nothing_unusable() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let pem = params.self_signed(&key).unwrap().pem();
        let bundle = format!("{pem}{pem}");
        assert_eq!(trusted_authorities(bundle.as_bytes()).unwrap().len(), 2);
        let with_key = format!("{}{pem}", key.serialize_pem());
        assert_eq!(trusted_authorities(with_key.as_bytes()).unwrap().len(), 1, "a key block is skipped");
        let empty = trusted_authorities(b"just text").unwrap_err();
        assert!(empty.contains("no PEM certificate"), "{empty}");
        let garbage = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let unusable = trusted_authorities(garbage.as_bytes()).unwrap_err();
        assert!(unusable.contains("certificate 1"), "{unusable}");
    }

    #[test]
    fn the_operators_proxy_serves_both_schemes_and_honours_no_proxy() {
        let connector = ProxiedConnector::with_proxies(
            proxy_matcher("http://agent:s3cret@proxy.example:3128", "internal.example,10.0.0.0/8").unwrap(),
        );
        let plain: Uri = "http://model.example/v1".parse().unwrap();
        assert_eq!(
            connector.proxy_authorization(&plain).unwrap().to_str().unwrap(),
            "Basic YWdlbnQ6czNjcmV0"
        );
        let tls: Uri = "https://model.example/v1".parse().unwrap();
        assert!(connector.proxies.intercept(&tls).is_some(), "https endpoints go through it too");
        let exempt: Uri = "https://internal.example/v1".parse().unwrap();
        assert!(connector.proxies.intercept(&exempt).is_none(), "NO_PROXY is honoured");
        for refused in ["proxy.example:3128", "https://proxy.example:3128", "not a url"] {
            let error = proxy_matcher(refused, "").unwrap_err();
            assert!(error.contains("http://"), "{refused}: {error}");
        }
    }

    fn matcher(http_proxy: &str, no_proxy: &str) -> Matcher {
        Matcher::builder().http(http_proxy).https(http_proxy).no(no_proxy).build()
    }

    #[test]
    fn credentials_go_with_plain_http_requests_through_a_proxy_only() {
        let connector =
            ProxiedConnector::with_proxies(matcher("http://user:secret@127.0.0.1:3128", "internal"));
        let plain: Uri = "http://model.example/v1/chat/completions".parse().unwrap();
        let auth = connector.proxy_authorization(&plain).unwrap();
        assert_eq!(auth.to_str().unwrap(), "Basic dXNlcjpzZWNyZXQ=");
        let tls: Uri = "https://model.example/v1/chat/completions".parse().unwrap();
        assert!(connector.proxy_authorization(&tls).is_none(), "sent in the CONNECT, not the request");
        let exempt: Uri = "http://internal/v1/chat/completions".parse().unwrap();
        assert!(connector.proxy_authorization(&exempt).is_none(), "NO_PROXY is honoured");
    }

    /// An `https` endpoint is spoken to in TLS: the first bytes it receives are a TLS handshake
    /// record, and an endpoint that answers in plain HTTP fails the call.
    #[tokio::test]
    async fn an_https_endpoint_is_reached_over_tls() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = server.local_addr().unwrap();
        let first_byte = tokio::spawn(async move {
            let (mut stream, _) = server.accept().await.unwrap();
            let mut byte = [0u8; 1];
            stream.read_exact(&mut byte).await.unwrap();
            let _ = stream.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}").await;
            byte[0]
        });
        let connector = upstream_connector(ProxiedConnector::direct()).unwrap();
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build::<_, http_body_util::Empty<bytes::Bytes>>(connector);
        let answer = client.get(format!("https://{address}/v1/models").parse().unwrap()).await;
        assert!(answer.is_err(), "a plain-HTTP answer to a TLS client is refused");
        assert_eq!(first_byte.await.unwrap(), 0x16, "the connection opened with a TLS handshake record");
    }

    /// A plain-HTTP endpoint behind a proxy: the connection goes to the proxy, and the request is
    /// sent to it in absolute form.
    #[tokio::test]
    async fn a_plain_http_request_goes_to_the_proxy_in_absolute_form() {
        let proxy = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_address = proxy.local_addr().unwrap();
        let seen = tokio::spawn(async move {
            let (mut stream, _) = proxy.accept().await.unwrap();
            answer_once(&mut stream).await
        });
        let connector = ProxiedConnector::with_proxies(matcher(&format!("http://{proxy_address}"), ""));
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build::<_, http_body_util::Empty<bytes::Bytes>>(connector);
        let answer = client.get("http://model.example:8080/v1/models".parse().unwrap()).await.unwrap();
        assert_eq!(answer.status(), 200);
        let head = seen.await.unwrap();
        assert!(head.starts_with("GET http://model.example:8080/v1/models HTTP/1.1\r\n"), "{head}");
    }
}
