//! Mistakes in a `#[node]` function are compile errors with a message that
//! names the mistake (the expected messages are in `tests/ui/*.stderr`).

#[test]
fn node_mistakes_do_not_compile() {
    trybuild::TestCases::new().compile_fail("tests/ui/*.rs");
}
