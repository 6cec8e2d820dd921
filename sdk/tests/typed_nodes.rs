//! `#[node]` functions, run natively: the definition they generate equals
//! the one built by hand, and their dispatch takes each input by name and
//! type, leaves out absent optional ones and hands the outputs back in order.

use kiln_sdk::bindings::exports::kiln::plugin::node as wit;
use kiln_sdk::prelude::*;

const MODES: [&str; 2] = ["fast", "exact"];

/// A node using every kind of input and option.
#[node(
    class = "Everything",
    category = "tests/typed",
    display_name = "Every option",
    description = "Adds numbers.",
    outputs = ["sum", "label", "on"],
    search_aliases = ["all", "every"],
    experimental
)]
fn everything(
    #[input(default = 3, min = -5, max = 10, step = 1, display = "slider", control_after_generate, tooltip = "How many.")] count: i64,
    #[input(default = 0.5, min = 0.0, max = 1.0, step = 0.05, round = 0.01)] ratio: f64,
    #[input(default = "hi", multiline)] text: &str,
    #[input(choices = MODES, default = "exact")] mode: &str,
    #[input(default = true)] on: bool,
    extra: Option<i64>,
    #[input(name = "size.width", default = 8, min = 0)] width: usize,
    #[hidden] unique_id: Option<String>,
) -> Result<(f64, String, bool)> {
    if count > 5 {
        return Err(Error::invalid("count above 5"));
    }
    let sum = count as f64 + ratio + extra.unwrap_or(0) as f64 + width as f64;
    Ok((sum, format!("{text}/{mode}/{}", unique_id.unwrap_or_default()), !on))
}

/// The same definition, built by hand.
const BY_HAND: NodeClass = NodeClass {
    class_type: "Everything",
    define: || {
        NodeDef::new("tests/typed")
            .display_name("Every option")
            .description("Adds numbers.")
            .required("count", Kind::int().default(3).int_range(-5, 10).step(1.0).display("slider").control_after_generate().tooltip("How many."))
            .required("ratio", Kind::float().default(0.5).min(0.0).max(1.0).step(0.05).round(0.01))
            .required("text", Kind::string().default("hi").multiline())
            .required("mode", Kind::combo(&MODES).default("exact"))
            .required("on", Kind::boolean().default(true))
            .optional("extra", Kind::int())
            .required("size.width", Kind::int().default(8).min(0.0))
            .hidden(Hidden::UniqueId)
            .output("sum", "FLOAT")
            .output("label", "STRING")
            .output("on", "BOOLEAN")
            .experimental()
            .search_aliases(&["all", "every"])
    },
    run: |_| Ok(vec![]),
};

/// A node with defaults everywhere: no options, one unnamed output.
#[node(category = "tests/typed")]
fn plain_double(value: f64) -> f64 {
    value * 2.0
}

fn input(name: &str, value: wit::Value) -> wit::Input {
    wit::Input { name: name.to_string(), value }
}

fn full_inputs() -> Vec<wit::Input> {
    vec![
        input("count", wit::Value::Int(2)),
        input("ratio", wit::Value::Float(0.25)),
        input("text", wit::Value::String("a".into())),
        input("mode", wit::Value::String("fast".into())),
        input("on", wit::Value::Boolean(true)),
        input("extra", wit::Value::Int(10)),
        input("size.width", wit::Value::Int(4)),
        input("unique_id", wit::Value::String("7".into())),
    ]
}

#[test]
fn the_generated_definition_equals_the_one_built_by_hand() {
    let generated = kiln_sdk::definitions(&[EVERYTHING]);
    let by_hand = kiln_sdk::definitions(&[BY_HAND]);
    assert_eq!(format!("{generated:?}"), format!("{by_hand:?}"));
    // Defaults: the class is the function's name in UpperCamelCase, the
    // output named after its type.
    let plain = kiln_sdk::definitions(&[PLAIN_DOUBLE]);
    assert_eq!(plain[0].class_type, "PlainDouble");
    assert_eq!(plain[0].required.len(), 1);
    assert_eq!((plain[0].outputs[0].name.as_str(), plain[0].outputs[0].type_name.as_str()), ("FLOAT", "FLOAT"));
}

#[test]
fn dispatch_takes_inputs_by_name_and_returns_outputs_in_order() {
    let out = kiln_sdk::execute(&[EVERYTHING], "Everything", full_inputs()).expect("runs");
    assert_eq!(format!("{out:?}"), format!("{:?}", [wit::Value::Float(16.25), wit::Value::String("a/fast/7".into()), wit::Value::Boolean(false)]));
}

#[test]
fn absent_optional_and_hidden_inputs_are_none() {
    let inputs = full_inputs().into_iter().filter(|i| i.name != "extra" && i.name != "unique_id").collect();
    let out = kiln_sdk::execute(&[EVERYTHING], "Everything", inputs).expect("runs");
    assert_eq!(format!("{out:?}"), format!("{:?}", [wit::Value::Float(6.25), wit::Value::String("a/fast/".into()), wit::Value::Boolean(false)]));
}

#[test]
fn bad_values_and_node_errors_are_node_errors() {
    let call = |change: &dyn Fn(&mut Vec<wit::Input>)| {
        let mut inputs = full_inputs();
        change(&mut inputs);
        match kiln_sdk::execute(&[EVERYTHING], "Everything", inputs) {
            Err(wit::NodeError::InvalidInput(m)) => m,
            other => panic!("expected an invalid-input error, got {other:?}"),
        }
    };
    assert_eq!(call(&|i| i[0].value = wit::Value::String("3".into())), "input `count` is STRING, not INT");
    assert_eq!(call(&|i| i[6].value = wit::Value::Int(-1)), "`size.width` must not be negative");
    assert_eq!(call(&|i| i.retain(|i| i.name != "ratio")), "missing input `ratio`");
    assert_eq!(call(&|i| i[0].value = wit::Value::Int(6)), "count above 5");
}

#[test]
fn a_node_function_stays_callable_with_plain_values() {
    assert_eq!(plain_double(1.5), 3.0);
    let (sum, label, on) = everything(1, 0.5, "t", "exact", false, None, 2, None).expect("runs");
    assert_eq!((sum, label.as_str(), on), (3.5, "t/exact/", true));
}

/// A parameter may share the function's name.
#[node(category = "tests/typed")]
fn levels(#[input(default = 4)] levels: i64) -> i64 {
    levels + 1
}

#[test]
fn a_parameter_named_like_its_function_works() {
    let out = kiln_sdk::execute(&[LEVELS], "Levels", vec![input("levels", wit::Value::Int(2))]).expect("runs");
    assert_eq!(format!("{out:?}"), format!("{:?}", [wit::Value::Int(3)]));
}
