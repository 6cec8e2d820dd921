//! kiln's end-to-end test package. The suites live in `e2e/` (one test
//! binary); `build.rs` compiles the test guests (`guests/`) and the example
//! plugin to WebAssembly first.
