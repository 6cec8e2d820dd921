//! The bundled core image plugin: ComfyUI's model-free image and mask nodes,
//! with the same class names, inputs, defaults and results.
//!
//! Layout: `files` holds the nodes that cross the sandbox edge (load, save,
//! preview: decoding and encoding run here, inside the sandbox); `nodes/` holds
//! the pixel nodes, one module per family, each over plain [`Image`]/[`Mask`]
//! values so their math is testable natively; `ops/` holds the shared kernels
//! (resampling, convolution).
//!
//! [`Image`]: kiln_sdk::Image
//! [`Mask`]: kiln_sdk::Mask

pub mod files;
pub mod nodes;

kiln_sdk::export_plugin!(
    files::LOAD_IMAGE,
    files::LOAD_IMAGE_MASK,
    files::SAVE_IMAGE,
    files::PREVIEW_IMAGE,
    nodes::basic::IMAGE_INVERT,
    nodes::basic::EMPTY_IMAGE,
    nodes::mask::IMAGE_TO_MASK,
    nodes::mask::IMAGE_COLOR_TO_MASK,
    nodes::mask::MASK_TO_IMAGE,
    nodes::mask::SOLID_MASK,
    nodes::mask::INVERT_MASK,
    nodes::mask::CROP_MASK,
    nodes::mask::MASK_COMPOSITE,
    nodes::mask::FEATHER_MASK,
    nodes::mask::GROW_MASK,
    nodes::mask::THRESHOLD_MASK,
);
