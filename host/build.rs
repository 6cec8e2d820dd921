//! Compiles the bundled plugins to wasm32-wasip2 so the binary embeds them,
//! and the hostile test plugin for this package's process-level suite
//! (`tests/hostile.rs`; the binary does not embed it).

#[path = "build/guests.rs"]
mod guests;

fn main() {
    guests::build_guests(&[("kiln-primitives", "kiln_primitives"), ("kiln-core-image", "kiln_core_image"), ("kiln-hostile-guests", "kiln_hostile_guests")]);
}
