//! Values that flow along workflow links and into nodes.

use crate::tensor::Tensor;

/// A node input or output value.
#[derive(Clone, Debug)]
pub enum Value {
    /// INT
    Int(i64),
    /// FLOAT
    Float(f64),
    /// BOOLEAN
    Bool(bool),
    /// STRING or a combo choice
    String(String),
    /// IMAGE, MASK or another tensor type
    Tensor(Tensor),
}

impl Value {
    /// The name of the value's kind, for error messages.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Int(_) => "INT",
            Value::Float(_) => "FLOAT",
            Value::Bool(_) => "BOOLEAN",
            Value::String(_) => "STRING",
            Value::Tensor(_) => "tensor",
        }
    }
    /// The value as JSON, tensors as their shape.
    pub fn to_json(&self) -> serde_json::Value {
        match self {
            Value::Int(v) => (*v).into(),
            Value::Float(v) => (*v).into(),
            Value::Bool(v) => (*v).into(),
            Value::String(v) => v.clone().into(),
            Value::Tensor(t) => serde_json::json!({ "tensor": t.shape() }),
        }
    }
}
