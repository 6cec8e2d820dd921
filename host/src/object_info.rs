//! Rendering node definitions as ComfyUI `object_info` entries.

use serde_json::{Map, Value as Json, json};

use crate::files::InputFiles;
use crate::plugins::NodeDef;
use crate::plugins::meta::ClassMeta;
use crate::plugins::node::{ComboSource, InputKind, InputSpec};
use crate::plugins::registry::hidden_name;

/// The `object_info` entry of `def`, with what its plugin's `node-meta`
/// says (`meta`: the API-node flag, dynamic combos, whose choices' inputs
/// show under the combo instead of beside it). Image-upload combos list
/// `files`' images.
pub fn node_info(def: &NodeDef, meta: Option<&ClassMeta>, files: &dyn InputFiles) -> Json {
    let combos = meta.map_or(&[][..], |m| &m.dynamic_combos[..]);
    let nested = |name: &str| combos.iter().any(|c| c.options.iter().any(|o| o.inputs.iter().any(|i| i == name)));
    let spec = |input: &InputSpec| match combos.iter().find(|c| c.input == input.name) {
        Some(combo) => dynamic_combo_spec(def, combo, files),
        None => input_spec(input, files),
    };
    let section = |inputs: &[InputSpec]| -> (Map<String, Json>, Vec<Json>) {
        let mut map = Map::new();
        let mut order = Vec::new();
        for input in inputs.iter().filter(|i| !nested(&i.name)) {
            map.insert(input.name.clone(), spec(input));
            order.push(Json::String(input.name.clone()));
        }
        (map, order)
    };
    let (required, required_order) = section(&def.required);
    let mut input = Map::new();
    let mut input_order = Map::new();
    input.insert("required".into(), Json::Object(required));
    input_order.insert("required".into(), Json::Array(required_order));
    if !def.optional.is_empty() {
        let (optional, optional_order) = section(&def.optional);
        input.insert("optional".into(), Json::Object(optional));
        input_order.insert("optional".into(), Json::Array(optional_order));
    }
    if !def.hidden.is_empty() {
        let mut hidden = Map::new();
        for h in &def.hidden {
            let kind = match hidden_name(*h) {
                "prompt" => "PROMPT",
                "extra_pnginfo" => "EXTRA_PNGINFO",
                _ => "UNIQUE_ID",
            };
            hidden.insert(hidden_name(*h).into(), Json::String(kind.into()));
        }
        input_order.insert("hidden".into(), def.hidden.iter().map(|h| Json::String(hidden_name(*h).into())).collect());
        input.insert("hidden".into(), Json::Object(hidden));
    }
    json!({
        "input": input,
        "input_order": input_order,
        "is_input_list": false,
        "output": def.outputs.iter().map(|o| o.type_name.clone()).collect::<Vec<_>>(),
        "output_is_list": def.outputs.iter().map(|o| o.is_list).collect::<Vec<_>>(),
        "output_name": def.outputs.iter().map(|o| o.name.clone()).collect::<Vec<_>>(),
        "output_tooltips": def.outputs.iter().map(|o| o.tooltip.clone()).collect::<Vec<_>>(),
        "name": def.class_type,
        "display_name": def.display_name.clone().unwrap_or_else(|| def.class_type.clone()),
        "description": def.description,
        "python_module": "kiln",
        "category": def.category,
        "output_node": def.output_node,
        "deprecated": def.deprecated,
        "experimental": def.experimental,
        "api_node": meta.is_some_and(|m| m.api_node),
        "search_aliases": def.search_aliases,
    })
}

/// `["COMFY_DYNAMICCOMBO_V3", {"options": [{"key", "inputs": {"required":
/// {name: spec}}}]}]`, each option's inputs named without the combo's prefix.
fn dynamic_combo_spec(def: &NodeDef, combo: &crate::plugins::meta::DynamicCombo, files: &dyn InputFiles) -> Json {
    let prefix = format!("{}.", combo.input);
    let options: Vec<Json> = combo
        .options
        .iter()
        .map(|option| {
            let mut required = Map::new();
            for name in &option.inputs {
                if let Some(input) = def.required.iter().chain(&def.optional).find(|i| &i.name == name) {
                    required.insert(name.strip_prefix(&prefix).unwrap_or(name).to_string(), input_spec(input, files));
                }
            }
            json!({ "key": option.key, "inputs": { "required": required } })
        })
        .collect();
    json!(["COMFY_DYNAMICCOMBO_V3", { "options": options }])
}

/// The spec of input `name` of `def` as `object_info` shows it (ComfyUI's
/// `input_config` in validation errors).
pub fn input_config(def: &NodeDef, name: &str, files: &dyn InputFiles) -> Option<Json> {
    def.required.iter().chain(def.optional.iter()).find(|i| i.name == name).map(|i| input_spec(i, files))
}

fn input_spec(input: &InputSpec, files: &dyn InputFiles) -> Json {
    let mut opts = Map::new();
    let mut put = |k: &str, v: Option<Json>| {
        if let Some(v) = v {
            opts.insert(k.into(), v);
        }
    };
    let type_name: Json = match &input.kind {
        InputKind::Int(s) => {
            put("default", s.default.map(Json::from));
            put("min", s.min.map(Json::from));
            put("max", s.max.map(Json::from));
            put("step", s.step.map(Json::from));
            put("display", s.display.clone().map(Json::from));
            put("control_after_generate", s.control_after_generate.then_some(Json::Bool(true)));
            "INT".into()
        }
        InputKind::Float(s) => {
            put("default", s.default.map(Json::from));
            put("min", s.min.map(Json::from));
            put("max", s.max.map(Json::from));
            put("step", s.step.map(Json::from));
            put("round", s.round.map(Json::from));
            put("display", s.display.clone().map(Json::from));
            "FLOAT".into()
        }
        InputKind::String(s) => {
            put("default", s.default.clone().map(Json::from));
            put("multiline", s.multiline.map(Json::Bool));
            put("placeholder", s.placeholder.clone().map(Json::from));
            "STRING".into()
        }
        InputKind::Boolean(s) => {
            put("default", s.default.map(Json::from));
            put("label_on", s.label_on.clone().map(Json::from));
            put("label_off", s.label_off.clone().map(Json::from));
            "BOOLEAN".into()
        }
        InputKind::Combo(c) => {
            put("default", c.default.clone().map(Json::from));
            let choices = match c.source {
                ComboSource::Fixed => c.choices.clone(),
                ComboSource::InputImages => {
                    put("image_upload", Some(Json::Bool(true)));
                    files.image_names()
                }
            };
            Json::Array(choices.into_iter().map(Json::String).collect())
        }
        InputKind::Link(t) => t.clone().into(),
    };
    if let Some(t) = &input.tooltip {
        opts.insert("tooltip".into(), Json::String(t.clone()));
    }
    if opts.is_empty() { json!([type_name]) } else { json!([type_name, opts]) }
}
