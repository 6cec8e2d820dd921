//! The types a [`#[node]`](crate::node) function's parameters and results
//! may have, and the traits its generated code calls to declare and take
//! each input and hand back each output.
//!
//! A parameter's type picks its input: `i64`, `f64`, `bool` and `String`
//! are INT, FLOAT, BOOLEAN and STRING widgets (`usize` an INT that must not
//! be negative) (a `String` with
//! `choices = ..` is a combo); [`Image`] and [`Mask`] are IMAGE and MASK
//! links copied into the plugin; [`ImageHandle`] and [`MaskHandle`] are the
//! same links left on the host (for host kernels, GPU work, or passing a
//! tensor through without a copy); `Option<T>` makes any of them optional.
//! The same types (but `Option`) are outputs. Each widget option is a method
//! of a trait implemented only by the types it fits, so `min` on a STRING is
//! a compile error naming the option.

use crate::bindings::exports::kiln::plugin::node as wit;
use crate::def::Kind;
use crate::image::{Image, Mask};
use crate::io::{Error, Inputs, Output, Result, Tensor};

/// A type a node input can have: its socket or widget, and how its value
/// is taken from the call's inputs.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a node input",
    label = "not an input type",
    note = "an input is i64, usize, f64, bool, String, Image, Mask, ImageHandle or MaskHandle, or an Option of one (an optional input)"
)]
pub trait NodeInput: Sized {
    /// Whether the input may be left out (`Option<T>`).
    const OPTIONAL: bool = false;
    /// The socket or widget, before options.
    fn kind() -> Kind;
    /// Takes the input `name` out of the call's inputs.
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self>;
}

/// A type a node output can have.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be a node output",
    label = "not an output type",
    note = "an output is i64, f64, bool, String, Image, Mask, ImageHandle or MaskHandle; several outputs are a tuple"
)]
pub trait NodeOutput {
    /// The output's link type (`"IMAGE"`, `"INT"`…), also its default name.
    const TYPE: &'static str;
    /// The value as it crosses to the host.
    fn into_output(self) -> Output;
}

/// An input the host fills in itself (`#[hidden]`): a `String`, or an
/// `Option<String>` when a run may lack it.
#[diagnostic::on_unimplemented(message = "a `#[hidden]` input is a String or an Option<String>, not `{Self}`")]
pub trait HiddenInput: Sized {
    /// Takes the hidden value `name`.
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self>;
}

/// Inputs with a widget, which can have a `default`.
#[diagnostic::on_unimplemented(message = "`default` applies to a widget input (i64, usize, f64, bool, String), not `{Self}`")]
pub trait Widget {
    /// The default's type.
    type Value;
    /// Sets the widget's default.
    fn with_default(kind: Kind, value: Self::Value) -> Kind;
}

/// INT and FLOAT inputs: `min`, `max`, `step` and `display`.
#[diagnostic::on_unimplemented(message = "`min`, `max`, `step` and `display` apply to an i64, usize or f64 input, not `{Self}`")]
pub trait NumberInput {
    /// The bounds' type.
    type Value;
    /// Sets the minimum.
    fn with_min(kind: Kind, value: Self::Value) -> Kind;
    /// Sets the maximum.
    fn with_max(kind: Kind, value: Self::Value) -> Kind;
    /// Sets the step.
    fn with_step(kind: Kind, value: Self::Value) -> Kind;
    /// Sets the frontend's display style (`"number"`, `"slider"`, `"color"`).
    fn with_display(kind: Kind, display: &str) -> Kind;
}

/// FLOAT inputs: `round`.
#[diagnostic::on_unimplemented(message = "`round` applies to an f64 input, not `{Self}`")]
pub trait FloatInput {
    /// Sets the rounding.
    fn with_round(kind: Kind, value: f64) -> Kind;
}

/// INT inputs: `control_after_generate`.
#[diagnostic::on_unimplemented(message = "`control_after_generate` applies to an i64 input, not `{Self}`")]
pub trait IntInput {
    /// Adds the frontend's "control after generate" widget.
    fn with_control_after_generate(kind: Kind) -> Kind;
}

/// STRING inputs: `multiline`, `single_line`.
#[diagnostic::on_unimplemented(message = "`multiline` and `single_line` apply to a String input, not `{Self}`")]
pub trait TextInput {
    /// Makes the text box multi-line or (explicitly) single-line.
    fn with_multiline(kind: Kind, multiline: bool) -> Kind;
}

/// Combo inputs: a `String` given `choices` or `image_upload`.
#[diagnostic::on_unimplemented(message = "`choices` and `image_upload` apply to a String input, not `{Self}`")]
pub trait ComboInput {
    /// A drop-down over fixed choices.
    fn combo(choices: &[&str]) -> Kind;
    /// A drop-down over the uploaded images, with an upload button.
    fn image_upload() -> Kind;
}

macro_rules! widget {
    ($ty:ty, $value:ty, $kind:expr, $take:ident, $variant:ident, $output:expr, $type_name:literal) => {
        impl NodeInput for $ty {
            fn kind() -> Kind {
                $kind
            }
            fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
                inputs.$take(name).map(Into::into)
            }
        }
        impl Widget for $ty {
            type Value = $value;
            fn with_default(mut kind: Kind, value: $value) -> Kind {
                if let wit::InputKind::$variant(spec) = &mut kind.kind {
                    spec.default = Some(value);
                }
                kind
            }
        }
        impl NodeOutput for $ty {
            const TYPE: &'static str = $type_name;
            fn into_output(self) -> Output {
                $output(self)
            }
        }
    };
}

widget!(i64, i64, Kind::int(), int, Int, Output::Int, "INT");
widget!(f64, f64, Kind::float(), float, Float, Output::Float, "FLOAT");
widget!(bool, bool, Kind::boolean(), boolean, Boolean, Output::Boolean, "BOOLEAN");

/// A size or position: an INT widget whose value must not be negative.
impl NodeInput for usize {
    fn kind() -> Kind {
        Kind::int()
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.usize(name)
    }
}
impl Widget for usize {
    type Value = i64;
    fn with_default(kind: Kind, value: i64) -> Kind {
        i64::with_default(kind, value)
    }
}
impl NumberInput for usize {
    type Value = i64;
    fn with_min(kind: Kind, value: i64) -> Kind {
        i64::with_min(kind, value)
    }
    fn with_max(kind: Kind, value: i64) -> Kind {
        i64::with_max(kind, value)
    }
    fn with_step(kind: Kind, value: i64) -> Kind {
        i64::with_step(kind, value)
    }
    fn with_display(kind: Kind, display: &str) -> Kind {
        i64::with_display(kind, display)
    }
}

impl NodeInput for String {
    fn kind() -> Kind {
        Kind::string()
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.take_string(name)
    }
}
impl Widget for String {
    type Value = &'static str;
    fn with_default(mut kind: Kind, value: &'static str) -> Kind {
        match &mut kind.kind {
            wit::InputKind::String(spec) => spec.default = Some(value.to_string()),
            wit::InputKind::Combo(spec) => spec.default = Some(value.to_string()),
            _ => {}
        }
        kind
    }
}
impl NodeOutput for String {
    const TYPE: &'static str = "STRING";
    fn into_output(self) -> Output {
        Output::String(self)
    }
}
impl TextInput for String {
    fn with_multiline(mut kind: Kind, multiline: bool) -> Kind {
        if let wit::InputKind::String(spec) = &mut kind.kind {
            spec.multiline = Some(multiline);
        }
        kind
    }
}
impl ComboInput for String {
    fn combo(choices: &[&str]) -> Kind {
        Kind::combo(choices)
    }
    fn image_upload() -> Kind {
        Kind::input_image()
    }
}
impl HiddenInput for String {
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.take_string(name)
    }
}
impl HiddenInput for Option<String> {
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        if inputs.has(name) { inputs.take_string(name).map(Some) } else { Ok(None) }
    }
}

macro_rules! number {
    ($ty:ty, $variant:ident) => {
        impl NumberInput for $ty {
            type Value = $ty;
            fn with_min(mut kind: Kind, value: $ty) -> Kind {
                if let wit::InputKind::$variant(spec) = &mut kind.kind {
                    spec.min = Some(value);
                }
                kind
            }
            fn with_max(mut kind: Kind, value: $ty) -> Kind {
                if let wit::InputKind::$variant(spec) = &mut kind.kind {
                    spec.max = Some(value);
                }
                kind
            }
            fn with_step(mut kind: Kind, value: $ty) -> Kind {
                if let wit::InputKind::$variant(spec) = &mut kind.kind {
                    spec.step = Some(value);
                }
                kind
            }
            fn with_display(mut kind: Kind, display: &str) -> Kind {
                if let wit::InputKind::$variant(spec) = &mut kind.kind {
                    spec.display = Some(display.to_string());
                }
                kind
            }
        }
    };
}

number!(i64, Int);
number!(f64, Float);

impl FloatInput for f64 {
    fn with_round(mut kind: Kind, value: f64) -> Kind {
        if let wit::InputKind::Float(spec) = &mut kind.kind {
            spec.round = Some(value);
        }
        kind
    }
}

impl IntInput for i64 {
    fn with_control_after_generate(mut kind: Kind) -> Kind {
        if let wit::InputKind::Int(spec) = &mut kind.kind {
            spec.control_after_generate = true;
        }
        kind
    }
}

impl NodeInput for Image {
    fn kind() -> Kind {
        Kind::link("IMAGE")
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.image(name)
    }
}
impl NodeOutput for Image {
    const TYPE: &'static str = "IMAGE";
    fn into_output(self) -> Output {
        Output::Image(self)
    }
}

impl NodeInput for Mask {
    fn kind() -> Kind {
        Kind::link("MASK")
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.mask(name)
    }
}
impl NodeOutput for Mask {
    const TYPE: &'static str = "MASK";
    fn into_output(self) -> Output {
        Output::Mask(self)
    }
}

/// An IMAGE left on the host: a `[B, H, W, C]` tensor handle. Host kernels
/// ([`crate::kernels`], [`crate::gpu`]) work on it without its pixels
/// entering the plugin; [`ImageHandle::read`] copies them in. Taking one as
/// an input or returning one costs no host call: the host checks the shape
/// of every IMAGE a node returns, so an IMAGE input always has it.
#[derive(Debug)]
pub struct ImageHandle(Tensor);

impl ImageHandle {
    /// Wraps a host tensor holding an IMAGE (the host refuses the output
    /// if it has not the shape `[B, H, W, C]`).
    pub fn new(tensor: Tensor) -> ImageHandle {
        ImageHandle(tensor)
    }
    /// Hands pixels computed in the plugin to the host.
    pub fn from_image(image: &Image) -> Result<ImageHandle> {
        image.to_tensor().map(ImageHandle)
    }
    /// The host tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.0
    }
    /// The host tensor, to hand to a kernel that consumes it.
    pub fn into_tensor(self) -> Tensor {
        self.0
    }
    /// `[batch, height, width, channels]`, asked of the host (no pixels).
    pub fn shape(&self) -> Result<[usize; 4]> {
        match self.0.shape()[..] {
            [b, h, w, c] => Ok([b as usize, h as usize, w as usize, c as usize]),
            ref shape => Err(Error::invalid(format!("a tensor of shape {shape:?} is not an IMAGE [B,H,W,C]"))),
        }
    }
    /// The pixels, copied into this plugin.
    pub fn read(&self) -> Result<Image> {
        let [batch, height, width, channels] = self.shape()?;
        Ok(Image { batch, height, width, channels, data: self.0.read() })
    }
}

impl NodeInput for ImageHandle {
    fn kind() -> Kind {
        Kind::link("IMAGE")
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.take_tensor(name).map(ImageHandle)
    }
}
impl NodeOutput for ImageHandle {
    const TYPE: &'static str = "IMAGE";
    fn into_output(self) -> Output {
        Output::Tensor(self.0)
    }
}

/// A MASK left on the host: a `[B, H, W]` tensor handle (the shape the host
/// checks every returned MASK for; `[H, W]` is read as one of a batch).
#[derive(Debug)]
pub struct MaskHandle(Tensor);

impl MaskHandle {
    /// Wraps a host tensor holding a MASK (the host refuses the output if
    /// it has not the shape `[B, H, W]`).
    pub fn new(tensor: Tensor) -> MaskHandle {
        MaskHandle(tensor)
    }
    /// Hands values computed in the plugin to the host.
    pub fn from_mask(mask: &Mask) -> Result<MaskHandle> {
        mask.to_tensor().map(MaskHandle)
    }
    /// The host tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.0
    }
    /// The host tensor, to hand to a kernel that consumes it.
    pub fn into_tensor(self) -> Tensor {
        self.0
    }
    /// `[batch, height, width]`, asked of the host; an `[H, W]` mask counts
    /// as one of a batch.
    pub fn shape(&self) -> Result<[usize; 3]> {
        match self.0.shape()[..] {
            [b, h, w] => Ok([b as usize, h as usize, w as usize]),
            [h, w] => Ok([1, h as usize, w as usize]),
            ref shape => Err(Error::invalid(format!("a tensor of shape {shape:?} is not a MASK [B,H,W]"))),
        }
    }
    /// Whether the host holds it as `[H, W]` (host kernels want `[B, H, W]`).
    pub fn is_unbatched(&self) -> bool {
        self.0.shape().len() == 2
    }
    /// The values, copied into this plugin, as `[B, H, W]`.
    pub fn read(&self) -> Result<Mask> {
        let [batch, height, width] = self.shape()?;
        Ok(Mask { batch, height, width, data: self.0.read() })
    }
}

impl NodeInput for MaskHandle {
    fn kind() -> Kind {
        Kind::link("MASK")
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        inputs.take_tensor(name).map(MaskHandle)
    }
}
impl NodeOutput for MaskHandle {
    const TYPE: &'static str = "MASK";
    fn into_output(self) -> Output {
        Output::Tensor(self.0)
    }
}

impl<T: NodeInput> NodeInput for Option<T> {
    const OPTIONAL: bool = true;
    fn kind() -> Kind {
        T::kind()
    }
    fn take(inputs: &mut Inputs, name: &str) -> Result<Self> {
        if inputs.has(name) { T::take(inputs, name).map(Some) } else { Ok(None) }
    }
}
impl<T: Widget> Widget for Option<T> {
    type Value = T::Value;
    fn with_default(kind: Kind, value: T::Value) -> Kind {
        T::with_default(kind, value)
    }
}
impl<T: NumberInput> NumberInput for Option<T> {
    type Value = T::Value;
    fn with_min(kind: Kind, value: T::Value) -> Kind {
        T::with_min(kind, value)
    }
    fn with_max(kind: Kind, value: T::Value) -> Kind {
        T::with_max(kind, value)
    }
    fn with_step(kind: Kind, value: T::Value) -> Kind {
        T::with_step(kind, value)
    }
    fn with_display(kind: Kind, display: &str) -> Kind {
        T::with_display(kind, display)
    }
}
impl<T: FloatInput> FloatInput for Option<T> {
    fn with_round(kind: Kind, value: f64) -> Kind {
        T::with_round(kind, value)
    }
}
impl<T: IntInput> IntInput for Option<T> {
    fn with_control_after_generate(kind: Kind) -> Kind {
        T::with_control_after_generate(kind)
    }
}
impl<T: TextInput> TextInput for Option<T> {
    fn with_multiline(kind: Kind, multiline: bool) -> Kind {
        T::with_multiline(kind, multiline)
    }
}
impl<T: ComboInput> ComboInput for Option<T> {
    fn combo(choices: &[&str]) -> Kind {
        T::combo(choices)
    }
    fn image_upload() -> Kind {
        T::image_upload()
    }
}
