//! Loading and saving images: decoding runs inside the sandbox, encoding in a
//! host kernel, with ComfyUI's conventions (mask = 1 − alpha, 64×64 zero mask without
//! alpha, truncating quantization, `prefix_00001_.png` names, workflow in the
//! PNG text chunks).

use kiln::executor::{Event, RunStatus};
use serde_json::json;

use crate::support::{RunOpts, read_png, run_workflow, write_png};

#[tokio::test]
async fn load_invert_save_round_trip_matches_comfy_quantization() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    // 3×2 RGBA with varied alpha.
    let px: Vec<u8> = (0..24).map(|i| (i * 11) as u8).collect();
    write_png(&input, 3, 2, 4, &px);
    let out = dir.path().join("out");
    let mut opts = RunOpts::new(&out);
    opts.inputs.insert("photo.png", &input);
    let workflow = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "photo.png"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "shots/inv"}},
        "4": {"class_type": "MaskToImage", "inputs": {"mask": ["1", 1]}},
        "5": {"class_type": "SaveImage", "inputs": {"images": ["4", 0], "filename_prefix": "mask"}},
        // Not Latin-1: the embedded workflow goes into an iTXt chunk instead of tEXt.
        "6": {"class_type": "PrimitiveString", "inputs": {"value": "夕焼け café"}}
    });
    let ran = run_workflow(workflow.clone(), opts).await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let saved = &ran.outcome.outputs.iter().find(|(n, _)| n == "3").unwrap().1;
    assert_eq!((saved[0].filename.as_str(), saved[0].subfolder.as_str()), ("inv_00001_.png", "shots"));
    assert!(ran.events.iter().any(|e| matches!(e, Event::Output { node, files, .. } if node == "3" && files.len() == 1)));

    let (w, h, c, inv, text) = read_png(&out.join("shots/inv_00001_.png"));
    assert_eq!((w, h, c), (3, 2, 3), "LoadImage drops alpha into the mask");
    for (i, v) in inv.iter().enumerate() {
        let src = px[(i / 3) * 4 + i % 3] as f32 / 255.0;
        let expected = ((1.0 - src) * 255.0).clamp(0.0, 255.0) as u8; // truncation, as ComfyUI
        assert_eq!(*v, expected, "pixel value {i}");
    }
    let prompt = text.iter().find(|(k, _)| k == "prompt").map(|(_, v)| v.clone()).expect("prompt text chunk");
    let embedded: serde_json::Value = serde_json::from_str(&prompt).unwrap();
    assert_eq!(embedded, workflow, "the workflow is embedded in the PNG");

    let (_, _, _, mask, _) = read_png(&out.join("mask_00001_.png"));
    for p in 0..6 {
        let alpha = px[p * 4 + 3] as f32 / 255.0;
        let expected = ((1.0 - alpha) * 255.0).clamp(0.0, 255.0) as u8;
        assert!(mask[p * 3].abs_diff(expected) <= 1, "mask = 1 − alpha at {p}: {} vs {expected}", mask[p * 3]);
    }
}

#[tokio::test]
async fn image_without_alpha_gets_a_64x64_zero_mask() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    write_png(&input, 5, 4, 3, &[128u8; 60]);
    let out = dir.path().join("out");
    let mut opts = RunOpts::new(&out);
    opts.inputs.insert("in.png", &input);
    let ran = run_workflow(
        json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": "in.png"}},
            "2": {"class_type": "MaskToImage", "inputs": {"mask": ["1", 1]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "m"}}
        }),
        opts,
    )
    .await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let (w, h, _, px, _) = read_png(&out.join("m_00001_.png"));
    assert_eq!((w, h), (64, 64));
    assert!(px.iter().all(|&v| v == 0));
}

#[tokio::test]
async fn hostile_image_file_fails_the_node_not_the_host() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("evil.png");
    // A PNG signature followed by garbage.
    let mut bytes = vec![0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];
    bytes.extend((0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 24) as u8));
    std::fs::write(&input, bytes).unwrap();
    let out = dir.path().join("out");
    let mut opts = RunOpts::new(&out);
    opts.inputs.insert("evil.png", &input);
    let ran = run_workflow(
        json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": "evil.png"}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "e"}}
        }),
        opts,
    )
    .await;
    match ran.outcome.status {
        RunStatus::Failed { node, failure, .. } => {
            assert_eq!(node, "1");
            assert_eq!(failure.kind, kiln::plugins::FailureKind::Failed, "{}", failure.message);
            assert!(failure.message.contains("evil.png"), "{}", failure.message);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn save_refuses_to_leave_the_output_dir() {
    let out = tempfile::tempdir().unwrap();
    let ran = run_workflow(
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 2, "height": 2, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "../escape"}}
        }),
        RunOpts::new(&out.path().join("inner")),
    )
    .await;
    assert!(matches!(ran.outcome.status, RunStatus::Failed { .. }), "{:?}", ran.outcome.status);
    assert!(!out.path().join("escape_00001_.png").exists());
}

#[tokio::test]
async fn load_image_mask_channels_and_preview_goes_to_temp() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.png");
    // 2×1 RGBA: red 200, green 100, blue 50, alpha 255 / 0.
    write_png(&input, 2, 1, 4, &[200, 100, 50, 255, 10, 20, 30, 0]);
    let out = dir.path().join("out");
    let mut opts = RunOpts::new(&out);
    opts.inputs.insert("in.png", &input);
    let ran = run_workflow(
        json!({
            "1": {"class_type": "LoadImageMask", "inputs": {"image": "in.png", "channel": "red"}},
            "2": {"class_type": "MaskToImage", "inputs": {"mask": ["1", 0]}},
            "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "red"}},
            "4": {"class_type": "LoadImageMask", "inputs": {"image": "in.png", "channel": "alpha"}},
            "5": {"class_type": "MaskToImage", "inputs": {"mask": ["4", 0]}},
            "6": {"class_type": "PreviewImage", "inputs": {"images": ["5", 0]}}
        }),
        opts,
    )
    .await;
    assert!(matches!(ran.outcome.status, RunStatus::Succeeded), "{:?}", ran.outcome.status);
    let (_, _, _, red, _) = read_png(&out.join("red_00001_.png"));
    assert_eq!((red[0], red[3]), (200, 10), "red channel, not inverted");
    let preview = &ran.outcome.outputs.iter().find(|(n, _)| n == "6").unwrap().1[0];
    assert_eq!(preview.kind, kiln::files::FileKind::Temp);
    assert!(preview.filename.starts_with("ComfyUI_temp"), "{}", preview.filename);
    let (_, _, _, alpha, _) = read_png(&out.join("temp").join(&preview.filename));
    assert_eq!((alpha[0], alpha[3]), (0, 255), "alpha mask is 1 − alpha");
}
