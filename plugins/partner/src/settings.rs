//! The operator's partner settings, which kiln hands this plugin (and only
//! it) as its environment: `KILN_PARTNER_BASE_URL`, `KILN_PARTNER_API_KEY`,
//! `KILN_PARTNER_TOKENS`.

/// The partner settings of one call.
pub struct Settings {
    /// The provider's base URL without a trailing `/`; `None`: not configured.
    pub base_url: Option<String>,
    /// The provider key (`x-freepik-api-key`).
    pub api_key: Option<String>,
    /// Tokens the proxy accepts.
    pub tokens: Vec<String>,
}

impl Settings {
    /// Reads the settings from the environment.
    pub fn load() -> Settings {
        let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        Settings {
            base_url: var("KILN_PARTNER_BASE_URL").map(|u| u.trim_end_matches('/').to_string()),
            api_key: var("KILN_PARTNER_API_KEY"),
            tokens: var("KILN_PARTNER_TOKENS").map(|t| t.split(',').map(str::trim).filter(|t| !t.is_empty()).map(String::from).collect()).unwrap_or_default(),
        }
    }

    /// Whether `token` is one the proxy accepts (compared without
    /// short-circuiting on the first differing byte).
    pub fn accepts(&self, token: &str) -> bool {
        self.tokens.iter().fold(false, |found, t| found | constant_time_eq(t.as_bytes(), token.as_bytes()))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_matched_exactly() {
        let s = Settings { base_url: None, api_key: None, tokens: vec!["abc".into(), "def".into()] };
        assert!(s.accepts("abc") && s.accepts("def"));
        assert!(!s.accepts("ab") && !s.accepts("abcd") && !s.accepts(""));
    }
}
