//! Primitive value nodes: they return their widget value, so a workflow can
//! feed one value into several nodes.

use kiln_sdk::prelude::*;

const CATEGORY: &str = "utils/primitive";
const I64_LIMIT: i64 = 9_223_372_036_854_775_807;

/// `PrimitiveInt`: an INT value.
pub const PRIMITIVE_INT: NodeClass = NodeClass {
    class_type: "PrimitiveInt",
    define: || {
        NodeDef::new(CATEGORY).display_name("Int").required("value", Kind::int().int_range(-I64_LIMIT, I64_LIMIT).control_after_generate()).output("INT", "INT")
    },
    run: |inputs| Ok(vec![Output::Int(inputs.int("value")?)]),
};

/// `PrimitiveFloat`: a FLOAT value.
pub const PRIMITIVE_FLOAT: NodeClass = NodeClass {
    class_type: "PrimitiveFloat",
    define: || {
        NodeDef::new(CATEGORY)
            .display_name("Float")
            .required("value", Kind::float().min(-I64_LIMIT as f64).max(I64_LIMIT as f64).step(0.1))
            .output("FLOAT", "FLOAT")
    },
    run: |inputs| Ok(vec![Output::Float(inputs.float("value")?)]),
};

/// `PrimitiveString`: a single-line STRING value (deprecated in ComfyUI).
pub const PRIMITIVE_STRING: NodeClass = NodeClass {
    class_type: "PrimitiveString",
    define: || NodeDef::new(CATEGORY).display_name("String").required("value", Kind::string().single_line()).output("STRING", "STRING"),
    run: |inputs| Ok(vec![Output::String(inputs.string("value")?.to_string())]),
};

/// `PrimitiveStringMultiline`: a multi-line STRING value.
pub const PRIMITIVE_STRING_MULTILINE: NodeClass = NodeClass {
    class_type: "PrimitiveStringMultiline",
    define: || NodeDef::new(CATEGORY).display_name("String (Multiline)").required("value", Kind::string().multiline()).output("STRING", "STRING"),
    run: |inputs| Ok(vec![Output::String(inputs.string("value")?.to_string())]),
};

/// `PrimitiveBoolean`: a BOOLEAN value.
pub const PRIMITIVE_BOOLEAN: NodeClass = NodeClass {
    class_type: "PrimitiveBoolean",
    define: || NodeDef::new(CATEGORY).display_name("Boolean").required("value", Kind::boolean()).output("BOOLEAN", "BOOLEAN"),
    run: |inputs| Ok(vec![Output::Boolean(inputs.boolean("value")?)]),
};

kiln_sdk::export_plugin!(PRIMITIVE_INT, PRIMITIVE_FLOAT, PRIMITIVE_STRING, PRIMITIVE_STRING_MULTILINE, PRIMITIVE_BOOLEAN);
