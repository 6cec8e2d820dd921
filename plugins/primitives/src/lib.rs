//! Primitive value nodes: they return their widget value, so a workflow can
//! feed one value into several nodes.

use kiln_sdk::prelude::*;

const I64_LIMIT: i64 = 9_223_372_036_854_775_807;

/// `PrimitiveInt`: an INT value.
#[node(class = "PrimitiveInt", category = "utils/primitive", display_name = "Int")]
pub fn primitive_int(#[input(min = -I64_LIMIT, max = I64_LIMIT, control_after_generate)] value: i64) -> i64 {
    value
}

/// `PrimitiveFloat`: a FLOAT value.
#[node(class = "PrimitiveFloat", category = "utils/primitive", display_name = "Float")]
pub fn primitive_float(#[input(min = -I64_LIMIT as f64, max = I64_LIMIT as f64, step = 0.1)] value: f64) -> f64 {
    value
}

/// `PrimitiveString`: a single-line STRING value (deprecated in ComfyUI).
#[node(class = "PrimitiveString", category = "utils/primitive", display_name = "String")]
pub fn primitive_string(#[input(single_line)] value: String) -> String {
    value
}

/// `PrimitiveStringMultiline`: a multi-line STRING value.
#[node(class = "PrimitiveStringMultiline", category = "utils/primitive", display_name = "String (Multiline)")]
pub fn primitive_string_multiline(#[input(multiline)] value: String) -> String {
    value
}

/// `PrimitiveBoolean`: a BOOLEAN value.
#[node(class = "PrimitiveBoolean", category = "utils/primitive", display_name = "Boolean")]
pub fn primitive_boolean(value: bool) -> bool {
    value
}

kiln_sdk::export_plugin!(PRIMITIVE_INT, PRIMITIVE_FLOAT, PRIMITIVE_STRING, PRIMITIVE_STRING_MULTILINE, PRIMITIVE_BOOLEAN);
