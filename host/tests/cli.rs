//! `kiln run` as a process: real binary, real files, exit codes.

use std::path::Path;
use std::process::Command;

fn kiln(args: &[&str], cwd: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_kiln"))
        .args(args)
        .current_dir(cwd)
        .env("KILN_CACHE_DIR", Path::new(env!("CARGO_TARGET_TMPDIR")).join("kiln-artifacts"))
        .output()
        .expect("kiln runs")
}

#[test]
fn runs_a_workflow_with_an_input_and_prints_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let workflow = dir.path().join("wf.json");
    std::fs::write(
        &workflow,
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 8, "batch_size": 2, "color": 255}},
            "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "run/x"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "wf.json", "--out", "results"], dir.path());
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let printed: Vec<&str> = stdout.lines().collect();
    assert_eq!(printed, vec!["results/run/x_00001_.png", "results/run/x_00002_.png"], "one file per batch image");
    assert!(dir.path().join("results/run/x_00002_.png").is_file());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("executing 2 (ImageInvert)"), "plain progress lines off a terminal: {stderr}");

    // The saved image becomes the input of a second run.
    std::fs::write(
        dir.path().join("wf2.json"),
        r#"{"1": {"class_type": "LoadImage", "inputs": {"image": "pic.png"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "again"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "wf2.json", "--input", "pic.png=results/run/x_00001_.png", "--out", "results"], dir.path());
    assert!(out.status.success(), "stderr: {}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.path().join("results/again_00001_.png").is_file());
}

#[test]
fn invalid_workflow_prints_errors_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("bad.json"),
        r#"{"1": {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "bad"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "bad.json", "--out", "results"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node 1 (EmptyImage), input `width`"), "names node, class and input: {stderr}");
    assert!(stderr.contains("value_smaller_than_min"), "{stderr}");
    assert!(!dir.path().join("results").exists(), "no outputs written");

    std::fs::write(dir.path().join("ui.json"), r#"{"nodes": [], "links": []}"#).unwrap();
    let out = kiln(&["run", "ui.json"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("UI-format"));
}

#[test]
fn a_failing_node_exits_non_zero_with_its_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("evil.png"), b"not an image at all").unwrap();
    std::fs::write(
        dir.path().join("wf.json"),
        r#"{"1": {"class_type": "LoadImage", "inputs": {"image": "evil.png"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "e"}}}"#,
    )
    .unwrap();
    let out = kiln(&["run", "wf.json", "--input", "evil.png=evil.png"], dir.path());
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("node 1 (LoadImage) failed [failed]"), "{stderr}");
}
