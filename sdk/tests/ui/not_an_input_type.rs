use kiln_sdk::prelude::*;

#[node(category = "tests")]
fn bytes(data: Vec<u8>) -> Result<i64> {
    Ok(data.len() as i64)
}

fn main() {}
