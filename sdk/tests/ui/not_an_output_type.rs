use kiln_sdk::prelude::*;

#[node(category = "tests")]
fn split(value: i64) -> Result<(i64, Vec<i64>)> {
    Ok((value, vec![value]))
}

fn main() {}
