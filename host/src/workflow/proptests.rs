//! Property tests of parsing and validation: any document gives a workflow
//! or a [`ParseError`], any graph over the bundled classes gives a plan or
//! issues — never a panic — and both agree with a small reference model of
//! the API format and of ComfyUI's validation rules written here.

use std::collections::{BTreeMap, HashMap, HashSet};

use proptest::prelude::*;
use serde_json::{Map, Value as Json, json};

use super::parse::{InputValue, ParseError, Workflow};
use super::plan::PlannedInput;
use super::validate::{Issue, IssueKind, ValidationError, validate};
use crate::files::{FileError, InputFiles};
use crate::plugins::node::{ComboSource, InputKind, NodeDef};
use crate::test_support::{self, proptest_config as config};
use crate::workflow::WorkflowLimits;

// ---------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------

/// Object keys: mostly the words the format gives meaning to.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["class_type", "inputs", "nodes", "links", "__value__", "1", "2", "_meta"]).prop_map(str::to_string),
        1 => ".{0,8}",
    ]
}

/// Any JSON value, nested at most four levels.
fn arb_json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        any::<i64>().prop_map(Json::from),
        any::<u64>().prop_map(Json::from),
        any::<f64>().prop_map(Json::from),
        (0u64..5).prop_map(Json::from),
        key().prop_map(Json::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Json::Array),
            prop::collection::vec((key(), inner), 0..5).prop_map(|kv| Json::Object(kv.into_iter().collect())),
        ]
    })
}

/// JSON shaped like a workflow, with every level sometimes wrong: node
/// ids to nodes (or not), `class_type` (a string or not), `inputs` (an
/// object of links, near-links and constants, or not).
fn workflowish_json() -> impl Strategy<Value = Json> {
    let input = prop_oneof![(key(), 0u32..4).prop_map(|(n, o)| json!([n, o])), (0u64..5, 0u64..4).prop_map(|(n, o)| json!([n, o])), arb_json(),];
    let inputs = prop_oneof![4 => prop::collection::vec((key(), input), 0..4).prop_map(|kv| Json::Object(kv.into_iter().collect())), 1 => arb_json(),];
    let class = prop_oneof![4 => "[A-Za-z]{1,8}".prop_map(Json::String), 1 => arb_json()];
    let node = prop_oneof![
        6 => (class, inputs, any::<(bool, bool)>()).prop_map(|(c, i, (has_class, has_inputs))| {
            let mut m = Map::new();
            if has_class {
                m.insert("class_type".into(), c);
            }
            if has_inputs {
                m.insert("inputs".into(), i);
            }
            Json::Object(m)
        }),
        1 => arb_json(),
    ];
    prop_oneof![
        8 => prop::collection::vec((key(), node), 0..5).prop_map(|kv| Json::Object(kv.into_iter().collect())),
        1 => arb_json(),
    ]
}

/// The API format, written out independently of `parse.rs`: what parsing
/// `json` must give.
/// A parsed node, as the reference sees it: id, class, inputs.
type RefNode = (String, Option<String>, Vec<(String, InputValue)>);

fn expected_parse(json: &Json) -> Result<Vec<RefNode>, ParseError> {
    let Json::Object(map) = json else { return Err(ParseError::NotAnObject) };
    if matches!(map.get("nodes"), Some(Json::Array(_))) && map.contains_key("links") {
        return Err(ParseError::UiFormat);
    }
    if map.is_empty() {
        return Err(ParseError::Empty);
    }
    let mut nodes = Vec::new();
    for (id, node) in map {
        let bad = || ParseError::BadNode(id.clone());
        let Json::Object(node) = node else { return Err(bad()) };
        let class = match node.get("class_type") {
            None | Some(Json::Null) => None,
            Some(Json::String(s)) => Some(s.clone()),
            Some(_) => return Err(bad()),
        };
        let inputs = match node.get("inputs") {
            None | Some(Json::Null) => Vec::new(),
            Some(Json::Object(inputs)) => inputs.iter().map(|(k, v)| (k.clone(), expected_input(v))).collect(),
            Some(_) => return Err(bad()),
        };
        nodes.push((id.clone(), class, inputs));
    }
    Ok(nodes)
}

/// A link is exactly `[id, output]`: id a string or a non-negative integer,
/// output an integer that fits in 32 bits; any other list is a bad link; a
/// lone `__value__` wraps a constant.
fn expected_input(value: &Json) -> InputValue {
    match value {
        Json::Array(items) => match items.as_slice() {
            [Json::String(node), Json::Number(o)] if o.as_u64().is_some_and(|o| o <= u64::from(u32::MAX)) => {
                InputValue::Link { node: node.clone(), output: o.as_u64().unwrap_or(0) as u32 }
            }
            [Json::Number(n), Json::Number(o)] if n.is_u64() && o.as_u64().is_some_and(|o| o <= u64::from(u32::MAX)) => {
                InputValue::Link { node: n.to_string(), output: o.as_u64().unwrap_or(0) as u32 }
            }
            _ => InputValue::BadLink(value.clone()),
        },
        Json::Object(o) if o.len() == 1 && o.contains_key("__value__") => InputValue::Const(o["__value__"].clone()),
        other => InputValue::Const(other.clone()),
    }
}

fn assert_parsed_as_expected(json: &Json, got: Result<Workflow, ParseError>) -> Result<(), TestCaseError> {
    match (expected_parse(json), got) {
        (Err(want), Err(got)) => prop_assert_eq!(want, got),
        (Ok(want), Ok(wf)) => {
            prop_assert_eq!(wf.nodes.len(), want.len());
            for (node, (id, class, inputs)) in wf.nodes.iter().zip(&want) {
                prop_assert_eq!(&node.id, id);
                prop_assert_eq!(&node.class_type, class);
                prop_assert_eq!(&node.inputs, inputs);
                // The index finds every node by its id.
                prop_assert_eq!(wf.node(id).map(|n| &n.id), Some(id));
            }
        }
        (want, got) => prop_assert!(false, "expected {want:?}, parsed {:?}", got.map(|w| w.nodes)),
    }
    Ok(())
}

/// Text that is often almost JSON: a document with a few bytes cut,
/// inserted or replaced.
fn mangled_text() -> impl Strategy<Value = String> {
    let edit =
        (any::<prop::sample::Index>(), 0usize..4, prop::sample::select(vec!["", "{", "}", "[", "]", ",", ":", "\"", "\\", "0", "-", "1e999", "\u{0}", "é"]));
    (workflowish_json(), prop::collection::vec(edit, 0..4)).prop_map(|(json, edits)| {
        let mut text = json.to_string();
        for (at, cut, insert) in edits {
            let mut i = at.index(text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            let mut end = (i + cut).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            text.replace_range(i..end, insert);
        }
        text
    })
}

/// A well-formed workflow: unique ids, a class each, links and constants.
#[derive(Debug, Clone)]
enum GoodInput {
    /// A link to the `usize`-th id (or to an id not in the workflow), written
    /// with a numeric id where the id is a canonical number.
    Link(usize, u32, bool),
    Const(Json),
}

fn good_const() -> impl Strategy<Value = Json> {
    // Floats that print and parse back exactly.
    let float = (-1_000_000i32..1_000_000).prop_map(|x| Json::from(f64::from(x) / 1024.0));
    let scalar = prop_oneof![Just(Json::Null), any::<bool>().prop_map(Json::Bool), any::<i64>().prop_map(Json::from), float, ".{0,12}".prop_map(Json::String)];
    prop_oneof![
        4 => scalar.clone(),
        // Lists and objects are constants when wrapped.
        1 => prop::collection::vec(scalar.clone(), 0..4).prop_map(|v| json!({ "__value__": v })),
        1 => prop::collection::vec(("[a-z]{1,4}", scalar), 1..3).prop_map(|kv| Json::Object(kv.into_iter().map(|(k, v)| (format!("k{k}"), v)).collect())),
    ]
}

/// A generated node: id, class, inputs.
type GoodNode = (String, String, Vec<(String, GoodInput)>);

fn good_workflow() -> impl Strategy<Value = Vec<GoodNode>> {
    let id = prop_oneof!["[1-9][0-9]{0,3}", ".{1,6}"];
    let input =
        prop_oneof![(0usize..12, any::<u32>(), any::<bool>()).prop_map(|(n, o, num)| GoodInput::Link(n, o, num)), good_const().prop_map(GoodInput::Const)];
    let node = ("[A-Za-z][A-Za-z0-9 ._-]{0,12}", prop::collection::btree_map("[a-z_]{1,6}", input, 0..5));
    prop::collection::btree_map(id, node, 1..10)
        .prop_map(|nodes| nodes.into_iter().map(|(id, (class, inputs))| (id, class, inputs.into_iter().collect())).collect::<Vec<_>>())
}

#[test]
fn parser_examples_of_the_reference_model() {
    // The reference agrees with the hand-written examples of `parse.rs`.
    let json = json!({"1": {"class_type": "A", "inputs": {"a": ["2", 4294967295u64], "b": ["2", 4294967296u64], "c": [-1, 0], "d": [1, 2, 3]}}});
    let wf = Workflow::from_json(&json, &WorkflowLimits::default()).unwrap();
    assert_eq!(wf.nodes[0].inputs[0].1, InputValue::Link { node: "2".into(), output: u32::MAX });
    for (_, v) in &wf.nodes[0].inputs[1..] {
        assert!(matches!(v, InputValue::BadLink(_)), "{v:?}");
    }
    assert_parsed_as_expected(&json, Workflow::from_json(&json, &WorkflowLimits::default())).unwrap();
}

proptest! {
    #![proptest_config(config(512))]

    /// Any JSON value: a workflow or the `ParseError` the format prescribes.
    #[test]
    fn any_json_parses_as_the_format_says(json in prop_oneof![arb_json(), workflowish_json()]) {
        assert_parsed_as_expected(&json, Workflow::from_json(&json, &WorkflowLimits::default()))?;
        // The text form parses the same (as what the text reads back as:
        // a float may come back one unit in the last place off).
        let text = json.to_string();
        let reread: Json = serde_json::from_str(&text).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        assert_parsed_as_expected(&reread, Workflow::from_json_str(&text, &WorkflowLimits::default()))?;
    }

    /// Any text: not JSON gives `ParseError::Json`, JSON parses as itself.
    #[test]
    fn any_text_gives_a_workflow_or_a_parse_error(text in prop_oneof![".{0,64}", mangled_text()]) {
        let got = Workflow::from_json_str(&text, &WorkflowLimits::default());
        match serde_json::from_str::<Json>(&text) {
            Err(_) => prop_assert!(matches!(got, Err(ParseError::Json(_))), "{:?}", got.map(|w| w.nodes)),
            Ok(json) => assert_parsed_as_expected(&json, got)?,
        }
    }

    /// A well-formed workflow survives the trip through text: every node
    /// (in order), class, constant and link.
    #[test]
    fn well_formed_workflows_round_trip(nodes in good_workflow()) {
        let ids: Vec<&str> = nodes.iter().map(|(id, _, _)| id.as_str()).collect();
        let target = |n: usize| ids.get(n).map_or_else(|| format!("missing-{n}"), |s| s.to_string());
        let mut doc = Map::new();
        for (id, class, inputs) in &nodes {
            let inputs: Map<String, Json> = inputs
                .iter()
                .map(|(name, input)| {
                    let value = match input {
                        GoodInput::Link(n, o, numeric) => match target(*n).parse::<u64>() {
                            Ok(num) if *numeric && num.to_string() == target(*n) => json!([num, o]),
                            _ => json!([target(*n), o]),
                        },
                        GoodInput::Const(c) => c.clone(),
                    };
                    (name.clone(), value)
                })
                .collect();
            doc.insert(id.clone(), json!({ "class_type": class, "inputs": inputs, "_meta": { "title": "x" } }));
        }
        let text = serde_json::to_string_pretty(&Json::Object(doc)).unwrap();
        let wf = Workflow::from_json_str(&text, &WorkflowLimits::default()).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(wf.nodes.len(), nodes.len());
        for (node, (id, class, inputs)) in wf.nodes.iter().zip(&nodes) {
            prop_assert_eq!(&node.id, id);
            prop_assert_eq!(node.class_type.as_deref(), Some(class.as_str()));
            prop_assert_eq!(node.inputs.len(), inputs.len());
            for ((name, got), (want_name, want)) in node.inputs.iter().zip(inputs) {
                prop_assert_eq!(name, want_name);
                let want = match want {
                    GoodInput::Link(n, o, _) => InputValue::Link { node: target(*n), output: *o },
                    GoodInput::Const(c) => match c.get("__value__") {
                        Some(inner) => InputValue::Const(inner.clone()),
                        None => InputValue::Const(c.clone()),
                    },
                };
                prop_assert_eq!(got, &want);
            }
            prop_assert!(wf.node(id).is_some_and(|n| std::ptr::eq(n, node)));
        }
    }
}

// ---------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------

/// The bundled classes the graphs are built from.
const CLASSES: &[&str] = &[
    "EmptyImage",
    "ImageInvert",
    "ImageBlur",
    "ImageBlend",
    "ImageScaleBy",
    "ImageToMask",
    "MaskToImage",
    "LoadImage",
    "SaveImage",
    "PreviewImage",
    "PrimitiveInt",
    "PrimitiveFloat",
    "PrimitiveString",
    "PrimitiveBoolean",
];

/// The one input file the graphs may name.
const FILE: &str = "present.png";

/// Input files: names only (validation never reads them).
struct Files;

impl InputFiles for Files {
    fn read(&self, name: &str) -> Result<Vec<u8>, FileError> {
        Err(FileError::NotFound(name.to_string()))
    }
    fn contains(&self, name: &str) -> bool {
        name == FILE
    }
    fn content_hash(&self, _: &str) -> Option<blake3::Hash> {
        None
    }
    fn image_names(&self) -> Vec<String> {
        vec![FILE.to_string()]
    }
}

fn defs() -> Vec<&'static NodeDef> {
    let registry = test_support::registry();
    CLASSES.iter().map(|c| registry.get(c).unwrap_or_else(|| panic!("bundled class {c}")).1).collect()
}

/// A node's class: one of [`CLASSES`], rarely an unknown one or none.
#[derive(Debug, Clone)]
enum ClassPick {
    Known(usize),
    Unknown,
    Missing,
}

/// What to write for a constant, turned into JSON against the input's spec.
#[derive(Debug, Clone)]
enum ConstPick {
    /// A valid value (this far into the allowed range, or list).
    Good(f64),
    /// A valid value written as a string with spaces around it.
    GoodText(f64),
    BelowMin,
    AboveMax,
    Bool(bool),
    Null,
    /// A string no number, list or file has.
    Word,
    /// An object (never a valid constant).
    Object,
    /// A list wrapped in `__value__` (a constant list).
    WrappedList,
}

/// One input of a node.
#[derive(Debug, Clone)]
enum Slot {
    Missing,
    /// A link to the node at this index (or past the end: a missing node);
    /// if `true`, to a node of the right type where there is one.
    Link(usize, u32, bool),
    Const(ConstPick),
    /// A list that is not a link.
    BadLink(usize),
}

#[derive(Debug, Clone)]
struct GenNode {
    class: ClassPick,
    /// One per input of the class (required, then optional); extra are unused.
    slots: Vec<Slot>,
    /// An input the class does not have (ignored by validation).
    extra: Option<Slot>,
}

/// A graph: its nodes, and whether links go only to earlier nodes.
#[derive(Debug, Clone)]
struct GenGraph {
    nodes: Vec<GenNode>,
    acyclic: bool,
}

fn slot() -> impl Strategy<Value = Slot> {
    let pick = prop_oneof![
        40 => (0.0..=1.0f64).prop_map(ConstPick::Good),
        1 => (0.0..=1.0f64).prop_map(ConstPick::GoodText),
        1 => Just(ConstPick::BelowMin),
        1 => Just(ConstPick::AboveMax),
        1 => any::<bool>().prop_map(ConstPick::Bool),
        1 => Just(ConstPick::Null),
        1 => Just(ConstPick::Word),
        1 => Just(ConstPick::Object),
        1 => Just(ConstPick::WrappedList),
    ];
    prop_oneof![
        1 => Just(Slot::Missing),
        // Mostly output 0 (every class has it), sometimes out of range.
        30 => (any::<usize>(), prop_oneof![12 => Just(0u32), 1 => 0u32..4, 1 => Just(u32::MAX)], prop::bool::weighted(0.8))
            .prop_map(|(i, o, typed)| Slot::Link(i, o, typed)),
        20 => pick.prop_map(Slot::Const),
        1 => any::<usize>().prop_map(Slot::BadLink),
    ]
}

fn graph() -> impl Strategy<Value = GenGraph> {
    let outputs: Vec<usize> = CLASSES.iter().enumerate().filter(|(_, c)| matches!(**c, "SaveImage" | "PreviewImage")).map(|(i, _)| i).collect();
    let class = prop_oneof![
        150 => (0..CLASSES.len()).prop_map(ClassPick::Known),
        50 => prop::sample::select(outputs.clone()).prop_map(ClassPick::Known),
        1 => Just(ClassPick::Unknown),
        1 => Just(ClassPick::Missing),
    ];
    let node = (class, prop::collection::vec(slot(), 8), prop::option::weighted(0.2, slot())).prop_map(|(class, slots, extra)| GenNode { class, slots, extra });
    (prop::collection::vec(node, 1..12), prop::bool::weighted(0.6)).prop_map(move |(mut nodes, acyclic)| {
        if acyclic {
            // Output nodes last, so they have something to read.
            nodes.sort_by_key(|n| matches!(n.class, ClassPick::Known(c) if outputs.contains(&c)));
        }
        GenGraph { nodes, acyclic }
    })
}

/// What the reference model expects of one input.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Verdict {
    Fine,
    Issue(IssueKind),
    /// A well-formed link of the right type to the node at this index.
    Edge(usize),
}

/// ComfyUI's link type rule, written out again.
fn link_types_match(received: &str, expected: &str) -> bool {
    let r: Vec<&str> = received.split(',').map(str::trim).collect();
    received == "*" || expected == "*" || received == expected || expected.split(',').map(str::trim).any(|t| r.contains(&t))
}

/// The link type an input accepts.
fn accepts(kind: &InputKind) -> &str {
    match kind {
        InputKind::Int(_) => "INT",
        InputKind::Float(_) => "FLOAT",
        InputKind::String(_) => "STRING",
        InputKind::Boolean(_) => "BOOLEAN",
        InputKind::Combo(_) => "COMBO",
        InputKind::Link(t) => t,
    }
}

/// The JSON for a constant, and whether validation must accept it.
fn constant(kind: &InputKind, pick: &ConstPick) -> (Json, Verdict) {
    use ConstPick as P;
    let bad = Verdict::Issue(IssueKind::InvalidInputType);
    let in_range = |lo: f64, hi: f64, v: f64| {
        if v < lo {
            Verdict::Issue(IssueKind::ValueBelowMin)
        } else if v > hi {
            Verdict::Issue(IssueKind::ValueAboveMax)
        } else {
            Verdict::Fine
        }
    };
    match kind {
        // A constant where only a link will do.
        InputKind::Link(_) => (json!(1), Verdict::Issue(IssueKind::BadLinkedInput)),
        InputKind::Int(s) => {
            let (lo, hi) = (s.min.unwrap_or(-1000), s.max.unwrap_or(1000));
            let good = |f: f64| (i128::from(lo) + ((i128::from(hi) - i128::from(lo)) as f64 * f) as i128).clamp(i128::from(lo), i128::from(hi)) as i64;
            match pick {
                P::Good(f) => (json!(good(*f)), Verdict::Fine),
                P::GoodText(f) => (json!(format!(" {} ", good(*f))), Verdict::Fine),
                P::BelowMin if lo > i64::MIN => (json!(lo - 1), Verdict::Issue(IssueKind::ValueBelowMin)),
                P::AboveMax if hi < i64::MAX => (json!(hi + 1), Verdict::Issue(IssueKind::ValueAboveMax)),
                P::BelowMin | P::AboveMax => (json!(good(0.5)), Verdict::Fine),
                P::Bool(b) => (json!(b), in_range(lo as f64, hi as f64, f64::from(u8::from(*b)))),
                P::Null | P::Word | P::Object | P::WrappedList => (garbage(pick), bad),
            }
        }
        InputKind::Float(s) => {
            let (lo, hi) = (s.min.unwrap_or(-1000.0), s.max.unwrap_or(1000.0));
            let good = |f: f64| (lo + (hi - lo) * f).clamp(lo, hi);
            match pick {
                P::Good(f) => (json!(good(*f)), Verdict::Fine),
                P::GoodText(f) => (json!(format!(" {} ", good(*f))), Verdict::Fine),
                P::BelowMin => (json!(lo - lo.abs() - 1.0), Verdict::Issue(IssueKind::ValueBelowMin)),
                P::AboveMax => (json!(hi + hi.abs() + 1.0), Verdict::Issue(IssueKind::ValueAboveMax)),
                P::Bool(b) => (json!(b), in_range(lo, hi, f64::from(u8::from(*b)))),
                P::Null | P::Word | P::Object | P::WrappedList => (garbage(pick), bad),
            }
        }
        InputKind::String(_) => match pick {
            P::Good(f) | P::GoodText(f) => (json!(format!("text {f}")), Verdict::Fine),
            P::BelowMin | P::AboveMax => (json!(-3.5), Verdict::Fine),
            P::Bool(b) => (json!(b), Verdict::Fine),
            P::Word => (garbage(pick), Verdict::Fine),
            P::Null | P::Object | P::WrappedList => (garbage(pick), bad),
        },
        InputKind::Boolean(_) => match pick {
            P::Good(f) | P::GoodText(f) => (json!(*f > 0.5), Verdict::Fine),
            P::BelowMin | P::AboveMax => (json!(-1), Verdict::Fine),
            P::Bool(b) => (json!(b), Verdict::Fine),
            P::Null | P::Word => (garbage(pick), Verdict::Fine),
            P::Object | P::WrappedList => (garbage(pick), bad),
        },
        InputKind::Combo(c) => {
            let fine_if = |name: &str, missing: IssueKind| {
                let known = match c.source {
                    ComboSource::Fixed => c.choices.iter().any(|x| x == name),
                    ComboSource::InputImages => name == FILE,
                };
                if known { Verdict::Fine } else { Verdict::Issue(missing) }
            };
            let missing = if c.source == ComboSource::Fixed { IssueKind::ValueNotInList } else { IssueKind::InputFileMissing };
            let choice = |f: f64| match c.source {
                ComboSource::Fixed => c.choices[((c.choices.len() as f64 * f) as usize).min(c.choices.len() - 1)].clone(),
                ComboSource::InputImages => FILE.to_string(),
            };
            match pick {
                P::Good(f) => (json!(choice(*f)), Verdict::Fine),
                // Combo values are not trimmed.
                P::GoodText(f) => {
                    let padded = format!(" {} ", choice(*f));
                    (json!(padded), fine_if(&padded, missing))
                }
                P::BelowMin | P::AboveMax => (json!(7), fine_if("7", missing)),
                P::Bool(b) => (json!(b), fine_if(if *b { "True" } else { "False" }, missing)),
                P::Word => (garbage(pick), fine_if("no such thing", missing)),
                P::Null | P::Object | P::WrappedList => (garbage(pick), bad),
            }
        }
    }
}

fn garbage(pick: &ConstPick) -> Json {
    match pick {
        ConstPick::Word => json!("no such thing"),
        ConstPick::Object => json!({ "a": 1 }),
        ConstPick::WrappedList => json!({ "__value__": [1, 2] }),
        _ => Json::Null,
    }
}

/// Lists that are not links.
const BAD_LINKS: &[&str] = &[r#"[]"#, r#"["1"]"#, r#"["1", -1]"#, r#"["1", 0, 0]"#, r#"[1.5, 0]"#, r#"["1", "0"]"#, r#"["1", 4294967296]"#, r#"[null, 0]"#];

/// A generated graph as a workflow, with what the reference model expects.
struct Case {
    json: Json,
    ids: Vec<String>,
    /// The definition of each node (None: unknown class or none).
    defs: Vec<Option<&'static NodeDef>>,
    /// Per node, per input name of the class: the verdict.
    verdicts: Vec<Vec<(String, Verdict)>>,
}

fn build(graph: &GenGraph, defs: &[&'static NodeDef]) -> Case {
    let n = graph.nodes.len();
    // Numeric ids like ComfyUI's, but not the indices (so an index is never
    // mistaken for an id); ids past the end are nodes that do not exist.
    let ids: Vec<String> = (0..n).map(|i| format!("{}", (i * 7 + 3) % 101)).collect();
    let mut doc = Map::new();
    let mut node_defs = Vec::new();
    let mut verdicts = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let def = match &node.class {
            ClassPick::Known(c) => Some(defs[*c]),
            _ => None,
        };
        let class_of = |j: usize| match graph.nodes[j].class {
            ClassPick::Known(c) => Some(defs[c]),
            _ => None,
        };
        // The nodes a link may go to: in an acyclic graph, earlier ones only.
        let reach = if graph.acyclic { i } else { n };
        let typed = |ty: &str| -> Vec<usize> {
            (0..reach).filter(|&j| class_of(j).and_then(|d| d.outputs.first()).is_some_and(|o| link_types_match(&o.type_name, ty))).collect()
        };
        // A link to a node of type `accepting` where there is one, else to
        // any node that may be read (past the end: one that does not exist).
        let link = |target: usize, output: u32, accepting: Option<&str>| -> (Json, usize) {
            let candidates = accepting.map(typed).unwrap_or_default();
            let t = if !candidates.is_empty() {
                candidates[target % candidates.len()]
            } else if graph.acyclic {
                match target % (i + 1) {
                    t if t == i => n + target % 2,
                    t => t,
                }
            } else {
                target % (n + 2)
            };
            let id = ids.get(t).cloned().unwrap_or_else(|| format!("{}", 500 + t));
            (json!([id, output]), t)
        };
        let mut inputs = Map::new();
        let mut node_verdicts = Vec::new();
        if let Some(def) = def {
            let specs = def.required.iter().map(|s| (s, true)).chain(def.optional.iter().map(|s| (s, false)));
            for ((spec, required), slot) in specs.zip(node.slots.iter().cycle()) {
                // A good value of a link input is a link of its type; a
                // widget is linked only where a node of its type is.
                let slot = match (slot, &spec.kind) {
                    (Slot::Const(ConstPick::Good(f)), InputKind::Link(_)) => Slot::Link((f * 1e6) as usize, 0, true),
                    (Slot::Link(_, 0, true), kind) if !matches!(kind, InputKind::Link(_)) && typed(accepts(kind)).is_empty() => {
                        Slot::Const(ConstPick::Good(0.5))
                    }
                    (slot, _) => slot.clone(),
                };
                let verdict = match &slot {
                    Slot::Missing if required => Verdict::Issue(IssueKind::RequiredInputMissing),
                    Slot::Missing => continue,
                    Slot::Const(pick) => {
                        let (value, verdict) = constant(&spec.kind, pick);
                        inputs.insert(spec.name.clone(), value);
                        verdict
                    }
                    Slot::BadLink(which) => {
                        inputs.insert(spec.name.clone(), serde_json::from_str(BAD_LINKS[which % BAD_LINKS.len()]).unwrap_or(Json::Null));
                        Verdict::Issue(IssueKind::BadLinkedInput)
                    }
                    Slot::Link(target, output, typed) => {
                        let (value, t) = link(*target, *output, (*typed && *output == 0).then(|| accepts(&spec.kind)));
                        inputs.insert(spec.name.clone(), value);
                        match graph.nodes.get(t) {
                            None => Verdict::Issue(IssueKind::LinkToMissingNode),
                            Some(target) => {
                                // The target's class is known: a workflow with an unknown one fails before links are read.
                                let target_def = match &target.class {
                                    ClassPick::Known(c) => defs[*c],
                                    _ => defs[0],
                                };
                                match target_def.outputs.get(*output as usize) {
                                    None => Verdict::Issue(IssueKind::LinkOutputOutOfRange),
                                    Some(out) if !link_types_match(&out.type_name, accepts(&spec.kind)) => Verdict::Issue(IssueKind::ReturnTypeMismatch),
                                    Some(_) => Verdict::Edge(t),
                                }
                            }
                        }
                    }
                };
                node_verdicts.push((spec.name.clone(), verdict));
            }
        }
        if let Some(extra) = &node.extra {
            let value = match extra {
                Slot::Link(target, output, _) => link(*target, *output, None).0,
                Slot::BadLink(_) => json!(["x"]),
                _ => json!("unused"),
            };
            inputs.insert("zz_not_an_input".into(), value);
        }
        let mut body = Map::new();
        let class = match (&node.class, def) {
            (_, Some(def)) => Some(def.class_type.as_str()),
            (ClassPick::Unknown, _) => Some("NoSuchClass"),
            _ => None,
        };
        if let Some(class) = class {
            body.insert("class_type".into(), json!(class));
        }
        body.insert("inputs".into(), Json::Object(inputs));
        doc.insert(ids[i].clone(), Json::Object(body));
        node_defs.push(def);
        verdicts.push(node_verdicts);
    }
    Case { json: Json::Object(doc), ids, defs: node_defs, verdicts }
}

/// Nodes reachable from `roots` along good links (the roots included).
fn closure(case: &Case, roots: impl IntoIterator<Item = usize>) -> HashSet<usize> {
    let mut seen = HashSet::new();
    let mut stack: Vec<usize> = roots.into_iter().collect();
    while let Some(i) = stack.pop() {
        if seen.insert(i) {
            stack.extend(case.verdicts[i].iter().filter_map(|(_, v)| match v {
                Verdict::Edge(t) => Some(*t),
                _ => None,
            }));
        }
    }
    seen
}

/// Whether some good link leads from `from` back to `from`.
fn on_cycle(case: &Case, from: usize) -> bool {
    let next: Vec<usize> = case.verdicts[from].iter().filter_map(|(_, v)| if let Verdict::Edge(t) = v { Some(*t) } else { None }).collect();
    closure(case, next).contains(&from)
}

/// Checks `validate`'s answer against the reference model.
fn check_validation(case: &Case, result: Result<(super::Plan, Vec<Issue>), ValidationError>) -> Result<(), TestCaseError> {
    let n = case.ids.len();
    let index: HashMap<&str, usize> = case.ids.iter().enumerate().map(|(i, id)| (id.as_str(), i)).collect();
    // A node without a known class refuses the whole workflow: the first one.
    if let Some(first) = case.defs.iter().position(Option::is_none) {
        let Err(ValidationError::Node(issue)) = result else { return Err(TestCaseError::fail(format!("expected a node error, got {result:?}"))) };
        prop_assert_eq!(&issue.node_id, &case.ids[first]);
        let expected = if case.json[&case.ids[first]].get("class_type").is_some() { IssueKind::UnknownClass } else { IssueKind::MissingClassType };
        prop_assert_eq!(issue.kind, expected);
        return Ok(());
    }
    let def = |i: usize| case.defs[i].unwrap_or_else(|| unreachable!());
    let outputs: Vec<usize> = (0..n).filter(|&i| def(i).output_node).collect();
    if outputs.is_empty() {
        prop_assert!(matches!(result, Err(ValidationError::NoOutputs)), "{:?}", result);
        return Ok(());
    }
    // A node is valid when nothing it depends on (itself included) has an
    // issue or lies on a cycle.
    let broken = |i: usize| case.verdicts[i].iter().any(|(_, v)| matches!(v, Verdict::Issue(_))) || on_cycle(case, i);
    let valid = |i: usize| !closure(case, [i]).into_iter().any(broken);
    let good: Vec<usize> = outputs.iter().copied().filter(|&o| valid(o)).collect();
    let failed: Vec<usize> = outputs.iter().copied().filter(|&o| !valid(o)).collect();
    let visited = closure(case, outputs.iter().copied());

    let issues = match &result {
        Ok((_, issues)) => issues,
        Err(ValidationError::OutputsFailed(issues)) => issues,
        Err(e) => return Err(TestCaseError::fail(format!("unexpected {e:?}"))),
    };
    prop_assert_eq!(good.is_empty(), result.is_err(), "good outputs {:?}, got {:?}", good, result);

    // Exactly the issues of the inputs of every node validation reaches.
    let mut want: Vec<(usize, String, IssueKind)> = visited
        .iter()
        .flat_map(|&i| case.verdicts[i].iter().filter_map(move |(name, v)| if let Verdict::Issue(k) = v { Some((i, name.clone(), *k)) } else { None }))
        .collect();
    want.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    let mut got = Vec::new();
    let mut cycles = Vec::new();
    for issue in issues {
        let Some(&i) = index.get(issue.node_id.as_str()) else {
            return Err(TestCaseError::fail(format!("issue names node {} that is not in the workflow", issue.node_id)));
        };
        prop_assert_eq!(issue.class_type.as_deref(), Some(def(i).class_type.as_str()));
        let input = issue.input.clone().unwrap_or_default();
        // Every issue blocks an output that failed, and every failed output
        // that depends on its node.
        prop_assert!(!issue.dependent_outputs.is_empty(), "{:?}", issue);
        for o in &issue.dependent_outputs {
            prop_assert!(failed.iter().any(|&f| &case.ids[f] == o), "issue {:?} blames output {} that did not fail", issue, o);
        }
        for &f in &failed {
            if closure(case, [f]).contains(&i) {
                prop_assert!(issue.dependent_outputs.contains(&case.ids[f]), "issue {:?} misses dependent output {}", issue, case.ids[f]);
            }
        }
        if issue.kind == IssueKind::DependencyCycle {
            cycles.push((i, input));
        } else {
            got.push((i, input, issue.kind));
        }
    }
    got.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));
    prop_assert_eq!(got, want);

    // A cycle among the links validation follows is reported as one, on a
    // link of that cycle.
    let cyclic = visited.iter().any(|&i| on_cycle(case, i));
    prop_assert_eq!(cyclic, !cycles.is_empty(), "cycle reported: {:?}", cycles);
    for (i, input) in &cycles {
        let edge = case.verdicts[*i].iter().find(|(name, _)| name == input).map(|(_, v)| *v);
        let Some(Verdict::Edge(t)) = edge else { return Err(TestCaseError::fail(format!("cycle reported on input {input} of {i}, which is not a link"))) };
        prop_assert!(closure(case, [t]).contains(i), "the link {} -> {} is on no cycle", i, t);
    }

    if let Ok((plan, _)) = &result {
        let want_outputs: Vec<&String> = good.iter().map(|&o| &case.ids[o]).collect();
        prop_assert_eq!(plan.outputs.iter().collect::<Vec<_>>(), want_outputs);
        // The plan is exactly what the good outputs need, each node after
        // what it reads, each input as written.
        let planned: Vec<usize> = plan.nodes.iter().map(|p| index[p.id.as_str()]).collect();
        let mut sorted = planned.clone();
        sorted.sort_unstable();
        let mut need: Vec<usize> = closure(case, good.iter().copied()).into_iter().collect();
        need.sort_unstable();
        prop_assert_eq!(sorted, need, "planned nodes");
        let position: HashMap<usize, usize> = planned.iter().enumerate().map(|(p, &i)| (i, p)).collect();
        for (p, node) in plan.nodes.iter().enumerate() {
            let i = planned[p];
            prop_assert_eq!(&node.class_type, &def(i).class_type);
            let mut names = Vec::new();
            for (name, input) in &node.inputs {
                let verdict = case.verdicts[i].iter().find(|(n, _)| n == name).map(|(_, v)| *v);
                match (input, verdict) {
                    (PlannedInput::Link { node: from, .. }, Some(Verdict::Edge(t))) => {
                        prop_assert_eq!(from, &case.ids[t]);
                        prop_assert!(position[&t] < p, "node {} planned before its input {}", node.id, from);
                    }
                    (PlannedInput::Const(_), Some(Verdict::Fine)) => {}
                    (PlannedInput::Hidden(_), None) => continue,
                    (input, verdict) => return Err(TestCaseError::fail(format!("node {} input {name}: planned {input:?}, expected {verdict:?}", node.id))),
                }
                names.push(name.as_str());
            }
            let given: Vec<&str> = case.verdicts[i].iter().map(|(n, _)| n.as_str()).collect();
            prop_assert_eq!(names, given);
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    /// Any graph over the bundled classes: never a panic; the plan, the
    /// issues and the error are what ComfyUI's rules give.
    #[test]
    fn validation_agrees_with_the_reference_model(graph in graph()) {
        let defs = defs();
        let case = build(&graph, &defs);
        let workflow = Workflow::from_json(&case.json, &WorkflowLimits::default()).map_err(|e| TestCaseError::fail(format!("{e}")))?;
        let result = validate(&workflow, test_support::registry(), &Files);
        check_validation(&case, result).map_err(|e| TestCaseError::fail(format!("{e}\nworkflow: {:#}", case.json)))?;
    }
}

/// A ring of well-typed links is a cycle whichever node the output reads.
#[test]
fn a_ring_is_a_dependency_cycle() {
    for len in 1..6 {
        let mut doc = Map::new();
        for i in 0..len {
            doc.insert(format!("{i}"), json!({ "class_type": "ImageInvert", "inputs": { "image": [format!("{}", (i + 1) % len), 0] } }));
        }
        doc.insert("out".into(), json!({ "class_type": "SaveImage", "inputs": { "images": ["0", 0], "filename_prefix": "x" } }));
        let workflow = Workflow::from_json(&Json::Object(doc), &WorkflowLimits::default()).unwrap();
        match validate(&workflow, test_support::registry(), &Files) {
            Err(ValidationError::OutputsFailed(issues)) => {
                assert!(issues.iter().any(|i| i.kind == IssueKind::DependencyCycle), "{issues:?}");
                assert!(issues.iter().all(|i| i.dependent_outputs == ["out"]), "{issues:?}");
            }
            other => panic!("ring of {len}: {other:?}"),
        }
    }
}

/// A chain of 100,000 nodes validates on a thread with a small stack.
#[test]
fn a_long_chain_validates_on_a_small_stack() {
    const LEN: usize = 100_000;
    let registry = test_support::registry();
    let mut doc = Map::new();
    doc.insert("0".into(), json!({ "class_type": "EmptyImage", "inputs": { "width": 8, "height": 8, "batch_size": 1, "color": 0 } }));
    for i in 1..=LEN {
        doc.insert(format!("{i}"), json!({ "class_type": "ImageInvert", "inputs": { "image": [format!("{}", i - 1), 0] } }));
    }
    doc.insert("out".into(), json!({ "class_type": "SaveImage", "inputs": { "images": [format!("{LEN}"), 0], "filename_prefix": "x" } }));
    let limits = crate::workflow::WorkflowLimits { max_nodes: 2 * LEN, ..Default::default() };
    let workflow = Workflow::from_json(&Json::Object(doc), &limits).unwrap();
    let order = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            let (plan, issues) = validate(&workflow, registry, &Files).expect("validates");
            assert!(issues.is_empty());
            plan.nodes.iter().map(|n| n.id.clone()).collect::<Vec<_>>()
        })
        .unwrap()
        .join()
        .expect("validation finished");
    let mut want: Vec<String> = (0..=LEN).map(|i| i.to_string()).collect();
    want.push("out".into());
    assert_eq!(order, want, "every node, each after its input");
}

/// Sanity of the generator: the reference sees all three outcomes.
#[test]
fn the_graphs_cover_success_failure_and_cycles() {
    use proptest::strategy::ValueTree;
    let defs = defs();
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..400 {
        let graph = graph().new_tree(&mut runner).unwrap().current();
        let case = build(&graph, &defs);
        let workflow = Workflow::from_json(&case.json, &WorkflowLimits::default()).unwrap();
        let kind = match validate(&workflow, test_support::registry(), &Files) {
            Ok((_, issues)) if issues.is_empty() => "ok",
            Ok(_) => "partial",
            Err(ValidationError::OutputsFailed(issues)) if issues.iter().any(|i| i.kind == IssueKind::DependencyCycle) => "cycle",
            Err(ValidationError::OutputsFailed(_)) => "failed",
            Err(ValidationError::NoOutputs) => "no outputs",
            Err(ValidationError::Node(_)) => "node",
        };
        *seen.entry(kind).or_default() += 1;
    }
    for kind in ["ok", "partial", "cycle", "failed", "no outputs", "node"] {
        assert!(seen.get(kind).copied().unwrap_or(0) >= 4, "too few {kind}: {seen:?}");
    }
}
