//! Compiles the hostile test guests and the example plugin for the suites.

#[path = "../host/build/guests.rs"]
mod guests;

fn main() {
    guests::build_guests(&[("kiln-hostile-guests", "kiln_hostile_guests"), ("kiln-custom-node-example", "kiln_custom_node_example")]);
}
