//! The core nodes' definitions match the reference ComfyUI `object_info`:
//! class names, input names and order, required/optional, defaults, ranges,
//! combo options, output types and names, categories, display names.

use kiln::files::NamedInputs;
use kiln::object_info::node_info;
use serde_json::{Map, Value};

use crate::support::env;

/// Every bundled class: core-image's file and pixel nodes and the primitives.
fn core_classes() -> Vec<String> {
    let all: Value = serde_json::from_str(include_str!("../fixtures/core-classes.json")).expect("core-classes.json parses");
    ["core_image_files", "core_image_pixels", "primitives"]
        .iter()
        .flat_map(|group| all[*group].as_array().expect("a class list").iter().map(|c| c.as_str().expect("a class name").to_string()))
        .collect()
}

/// An input spec reduced to what must match: type (combos: their options),
/// and the validation-relevant options.
fn normalize_input(spec: &Value) -> Value {
    let items = spec.as_array().expect("input spec is an array");
    let opts = items.get(1).and_then(Value::as_object).cloned().unwrap_or_default();
    let (kind, choices) = match &items[0] {
        Value::Array(choices) => ("COMBO".to_string(), Some(Value::Array(choices.clone()))),
        Value::String(s) if s == "COMBO" => ("COMBO".to_string(), opts.get("options").cloned()),
        Value::String(s) => (s.clone(), None),
        other => panic!("odd input type {other}"),
    };
    let mut out = Map::new();
    out.insert("type".into(), kind.clone().into());
    if (kind != "COMBO" || !opts.contains_key("image_upload"))
        && let Some(c) = choices
    {
        out.insert("choices".into(), c);
    }
    for key in ["default", "min", "max", "step", "multiline", "image_upload"] {
        if let Some(v) = opts.get(key) {
            // 1 and 1.0 are the same default.
            let v = match v.as_f64() {
                Some(f) if !v.is_boolean() => Value::from(f),
                _ => v.clone(),
            };
            out.insert(key.into(), v);
        }
    }
    Value::Object(out)
}

fn normalize(entry: &Value) -> Value {
    let mut out = Map::new();
    for section in ["required", "optional"] {
        let inputs = entry["input"].get(section).and_then(Value::as_object).cloned().unwrap_or_default();
        let order = entry["input_order"].get(section).cloned().unwrap_or(Value::Array(vec![]));
        out.insert(format!("{section}_order"), order);
        out.insert(section.into(), inputs.iter().map(|(k, v)| (k.clone(), normalize_input(v))).collect::<Map<_, _>>().into());
    }
    let hidden = entry["input"].get("hidden").and_then(Value::as_object).map(|h| h.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
    out.insert("hidden".into(), hidden.into());
    for key in ["output", "output_name", "output_is_list", "name", "category", "output_node", "description"] {
        out.insert(key.into(), entry[key].clone());
    }
    // ComfyUI reports `null` for V3 nodes without a display name and means the class name.
    let display = entry["display_name"].as_str().unwrap_or_else(|| entry["name"].as_str().unwrap_or_default());
    out.insert("display_name".into(), display.into());
    out.insert("deprecated".into(), entry.get("deprecated").cloned().unwrap_or(Value::Bool(false)));
    Value::Object(out)
}

#[tokio::test]
async fn core_nodes_match_the_reference_object_info() {
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/fixtures/comfyui/object_info-core.json")).unwrap()).unwrap();
    let registry = &env().await.registry;
    let files = NamedInputs::new();
    let mut mismatches = Vec::new();
    let core = core_classes();
    for class in &core {
        let Some((_, def)) = registry.get(class) else {
            mismatches.push(format!("{class}: not provided"));
            continue;
        };
        let ours = normalize(&node_info(def, registry.meta(class), &files));
        let theirs = normalize(&reference[class.as_str()]);
        if ours != theirs {
            mismatches.push(format!("{class}:\n  ours:   {ours}\n  theirs: {theirs}"));
        }
    }
    assert!(mismatches.is_empty(), "{} of {} core nodes differ:\n{}", mismatches.len(), core.len(), mismatches.join("\n"));
}
