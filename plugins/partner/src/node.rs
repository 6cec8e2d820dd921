//! `MagnificImageSkinEnhancerNode`: ComfyUI's partner node, run against
//! this plugin's own proxy code in-process. It authenticates with the job's
//! `api_key_svc_org` (which must be a token the proxy accepts), sends the
//! image as base64 PNG, polls the task with backoff (reporting progress)
//! until it completes or fails, downloads `generated[0]` (kiln's allowlist
//! decides from where) and returns it as an IMAGE. The provider sees only
//! the operator's provider key. A cancelled job stops it at once: kiln drops
//! the call, waits included, so no further request leaves.

use base64::Engine;
use kiln_sdk::Tensor;
use kiln_sdk::prelude::*;
use serde_json::{Value, json};

use crate::proxy::{self, Answer};
use crate::settings::Settings;
use crate::validate::OPTIMIZED_FOR;

/// First wait between two polls, ms; each next one is 1.5× longer, up to [`MAX_POLL_MS`].
const FIRST_POLL_MS: u64 = 500;
const MAX_POLL_MS: u64 = 10_000;
/// Polls before giving up (the node's time limit usually ends it first).
const MAX_POLLS: u64 = 600;
/// Largest result image downloaded.
const MAX_RESULT_BYTES: usize = 64 << 20;
/// Largest result image decoded, pixels.
const MAX_RESULT_PIXELS: u64 = 8192 * 8192;

/// The node class's function.
#[node(
    class = "MagnificImageSkinEnhancerNode",
    category = "partner/image/Magnific",
    display_name = "Magnific Image Skin Enhancer",
    description = "Skin enhancement for portraits with multiple processing modes.",
    api_node,
    dynamic_combo("mode", &[("flexible", &["mode.optimized_for"])])
)]
pub fn skin_enhancer(
    image: ImageHandle,
    #[input(default = 0, min = 0, max = 100, display = "slider")] sharpen: i64,
    #[input(default = 2, min = 0, max = 100, display = "slider")] smart_grain: i64,
    #[input(choices = ["flexible"])] mode: &str,
    #[input(name = "mode.optimized_for", choices = OPTIMIZED_FOR)] optimized_for: &str,
    #[hidden] _unique_id: Option<String>,
) -> Result<ImageHandle> {
    let Some(key) = host::secret("api_key_svc_org") else {
        return Err(Error::failed(
            "MagnificImageSkinEnhancerNode needs a partner key: submit the prompt with extra_data.api_key_svc_org set to a key the partner proxy accepts.",
        ));
    };
    let settings = Settings::load();
    let base = match proxy::admit(&settings, Some(&key)) {
        Ok(base) => base.to_string(),
        Err(answer) if answer.status == 401 => return Err(Error::failed("The partner proxy does not accept the key in extra_data.api_key_svc_org.")),
        Err(answer) => return Err(Error::failed(answer.message().to_string())),
    };
    if mode != "flexible" {
        return Err(Error::invalid("mode must be `flexible`: kiln proxies no other mode."));
    }
    check_image(&image.tensor().shape())?;
    let png = kernels::encode_png(image.tensor(), 0, &[])?;
    let body = json!({
        "image": base64::engine::general_purpose::STANDARD.encode(&png),
        "sharpen": sharpen,
        "smart_grain": smart_grain,
        "optimized_for": optimized_for,
    });
    let created = proxy::create(&settings, &base, body.to_string().as_bytes());
    let task_id = task(&created)?.get("task_id").and_then(Value::as_str).unwrap_or_default().to_string();
    let url = poll(&settings, &base, &task_id)?;
    let result = crate::provider::send(wasip2::http::types::Method::Get, &url, &[], None, MAX_RESULT_BYTES)
        .map_err(|e| Error::failed(format!("Downloading the result failed: {e:?}")))?;
    if result.status != 200 {
        return Err(Error::failed(format!("Downloading the result failed: HTTP {}", result.status)));
    }
    Ok(ImageHandle::new(decode(&result.body)?))
}

/// ComfyUI's checks: one image, aspect ratio within 1:3..3:1, at least 160×160.
fn check_image(shape: &[u32]) -> Result<()> {
    let [batch, height, width, _] = shape else { return Err(Error::invalid("image must be an IMAGE tensor")) };
    if *batch != 1 {
        return Err(Error::invalid(format!("exactly one image is needed, got {batch}")));
    }
    if *width < 160 || *height < 160 {
        return Err(Error::invalid(format!("the image must be at least 160×160, got {width}×{height}")));
    }
    let (w, h) = (u64::from(*width), u64::from(*height));
    if w > 3 * h || h > 3 * w {
        return Err(Error::invalid(format!("the image's aspect ratio must be between 1:3 and 3:1, got {width}×{height}")));
    }
    Ok(())
}

/// The task record of a 200 answer, or the node's failure.
fn task(answer: &Answer) -> Result<&Value> {
    match answer.status {
        200 => answer.body.get("data").ok_or_else(|| Error::failed("The provider's answer was not valid.")),
        402 => {
            host::insufficient_funds(answer.message());
            Err(Error::failed(format!("Insufficient funds: {}", answer.message())))
        }
        _ => Err(Error::failed(format!("Partner request failed (HTTP {}): {}", answer.status, answer.message()))),
    }
}

/// Polls until the task completes (its first result URL) or fails.
fn poll(settings: &Settings, base: &str, task_id: &str) -> Result<String> {
    let mut wait_ms = FIRST_POLL_MS;
    for n in 1..=MAX_POLLS {
        sleep_ms(wait_ms);
        wait_ms = (wait_ms * 3 / 2).min(MAX_POLL_MS);
        let answer = proxy::status(settings, base, task_id);
        // A provider that is briefly unavailable is asked again.
        if matches!(answer.status, 502 | 504) {
            continue;
        }
        let data = task(&answer)?;
        let status = data.get("status").and_then(Value::as_str).unwrap_or("").to_ascii_lowercase();
        host::progress_text(&format!("Task {task_id}: {status}"));
        host::progress(n, MAX_POLLS);
        match status.as_str() {
            "completed" | "succeeded" | "success" | "finished" | "done" => {
                return data
                    .get("generated")
                    .and_then(|g| g.get(0))
                    .and_then(Value::as_str)
                    .map(String::from)
                    .ok_or_else(|| Error::failed("The task completed without a result."));
            }
            "failed" | "fail" | "error" | "canceled" | "cancelled" => return Err(Error::failed(format!("Task failed: {}", answer.body))),
            _ => {}
        }
    }
    Err(Error::failed("The task did not finish in time."))
}

fn sleep_ms(ms: u64) {
    wasip2::clocks::monotonic_clock::subscribe_duration(ms * 1_000_000).block();
}

/// The downloaded image as a 1×H×W×3 IMAGE.
fn decode(bytes: &[u8]) -> Result<Tensor> {
    let reader =
        image::ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(|e| Error::failed(format!("The result is not an image: {e}")))?;
    let (w, h) = reader.into_dimensions().map_err(|e| Error::failed(format!("The result is not an image: {e}")))?;
    if u64::from(w) * u64::from(h) > MAX_RESULT_PIXELS {
        return Err(Error::failed(format!("The result image is too large ({w}×{h})")));
    }
    let decoded = image::load_from_memory(bytes).map_err(|e| Error::failed(format!("The result is not an image: {e}")))?.into_rgb8();
    let (w, h) = decoded.dimensions();
    kernels::create_from_u8(&[1, h as usize, w as usize, 3], decoded.as_raw())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_checks_follow_comfyui() {
        assert!(check_image(&[1, 160, 160, 3]).is_ok());
        assert!(check_image(&[1, 160, 480, 3]).is_ok());
        assert!(check_image(&[2, 200, 200, 3]).is_err());
        assert!(check_image(&[1, 159, 400, 3]).is_err());
        assert!(check_image(&[1, 160, 481, 3]).is_err());
    }
}
