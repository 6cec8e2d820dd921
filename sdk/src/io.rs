//! A node's inputs, outputs and errors.

use crate::bindings::exports::kiln::plugin::node as wit;
use crate::bindings::kiln::plugin::tensors;
use crate::image::{Image, Mask};

/// A host-owned tensor handle (IMAGE, MASK or any other tensor type).
pub type Tensor = tensors::Tensor;

/// Why a node failed. `?` converts strings and tensor errors into it.
#[derive(Debug, Clone, PartialEq)]
pub enum Error {
    /// The inputs are unusable.
    InvalidInput(String),
    /// The node could not do its work.
    Failed(String),
}

impl Error {
    /// An invalid-input error.
    pub fn invalid(message: impl Into<String>) -> Error {
        Error::InvalidInput(message.into())
    }
    /// A general failure.
    pub fn failed(message: impl Into<String>) -> Error {
        Error::Failed(message.into())
    }
}

impl From<String> for Error {
    fn from(message: String) -> Error {
        Error::Failed(message)
    }
}
impl From<&str> for Error {
    fn from(message: &str) -> Error {
        Error::Failed(message.to_string())
    }
}
impl From<tensors::TensorError> for Error {
    fn from(e: tensors::TensorError) -> Error {
        Error::Failed(match e {
            tensors::TensorError::BadShape(m) => format!("bad tensor shape: {m}"),
            tensors::TensorError::LengthMismatch(m) => format!("tensor length mismatch: {m}"),
            tensors::TensorError::BudgetExceeded(m) => format!("tensor budget exceeded: {m}"),
            tensors::TensorError::OutOfRange(m) => format!("tensor range: {m}"),
        })
    }
}
impl From<Error> for wit::NodeError {
    fn from(e: Error) -> wit::NodeError {
        match e {
            Error::InvalidInput(m) => wit::NodeError::InvalidInput(m),
            Error::Failed(m) => wit::NodeError::Failed(m),
        }
    }
}

/// Result of a node function.
pub type Result<T> = std::result::Result<T, Error>;

/// One output value, in the order the node declares its outputs.
#[derive(Debug)]
pub enum Output {
    /// INT
    Int(i64),
    /// FLOAT
    Float(f64),
    /// BOOLEAN
    Boolean(bool),
    /// STRING (or a combo choice)
    String(String),
    /// IMAGE, copied to the host
    Image(Image),
    /// MASK, copied to the host
    Mask(Mask),
    /// Any tensor already on the host (e.g. an input passed through unchanged, no copy).
    Tensor(Tensor),
}

/// A node's outputs.
pub type Outputs = Vec<Output>;

fn dims(shape: &[usize]) -> Result<Vec<u32>> {
    shape.iter().map(|&d| u32::try_from(d).map_err(|_| Error::failed(format!("dimension {d} too large")))).collect()
}

impl crate::Image {
    /// Hands the pixels to the host as a tensor (for [`crate::host::preview`]
    /// or to return as [`Output::Tensor`] without a second copy).
    pub fn to_tensor(&self) -> Result<Tensor> {
        Ok(tensors::create(&dims(&self.shape())?, &self.data)?)
    }
}

impl crate::Mask {
    /// Hands the values to the host as a `B×H×W` tensor.
    pub fn to_tensor(&self) -> Result<Tensor> {
        Ok(tensors::create(&dims(&self.shape())?, &self.data)?)
    }
}

impl Output {
    pub(crate) fn into_wit(self) -> Result<wit::Value> {
        Ok(match self {
            Output::Int(v) => wit::Value::Int(v),
            Output::Float(v) => wit::Value::Float(v),
            Output::Boolean(v) => wit::Value::Boolean(v),
            Output::String(v) => wit::Value::String(v),
            Output::Image(img) => wit::Value::Tensor(tensors::create(&dims(&img.shape())?, &img.data)?),
            Output::Mask(m) => wit::Value::Tensor(tensors::create(&dims(&m.shape())?, &m.data)?),
            Output::Tensor(t) => wit::Value::Tensor(t),
        })
    }
}

/// The inputs of one node call, by name.
pub struct Inputs {
    pub(crate) values: Vec<(String, Option<wit::Value>)>,
}

impl Inputs {
    fn find(&self, name: &str) -> Option<&wit::Value> {
        self.values.iter().find(|(n, _)| n == name).and_then(|(_, v)| v.as_ref())
    }
    fn get(&self, name: &str) -> Result<&wit::Value> {
        self.find(name).ok_or_else(|| Error::invalid(format!("missing input `{name}`")))
    }
    /// Whether an (optional) input was given.
    pub fn has(&self, name: &str) -> bool {
        self.find(name).is_some()
    }
    /// An INT input.
    pub fn int(&self, name: &str) -> Result<i64> {
        match self.get(name)? {
            wit::Value::Int(v) => Ok(*v),
            other => Err(Error::invalid(format!("input `{name}` is {}, not INT", kind_name(other)))),
        }
    }
    /// A non-negative INT input as a size or position.
    pub fn usize(&self, name: &str) -> Result<usize> {
        usize::try_from(self.int(name)?).map_err(|_| Error::invalid(format!("`{name}` must not be negative")))
    }
    /// A FLOAT input (an INT is widened).
    pub fn float(&self, name: &str) -> Result<f64> {
        match self.get(name)? {
            wit::Value::Float(v) => Ok(*v),
            wit::Value::Int(v) => Ok(*v as f64),
            other => Err(Error::invalid(format!("input `{name}` is {}, not FLOAT", kind_name(other)))),
        }
    }
    /// A BOOLEAN input.
    pub fn boolean(&self, name: &str) -> Result<bool> {
        match self.get(name)? {
            wit::Value::Boolean(v) => Ok(*v),
            other => Err(Error::invalid(format!("input `{name}` is {}, not BOOLEAN", kind_name(other)))),
        }
    }
    /// A STRING or combo input.
    pub fn string(&self, name: &str) -> Result<&str> {
        match self.get(name)? {
            wit::Value::String(v) => Ok(v),
            other => Err(Error::invalid(format!("input `{name}` is {}, not STRING", kind_name(other)))),
        }
    }
    /// A tensor input's host handle (no copy).
    pub fn tensor(&self, name: &str) -> Result<&Tensor> {
        match self.get(name)? {
            wit::Value::Tensor(t) => Ok(t),
            other => Err(Error::invalid(format!("input `{name}` is {}, not a tensor", kind_name(other)))),
        }
    }
    /// An IMAGE input, copied into this plugin's memory.
    pub fn image(&self, name: &str) -> Result<Image> {
        let t = self.tensor(name)?;
        let shape = t.shape();
        match shape[..] {
            [b, h, w, c] => Ok(Image { batch: b as usize, height: h as usize, width: w as usize, channels: c as usize, data: t.read() }),
            _ => Err(Error::invalid(format!("input `{name}` has shape {shape:?}, not an IMAGE [B,H,W,C]"))),
        }
    }
    /// A MASK input, copied into this plugin's memory. `[H,W]` masks become `[1,H,W]`.
    pub fn mask(&self, name: &str) -> Result<Mask> {
        let t = self.tensor(name)?;
        let shape = t.shape();
        match shape[..] {
            [b, h, w] => Ok(Mask { batch: b as usize, height: h as usize, width: w as usize, data: t.read() }),
            [h, w] => Ok(Mask { batch: 1, height: h as usize, width: w as usize, data: t.read() }),
            _ => Err(Error::invalid(format!("input `{name}` has shape {shape:?}, not a MASK [B,H,W]"))),
        }
    }
    /// An optional MASK input.
    pub fn opt_mask(&self, name: &str) -> Result<Option<Mask>> {
        if self.has(name) { self.mask(name).map(Some) } else { Ok(None) }
    }
    /// An optional IMAGE input.
    pub fn opt_image(&self, name: &str) -> Result<Option<Image>> {
        if self.has(name) { self.image(name).map(Some) } else { Ok(None) }
    }
    /// Takes a STRING or combo input's value out (no copy).
    pub fn take_string(&mut self, name: &str) -> Result<String> {
        self.take_value(name, "STRING", |v| match v {
            wit::Value::String(s) => Ok(s),
            other => Err(other),
        })
    }
    /// Takes a tensor input's handle out, to pass it through as an output without copying.
    pub fn take_tensor(&mut self, name: &str) -> Result<Tensor> {
        self.take_value(name, "a tensor", |v| match v {
            wit::Value::Tensor(t) => Ok(t),
            other => Err(other),
        })
    }
    /// Takes input `name` out if `extract` accepts it; otherwise it stays.
    fn take_value<T>(&mut self, name: &str, want: &str, extract: impl FnOnce(wit::Value) -> std::result::Result<T, wit::Value>) -> Result<T> {
        let missing = || Error::invalid(format!("missing input `{name}`"));
        let slot = self.values.iter_mut().find(|(n, _)| n == name).ok_or_else(missing)?;
        match extract(slot.1.take().ok_or_else(missing)?) {
            Ok(value) => Ok(value),
            Err(other) => {
                let kind = kind_name(&other);
                slot.1 = Some(other);
                Err(Error::invalid(format!("input `{name}` is {kind}, not {want}")))
            }
        }
    }
}

fn kind_name(v: &wit::Value) -> &'static str {
    match v {
        wit::Value::Int(_) => "INT",
        wit::Value::Float(_) => "FLOAT",
        wit::Value::Boolean(_) => "BOOLEAN",
        wit::Value::String(_) => "STRING",
        wit::Value::Tensor(_) => "a tensor",
    }
}
