use kiln_sdk::prelude::*;

#[node(category = "tests", colour = "red")]
fn double(#[input(maximum = 3)] value: i64, #[hidden] node_id: String) -> i64 {
    value * 2
}

fn main() {}
