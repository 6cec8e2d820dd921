//! Compiles the bundled plugins to wasm32-wasip2 so the binary embeds them
//! (the partner plugin with the `partner` feature, on by default),
//! and the hostile test plugin for this package's process-level suite
//! (`tests/hostile.rs`; the binary does not embed it).

#[path = "build/guests.rs"]
mod guests;

fn main() {
    let mut guests = vec![("kiln-primitives", "kiln_primitives"), ("kiln-core-image", "kiln_core_image"), ("kiln-hostile-guests", "kiln_hostile_guests")];
    if std::env::var_os("CARGO_FEATURE_PARTNER").is_some() {
        guests.push(("kiln-partner", "kiln_partner"));
    }
    guests::build_guests(&guests);
}
