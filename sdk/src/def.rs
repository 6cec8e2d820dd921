//! Node definitions: the builder behind a node's `object_info` entry.

use crate::bindings::exports::kiln::plugin::node as wit;
use crate::bindings::exports::kiln::plugin::node_meta as meta;

/// A hidden input the host fills in (see [`NodeDef::hidden`]).
pub type Hidden = wit::HiddenInput;

/// What one input accepts; build with the constructors and chain options.
#[derive(Clone, Debug)]
pub struct Kind {
    pub(crate) kind: wit::InputKind,
    tooltip: Option<String>,
}

impl Kind {
    /// A link from another node's output of `type_name` (e.g. `"IMAGE"`).
    pub fn link(type_name: &str) -> Kind {
        Kind { kind: wit::InputKind::Link(type_name.to_string()), tooltip: None }
    }
    /// An INT widget with no options yet.
    pub fn int() -> Kind {
        Kind {
            kind: wit::InputKind::Int(wit::IntSpec { default: None, min: None, max: None, step: None, display: None, control_after_generate: false }),
            tooltip: None,
        }
    }
    /// A FLOAT widget with no options yet.
    pub fn float() -> Kind {
        Kind { kind: wit::InputKind::Float(wit::FloatSpec { default: None, min: None, max: None, step: None, round: None, display: None }), tooltip: None }
    }
    /// A STRING widget (single line unless [`Kind::multiline`]).
    pub fn string() -> Kind {
        Kind { kind: wit::InputKind::String(wit::StringSpec { default: None, multiline: None, placeholder: None }), tooltip: None }
    }
    /// A BOOLEAN widget.
    pub fn boolean() -> Kind {
        Kind { kind: wit::InputKind::Boolean(wit::BooleanSpec { default: None, label_on: None, label_off: None }), tooltip: None }
    }
    /// A combo (drop-down) over fixed `choices`; the first is the frontend's default.
    pub fn combo(choices: &[&str]) -> Kind {
        Kind {
            kind: wit::InputKind::Combo(wit::ComboSpec {
                choices: choices.iter().map(|c| c.to_string()).collect(),
                default: None,
                source: wit::ComboSource::Fixed,
            }),
            tooltip: None,
        }
    }
    /// A combo over the image files uploaded to the host, with an upload button.
    pub fn input_image() -> Kind {
        Kind { kind: wit::InputKind::Combo(wit::ComboSpec { choices: Vec::new(), default: None, source: wit::ComboSource::InputImages }), tooltip: None }
    }

    /// Sets the default of an INT (`i64`), FLOAT (`f64`), STRING (`&str`),
    /// BOOLEAN (`bool`) or combo (`&str`) widget.
    pub fn default(mut self, value: impl Into<DefaultValue>) -> Kind {
        match (&mut self.kind, value.into()) {
            (wit::InputKind::Int(s), DefaultValue::Int(v)) => s.default = Some(v),
            (wit::InputKind::Float(s), DefaultValue::Float(v)) => s.default = Some(v),
            (wit::InputKind::Float(s), DefaultValue::Int(v)) => s.default = Some(v as f64),
            (wit::InputKind::String(s), DefaultValue::Str(v)) => s.default = Some(v),
            (wit::InputKind::Combo(s), DefaultValue::Str(v)) => s.default = Some(v),
            (wit::InputKind::Boolean(s), DefaultValue::Bool(v)) => s.default = Some(v),
            (kind, value) => panic!("default {value:?} does not fit input kind {kind:?}"),
        }
        self
    }
    /// Sets the minimum of an INT or FLOAT widget.
    pub fn min(mut self, value: f64) -> Kind {
        match &mut self.kind {
            wit::InputKind::Int(s) => s.min = Some(value as i64),
            wit::InputKind::Float(s) => s.min = Some(value),
            kind => panic!("min does not apply to {kind:?}"),
        }
        self
    }
    /// Sets the maximum of an INT or FLOAT widget.
    pub fn max(mut self, value: f64) -> Kind {
        match &mut self.kind {
            wit::InputKind::Int(s) => s.max = Some(value as i64),
            wit::InputKind::Float(s) => s.max = Some(value),
            kind => panic!("max does not apply to {kind:?}"),
        }
        self
    }
    /// Sets the minimum of an INT widget exactly (for bounds beyond f64 precision).
    pub fn int_range(mut self, min: i64, max: i64) -> Kind {
        match &mut self.kind {
            wit::InputKind::Int(s) => {
                s.min = Some(min);
                s.max = Some(max);
            }
            kind => panic!("int_range does not apply to {kind:?}"),
        }
        self
    }
    /// Sets the step of an INT or FLOAT widget.
    pub fn step(mut self, value: f64) -> Kind {
        match &mut self.kind {
            wit::InputKind::Int(s) => s.step = Some(value as i64),
            wit::InputKind::Float(s) => s.step = Some(value),
            kind => panic!("step does not apply to {kind:?}"),
        }
        self
    }
    /// Sets the rounding of a FLOAT widget.
    pub fn round(mut self, value: f64) -> Kind {
        if let wit::InputKind::Float(s) = &mut self.kind {
            s.round = Some(value);
        }
        self
    }
    /// Sets the frontend display style (`"number"`, `"slider"`, `"color"`).
    pub fn display(mut self, display: &str) -> Kind {
        match &mut self.kind {
            wit::InputKind::Int(s) => s.display = Some(display.to_string()),
            wit::InputKind::Float(s) => s.display = Some(display.to_string()),
            kind => panic!("display does not apply to {kind:?}"),
        }
        self
    }
    /// Adds the frontend's "control after generate" widget to an INT.
    pub fn control_after_generate(mut self) -> Kind {
        if let wit::InputKind::Int(s) = &mut self.kind {
            s.control_after_generate = true;
        }
        self
    }
    /// Sets the input's tooltip.
    pub fn tooltip(mut self, text: &str) -> Kind {
        self.tooltip = Some(text.to_string());
        self
    }
    /// Makes a STRING widget multi-line.
    pub fn multiline(mut self) -> Kind {
        if let wit::InputKind::String(s) = &mut self.kind {
            s.multiline = Some(true);
        }
        self
    }
    /// States explicitly that a STRING widget is single-line.
    pub fn single_line(mut self) -> Kind {
        if let wit::InputKind::String(s) = &mut self.kind {
            s.multiline = Some(false);
        }
        self
    }
}

/// A widget default; see [`Kind::default`].
#[derive(Debug)]
#[doc(hidden)]
pub enum DefaultValue {
    Int(i64),
    Float(f64),
    Str(String),
    Bool(bool),
}
impl From<i64> for DefaultValue {
    fn from(v: i64) -> Self {
        DefaultValue::Int(v)
    }
}
impl From<i32> for DefaultValue {
    fn from(v: i32) -> Self {
        DefaultValue::Int(v as i64)
    }
}
impl From<f64> for DefaultValue {
    fn from(v: f64) -> Self {
        DefaultValue::Float(v)
    }
}
impl From<&str> for DefaultValue {
    fn from(v: &str) -> Self {
        DefaultValue::Str(v.to_string())
    }
}
impl From<bool> for DefaultValue {
    fn from(v: bool) -> Self {
        DefaultValue::Bool(v)
    }
}

/// The definition of one node class (everything behind its `object_info` entry).
#[derive(Clone, Debug)]
pub struct NodeDef {
    pub(crate) def: wit::NodeDef,
    pub(crate) meta: meta::ClassMeta,
}

impl NodeDef {
    /// A node in `category` (a slash path such as `"image/transform"`).
    pub fn new(category: &str) -> NodeDef {
        NodeDef {
            def: wit::NodeDef {
                class_type: String::new(),
                display_name: None,
                description: String::new(),
                category: category.to_string(),
                required: Vec::new(),
                optional: Vec::new(),
                hidden: Vec::new(),
                outputs: Vec::new(),
                output_node: false,
                deprecated: false,
                experimental: false,
                search_aliases: Vec::new(),
            },
            meta: meta::ClassMeta { class_type: String::new(), api_node: false, dynamic_combos: Vec::new() },
        }
    }
    /// The name the frontend shows (defaults to the class name).
    pub fn display_name(mut self, name: &str) -> NodeDef {
        self.def.display_name = Some(name.to_string());
        self
    }
    /// A longer description.
    pub fn description(mut self, text: &str) -> NodeDef {
        self.def.description = text.to_string();
        self
    }
    /// Adds a required input.
    pub fn required(self, name: &str, kind: Kind) -> NodeDef {
        self.input(name, false, kind)
    }
    /// Adds an optional input.
    pub fn optional(self, name: &str, kind: Kind) -> NodeDef {
        self.input(name, true, kind)
    }
    /// Adds an input, optional or required.
    pub fn input(mut self, name: &str, optional: bool, kind: Kind) -> NodeDef {
        let spec = wit::InputSpec { name: name.to_string(), kind: kind.kind, tooltip: kind.tooltip };
        if optional {
            self.def.optional.push(spec)
        } else {
            self.def.required.push(spec)
        }
        self
    }
    /// Sets the tooltip of the input added last.
    pub fn tooltip(mut self, text: &str) -> NodeDef {
        let last = if self.def.optional.is_empty() { self.def.required.last_mut() } else { self.def.optional.last_mut() };
        if let Some(input) = last {
            input.tooltip = Some(text.to_string());
        }
        self
    }
    /// Asks the host for a hidden input (the workflow, PNG info, the node id).
    pub fn hidden(mut self, hidden: Hidden) -> NodeDef {
        self.def.hidden.push(hidden);
        self
    }
    /// Adds an output socket named `name` of link type `type_name`.
    pub fn output(mut self, name: &str, type_name: &str) -> NodeDef {
        self.def.outputs.push(wit::OutputSpec { name: name.to_string(), type_name: type_name.to_string(), is_list: false, tooltip: None });
        self
    }
    /// Marks the node as an output (sink) node: workflows run towards these.
    pub fn output_node(mut self) -> NodeDef {
        self.def.output_node = true;
        self
    }
    /// Marks the node deprecated.
    pub fn deprecated(mut self) -> NodeDef {
        self.def.deprecated = true;
        self
    }
    /// Marks the node experimental.
    pub fn experimental(mut self) -> NodeDef {
        self.def.experimental = true;
        self
    }
    /// Extra words the node library search matches.
    pub fn search_aliases(mut self, aliases: &[&str]) -> NodeDef {
        self.def.search_aliases = aliases.iter().map(|a| a.to_string()).collect();
        self
    }
    /// Marks the node as a partner (API) node (`api_node` in `object_info`).
    pub fn api_node(mut self) -> NodeDef {
        self.meta.api_node = true;
        self
    }
    /// Makes combo input `input` a dynamic combo: each `(key, inputs)`
    /// choice shows `inputs`, declared like any other as `<input>.<name>`.
    pub fn dynamic_combo(mut self, input: &str, options: &[(&str, &[&str])]) -> NodeDef {
        let options =
            options.iter().map(|(key, inputs)| meta::DynamicOption { key: key.to_string(), inputs: inputs.iter().map(|i| i.to_string()).collect() }).collect();
        self.meta.dynamic_combos.push(meta::DynamicCombo { input: input.to_string(), options });
        self
    }
}
