//! A plugin's network capabilities: the outbound HTTP policy its
//! `wasi:http/outgoing-handler` calls go through, and the route prefixes
//! it may serve.
//!
//! Policy is data: the manifest asks (`capabilities.outbound_hosts`,
//! `capabilities.routes`), the operator grants ([`NetGrant`]), and
//! [`PluginNet::resolve`] is the one place the two meet. An outbound request
//! goes out only when its `host:port` is in both lists and every address the
//! name resolves to is public; a private, loopback or link-local address is
//! reached only when the allowlist names that address itself (an IP
//! literal). Plain-HTTP requests connect to the address that was checked
//! (no second lookup a rebinding DNS server could answer differently);
//! HTTPS requests keep the name for TLS, whose certificate check binds it.
//! Connect and first-byte timeouts and the response size are capped by the
//! operator whatever the guest asks. Every refusal is logged with the
//! plugin's name.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use wasmtime_wasi_http::{Error as HttpError, RequestOptions, WasiBody, WasiHttpHooks};

use super::identity::{PluginGrant, PluginId};

/// One allowed destination: a host name or IP literal, and a port (`None`:
/// the scheme's default port).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    host: String,
    port: Option<u16>,
}

impl HostPattern {
    /// Parses `host`, `host:port`, `1.2.3.4:80` or `[::1]:80`.
    pub fn parse(text: &str) -> Result<HostPattern, String> {
        let text = text.trim();
        let bad = || format!("{text:?} is not `host` or `host:port`");
        let (host, port) = if let Some(rest) = text.strip_prefix('[') {
            let (ip, after) = rest.split_once(']').ok_or_else(bad)?;
            let port = match after.strip_prefix(':') {
                Some(p) => Some(p.parse::<u16>().map_err(|_| bad())?),
                None if after.is_empty() => None,
                None => return Err(bad()),
            };
            (ip.to_string(), port)
        } else {
            match text.rsplit_once(':') {
                Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p.parse::<u16>().map_err(|_| bad())?)),
                Some(_) => return Err(bad()),
                None => (text.to_string(), None),
            }
        };
        let host_ok = !host.is_empty()
            && host.len() <= 253
            && (host.parse::<IpAddr>().is_ok() || host.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'));
        if !host_ok || port == Some(0) {
            return Err(bad());
        }
        Ok(HostPattern { host: host.to_ascii_lowercase(), port })
    }

    /// Whether a request to `host:port` over a scheme whose default port is
    /// `default_port` matches.
    fn matches(&self, host: &str, port: u16, default_port: u16) -> bool {
        self.host.eq_ignore_ascii_case(host) && self.port.unwrap_or(default_port) == port
    }

    /// The IP address the pattern names, if it is a literal.
    fn ip(&self) -> Option<IpAddr> {
        self.host.parse().ok()
    }
}

impl std::fmt::Display for HostPattern {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.host.contains(':'), self.port) {
            (true, Some(p)) => write!(f, "[{}]:{p}", self.host),
            (false, Some(p)) => write!(f, "{}:{p}", self.host),
            (_, None) => write!(f, "{}", self.host),
        }
    }
}

/// Whether `prefix` may be a plugin's route prefix: under `/proxy/`, at
/// least one segment more, ending with `/`, plain path characters.
pub fn is_route_prefix(prefix: &str) -> bool {
    prefix.len() > "/proxy/".len()
        && prefix.len() <= 256
        && prefix.starts_with("/proxy/")
        && prefix.ends_with('/')
        && !prefix.contains("//")
        && !prefix.split('/').any(|s| s == "." || s == "..")
        && prefix.chars().all(|c| c.is_ascii_alphanumeric() || "-._~/".contains(c))
}

/// Whether `ip` is an address a plugin reaches only when named explicitly:
/// loopback, private, link-local, shared (CGNAT), unspecified, broadcast,
/// multicast, unique-local, and IPv4 inside IPv6 of those.
pub fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, ..] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || a == 0
                || (a == 100 && (64..128).contains(&b))
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return is_internal(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback() || v6.is_unspecified() || v6.is_multicast() || (first & 0xfe00) == 0xfc00 || (first & 0xffc0) == 0xfe80
        }
    }
}

/// The operator's ceilings on a plugin's outbound requests.
#[derive(Debug, Clone, Copy)]
pub struct OutboundLimits {
    /// Name resolution plus TCP (and TLS) connection.
    pub connect_timeout: Duration,
    /// From the request sent to the response's first byte (its head), and
    /// between two chunks of its body.
    pub first_byte_timeout: Duration,
    /// Largest response body; a longer one fails the guest's read.
    pub max_response_bytes: u64,
}

impl Default for OutboundLimits {
    fn default() -> OutboundLimits {
        OutboundLimits { connect_timeout: Duration::from_secs(10), first_byte_timeout: Duration::from_secs(60), max_response_bytes: 64 << 20 }
    }
}

/// What the operator grants one plugin (the bundled partner plugin's grant
/// is derived from the `partner_*` settings, see `config`).
#[derive(Debug, Clone)]
pub struct NetGrant {
    /// The plugin it names (a directory, a component hash, or bundled).
    pub plugin: PluginGrant,
    /// Hosts it may reach (intersected with its manifest's list).
    pub outbound_hosts: Vec<HostPattern>,
    /// Whether its manifest's routes are mounted.
    pub routes: bool,
    /// Plugin configuration, handed to the plugin (only to it) as its WASI
    /// environment: settings and secrets such as a provider key.
    pub env: Vec<(String, String)>,
}

/// A loaded plugin's network capabilities, as granted.
#[derive(Debug, Clone, Default)]
pub struct PluginNet {
    /// Destinations its outbound requests may reach.
    pub allowed: Arc<[HostPattern]>,
    /// Route prefixes it serves (empty: none).
    pub routes: Vec<String>,
    /// Its configuration (WASI environment).
    pub env: Arc<[(String, String)]>,
}

impl PluginNet {
    /// What `grants` give plugin `id` of the manifest asking for
    /// `asked_hosts` and `asked_routes`. Asking for outbound hosts when no
    /// grant names the plugin, or for routes when none grants it routes, is
    /// an error (`Err` names the capability, e.g. `routes: /proxy/x/`).
    pub fn resolve(
        grants: &[NetGrant],
        id: &PluginId,
        component_hash: &blake3::Hash,
        asked_hosts: &[String],
        asked_routes: &[String],
    ) -> Result<PluginNet, String> {
        let granted: Vec<&NetGrant> = grants.iter().filter(|g| g.plugin.matches(id, component_hash)).collect();
        let any_host = asked_hosts.iter().any(|h| h == "*");
        let asked: Vec<HostPattern> = asked_hosts.iter().filter_map(|h| HostPattern::parse(h).ok()).collect();
        let allowed: Vec<HostPattern> = granted.iter().flat_map(|g| g.outbound_hosts.iter()).filter(|g| any_host || asked.contains(g)).cloned().collect();
        if let Some(host) = asked_hosts.first()
            && granted.is_empty()
        {
            return Err(format!("outbound_hosts: {host}"));
        }
        if let Some(route) = asked_routes.first()
            && !granted.iter().any(|g| g.routes)
        {
            return Err(format!("routes: {route}"));
        }
        let env: Vec<(String, String)> = granted.iter().flat_map(|g| g.env.iter().cloned()).collect();
        Ok(PluginNet { allowed: allowed.into(), routes: asked_routes.to_vec(), env: env.into() })
    }
}

/// The `wasi:http` hooks of one call's store: every outgoing request passes
/// [`OutboundPolicy::send_request`].
#[derive(Clone)]
pub struct OutboundPolicy {
    plugin: Arc<str>,
    allowed: Arc<[HostPattern]>,
    limits: OutboundLimits,
}

impl OutboundPolicy {
    /// The policy of plugin `plugin` (its name, for logs).
    pub fn new(plugin: Arc<str>, allowed: Arc<[HostPattern]>, limits: OutboundLimits) -> OutboundPolicy {
        OutboundPolicy { plugin, allowed, limits }
    }

    /// Logs and returns a refusal.
    fn refuse(&self, host: &str, port: u16, why: &str, error: HttpError) -> HttpError {
        tracing::warn!(plugin = %self.plugin, host, port, "outbound request refused: {why}");
        error
    }

    /// Where a request to `uri` may connect: the checked address for plain
    /// HTTP, or `None` (connect by name) for HTTPS; or why not.
    async fn check(&self, uri: &http::Uri) -> Result<Option<SocketAddr>, HttpError> {
        let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
        let default_port = if https { 443 } else { 80 };
        let host = uri.host().unwrap_or("").trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase();
        let port = uri.port_u16().unwrap_or(default_port);
        let Some(pattern) = self.allowed.iter().find(|p| p.matches(&host, port, default_port)) else {
            return Err(self.refuse(&host, port, "not in the plugin's allowlist", HttpError::HttpRequestDenied));
        };
        if let Some(ip) = pattern.ip() {
            return Ok((!https).then_some(SocketAddr::new(ip, port)));
        }
        let lookup = tokio::time::timeout(self.limits.connect_timeout, tokio::net::lookup_host((host.as_str(), port))).await;
        let addrs: Vec<SocketAddr> = match lookup {
            Err(_) => return Err(self.refuse(&host, port, "name resolution timed out", HttpError::DnsTimeout)),
            Ok(Err(_)) => return Err(self.refuse(&host, port, "the name does not resolve", HttpError::DestinationNotFound)),
            Ok(Ok(addrs)) => addrs.collect(),
        };
        if let Some(internal) = addrs.iter().find(|a| is_internal(a.ip())) {
            let why = format!("{host} resolves to the internal address {}, which the allowlist does not name", internal.ip());
            return Err(self.refuse(&host, port, &why, HttpError::DestinationIpProhibited));
        }
        match addrs.first() {
            Some(addr) => Ok((!https).then_some(*addr)),
            None => Err(self.refuse(&host, port, "the name resolves to no address", HttpError::DestinationNotFound)),
        }
    }

    /// The guest's timeouts, capped by the operator's.
    fn capped(&self, options: Option<RequestOptions>) -> RequestOptions {
        let cap = |asked: Option<Duration>, max: Duration| Some(asked.map_or(max, |a| a.min(max)));
        let o = options.unwrap_or_default();
        RequestOptions {
            connect_timeout: cap(o.connect_timeout, self.limits.connect_timeout),
            first_byte_timeout: cap(o.first_byte_timeout, self.limits.first_byte_timeout),
            between_bytes_timeout: cap(o.between_bytes_timeout, self.limits.first_byte_timeout),
        }
    }

    async fn send(
        self,
        mut request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
    ) -> Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), HttpError>> + Send>), HttpError> {
        if let Some(addr) = self.check(request.uri()).await? {
            let path = request.uri().path_and_query().map_or("/", |p| p.as_str()).to_string();
            *request.uri_mut() =
                http::Uri::builder().scheme("http").authority(addr.to_string()).path_and_query(path).build().map_err(|_| HttpError::HttpRequestUriInvalid)?;
        }
        let max = self.limits.max_response_bytes;
        let (response, io) = wasmtime_wasi_http::default_send_request(request, Some(self.capped(options))).await?;
        let declared = response.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > max) {
            tracing::warn!(plugin = %self.plugin, max, "outbound response refused: its body is larger than the limit");
            return Err(HttpError::HttpResponseBodySize(declared));
        }
        let plugin = self.plugin.clone();
        let limited = response.map(move |body| {
            http_body_util::Limited::new(body, usize::try_from(max).unwrap_or(usize::MAX))
                .map_err(move |e| match e.downcast::<HttpError>() {
                    Ok(inner) => *inner,
                    Err(_) => {
                        tracing::warn!(plugin = %plugin, max, "outbound response cut: its body is larger than the limit");
                        HttpError::HttpResponseBodySize(None)
                    }
                })
                .boxed_unsync()
        });
        Ok((limited, Box::new(io)))
    }
}

impl WasiHttpHooks for OutboundPolicy {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), HttpError>> + Send>,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, Box<dyn Future<Output = Result<(), HttpError>> + Send>), HttpError>> + Send> {
        Box::new(self.clone().send(request, options))
    }
}

/// A body of `bytes`, as `wasi:http` hands it to a guest.
pub fn full_body(bytes: Bytes) -> WasiBody {
    http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_patterns_parse_and_match() {
        let p = HostPattern::parse("API.example.com").unwrap();
        assert!(p.matches("api.example.com", 443, 443));
        assert!(!p.matches("api.example.com", 8443, 443));
        let q = HostPattern::parse("127.0.0.1:9999").unwrap();
        assert!(q.matches("127.0.0.1", 9999, 80) && !q.matches("127.0.0.1", 80, 80));
        assert_eq!(q.ip(), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(HostPattern::parse("[::1]:8080").unwrap().to_string(), "[::1]:8080");
        for bad in ["", "http://x", "x:0", "x:y", "a b", "x/y", "::1", "[::1]x"] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn internal_addresses_are_recognised() {
        for ip in
            ["127.0.0.1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1"]
        {
            assert!(is_internal(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["93.184.216.34", "8.8.8.8", "2606:4700::1111"] {
            assert!(!is_internal(ip.parse().unwrap()), "{ip}");
        }
    }

    #[test]
    fn route_prefixes_stay_under_proxy() {
        assert!(is_route_prefix("/proxy/partner/"));
        for bad in ["/proxy/", "/proxy/a", "/api/a/", "/proxy/../a/", "/proxy//a/", "/proxy/{x}/"] {
            assert!(!is_route_prefix(bad), "{bad}");
        }
    }

    #[test]
    fn grants_meet_manifests() {
        let id = PluginId::Bundled("p".into());
        let hash = blake3::hash(b"x");
        let grant = NetGrant {
            plugin: PluginGrant::Bundled("p".into()),
            outbound_hosts: vec![HostPattern::parse("a.com").unwrap(), HostPattern::parse("b.com:81").unwrap()],
            routes: true,
            env: vec![("K".into(), "v".into())],
        };
        let net = PluginNet::resolve(std::slice::from_ref(&grant), &id, &hash, &["b.com:81".into(), "c.com".into()], &["/proxy/p/".into()]).unwrap();
        assert_eq!(net.allowed.len(), 1, "only what both name");
        assert_eq!(net.env.len(), 1);
        let any = PluginNet::resolve(std::slice::from_ref(&grant), &id, &hash, &["*".into()], &[]).unwrap();
        assert_eq!(any.allowed.len(), 2);
        let other = PluginId::Bundled("q".into());
        let none = PluginNet::resolve(std::slice::from_ref(&grant), &other, &hash, &[], &[]).unwrap();
        assert!(none.allowed.is_empty() && none.env.is_empty(), "a grant names one plugin");
        assert_eq!(PluginNet::resolve(&[], &id, &hash, &[], &["/proxy/p/".into()]).unwrap_err(), "routes: /proxy/p/");
        assert_eq!(PluginNet::resolve(&[], &id, &hash, &["x.com".into()], &[]).unwrap_err(), "outbound_hosts: x.com");
        let no_routes = NetGrant { routes: false, ..grant.clone() };
        assert!(PluginNet::resolve(&[no_routes], &id, &hash, &["*".into()], &["/proxy/p/".into()]).is_err());
    }
}
