//! Pixel nodes, grouped by family.

pub mod basic;
pub mod batch;
pub mod composite;
pub mod filters;
pub mod mask;
pub mod scale;
pub mod transform;
