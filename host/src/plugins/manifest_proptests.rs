//! Property tests of plugin manifests (`kiln-plugin.toml`), which tenants
//! upload with their own plugins: any text is a manifest or a
//! [`ManifestError`], never a panic or a stack overflow; nesting as deep as
//! an upload may hold is refused; and for manifests made of good and bad
//! fields, exactly the first broken rule — in the order `parse` checks
//! them — is the one named.

use proptest::prelude::*;

use super::manifest::{Manifest, ManifestError};

/// A TOML string literal of `s`.
fn quoted(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Pieces of TOML and of manifests, for text that is nearly a manifest.
fn soup() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("name = 'a'\n".to_string()),
        Just("version = '1'\n".to_string()),
        Just("component = 'a.wasm'\n".to_string()),
        Just("[capabilities]\n".to_string()),
        Just("[limits]\n".to_string()),
        Just("memory_mb = 18446744073709551615\n".to_string()),
        Just("timeout_ms = -1\n".to_string()),
        Just("routes = ['/proxy/x/']\n".to_string()),
        Just("outbound_hosts = ['*', 'a.b:1']\n".to_string()),
        Just("nondeterministic = ['*']\n".to_string()),
        Just("[[x]]\n".to_string()),
        Just("{".to_string()),
        Just("[".to_string()),
        Just("]".to_string()),
        Just("\"".to_string()),
        Just("'''".to_string()),
        Just("=".to_string()),
        Just("\u{0}".to_string()),
        "[ -~]{0,12}",
        any::<String>(),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

/// What `parse` checks, for a manifest with these fields and otherwise
/// well formed: the field of the first rule broken, `None` when none is.
fn first_broken(name: &str, component: &str, hosts: &[String], routes: &[String], secrets: &[String], nondet: &[String]) -> Option<&'static str> {
    let name_ok = (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    let component_ok = !component.contains(['/', '\\']) && component != ".." && component.ends_with(".wasm");
    let host_ok = |h: &String| h == "*" || super::network::HostPattern::parse(h).is_ok();
    if !name_ok {
        Some("name")
    } else if !component_ok {
        Some("component")
    } else if !hosts.iter().all(host_ok) {
        Some("capabilities.outbound_hosts")
    } else if !routes.iter().all(|r| super::network::is_route_prefix(r)) {
        Some("capabilities.routes")
    } else if !secrets.iter().all(|s| super::secrets::KNOWN_SECRETS.contains(&s.as_str())) {
        Some("capabilities.secrets")
    } else if nondet.iter().any(|c| c == "*") && nondet.len() > 1 {
        Some("nondeterministic")
    } else {
        None
    }
}

fn names() -> impl Strategy<Value = String> {
    prop_oneof!["[A-Za-z0-9_-]{1,64}", "[A-Za-z0-9_-]{65,70}", Just(String::new()), "[a-z]{1,8}[ ./é\u{0}][a-z]{0,8}"]
}

fn components() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z]{1,8}\\.wasm",
        Just(".wasm".to_string()),
        "[a-z]{1,4}/[a-z]{1,4}\\.wasm",
        "[a-z]{1,4}\\\\[a-z]\\.wasm",
        "[a-z]{1,8}\\.wat",
        Just("..".to_string())
    ]
}

fn hosts() -> impl Strategy<Value = Vec<String>> {
    let host =
        prop_oneof![Just("*".to_string()), "[a-z]{1,8}\\.[a-z]{2,3}", "[a-z]{1,8}\\.[a-z]{2,3}:[0-9]{1,6}", "https?://[a-z]{1,8}", "[a-z]{0,3}[ /@][a-z]{0,3}"];
    prop::collection::vec(host, 0..3)
}

fn routes() -> impl Strategy<Value = Vec<String>> {
    let route = prop_oneof![
        "/proxy/[a-z0-9._~-]{1,12}/",
        "/proxy/[a-z]{1,4}/[a-z]{1,4}/",
        "/proxy/[a-z]{1,4}",
        "/api/[a-z]{1,4}/",
        Just("/proxy/../".to_string()),
        "/proxy/[a-z{}]{1,6}/"
    ];
    prop::collection::vec(route, 0..3)
}

fn secrets() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(prop_oneof![Just("api_key_svc_org".to_string()), "[A-Z_]{1,8}"], 0..2)
}

fn nondeterministic() -> impl Strategy<Value = Vec<String>> {
    prop::collection::vec(prop_oneof![Just("*".to_string()), "[A-Z][a-z]{1,6}"], 0..3)
}

fn list(items: &[String]) -> String {
    format!("[{}]", items.iter().map(|s| quoted(s)).collect::<Vec<_>>().join(", "))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn any_text_is_a_manifest_or_an_error(text in soup()) {
        if let Ok(m) = Manifest::parse(&text) {
            prop_assert!(first_broken(&m.name, &m.component, &m.capabilities.outbound_hosts, &m.capabilities.routes, &m.capabilities.secrets, &m.nondeterministic).is_none());
            prop_assert_eq!(&*m.text, text.as_str());
        }
    }

    #[test]
    fn the_first_broken_rule_is_the_one_named(
        name in names(),
        component in components(),
        hosts in hosts(),
        routes in routes(),
        secrets in secrets(),
        nondet in nondeterministic(),
    ) {
        let text = format!(
            "name = {}\nversion = '1'\ncomponent = {}\nnondeterministic = {}\n[capabilities]\noutbound_hosts = {}\nroutes = {}\nsecrets = {}\n",
            quoted(&name), quoted(&component), list(&nondet), list(&hosts), list(&routes), list(&secrets),
        );
        match (Manifest::parse(&text), first_broken(&name, &component, &hosts, &routes, &secrets, &nondet)) {
            (Ok(m), None) => prop_assert_eq!((m.name, m.component), (name, component)),
            (Err(ManifestError::Invalid { field, .. }), Some(expected)) => prop_assert_eq!(field, expected, "{}", text),
            (got, expected) => prop_assert!(false, "{text}: parsed {got:?}, expected {expected:?}"),
        }
    }
}

/// Nesting a megabyte deep (arrays, inline tables, dotted keys) is a parse
/// error, not a stack overflow of the thread that reads it.
#[test]
fn deep_nesting_is_refused_without_recursion() {
    let depth = 500_000;
    let arrays = format!("name = 'a'\nversion = '1'\ncomponent = 'a.wasm'\nx = {}{}", "[".repeat(depth), "]".repeat(depth));
    let tables = format!("name = 'a'\nversion = '1'\ncomponent = 'a.wasm'\nx = {}1{}", "{a = ".repeat(depth), "}".repeat(depth));
    let dotted = format!("name = 'a'\nversion = '1'\ncomponent = 'a.wasm'\n{}= 1", "a.".repeat(depth));
    for text in [arrays, tables, dotted] {
        assert!(Manifest::parse(&text).is_err());
    }
}
