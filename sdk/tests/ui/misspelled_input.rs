use kiln_sdk::prelude::*;

#[node(category = "tests")]
fn posterize(image: Image, levels: i64) -> Result<Image> {
    let _ = levls;
    Ok(image)
}

fn main() {}
