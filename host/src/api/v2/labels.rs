//! Job labels (`metadata`): the one rule for a label's key and value, used
//! by a submission's `metadata` object and by the listing's
//! `metadata[key]=value` filters, and the patterns the published document
//! gives for both (`api::openapi::schemas`).

use std::ops::RangeInclusive;

use serde_json::{Map, Value as Json_};

use crate::api::error::{ApiCode, ApiError};

/// At most this many labels on one job.
pub const MAX_LABELS: usize = 16;
/// At most this many `metadata[key]=value` filters on one listing.
pub const MAX_FILTERS: usize = 3;
/// A key is 1 to this many characters of `[A-Za-z0-9_.-]`.
pub const MAX_KEY_CHARS: usize = 40;
/// A value is at most this many UTF-8 bytes.
pub const MAX_VALUE_BYTES: usize = 256;

/// Characters no value may hold: the C0 and C1 controls (`char::is_control`)
/// and Unicode's bidirectional formatting characters (`Bidi_Control`), which
/// can make a label read differently from what it is.
const FORBIDDEN: [RangeInclusive<char>; 6] =
    ['\u{0}'..='\u{1f}', '\u{7f}'..='\u{9f}', '\u{61c}'..='\u{61c}', '\u{200e}'..='\u{200f}', '\u{202a}'..='\u{202e}', '\u{2066}'..='\u{2069}'];

/// Whether `key` may name a label.
pub fn key_ok(key: &str) -> bool {
    (1..=MAX_KEY_CHARS).contains(&key.len()) && key.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Whether `value` may be a label's value.
pub fn value_ok(value: &str) -> bool {
    value.len() <= MAX_VALUE_BYTES && !value.chars().any(|c| FORBIDDEN.iter().any(|r| r.contains(&c)))
}

/// The key rule as a JSON Schema pattern.
pub fn key_pattern() -> String {
    format!("^[A-Za-z0-9_.-]{{1,{MAX_KEY_CHARS}}}$")
}

/// The value's characters as a JSON Schema pattern (its byte bound is
/// stated in prose: JSON Schema counts characters).
pub fn value_pattern() -> String {
    let class: String = FORBIDDEN.iter().map(|r| format!("\\u{:04x}-\\u{:04x}", u32::from(*r.start()), u32::from(*r.end()))).collect();
    format!("^[^{class}]*$")
}

/// A submission's `metadata`: an object of at most [`MAX_LABELS`] labels
/// whose keys and string values keep the rule; else 422 `metadata_invalid`.
pub fn check_metadata(value: &Json_) -> Result<Map<String, Json_>, ApiError> {
    let bad = |m: String| ApiError::new(ApiCode::MetadataInvalid, m);
    let map = value.as_object().ok_or_else(|| bad("`metadata` must be an object of string labels.".into()))?;
    if map.len() > MAX_LABELS {
        return Err(bad(format!("`metadata` has more than {MAX_LABELS} labels.")));
    }
    for (k, v) in map {
        if !key_ok(k) {
            return Err(bad(key_message(k)));
        }
        match v.as_str() {
            Some(s) if value_ok(s) => {}
            Some(_) => return Err(bad(value_message(k))),
            None => return Err(bad(format!("metadata value of {k:?} must be a string."))),
        }
    }
    Ok(map.clone())
}

/// Whether a query parameter named `name` (decoded) is a label filter's:
/// `metadata` itself or `metadata[…` (well formed or not); any other name
/// is another parameter.
pub fn is_filter_name(name: &str) -> bool {
    name == "metadata" || name.starts_with("metadata[")
}

/// The listing's filters, gathered one query pair at a time.
#[derive(Debug, Default)]
pub struct Filters(Vec<(String, String)>);

impl Filters {
    /// Takes the pair `name=value` if its name is a filter's
    /// ([`is_filter_name`]). A filter is a kept key in brackets and a kept
    /// value, at most [`MAX_FILTERS`] of them, each key once; else 400
    /// `invalid_metadata_filter`. Any other name is not taken (`Ok(false)`).
    pub fn take(&mut self, name: &str, value: &str) -> Result<bool, ApiError> {
        let bad = |m: String| Err(ApiError::new(ApiCode::InvalidMetadataFilter, m));
        if !is_filter_name(name) {
            return Ok(false);
        }
        let Some(key) = name.strip_prefix("metadata[").and_then(|r| r.strip_suffix(']')) else {
            return bad(format!("A metadata filter is `metadata[key]=value`, not {name:?}."));
        };
        if !key_ok(key) {
            return bad(key_message(key));
        }
        if !value_ok(value) {
            return bad(value_message(key));
        }
        if self.0.iter().any(|(k, _)| k == key) {
            return bad(format!("The metadata filter {key:?} is given twice."));
        }
        if self.0.len() == MAX_FILTERS {
            return bad(format!("At most {MAX_FILTERS} metadata filters."));
        }
        self.0.push((key.to_string(), value.to_string()));
        Ok(true)
    }

    pub fn into_pairs(self) -> Vec<(String, String)> {
        self.0
    }
}

fn key_message(key: &str) -> String {
    format!("metadata key {key:?} must be 1-{MAX_KEY_CHARS} characters of A-Z a-z 0-9 _ . -")
}

fn value_message(key: &str) -> String {
    format!("metadata value of {key:?} must be at most {MAX_VALUE_BYTES} UTF-8 bytes without control or bidirectional formatting characters.")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn keys_and_values_keep_the_platforms_rule() {
        for ok in ["a", "A-z_0.9", &"k".repeat(40)] {
            assert!(key_ok(ok), "{ok:?}");
        }
        for bad in ["", "a b", "a]", "ключ", "a/b", &"k".repeat(41)] {
            assert!(!key_ok(bad), "{bad:?}");
        }
        // Bytes, not characters: 128 two-byte characters fit, 129 do not.
        assert!(value_ok(&"é".repeat(128)) && !value_ok(&"é".repeat(129)));
        assert!(value_ok("") && value_ok(&"v".repeat(256)) && !value_ok(&"v".repeat(257)));
        for bad in ["a\nb", "\u{7f}", "\u{85}", "\u{61c}", "\u{200e}", "\u{200f}", "\u{202a}", "\u{202e}", "\u{2066}", "\u{2069}"] {
            assert!(!value_ok(bad), "{bad:?}");
        }
        for ok in ["\u{a0}", "\u{200d}", "\u{2070}", "\u{202f}", "日本"] {
            assert!(value_ok(ok), "{ok:?}");
        }
    }

    #[test]
    fn the_documents_patterns_name_every_forbidden_character() {
        assert_eq!(key_pattern(), "^[A-Za-z0-9_.-]{1,40}$");
        assert_eq!(value_pattern(), r"^[^\u0000-\u001f\u007f-\u009f\u061c-\u061c\u200e-\u200f\u202a-\u202e\u2066-\u2069]*$");
    }

    #[test]
    fn a_submissions_metadata_is_checked_label_by_label() {
        assert!(check_metadata(&json!({ "a": "b", "c.d": "" })).is_ok());
        let sixteen: Map<String, Json_> = (0..16).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert!(check_metadata(&Json_::Object(sixteen.clone())).is_ok());
        let mut seventeen = sixteen;
        seventeen.insert("k16".into(), json!("v"));
        for bad in [json!([]), json!("x"), Json_::Object(seventeen), json!({ "bad key": "v" }), json!({ "k": 1 }), json!({ "k": "\u{202e}gpj.exe" })] {
            let err = check_metadata(&bad).expect_err("refused");
            assert_eq!(err.code, ApiCode::MetadataInvalid, "{bad}");
        }
    }

    #[test]
    fn filters_are_bracketed_kept_keys_each_once_at_most_three() {
        let mut f = Filters::default();
        assert!(!f.take("metadatax", "1").unwrap(), "another parameter");
        assert!(!f.take("metadata.x", "1").unwrap() && !f.take("metadata]", "1").unwrap());
        assert!(!f.take("limit", "1").unwrap());
        assert!(f.take("metadata[a]", "1").unwrap());
        assert!(f.take("metadata[b]", "").unwrap());
        let refused = |f: &mut Filters, name: &str, value: &str| f.take(name, value).expect_err(name).code;
        for (name, value) in [("metadata", ""), ("metadata", "5"), ("metadata[", "1"), ("metadata[a", "1"), ("metadata[]", "1"), ("metadata[a][b]", "1")] {
            assert_eq!(refused(&mut f, name, value), ApiCode::InvalidMetadataFilter, "{name}={value}");
        }
        assert_eq!(refused(&mut f, "metadata[a]", "2"), ApiCode::InvalidMetadataFilter, "a repeated key");
        assert_eq!(refused(&mut f, "metadata[c]", "\u{2067}"), ApiCode::InvalidMetadataFilter, "a bidi character");
        assert!(f.take("metadata[c]", "3").unwrap());
        assert_eq!(refused(&mut f, "metadata[d]", "4"), ApiCode::InvalidMetadataFilter, "a fourth");
        assert_eq!(f.into_pairs(), [("a", "1"), ("b", ""), ("c", "3")].map(|(k, v)| (k.to_string(), v.to_string())));
    }
}
