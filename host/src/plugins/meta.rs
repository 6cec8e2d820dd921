//! The optional `node-meta` export (`kiln:plugin@0.1.2`): which classes are
//! partner (API) nodes and which combo inputs are dynamic combos. A plugin
//! built against an older contract (or without the SDK) has none; the host
//! looks the export up at load and checks what it says against the
//! plugin's definitions (`check`).

mod generated {
    wasmtime::component::bindgen!({
        path: "../wit",
        world: "kiln:plugin/node-meta-only",
        exports: { default: async },
    });
}

pub use generated::NodeMetaOnlyPre as MetaPre;
pub use generated::exports::kiln::plugin::node_meta::{ClassMeta, DynamicCombo, DynamicOption};

use super::NodeDef;
use super::node::InputKind;

/// Checks `metas` against `defs`: known classes, each once; dynamic combos
/// name a fixed combo input whose choices are the options' keys, and each
/// option's inputs are declared inputs named `<combo>.<name>`.
pub fn check(metas: &[ClassMeta], defs: &[NodeDef]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for meta in metas {
        let Some(def) = defs.iter().find(|d| d.class_type == meta.class_type) else {
            return Err(format!("node-meta describes class `{}`, which the plugin does not define", meta.class_type));
        };
        if !seen.insert(meta.class_type.as_str()) {
            return Err(format!("node-meta describes class `{}` twice", meta.class_type));
        }
        let inputs = || def.required.iter().chain(&def.optional);
        for combo in &meta.dynamic_combos {
            let choices = match inputs().find(|i| i.name == combo.input).map(|i| &i.kind) {
                Some(InputKind::Combo(c)) => &c.choices,
                _ => return Err(format!("class `{}`: dynamic combo `{}` is not a combo input", def.class_type, combo.input)),
            };
            let keys: Vec<&String> = combo.options.iter().map(|o| &o.key).collect();
            if keys.len() != choices.len() || !choices.iter().all(|c| keys.contains(&c)) {
                return Err(format!("class `{}`: the options of dynamic combo `{}` are not its choices", def.class_type, combo.input));
            }
            let prefix = format!("{}.", combo.input);
            for name in combo.options.iter().flat_map(|o| &o.inputs) {
                if !name.starts_with(&prefix) || !inputs().any(|i| &i.name == name) {
                    return Err(format!(
                        "class `{}`: dynamic combo `{}` shows `{name}`, which is not a declared input named `{prefix}…`",
                        def.class_type, combo.input
                    ));
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugins::node::{ComboSource, ComboSpec, InputSpec};

    fn combo(name: &str, choices: &[&str]) -> InputSpec {
        let choices = choices.iter().map(|c| c.to_string()).collect();
        InputSpec { name: name.into(), kind: InputKind::Combo(ComboSpec { choices, default: None, source: ComboSource::Fixed }), tooltip: None }
    }

    fn def() -> NodeDef {
        NodeDef {
            class_type: "P".into(),
            display_name: None,
            description: String::new(),
            category: "c".into(),
            required: vec![
                combo("mode", &["flexible"]),
                combo("mode.optimized_for", &["a", "b"]),
                InputSpec { name: "x".into(), kind: InputKind::Link("IMAGE".into()), tooltip: None },
            ],
            optional: vec![],
            hidden: vec![],
            outputs: vec![],
            output_node: false,
            deprecated: false,
            experimental: false,
            search_aliases: vec![],
        }
    }

    fn meta(class: &str, input: &str, key: &str, inputs: &[&str]) -> ClassMeta {
        let options = vec![DynamicOption { key: key.into(), inputs: inputs.iter().map(|i| i.to_string()).collect() }];
        ClassMeta { class_type: class.into(), api_node: true, dynamic_combos: vec![DynamicCombo { input: input.into(), options }] }
    }

    #[test]
    fn meta_must_match_the_definitions() {
        let defs = [def()];
        assert!(check(&[meta("P", "mode", "flexible", &["mode.optimized_for"])], &defs).is_ok());
        assert!(check(&[], &defs).is_ok());
        for (bad, says) in [
            (vec![meta("Q", "mode", "flexible", &[])], "does not define"),
            (vec![meta("P", "mode", "flexible", &[]), meta("P", "mode", "flexible", &[])], "twice"),
            (vec![meta("P", "x", "flexible", &[])], "not a combo input"),
            (vec![meta("P", "mode", "creative", &[])], "not its choices"),
            (vec![meta("P", "mode", "flexible", &["x"])], "not a declared input"),
            (vec![meta("P", "mode", "flexible", &["mode.missing"])], "not a declared input"),
        ] {
            let err = check(&bad, &defs).unwrap_err();
            assert!(err.contains(says), "{err}");
        }
    }
}
