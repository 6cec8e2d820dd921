//! The plugins built into the `kiln` binary (compiled by `host/build.rs`).

/// A bundled plugin: its manifest text and component bytes.
pub struct Bundled {
    pub manifest: &'static str,
    pub wasm: &'static [u8],
}

/// Every bundled plugin.
pub const BUNDLED: &[Bundled] = &[
    Bundled { manifest: include_str!("../../../plugins/primitives/kiln-plugin.toml"), wasm: include_bytes!(concat!(env!("OUT_DIR"), "/kiln_primitives.wasm")) },
    Bundled { manifest: include_str!("../../../plugins/core-image/kiln-plugin.toml"), wasm: include_bytes!(concat!(env!("OUT_DIR"), "/kiln_core_image.wasm")) },
    #[cfg(feature = "partner")]
    Bundled { manifest: include_str!("../../../plugins/partner/kiln-plugin.toml"), wasm: include_bytes!(concat!(env!("OUT_DIR"), "/kiln_partner.wasm")) },
];
