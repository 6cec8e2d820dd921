//! What a JSON document will cost once parsed, read off its bytes before
//! it is parsed: how many values it holds and how many bytes its strings
//! take. A submitted workflow is client input, and a `serde_json::Value`
//! tree costs far more than its text — up to ~90× for a body of tiny
//! arrays (`[1],[1],…`: each a 72-byte value plus a 4-slot allocation) —
//! so the count bounds the tree where the size alone cannot.
//!
//! The scan is a single pass with no allocation and no recursion; it does
//! not validate (the parser does that next), it only counts.

/// Bytes one parsed value may take, its allocations included: measured
/// with a counting allocator (serde_json 1 with `preserve_order`): a value
/// is 72 bytes; a one-element array takes 360 bytes for two values, a
/// one-key object 440 for two values and a key. Strings add their bytes.
pub const VALUE_COST: u64 = 256;

/// The shape of a JSON text, as far as memory goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct JsonCost {
    /// Values: objects, arrays, strings (object keys included), numbers,
    /// `true`, `false`, `null`.
    pub values: u64,
    /// The bytes of the text.
    pub bytes: u64,
}

impl JsonCost {
    /// The most memory, in bytes, one parsed tree of this text can hold:
    /// every value at [`VALUE_COST`] plus the text's bytes (which bound
    /// its strings).
    pub fn tree_bytes(&self) -> u64 {
        self.values.saturating_mul(VALUE_COST).saturating_add(self.bytes)
    }
}

/// Counts the values of `text`, stopping as soon as there are more than
/// `limit` (then `Err(limit + 1)`, the count so far).
pub fn count_values(text: &[u8], limit: u64) -> Result<JsonCost, u64> {
    let mut values: u64 = 0;
    let mut i = 0;
    let n = text.len();
    while i < n {
        match text[i] {
            b'"' => {
                // A string (a key or a value): skip to its closing quote.
                i += 1;
                while i < n {
                    match text[i] {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
                values += 1;
            }
            b'{' | b'[' => {
                i += 1;
                values += 1;
            }
            b'}' | b']' | b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' => i += 1,
            _ => {
                // A number or a literal: one value up to the next delimiter.
                while i < n && !matches!(text[i], b'}' | b']' | b',' | b':' | b' ' | b'\t' | b'\n' | b'\r' | b'"' | b'{' | b'[') {
                    i += 1;
                }
                values += 1;
            }
        }
        if values > limit {
            return Err(values);
        }
    }
    Ok(JsonCost { values, bytes: n as u64 })
}

/// The same measure of a tree already parsed (`bytes`: its strings' and
/// keys' bytes), walked with an explicit stack.
pub fn of_value(value: &serde_json::Value) -> JsonCost {
    use serde_json::Value as Json;
    let mut cost = JsonCost::default();
    let mut stack = vec![value];
    while let Some(v) = stack.pop() {
        cost.values += 1;
        match v {
            Json::String(s) => cost.bytes += s.len() as u64,
            Json::Array(items) => stack.extend(items),
            Json::Object(map) => {
                for (k, v) in map {
                    cost.values += 1;
                    cost.bytes += k.len() as u64;
                    stack.push(v);
                }
            }
            _ => {}
        }
    }
    cost
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(text: &str) -> u64 {
        count_values(text.as_bytes(), u64::MAX).unwrap().values
    }

    #[test]
    fn counts_every_value_once() {
        assert_eq!(count("{}"), 1);
        assert_eq!(count("[1, 2.5e3, -3, true, false, null]"), 7);
        assert_eq!(count(r#"{"a": {"b": [1, "x"]}}"#), 7, "keys count as strings");
        assert_eq!(count(r#"["a\"b", "c\\", "]"]"#), 4, "escapes and brackets inside strings");
        assert_eq!(count("  \n"), 0);
    }

    #[test]
    fn stops_past_the_limit() {
        let text = format!("[{}1]", "1,".repeat(999));
        assert_eq!(count_values(text.as_bytes(), 1001).unwrap().values, 1001);
        assert_eq!(count_values(text.as_bytes(), 100), Err(101));
    }

    #[test]
    fn matches_what_serde_parses() {
        // Count the values of a parsed tree (iteratively) and compare.
        let text = r#"{"1": {"class_type": "A", "inputs": {"x": [1, [2, {"y": null}]], "s": "q\"]"}, "_meta": {"title": "t"}}}"#;
        let parsed: serde_json::Value = serde_json::from_str(text).unwrap();
        let mut stack = vec![&parsed];
        let mut values = 0;
        while let Some(v) = stack.pop() {
            values += 1;
            match v {
                serde_json::Value::Array(a) => stack.extend(a),
                serde_json::Value::Object(o) => {
                    values += o.len(); // the keys
                    stack.extend(o.values());
                }
                _ => {}
            }
        }
        assert_eq!(count(text), values as u64);
        assert_eq!(of_value(&parsed).values, values as u64);
    }

    #[test]
    fn the_estimate_bounds_the_parsed_tree() {
        // The worst shape measured: one-element arrays (~90× their text).
        let text = format!("[{}[1]]", "[1],".repeat(9_999));
        let cost = count_values(text.as_bytes(), u64::MAX).unwrap();
        assert_eq!(cost.values, 20_001);
        assert!(cost.tree_bytes() >= 20_000 * 180, "{cost:?}");
    }
}
