//! Pixel nodes, grouped by family.

pub mod basic;
