//! Validation reports every kind of error, naming the node, its class and
//! the input, before anything runs.

use kiln::files::NamedInputs;
use kiln::workflow::{Issue, IssueKind, ValidationError, Workflow, validate};
use serde_json::{Value, json};

use crate::support::env;

fn load(name: &str) -> Value {
    json!({"class_type": "LoadImage", "inputs": {"image": name}})
}

fn save(from: &str) -> Value {
    json!({"class_type": "SaveImage", "inputs": {"images": [from, 0], "filename_prefix": "v"}})
}

async fn check(workflow: Value, inputs: &NamedInputs) -> Result<Vec<Issue>, ValidationError> {
    let wf = Workflow::from_json(&workflow, &Default::default()).unwrap();
    validate(&wf, &env().await.registry, inputs).map(|(_, issues)| issues)
}

/// The issues of a workflow whose only output fails.
async fn issues(workflow: Value) -> Vec<Issue> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.png"), b"x").unwrap();
    let mut inputs = NamedInputs::new();
    inputs.insert("in.png", dir.path().join("in.png"));
    match check(workflow, &inputs).await {
        Err(ValidationError::OutputsFailed(issues)) => issues,
        other => panic!("expected failed outputs, got {other:?}"),
    }
}

fn single(issues: &[Issue], kind: IssueKind, node: &str, class: &str, input: Option<&str>) {
    assert!(
        issues.iter().any(|i| i.kind == kind && i.node_id == node && i.class_type.as_deref() == Some(class) && i.input.as_deref() == input),
        "expected {kind:?} on node {node} ({class}) input {input:?}, got {issues:#?}"
    );
}

#[tokio::test]
async fn unknown_and_missing_class_refuse_the_workflow() {
    match check(json!({"1": load("in.png"), "2": {"class_type": "NoSuchNode", "inputs": {}}, "3": save("1")}), &NamedInputs::new()).await {
        Err(ValidationError::Node(i)) => {
            assert_eq!((i.kind, i.node_id.as_str()), (IssueKind::UnknownClass, "2"));
            assert_eq!(i.kind.comfy_type(), "missing_node_type");
        }
        other => panic!("{other:?}"),
    }
    match check(json!({"1": {"inputs": {}}, "3": save("1")}), &NamedInputs::new()).await {
        Err(ValidationError::Node(i)) => assert_eq!(i.kind, IssueKind::MissingClassType),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn no_output_node() {
    let r = check(json!({"1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}}}), &NamedInputs::new()).await;
    assert!(matches!(r, Err(ValidationError::NoOutputs)), "{r:?}");
}

#[tokio::test]
async fn missing_required_input() {
    let i = issues(json!({"1": load("in.png"), "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}})).await;
    single(&i, IssueKind::RequiredInputMissing, "2", "SaveImage", Some("filename_prefix"));
    assert_eq!(i[0].dependent_outputs, vec!["2".to_string()]);
}

#[tokio::test]
async fn link_errors() {
    let i = issues(json!({"1": load("in.png"), "2": {"class_type": "SaveImage", "inputs": {"images": ["9", 0], "filename_prefix": "x"}}})).await;
    single(&i, IssueKind::LinkToMissingNode, "2", "SaveImage", Some("images"));
    let i = issues(json!({"1": load("in.png"), "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 5], "filename_prefix": "x"}}})).await;
    single(&i, IssueKind::LinkOutputOutOfRange, "2", "SaveImage", Some("images"));
    let i = issues(json!({"1": load("in.png"), "2": {"class_type": "SaveImage", "inputs": {"images": ["1"], "filename_prefix": "x"}}})).await;
    single(&i, IssueKind::BadLinkedInput, "2", "SaveImage", Some("images"));
    // MASK into an IMAGE input.
    let i = issues(json!({"1": load("in.png"), "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 1], "filename_prefix": "x"}}})).await;
    single(&i, IssueKind::ReturnTypeMismatch, "2", "SaveImage", Some("images"));
    let m = i.iter().find(|i| i.kind == IssueKind::ReturnTypeMismatch).unwrap();
    assert_eq!(m.received_type.as_deref(), Some("MASK"));
    assert_eq!(m.linked, Some(("1".to_string(), 1)));
}

#[tokio::test]
async fn constant_errors() {
    let empty = |w: Value, h: Value, color: Value| json!({"class_type": "EmptyImage", "inputs": {"width": w, "height": h, "batch_size": 1, "color": color}});
    let i = issues(json!({"1": empty(json!("abc"), json!(8), json!(0)), "2": save("1")})).await;
    single(&i, IssueKind::InvalidInputType, "1", "EmptyImage", Some("width"));
    assert_eq!(i[0].received, Some(json!("abc")));
    let i = issues(json!({"1": empty(json!(8), json!(0), json!(0)), "2": save("1")})).await;
    single(&i, IssueKind::ValueBelowMin, "1", "EmptyImage", Some("height"));
    let i = issues(json!({"1": empty(json!(8), json!(8), json!(16777216)), "2": save("1")})).await;
    single(&i, IssueKind::ValueAboveMax, "1", "EmptyImage", Some("color"));
    let i = issues(json!({"1": {"class_type": "LoadImageMask", "inputs": {"image": "in.png", "channel": "purple"}},
                          "2": {"class_type": "MaskToImage", "inputs": {"mask": ["1", 0]}}, "3": save("2")}))
    .await;
    single(&i, IssueKind::ValueNotInList, "1", "LoadImageMask", Some("channel"));
}

#[tokio::test]
async fn missing_input_file() {
    let i = issues(json!({"1": load("nope.png"), "2": save("1")})).await;
    single(&i, IssueKind::InputFileMissing, "1", "LoadImage", Some("image"));
    assert_eq!(i[0].kind.comfy_type(), "custom_validation_failed");
    assert!(i[0].message.contains("invalid image file: nope.png"), "{}", i[0].message);
}

#[tokio::test]
async fn cycles_are_reported_not_followed() {
    let i = issues(json!({
        "1": load("in.png"),
        "2": {"class_type": "ImageBlend", "inputs": {"image1": ["1", 0], "image2": ["4", 0], "blend_factor": 0.5, "blend_mode": "normal"}},
        "4": {"class_type": "ImageInvert", "inputs": {"image": ["2", 0]}},
        "3": save("2")
    }))
    .await;
    assert!(i.iter().any(|i| i.kind == IssueKind::DependencyCycle), "{i:#?}");
}

#[tokio::test]
async fn a_bad_output_is_dropped_and_the_good_one_kept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("in.png"), b"x").unwrap();
    let mut inputs = NamedInputs::new();
    inputs.insert("in.png", dir.path().join("in.png"));
    let wf = Workflow::from_json(
        &json!({
            "1": load("in.png"),
            "2": save("1"),
            "3": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}},
            "4": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}}
        }),
        &Default::default(),
    )
    .unwrap();
    let (plan, issues) = validate(&wf, &env().await.registry, &inputs).unwrap();
    assert_eq!(plan.outputs, vec!["2".to_string()]);
    assert_eq!(issues.len(), 1);
    let ids: Vec<&str> = plan.nodes.iter().map(|n| n.id.as_str()).collect();
    assert_eq!(ids, vec!["1", "2"], "only ancestors of valid outputs are planned, dependencies first");
}
