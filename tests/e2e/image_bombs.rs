//! Hostile image files through LoadImage, in every format the node decodes
//! (PNG, JPEG, WebP): headers claiming dimensions far past any limit,
//! a real decompression bomb (a small PNG that inflates to 36 MB of pixels
//! and a 432 MB tensor), and files cut short. Each fails its node with a
//! clear error naming what was wrong — the decoder's allocation limit, the
//! node's tensor budget, or the truncation — and the host goes on to run
//! the next job. A JPEG cut short loads with its missing part grey, as
//! ComfyUI loads one (it retries with Pillow's `LOAD_TRUNCATED_IMAGES`).

use std::io::Write;

use kiln::executor::RunStatus;
use kiln::plugins::FailureKind;
use serde_json::json;

use crate::support::{Rng, RunOpts, run_workflow, write_png};

/// Runs LoadImage → SaveImage on `bytes` saved as `name`: how the run ended.
async fn run_load(name: &str, bytes: &[u8]) -> RunStatus {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join(name);
    std::fs::write(&input, bytes).unwrap();
    let out = dir.path().join("out");
    let mut opts = RunOpts::new(&out);
    opts.inputs.insert(name, &input);
    let workflow = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": name}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "b"}}
    });
    run_workflow(workflow, opts).await.outcome.status
}

/// [`run_load`]'s failure of node "1" (panics if the run did anything else).
async fn load(name: &str, bytes: &[u8]) -> (FailureKind, String) {
    match run_load(name, bytes).await {
        RunStatus::Failed { node, failure, .. } if node == "1" => (failure.kind, failure.message),
        other => panic!("{name}: {other:?}"),
    }
}

/// A PNG whose header claims `width`×`height` RGBA and which holds no pixels.
fn png_claiming(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut bytes, width, height);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    drop(enc.write_header().unwrap());
    bytes
}

/// A valid `width`×`height` 8-bit grey PNG of zeros: a few kilobytes per
/// tens of megabytes of pixels.
fn png_of_zeros(width: u32, height: u32) -> Vec<u8> {
    let mut bytes = Vec::new();
    let mut enc = png::Encoder::new(&mut bytes, width, height);
    enc.set_color(png::ColorType::Grayscale);
    enc.set_depth(png::BitDepth::Eight);
    enc.set_compression(png::Compression::Fast);
    let mut writer = enc.write_header().unwrap();
    let mut stream = writer.stream_writer().unwrap();
    let row = vec![0u8; width as usize];
    for _ in 0..height {
        stream.write_all(&row).unwrap();
    }
    stream.finish().unwrap();
    drop(writer);
    bytes
}

/// A small JPEG whose frame header (SOF0) now claims 65500×65500.
fn jpeg_claiming_65500() -> Vec<u8> {
    let mut bytes = Vec::new();
    let pixels = vec![128u8; 16 * 16 * 3];
    image::codecs::jpeg::JpegEncoder::new(&mut bytes).encode(&pixels, 16, 16, image::ExtendedColorType::Rgb8).unwrap();
    let sof = bytes.windows(2).position(|w| w == [0xff, 0xc0]).expect("a baseline frame header");
    // Marker, length (2), precision (1), then height and width.
    bytes[sof + 5..sof + 9].copy_from_slice(&[0xff, 0xdc, 0xff, 0xdc]);
    bytes
}

/// A small lossless WebP whose header now claims 16384×16384 (the format's
/// largest).
fn webp_claiming_16384() -> Vec<u8> {
    let mut bytes = Vec::new();
    let pixels = vec![200u8; 8 * 8 * 4];
    image::codecs::webp::WebPEncoder::new_lossless(&mut bytes).encode(&pixels, 8, 8, image::ExtendedColorType::Rgba8).unwrap();
    assert_eq!(&bytes[12..16], b"VP8L");
    // After the chunk header and the 0x2f signature: 14 bits width − 1,
    // 14 bits height − 1, then the alpha and version bits, kept.
    let at = 21;
    let bits = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let claimed = (bits & 0xf000_0000) | 0x3fff | (0x3fff << 14);
    bytes[at..at + 4].copy_from_slice(&claimed.to_le_bytes());
    bytes
}

/// Refused from the header, before any pixel is allocated: PNG and JPEG at
/// the decoder's allocation limit, the WebP because its header no longer
/// agrees with its data.
#[tokio::test]
async fn headers_claiming_huge_images_are_refused_before_decoding() {
    for (name, bytes, why) in [
        ("huge.png", png_claiming(60_000, 60_000), "limit"),
        ("huge.jpg", jpeg_claiming_65500(), "limit"),
        ("huge.webp", webp_claiming_16384(), "inconsistent image sizes"),
    ] {
        let (kind, message) = load(name, &bytes).await;
        assert_eq!(kind, FailureKind::Failed, "{name}: {message}");
        assert!(message.contains(name) && message.to_lowercase().contains(why), "{name}: {message}");
    }
}

#[tokio::test]
async fn a_png_decompression_bomb_fails_at_the_tensor_budget() {
    // 6000² grey: 36 MB of pixels, a 432 MB float tensor (over the suite's
    // 256 MiB budget), from a file of a few tens of kilobytes.
    let bomb = png_of_zeros(6000, 6000);
    assert!(bomb.len() < 256 << 10, "{} bytes", bomb.len());
    let (kind, message) = load("bomb.png", &bomb).await;
    assert_eq!(kind, FailureKind::InvalidOutput, "{message}");
    assert!(message.contains("tensor budget exceeded") && message.contains("256 MiB"), "{message}");
}

/// `pixels` (RGB, `side`×`side`) as PNG, JPEG and lossless WebP files.
fn encoded(pixels: &[u8], side: u32) -> [Vec<u8>; 3] {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("a.png");
    write_png(&path, side, side, 3, pixels);
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new(&mut jpeg).encode(pixels, side, side, image::ExtendedColorType::Rgb8).unwrap();
    let mut webp = Vec::new();
    image::codecs::webp::WebPEncoder::new_lossless(&mut webp).encode(pixels, side, side, image::ExtendedColorType::Rgb8).unwrap();
    [std::fs::read(&path).unwrap(), jpeg, webp]
}

#[tokio::test]
async fn files_cut_short_fail_as_unreadable_and_the_host_goes_on() {
    let pixels: Vec<u8> = (0..64 * 64 * 3).map(|i| (i * 7) as u8).collect();
    let [png, jpeg, webp] = encoded(&pixels, 64);
    for (name, bytes) in [("cut.png", &png), ("cut.webp", &webp)] {
        let (kind, message) = load(name, &bytes[..bytes.len() / 2]).await;
        assert_eq!(kind, FailureKind::Failed, "{name}: {message}");
        assert!(message.contains(name), "{name}: {message}");
    }
    // A JPEG cut short loads, as in ComfyUI; the PNG whole still loads:
    // nothing a failed decode did stays.
    for (name, bytes) in [("cut.jpg", &jpeg[..jpeg.len() / 2]), ("whole.png", &png[..])] {
        let status = run_load(name, bytes).await;
        assert!(matches!(status, RunStatus::Succeeded), "{name}: {status:?}");
    }
}

/// Seeded mutations: the same on every run with the same seed.
struct Mutator(Rng);

impl Mutator {
    fn below(&mut self, n: usize) -> usize {
        self.0.below(n.max(1) as u64) as usize
    }

    /// `base` with one to four mutations: bytes flipped or set to edge
    /// values, a span cut out or repeated, the file cut short, or a
    /// 32-bit field (a chunk length, a dimension) overwritten.
    fn mutate(&mut self, base: &[u8]) -> Vec<u8> {
        let mut bytes = base.to_vec();
        for _ in 0..1 + self.below(4) {
            let at = self.below(bytes.len());
            match self.below(6) {
                0 => bytes[at] ^= 1 << self.below(8),
                1 => bytes[at] = [0x00, 0xff, 0x7f, 0x80][self.below(4)],
                2 => {
                    let end = (at + 1 + self.below(64)).min(bytes.len());
                    bytes.drain(at..end);
                }
                3 => {
                    let end = (at + 1 + self.below(64)).min(bytes.len());
                    let span = bytes[at..end].to_vec();
                    bytes.splice(at..at, span);
                }
                4 => bytes.truncate(at.max(1)),
                _ if bytes.len() >= 4 => {
                    let value = [0u32, 1, 0x7fff_ffff, 0xffff_ffff, 65_535, 1 << 20][self.below(6)];
                    let at = at.min(bytes.len() - 4);
                    bytes[at..at + 4].copy_from_slice(&value.to_be_bytes());
                }
                _ => bytes.push(0),
            }
            if bytes.is_empty() {
                bytes.push(0);
            }
        }
        bytes
    }
}

/// Seeded mutations of valid PNG, JPEG and WebP files through LoadImage:
/// each run loads the image (and SaveImage saves it) or fails LoadImage
/// with a message; never another node, never the host. `KILN_FUZZ_SEED`
/// and `KILN_FUZZ_CASES` (default 1,500) run another set; a failing case
/// prints its seed, index and bytes.
#[tokio::test]
async fn mutated_images_load_or_fail_their_node_with_a_message() {
    let seed = std::env::var("KILN_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x6b69_6c6e_u64);
    let cases: usize = std::env::var("KILN_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1500);
    let pixels: Vec<u8> = (0..24 * 24 * 3).map(|i| (i * 13 % 251) as u8).collect();
    let [png, jpeg, webp] = encoded(&pixels, 24);
    let bases = [("m.png", png), ("m.jpg", jpeg), ("m.webp", webp)];
    let mut mutator = Mutator(Rng(seed.max(1)));
    let (mut loaded, mut refused) = (0, 0);
    for case in 0..cases {
        let (name, base) = &bases[case % bases.len()];
        let bytes = mutator.mutate(base);
        match run_load(name, &bytes).await {
            RunStatus::Succeeded => loaded += 1,
            RunStatus::Failed { node, failure, .. } if node == "1" && !failure.message.trim().is_empty() => refused += 1,
            other => {
                let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
                panic!("seed {seed} case {case} ({name}): {other:?}\nbytes: {hex}");
            }
        }
    }
    eprintln!("mutated images (seed {seed}): {cases} runs, {loaded} loaded, {refused} refused by LoadImage");
    assert!(loaded > 0 && refused > 0, "the mutations reach both outcomes: {loaded} loaded, {refused} refused");
}
