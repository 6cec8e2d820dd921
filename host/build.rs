//! Compiles the bundled plugins to wasm32-wasip2 so the binary embeds them.

#[path = "build/guests.rs"]
mod guests;

fn main() {
    guests::build_guests(&[("kiln-primitives", "kiln_primitives"), ("kiln-core-image", "kiln_core_image")]);
}
