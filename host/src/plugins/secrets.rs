//! Secrets a job carries for its plugins, and who may read them.
//!
//! A request may carry a partner key (`extra_data.api_key_svc_org`). It is
//! held in memory for the job's run — never stored, never logged — and a
//! node reads it through the `host.secret` import only when its plugin's
//! manifest asks for it (`capabilities.secrets`) and the operator granted
//! that plugin secrets (`secret_plugins`); every other call sees none.
//! What a granted node prints or reports as its failure has the secret's
//! value replaced ([`JobSecrets::redact`]) before it reaches a log or a
//! record, since partner APIs often echo the key in their errors.

use std::sync::Arc;

/// The secrets kiln knows: a manifest may ask for these and no others.
pub const KNOWN_SECRETS: &[&str] = &["api_key_svc_org"];

/// The secrets of one job (or, restricted, what one plugin may read of them).
#[derive(Clone, Default)]
pub struct JobSecrets {
    api_key_svc_org: Option<Arc<str>>,
}

impl JobSecrets {
    /// A job's secrets from its request.
    pub fn new(api_key_svc_org: Option<String>) -> JobSecrets {
        JobSecrets { api_key_svc_org: api_key_svc_org.map(Arc::from) }
    }

    /// The secret called `name`, if the job has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        match name {
            "api_key_svc_org" => self.api_key_svc_org.as_deref(),
            _ => None,
        }
    }

    /// What `granted` lets a plugin read of these secrets, as a value for
    /// cache keys (results that may depend on a secret are not shared
    /// between jobs with different ones): a hash keyed with a random
    /// per-process key (the cache lives in memory), not the secret.
    pub fn cache_salt(&self, granted: &[String]) -> String {
        static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        let key = KEY.get_or_init(crate::secret_file::random_key);
        let mut h = blake3::Hasher::new_keyed(key);
        for name in KNOWN_SECRETS.iter().filter(|n| granted.iter().any(|g| g == *n)) {
            h.update(name.as_bytes());
            match self.get(name) {
                Some(value) => h.update(&[1]).update(&(value.len() as u64).to_le_bytes()).update(value.as_bytes()),
                None => h.update(&[0]),
            };
        }
        h.finalize().to_hex().to_string()
    }

    /// Whether there is any secret to hide.
    pub fn is_empty(&self) -> bool {
        self.api_key_svc_org.is_none()
    }

    /// Replaces every occurrence of a secret's value in `text` with
    /// `[redacted]`.
    pub fn redact(&self, text: &mut String) {
        if let Some(value) = self.api_key_svc_org.as_deref().filter(|v| !v.is_empty())
            && text.contains(value)
        {
            *text = text.replace(value, "[redacted]");
        }
    }

    /// Only the secrets named in `granted`.
    pub fn restricted_to(&self, granted: &[String]) -> JobSecrets {
        let keep = |name: &str, value: &Option<Arc<str>>| value.clone().filter(|_| granted.iter().any(|g| g == name));
        JobSecrets { api_key_svc_org: keep("api_key_svc_org", &self.api_key_svc_org) }
    }
}

/// Never prints a value.
impl std::fmt::Debug for JobSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobSecrets").field("api_key_svc_org", &self.api_key_svc_org.as_ref().map(|_| "<redacted>")).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restriction_keeps_only_granted_names_and_debug_redacts() {
        let all = JobSecrets::new(Some("k-123".into()));
        assert_eq!(all.get("api_key_svc_org"), Some("k-123"));
        assert_eq!(all.get("other"), None);
        assert_eq!(all.restricted_to(&["api_key_svc_org".into()]).get("api_key_svc_org"), Some("k-123"));
        assert_eq!(all.restricted_to(&[]).get("api_key_svc_org"), None);
        assert_eq!(all.restricted_to(&["other".into()]).get("api_key_svc_org"), None);
        assert!(!format!("{all:?}").contains("k-123"));
        let granted = ["api_key_svc_org".to_string()];
        let salt = all.cache_salt(&granted);
        assert_eq!(salt, JobSecrets::new(Some("k-123".into())).cache_salt(&granted));
        assert_ne!(salt, JobSecrets::new(Some("k-124".into())).cache_salt(&granted));
        assert_ne!(salt, JobSecrets::default().cache_salt(&granted));
        assert!(!salt.contains("k-123"));
    }

    #[test]
    fn redaction_replaces_every_occurrence_and_leaves_other_text() {
        let secrets = JobSecrets::new(Some("sk-live-42".into()));
        let mut text = "401 for key sk-live-42 (sk-live-42)\nretry".to_string();
        secrets.redact(&mut text);
        assert_eq!(text, "401 for key [redacted] ([redacted])\nretry");
        let mut plain = "nothing secret".to_string();
        secrets.redact(&mut plain);
        assert_eq!(plain, "nothing secret");
        let mut untouched = "sk-live-42".to_string();
        JobSecrets::default().redact(&mut untouched);
        assert_eq!(untouched, "sk-live-42");
        JobSecrets::new(Some(String::new())).redact(&mut untouched);
        assert_eq!(untouched, "sk-live-42", "an empty key redacts nothing");
    }
}
