//! An example third-party plugin: one node, `ExamplePosterize`, that reduces
//! each channel to `levels` evenly spaced values, reporting progress per
//! image and showing its result as a preview.
//!
//! Build it with `cargo build -p kiln-custom-node-example --release --target
//! wasm32-wasip2`, put `kiln_custom_node_example.wasm` beside
//! `kiln-plugin.toml` in a directory, and run kiln with `--plugins DIR`.

use kiln_sdk::prelude::*;

/// `ExamplePosterize`: quantize every channel to `levels` levels.
pub const POSTERIZE: NodeClass = NodeClass {
    class_type: "ExamplePosterize",
    define: || {
        NodeDef::new("examples")
            .display_name("Posterize (example)")
            .description("Reduces each channel to a few evenly spaced levels.")
            .required("image", Kind::link("IMAGE"))
            .required("levels", Kind::int().default(4).min(2.0).max(256.0).step(1.0))
            .output("IMAGE", "IMAGE")
    },
    run: |inputs| {
        let mut image = inputs.image("image")?;
        let steps = (inputs.int("levels")? - 1) as f32;
        let frame = image.height * image.width * image.channels;
        let batch = image.batch;
        for (b, pixels) in image.data.chunks_mut(frame.max(1)).enumerate() {
            for v in pixels {
                *v = (v.clamp(0.0, 1.0) * steps).round() / steps;
            }
            kiln_sdk::host::progress(b as u64 + 1, batch as u64);
        }
        let result = image.to_tensor()?;
        kiln_sdk::host::preview(&result);
        Ok(vec![Output::Tensor(result)])
    },
};

kiln_sdk::export_plugin!(POSTERIZE);
