use kiln_sdk::prelude::*;

#[node(category = "tests")]
fn levels(#[input(default = "four")] levels: i64) -> i64 {
    levels
}

fn main() {}
