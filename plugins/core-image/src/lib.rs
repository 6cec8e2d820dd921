//! The bundled core image plugin: ComfyUI's model-free image and mask nodes,
//! with the same class names, inputs, defaults and results.
//!
//! Layout: `files` holds the nodes that cross the sandbox edge (load, save,
//! preview: decoding runs here, inside the sandbox; encoding is a host
//! kernel); `nodes/` holds
//! the pixel nodes, one module per family, each over plain [`Image`]/[`Mask`]
//! values so their math is testable natively; `ops/` holds the shared kernels
//! (resampling, convolution).
//!
//! [`Image`]: kiln_sdk::Image
//! [`Mask`]: kiln_sdk::Mask

pub mod files;
pub mod gpu;
pub mod nodes;
pub mod ops;

kiln_sdk::export_plugin!(
    files::LOAD_IMAGE,
    files::LOAD_IMAGE_MASK,
    files::SAVE_IMAGE,
    files::PREVIEW_IMAGE,
    nodes::basic::IMAGE_INVERT,
    nodes::basic::EMPTY_IMAGE,
    nodes::mask::IMAGE_TO_MASK_NODE,
    nodes::mask::IMAGE_COLOR_TO_MASK,
    nodes::mask::MASK_TO_IMAGE,
    nodes::mask::SOLID_MASK,
    nodes::mask::INVERT_MASK_NODE,
    nodes::mask::CROP_MASK,
    nodes::mask::MASK_COMPOSITE_NODE,
    nodes::mask::FEATHER_MASK_NODE,
    nodes::mask::GROW_MASK_NODE,
    nodes::mask::THRESHOLD_MASK_NODE,
    nodes::composite::IMAGE_COMPOSITE_MASKED,
    nodes::composite::SPLIT_ALPHA,
    nodes::composite::JOIN_ALPHA,
    nodes::scale::IMAGE_SCALE_NODE,
    nodes::scale::IMAGE_SCALE_BY_NODE,
    nodes::scale::IMAGE_SCALE_TO_TOTAL_PIXELS_NODE,
    nodes::filters::IMAGE_BLUR,
    nodes::filters::IMAGE_SHARPEN,
    nodes::filters::IMAGE_BLEND,
    nodes::filters::IMAGE_QUANTIZE,
    nodes::transform::IMAGE_CROP,
    nodes::transform::IMAGE_ROTATE,
    nodes::transform::IMAGE_FLIP,
    nodes::transform::PAD_FOR_OUTPAINT,
    nodes::batch::IMAGE_BATCH,
    nodes::batch::REPEAT_IMAGE_BATCH,
    nodes::batch::IMAGE_FROM_BATCH,
    nodes::batch::GET_IMAGE_SIZE,
);
