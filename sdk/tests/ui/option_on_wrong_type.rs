use kiln_sdk::prelude::*;

#[node(category = "tests")]
fn label(#[input(min = 1)] text: String, #[input(multiline)] count: i64) -> String {
    format!("{text}{count}")
}

fn main() {}
