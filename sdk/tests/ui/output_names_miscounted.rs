use kiln_sdk::prelude::*;

#[node(category = "tests", outputs = ["width", "height", "batch"])]
fn size(image: ImageHandle) -> (i64, i64) {
    let [_, h, w, _] = image.shape().unwrap_or_default();
    (w as i64, h as i64)
}

fn main() {}
