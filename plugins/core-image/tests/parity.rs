//! Native parity check: every case of `tests/fixtures/parity/<ClassType>.json`
//! (written by `tests/parity/generate.py`, an independent Python oracle) is
//! run through the pure function behind the node, and the largest absolute
//! error of each output must stay within the case's tolerance.
//!
//! The host suite runs the same fixtures through the real WebAssembly
//! component; this test pins the maths natively, where failures are quick to
//! debug. Run with `cargo test -p kiln-core-image --test parity -- --nocapture`
//! to see the worst case of every node.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kiln_core_image::nodes::{basic, batch, composite, filters, mask, scale, transform};
use kiln_sdk::{Image, Mask, Result};
use serde_json::Value;

/// The bundled classes by plugin (shared with the host's object_info test).
fn classes(group: &str) -> Vec<String> {
    let all: Value = serde_json::from_str(include_str!("../../../tests/fixtures/core-classes.json")).expect("core-classes.json parses");
    all[group].as_array().expect("a class list").iter().map(|c| c.as_str().expect("a class name").to_string()).collect()
}

/// A node input or output value.
#[derive(Debug)]
enum Val {
    Image(Image),
    Mask(Mask),
    Int(i64),
}

/// A case's inputs by name.
struct Args<'a>(&'a serde_json::Map<String, Value>);

impl Args<'_> {
    fn get(&self, name: &str) -> &Value {
        self.0.get(name).unwrap_or_else(|| panic!("fixture lacks input `{name}`"))
    }
    fn int(&self, name: &str) -> i64 {
        self.get(name).as_i64().unwrap_or_else(|| panic!("`{name}` is not an integer"))
    }
    fn usize(&self, name: &str) -> usize {
        usize::try_from(self.int(name)).unwrap_or_else(|_| panic!("`{name}` is negative"))
    }
    fn float(&self, name: &str) -> f64 {
        self.get(name).as_f64().unwrap_or_else(|| panic!("`{name}` is not a number"))
    }
    fn boolean(&self, name: &str) -> bool {
        self.get(name).as_bool().unwrap_or_else(|| panic!("`{name}` is not a boolean"))
    }
    fn str(&self, name: &str) -> &str {
        self.get(name).as_str().unwrap_or_else(|| panic!("`{name}` is not a string"))
    }
    fn image(&self, name: &str) -> Image {
        match tensor(self.get(name)) {
            Val::Image(i) => i,
            other => panic!("`{name}` is not an IMAGE: {other:?}"),
        }
    }
    fn mask(&self, name: &str) -> Mask {
        match tensor(self.get(name)) {
            Val::Mask(m) => m,
            other => panic!("`{name}` is not a MASK: {other:?}"),
        }
    }
    fn opt_mask(&self, name: &str) -> Option<Mask> {
        self.0.get(name).map(|_| self.mask(name))
    }
}

/// `{"shape": [...], "data": [...]}` as an IMAGE (4 dimensions) or MASK (3, or 2 = one mask).
fn tensor(v: &Value) -> Val {
    let shape: Vec<usize> = v["shape"].as_array().expect("tensor shape").iter().map(|d| d.as_u64().expect("dimension") as usize).collect();
    // Inputs are written as the shortest decimal that reads back, via f64, as the exact f32.
    let data: Vec<f32> = v["data"].as_array().expect("tensor data").iter().map(|x| x.as_f64().expect("number") as f32).collect();
    match shape[..] {
        [b, h, w, c] => Val::Image(Image::from_vec(b, h, w, c, data).expect("image data length")),
        [b, h, w] => Val::Mask(Mask::from_vec(b, h, w, data).expect("mask data length")),
        [h, w] => Val::Mask(Mask::from_vec(1, h, w, data).expect("mask data length")),
        _ => panic!("unsupported tensor shape {shape:?}"),
    }
}

/// Runs the pure function behind `class` on the case's inputs.
fn run(class: &str, a: &Args) -> Result<Vec<Val>> {
    use Val::{Image as I, Int, Mask as M};
    Ok(match class {
        "ImageScale" => vec![I(scale::image_scale(&a.image("image"), a.str("upscale_method"), a.usize("width"), a.usize("height"), a.str("crop"))?)],
        "ImageScaleBy" => vec![I(scale::image_scale_by(&a.image("image"), a.str("upscale_method"), a.float("scale_by"))?)],
        "ImageScaleToTotalPixels" => {
            vec![I(scale::image_scale_to_total_pixels(&a.image("image"), a.str("upscale_method"), a.float("megapixels"), a.usize("resolution_steps"))?)]
        }
        "ImageInvert" => {
            let mut image = a.image("image");
            basic::invert(&mut image.data);
            vec![I(image)]
        }
        "EmptyImage" => vec![I(basic::empty_image(a.usize("width"), a.usize("height"), a.usize("batch_size"), a.int("color")))],
        "ImageBatch" => vec![I(batch::image_batch(a.image("image1"), a.image("image2"))?)],
        "ImagePadForOutpaint" => {
            let (img, m) =
                transform::pad_for_outpaint(&a.image("image"), a.usize("left"), a.usize("top"), a.usize("right"), a.usize("bottom"), a.usize("feathering"));
            vec![I(img), M(m)]
        }
        "ImageCrop" => vec![I(transform::crop(&a.image("image"), a.usize("x"), a.usize("y"), a.usize("width"), a.usize("height"))?)],
        "ImageBlend" => vec![I(filters::blend(a.image("image1"), a.image("image2"), a.float("blend_factor") as f32, a.str("blend_mode"))?)],
        "ImageBlur" => vec![I(filters::blur(a.image("image"), a.usize("blur_radius"), a.float("sigma"))?)],
        "ImageSharpen" => vec![I(filters::sharpen(a.image("image"), a.usize("sharpen_radius"), a.float("sigma"), a.float("alpha"))?)],
        "ImageQuantize" => vec![I(filters::quantize(&a.image("image"), a.usize("colors"), a.str("dither"))?)],
        "ImageCompositeMasked" => {
            let m = a.opt_mask("mask");
            vec![I(composite::composite_masked(a.image("destination"), a.image("source"), a.usize("x"), a.usize("y"), a.boolean("resize_source"), m.as_ref())?)]
        }
        "ImageToMask" => vec![M(mask::image_to_mask(&a.image("image"), mask::channel_index(a.str("channel"))?)?)],
        "ImageColorToMask" => vec![M(mask::image_color_to_mask(&a.image("image"), a.int("color"))?)],
        "MaskToImage" => vec![I(mask::mask_to_image(&a.mask("mask")))],
        "SolidMask" => vec![M(mask::solid_mask(a.float("value"), a.usize("width"), a.usize("height"))?)],
        "InvertMask" => vec![M(mask::invert_mask(a.mask("mask")))],
        "CropMask" => vec![M(mask::crop_mask(&a.mask("mask"), a.usize("x"), a.usize("y"), a.usize("width"), a.usize("height"))?)],
        "MaskComposite" => vec![M(mask::mask_composite(&a.mask("destination"), &a.mask("source"), a.usize("x"), a.usize("y"), a.str("operation"))?)],
        "FeatherMask" => {
            let mut m = a.mask("mask");
            mask::feather_mask(&mut m, a.usize("left"), a.usize("top"), a.usize("right"), a.usize("bottom"));
            vec![M(m)]
        }
        "GrowMask" => vec![M(mask::grow_mask(&a.mask("mask"), a.int("expand"), a.boolean("tapered_corners")))],
        "ThresholdMask" => vec![M(mask::threshold_mask(a.mask("mask"), a.float("value")))],
        "RepeatImageBatch" => vec![I(batch::repeat_image_batch(&a.image("image"), a.usize("amount"))?)],
        "ImageFromBatch" => vec![I(batch::image_from_batch(a.image("image"), a.int("batch_index"), a.usize("length"))?)],
        "ImageRotate" => vec![I(transform::rotate(a.image("image"), transform::rotation_turns(a.str("rotation"))?))],
        "ImageFlip" => vec![I(transform::flip(&a.image("image"), transform::flip_is_vertical(a.str("flip_method"))?))],
        "SplitImageWithAlpha" => {
            let (rgb, m) = composite::split_alpha(&a.image("image"))?;
            vec![I(rgb), M(m)]
        }
        "JoinImageWithAlpha" => vec![I(composite::join_alpha(&a.image("image"), &a.mask("alpha"))?)],
        "GetImageSize" => {
            let [w, h, b] = batch::image_size(&a.image("image").shape())?;
            vec![Int(w), Int(h), Int(b)]
        }
        other => panic!("no dispatch for class `{other}`"),
    })
}

/// The largest absolute difference between `got` and the expected output, or
/// a description of a shape/type mismatch.
fn compare(got: &Val, want: &Value) -> std::result::Result<f64, String> {
    let (shape, data): (Vec<usize>, &[f32]) = match got {
        Val::Int(v) => {
            return match want.as_i64() {
                Some(w) if w == *v => Ok(0.0),
                _ => Err(format!("INT {v}, expected {want}")),
            };
        }
        Val::Image(i) => (i.shape().to_vec(), &i.data),
        Val::Mask(m) => (m.shape().to_vec(), &m.data),
    };
    let want_shape: Vec<usize> = want["shape"].as_array().ok_or("expected a tensor")?.iter().map(|d| d.as_u64().unwrap_or(0) as usize).collect();
    if shape != want_shape {
        return Err(format!("shape {shape:?}, expected {want_shape:?}"));
    }
    let want_data = want["data"].as_array().ok_or("expected tensor data")?;
    if want_data.len() != data.len() {
        return Err(format!("{} values, expected {}", data.len(), want_data.len()));
    }
    Ok(data
        .iter()
        .zip(want_data)
        .map(|(&g, w)| (g as f64 - w.as_f64().unwrap_or(f64::NAN)).abs())
        .fold(0.0, |m, e| if e.is_nan() { f64::INFINITY } else { m.max(e) }))
}

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/parity")
}

#[test]
fn every_fixture_case_matches_within_tolerance() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(fixture_dir())
        .expect("tests/fixtures/parity exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    // class -> (cases, worst error / tolerance, worst error, its tolerance, worst case name)
    let mut worst: BTreeMap<String, (usize, f64, f64, f64, String)> = BTreeMap::new();
    let mut failures = Vec::new();
    // Fixture classes that belong to another plugin.
    let other_plugins = classes("primitives");
    for path in &files {
        let text = std::fs::read_to_string(path).expect("fixture readable");
        let cases: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for case in &cases {
            let class = case["class_type"].as_str().expect("class_type");
            if other_plugins.iter().any(|c| c == class) {
                continue;
            }
            let name = case["name"].as_str().expect("name");
            let tol = case["tolerance"].as_f64().expect("tolerance");
            let inputs = case["inputs"].as_object().expect("inputs object");
            let want = case["outputs"].as_array().expect("outputs list");
            let entry = worst.entry(class.to_string()).or_insert((0, 0.0, 0.0, tol, String::new()));
            entry.0 += 1;
            let got = match run(class, &Args(inputs)) {
                Ok(got) => got,
                Err(e) => {
                    failures.push(format!("{class}/{name}: error {e:?}"));
                    continue;
                }
            };
            if got.len() != want.len() {
                failures.push(format!("{class}/{name}: {} outputs, expected {}", got.len(), want.len()));
                continue;
            }
            for (k, (g, w)) in got.iter().zip(want).enumerate() {
                match compare(g, w) {
                    Ok(err) => {
                        // Fixture outputs are rounded to 6 decimals.
                        if err > tol + 1e-6 {
                            failures.push(format!("{class}/{name}: output {k} max abs error {err:.6} > tolerance {tol:.6}"));
                        }
                        if err / tol > entry.1 || entry.4.is_empty() {
                            *entry = (entry.0, err / tol, err, tol, format!("{name} (output {k})"));
                        }
                    }
                    Err(e) => failures.push(format!("{class}/{name}: output {k}: {e}")),
                }
            }
        }
    }
    println!("{:<26} {:>5} {:>10} {:>10}  worst case", "class", "cases", "max error", "tolerance");
    for (class, (n, _, err, tol, case)) in &worst {
        println!("{class:<26} {n:>5} {err:>10.6} {tol:>10.6}  {case}");
    }
    let missing: Vec<String> = classes("core_image_pixels").into_iter().filter(|c| !worst.contains_key(c.as_str())).collect();
    assert!(missing.is_empty(), "no fixture cases for {missing:?}");
    assert!(failures.is_empty(), "{} parity failures:\n{}", failures.len(), failures.join("\n"));
}
