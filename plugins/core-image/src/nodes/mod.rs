//! Pixel nodes, grouped by family.

pub mod basic;
pub mod mask;
