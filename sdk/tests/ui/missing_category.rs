use kiln_sdk::prelude::*;

#[node(class = "Double")]
fn double(value: i64) -> i64 {
    value * 2
}

fn main() {}
