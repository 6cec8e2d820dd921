//! Plugin manifests (`kiln-plugin.toml`): who a plugin is and what it may use.
//!
//! Policy is data: the manifest asks, the operator's limits cap, and
//! [`Manifest::effective_limits`] is the one place the two meet. Nothing the
//! manifest says can widen what the operator allows.

use std::time::Duration;

use serde::Deserialize;

/// A plugin's manifest.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// Unique plugin name.
    pub name: String,
    /// The plugin's version.
    pub version: String,
    /// File name of the component, relative to the manifest.
    pub component: String,
    /// Resource ceilings the plugin asks for.
    #[serde(default)]
    pub limits: RequestedLimits,
    /// Capabilities the plugin asks for.
    #[serde(default)]
    pub capabilities: Capabilities,
    /// Node classes whose results depend on more than their inputs (the
    /// time, fresh randomness), or `["*"]` for all of the plugin's classes.
    /// Their calls see the real clocks and the OS's randomness, and their
    /// results (and everything downstream) are never served from the cache.
    /// Every other class gets virtual clocks and seeded randomness (see
    /// `plugins::determinism`). Each class listed must be one the plugin
    /// defines. Default: none.
    #[serde(default)]
    pub nondeterministic: Vec<String>,
    /// The text it was parsed from (a bundle carries it verbatim; its
    /// blake3 pins it).
    #[serde(skip)]
    pub text: std::sync::Arc<str>,
}

/// What a plugin asks for; absent values take the operator's defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedLimits {
    /// Linear memory per node call, MiB.
    pub memory_mb: Option<u64>,
    /// Wall-clock time per node call, ms.
    pub timeout_ms: Option<u64>,
}

/// Capabilities beyond pure computation. The manifest asks; the operator
/// grants (see `network` for outbound hosts and routes, `secrets`); a plugin
/// asking for one the host cannot grant at all is refused at load.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Capabilities {
    /// Its own WGSL kernels on the host's GPU (`kiln:plugin/gpu`): without
    /// it `gpu.available()` is false. Bounded like host kernels (see `gpu`).
    #[serde(default)]
    pub gpu: bool,
    /// Hosts the plugin may call through `wasi:http/outgoing-handler`:
    /// `host` (the scheme's default port) or `host:port`, or `"*"`: any
    /// host the operator grants it. What it may really reach is this list
    /// intersected with the operator's grant (see `network`).
    #[serde(default)]
    pub outbound_hosts: Vec<String>,
    /// Path prefixes under `/proxy/` the plugin serves through its
    /// `wasi:http/incoming-handler` export (e.g. `"/proxy/partner/"`),
    /// mounted only when the operator grants the plugin routes.
    #[serde(default)]
    pub routes: Vec<String>,
    /// Secrets the plugin may receive from a job's `extra_data` (see
    /// `secrets`); the operator must grant the plugin (`secret_plugins`).
    #[serde(default)]
    pub secrets: Vec<String>,
}

/// The operator's ceilings and defaults for node calls.
#[derive(Debug, Clone, Copy)]
pub struct OperatorLimits {
    pub default_memory_bytes: u64,
    pub max_memory_bytes: u64,
    pub default_timeout: Duration,
    pub max_timeout: Duration,
}

/// The limits a plugin's node calls actually run under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EffectiveLimits {
    pub memory_bytes: u64,
    pub timeout: Duration,
}

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest is not valid TOML for kiln-plugin.toml: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("manifest field `{field}` is invalid: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("plugin asks for capability `{0}`, which this host does not grant")]
    CapabilityNotGranted(String),
}

/// Interfaces any plugin may import: kiln's own and the WASI runtime a
/// Rust or C guest links (the host gives it no files or sockets).
const PROVIDED_IMPORTS: &[&str] = &["kiln:plugin/", "wasi:cli/", "wasi:io/", "wasi:clocks/", "wasi:random/", "wasi:filesystem/", "wasi:sockets/"];
/// `wasi:http`: only for a plugin whose manifest asks for the network.
const HTTP_IMPORTS: &str = "wasi:http/";
/// kiln's own interfaces, `kiln:plugin/<name>@<version>`.
const CONTRACT: &str = "kiln:plugin/";
/// The versions of `kiln:plugin` this host implements: a component built
/// against any of them loads (the linker resolves an older patch version
/// to the newest, see `wit/kiln-plugin.wit`); `NEWEST` is the package
/// version of `wit/kiln-plugin.wit`.
pub const CONTRACT_OLDEST: (u64, u64, u64) = (0, 1, 0);
pub const CONTRACT_NEWEST: (u64, u64, u64) = (0, 1, 2);

/// Why a component's import does not fit its manifest.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    #[error("imports `{0}`, which kiln does not provide")]
    NotProvided(String),
    #[error("imports `{import}`, but its manifest does not declare it: it needs {needs}")]
    Undeclared { import: String, needs: &'static str },
    #[error("imports `{import}`: it was built against a version of kiln's plugin contract this host does not implement (it speaks kiln:plugin@{}.{}.{} to @{}.{}.{})", CONTRACT_OLDEST.0, CONTRACT_OLDEST.1, CONTRACT_OLDEST.2, CONTRACT_NEWEST.0, CONTRACT_NEWEST.1, CONTRACT_NEWEST.2)]
    Version { import: String },
}

/// Whether `import` (`kiln:plugin/<name>@<version>`) names a version of the
/// contract this host implements.
fn contract_version_ok(import: &str) -> bool {
    let Some((_, version)) = import.split_once('@') else { return false };
    let mut parts = version.split('.').map(|p| p.parse::<u64>().ok());
    match (parts.next().flatten(), parts.next().flatten(), parts.next().flatten(), parts.next()) {
        (Some(major), Some(minor), Some(patch), None) => (CONTRACT_OLDEST..=CONTRACT_NEWEST).contains(&(major, minor, patch)),
        _ => false,
    }
}

impl Manifest {
    /// Checks one import of the plugin's component against what kiln
    /// provides and what this manifest declares.
    pub fn check_import(&self, import: &str) -> Result<(), ImportError> {
        let caps = &self.capabilities;
        if import.starts_with(HTTP_IMPORTS) {
            if caps.outbound_hosts.is_empty() && caps.routes.is_empty() {
                return Err(ImportError::Undeclared { import: import.to_string(), needs: "`capabilities.outbound_hosts` or `capabilities.routes`" });
            }
            return Ok(());
        }
        if import.starts_with(CONTRACT) && !contract_version_ok(import) {
            return Err(ImportError::Version { import: import.to_string() });
        }
        match PROVIDED_IMPORTS.iter().any(|p| import.starts_with(p)) {
            true => Ok(()),
            false => Err(ImportError::NotProvided(import.to_string())),
        }
    }

    /// Parses and checks a manifest.
    pub fn parse(text: &str) -> Result<Manifest, ManifestError> {
        let mut manifest: Manifest = toml::from_str(text)?;
        manifest.text = std::sync::Arc::from(text);
        let name_ok =
            !manifest.name.is_empty() && manifest.name.len() <= 64 && manifest.name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !name_ok {
            return Err(ManifestError::Invalid { field: "name", reason: "1-64 of [A-Za-z0-9_-]".into() });
        }
        let component_ok =
            !manifest.component.is_empty() && !manifest.component.contains(['/', '\\']) && manifest.component != ".." && manifest.component.ends_with(".wasm");
        if !component_ok {
            return Err(ManifestError::Invalid { field: "component", reason: "a .wasm file name beside the manifest".into() });
        }
        if let Some(bad) = manifest.capabilities.outbound_hosts.iter().find(|h| h.as_str() != "*" && super::network::HostPattern::parse(h).is_err()) {
            return Err(ManifestError::Invalid { field: "capabilities.outbound_hosts", reason: format!("{bad:?} is not `host`, `host:port` or \"*\"") });
        }
        if let Some(bad) = manifest.capabilities.routes.iter().find(|r| !super::network::is_route_prefix(r)) {
            return Err(ManifestError::Invalid {
                field: "capabilities.routes",
                reason: format!("{bad:?} is not a path prefix under /proxy/ (letters, digits and -._~/, ending with /)"),
            });
        }
        if let Some(unknown) = manifest.capabilities.secrets.iter().find(|s| !super::secrets::KNOWN_SECRETS.contains(&s.as_str())) {
            return Err(ManifestError::Invalid {
                field: "capabilities.secrets",
                reason: format!("no secret is called {unknown:?}; known: {}", super::secrets::KNOWN_SECRETS.join(", ")),
            });
        }
        if manifest.nondeterministic.iter().any(|c| c == "*") && manifest.nondeterministic.len() > 1 {
            return Err(ManifestError::Invalid { field: "nondeterministic", reason: "\"*\" (every class) stands alone".into() });
        }
        Ok(manifest)
    }

    /// Checks that `nondeterministic` names only classes in `defs` (the
    /// plugin's own definitions, known once it is loaded).
    pub fn check_nondeterministic(&self, defs: &[super::NodeDef]) -> Result<(), ManifestError> {
        match self.nondeterministic.iter().find(|c| *c != "*" && !defs.iter().any(|d| &d.class_type == *c)) {
            Some(unknown) => Err(ManifestError::Invalid { field: "nondeterministic", reason: format!("the plugin defines no node class `{unknown}`") }),
            None => Ok(()),
        }
    }

    /// Whether calls of `class_type` get virtual clocks and seeded
    /// randomness, and their results may be cached.
    pub fn is_deterministic(&self, class_type: &str) -> bool {
        !self.nondeterministic.iter().any(|c| c == "*" || c == class_type)
    }

    /// The manifest's requests, capped by the operator.
    pub fn effective_limits(&self, op: &OperatorLimits) -> EffectiveLimits {
        let memory = self.limits.memory_mb.map(|mb| mb.saturating_mul(1 << 20)).unwrap_or(op.default_memory_bytes);
        let timeout = self.limits.timeout_ms.map(Duration::from_millis).unwrap_or(op.default_timeout);
        EffectiveLimits { memory_bytes: memory.min(op.max_memory_bytes), timeout: timeout.min(op.max_timeout) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_of_each_contract_version_this_host_speaks_are_taken_others_refused_naming_the_range() {
        let m = Manifest::parse("name = \"p\"\nversion = \"1\"\ncomponent = \"p.wasm\"\n").unwrap();
        for ok in ["kiln:plugin/tensors@0.1.0", "kiln:plugin/host@0.1.1", "kiln:plugin/gpu@0.1.2", "wasi:io/streams@0.2.6"] {
            assert!(m.check_import(ok).is_ok(), "{ok}");
        }
        for newer in ["kiln:plugin/tensors@0.1.3", "kiln:plugin/tensors@0.2.0", "kiln:plugin/tensors@1.0.0", "kiln:plugin/tensors", "kiln:plugin/tensors@0.1"] {
            let e = m.check_import(newer).unwrap_err().to_string();
            assert!(e.contains(newer) && e.contains("it speaks kiln:plugin@0.1.0 to @0.1.2"), "{e}");
        }
        let e = m.check_import("wasi:http/types@0.2.6").unwrap_err().to_string();
        assert!(e.contains("it needs `capabilities.outbound_hosts` or `capabilities.routes`"), "{e}");
        assert!(m.check_import("acme:evil/iface@1.0.0").unwrap_err().to_string().contains("which kiln does not provide"));
    }

    #[test]
    fn the_newest_contract_version_is_the_wit_package_version() {
        let wit = include_str!("../../../wit/kiln-plugin.wit");
        let (a, b, c) = CONTRACT_NEWEST;
        assert!(
            wit.lines().any(|l| l.trim() == format!("package kiln:plugin@{a}.{b}.{c};")),
            "wit/kiln-plugin.wit's package version moved: update CONTRACT_NEWEST"
        );
    }

    const OP: OperatorLimits = OperatorLimits {
        default_memory_bytes: 256 << 20,
        max_memory_bytes: 1 << 30,
        default_timeout: Duration::from_secs(30),
        max_timeout: Duration::from_secs(60),
    };

    #[test]
    fn operator_caps_requests() {
        let m = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\n[limits]\nmemory_mb=8192\ntimeout_ms=5").unwrap();
        assert_eq!(m.effective_limits(&OP), EffectiveLimits { memory_bytes: 1 << 30, timeout: Duration::from_millis(5) });
        let d = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'").unwrap();
        assert_eq!(d.effective_limits(&OP), EffectiveLimits { memory_bytes: 256 << 20, timeout: Duration::from_secs(30) });
    }

    #[test]
    fn refuses_bad_names_paths_and_ungranted_capabilities() {
        assert!(Manifest::parse("name='a b'\nversion='1'\ncomponent='a.wasm'").is_err());
        assert!(Manifest::parse("name='a'\nversion='1'\ncomponent='../a.wasm'").is_err());
        assert!(Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\nsurprise=1").is_err());
        let net =
            Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\n[capabilities]\noutbound_hosts=['x.com', '127.0.0.1:9', '*']\nroutes=['/proxy/a/']")
                .unwrap();
        assert_eq!(net.capabilities.outbound_hosts.len(), 3);
        for bad in [
            "outbound_hosts=['http://x.com']",
            "outbound_hosts=['x.com:99999']",
            "routes=['/api/x/']",
            "routes=['/proxy/']",
            "routes=['/proxy/a']",
            "routes=['/proxy/{a}/']",
        ] {
            assert!(
                matches!(Manifest::parse(&format!("name='a'\nversion='1'\ncomponent='a.wasm'\n[capabilities]\n{bad}")), Err(ManifestError::Invalid { .. })),
                "{bad}"
            );
        }
        // Secrets: only ones kiln knows (the operator's grant is checked at load).
        let asks = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\n[capabilities]\nsecrets=['api_key_svc_org']").unwrap();
        assert_eq!(asks.capabilities.secrets, ["api_key_svc_org"]);
        let err = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\n[capabilities]\nsecrets=['HOME']").unwrap_err();
        assert!(err.to_string().contains("no secret is called \"HOME\""), "{err}");
    }

    #[test]
    fn nondeterministic_classes_are_listed_or_all() {
        let some = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\nnondeterministic=['Clock']").unwrap();
        assert!(!some.is_deterministic("Clock"));
        assert!(some.is_deterministic("Blur"));
        let all = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\nnondeterministic=['*']").unwrap();
        assert!(!all.is_deterministic("Blur"));
        let none = Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'").unwrap();
        assert!(none.is_deterministic("Clock"));
        assert!(Manifest::parse("name='a'\nversion='1'\ncomponent='a.wasm'\nnondeterministic=['*', 'Clock']").is_err());
    }
}
