//! Workflow shapes the suites build (included by path into `tests/e2e` and
//! `host/tests/hostile.rs`, which are different crates): chains, and wide
//! graphs whose branches make big images.

use serde_json::{Map, Value, json};

/// `EmptyImage` of `size`² × `batch`.
pub fn empty(size: u32, batch: u32) -> Value {
    json!({ "class_type": "EmptyImage", "inputs": { "width": size, "height": size, "batch_size": batch, "color": 0 } })
}

/// `EmptyImage(size²) → ImageInvert × n → PreviewImage`: ids `0`..=`n`, then `out`.
pub fn invert_chain(n: usize, size: u32) -> Map<String, Value> {
    let mut wf = Map::new();
    wf.insert("0".into(), empty(size, 1));
    for i in 1..=n {
        wf.insert(i.to_string(), json!({ "class_type": "ImageInvert", "inputs": { "image": [(i - 1).to_string(), 0] } }));
    }
    wf.insert("out".into(), json!({ "class_type": "PreviewImage", "inputs": { "images": [n.to_string(), 0] } }));
    wf
}

/// A source of `size`², `leaves` branches that each scale it up by `up`
/// (big) and back down by 8 (small), and an `ImageBatch` tree joining the
/// small ones into a `PreviewImage`.
pub fn wide_tree(leaves: usize, size: u32, up: f64) -> Value {
    let mut wf = Map::new();
    wf.insert("src".into(), empty(size, 1));
    let mut level: Vec<String> = Vec::new();
    for i in 0..leaves {
        wf.insert(format!("big{i}"), json!({ "class_type": "ImageScaleBy", "inputs": { "image": ["src", 0], "upscale_method": "bilinear", "scale_by": up } }));
        wf.insert(
            format!("small{i}"),
            json!({ "class_type": "ImageScaleBy", "inputs": { "image": [format!("big{i}"), 0], "upscale_method": "area", "scale_by": 0.125 } }),
        );
        level.push(format!("small{i}"));
    }
    let mut round = 0;
    while level.len() > 1 {
        level = level
            .chunks(2)
            .enumerate()
            .map(|(j, pair)| {
                let id = format!("join{round}_{j}");
                wf.insert(id.clone(), json!({ "class_type": "ImageBatch", "inputs": { "image1": [pair[0], 0], "image2": [pair[pair.len() - 1], 0] } }));
                id
            })
            .collect();
        round += 1;
    }
    wf.insert("out".into(), json!({ "class_type": "PreviewImage", "inputs": { "images": [level[0], 0] } }));
    Value::Object(wf)
}
