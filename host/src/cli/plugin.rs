//! `kiln plugin new | build | check`: a node author's commands. `new`
//! writes a plugin crate that builds on its own, outside kiln's workspace;
//! `build` compiles it to a component and gathers it with its manifest into
//! a plugin folder; `check` loads a plugin folder exactly as a server would
//! (compile, imports against the manifest, node definitions), granting it
//! whatever its manifest asks, so only the plugin itself is judged.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use clap::Subcommand;

use crate::config::Config;
use crate::plugins::{NodeRegistry, PluginRuntime, RuntimeConfig};

/// Arguments of `kiln plugin`.
#[derive(Debug, clap::Args)]
pub struct PluginArgs {
    #[command(subcommand)]
    command: PluginCommand,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Write the crate folder NAME/: a working image node (IMAGE in, IMAGE
    /// out), its manifest and the build settings.
    New {
        /// The plugin's name (lower case letters, digits, `-`).
        name: String,
        /// kiln's `sdk/` folder (the SDK is used by path; default: the one
        /// this kiln was built from, when it is still there).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Build the crate in DIR (default: here) for wasm32-wasip2 and print
    /// the folder holding the component and its manifest.
    Build { dir: Option<PathBuf> },
    /// Check the plugin folder DIR (a `kiln-plugin.toml` and its component).
    Check { dir: PathBuf },
}

/// Runs `kiln plugin`; the exit code.
pub async fn run(config: &Config, args: PluginArgs) -> anyhow::Result<i32> {
    match args.command {
        PluginCommand::New { name, sdk } => {
            let dir = new(&name, sdk.as_deref(), Path::new("."))?;
            println!("{}", dir.display());
            eprintln!("next: kiln plugin build {}", dir.display());
            Ok(0)
        }
        PluginCommand::Build { dir } => {
            let folder = build(dir.as_deref().unwrap_or(Path::new(".")))?;
            let report = check(config, &folder).await?;
            eprintln!("{report}");
            println!("{}", folder.display());
            Ok(0)
        }
        PluginCommand::Check { dir } => {
            println!("{}", check(config, &dir).await?);
            Ok(0)
        }
    }
}

/// Where `kiln plugin new` finds the SDK when `--sdk` is not given: the
/// source tree this binary was built from.
fn default_sdk() -> Option<PathBuf> {
    let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../sdk");
    sdk.join("Cargo.toml").is_file().then_some(sdk)
}

/// Writes the crate `parent/name/`; its path.
pub fn new(name: &str, sdk: Option<&Path>, parent: &Path) -> anyhow::Result<PathBuf> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !valid {
        bail!("`{name}` is not a plugin name: lower case letters, digits and `-`, starting with a letter, at most 64");
    }
    let sdk = match sdk.map(Path::to_path_buf).or_else(default_sdk) {
        Some(sdk) => sdk.canonicalize().with_context(|| format!("the SDK folder {}", sdk.display()))?,
        None => bail!("where is kiln's sdk/ folder? Name it with --sdk PATH"),
    };
    if !sdk.join("Cargo.toml").is_file() {
        bail!("{} is not kiln's sdk/ folder (it has no Cargo.toml)", sdk.display());
    }
    let dir = parent.join(name);
    if dir.exists() {
        bail!("{} already exists", dir.display());
    }
    let files = template::files(name, &sdk);
    for (path, text) in &files {
        let path = dir.join(path);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    // The SDK's own lock file: the plugin builds with the dependency
    // versions kiln tests, and offline from an existing cargo cache.
    if let Some(lock) = sdk.parent().map(|root| root.join("Cargo.lock")).filter(|l| l.is_file()) {
        std::fs::copy(&lock, dir.join("Cargo.lock")).with_context(|| format!("copying {}", lock.display()))?;
    }
    Ok(dir)
}

/// Builds the crate in `dir` (release, wasm32-wasip2) and gathers the
/// component and its manifest into `dir/target/kiln-plugin`; that folder.
pub fn build(dir: &Path) -> anyhow::Result<PathBuf> {
    let manifest_path = dir.join("kiln-plugin.toml");
    let text = std::fs::read_to_string(&manifest_path).with_context(|| format!("reading {}", manifest_path.display()))?;
    let manifest = crate::plugins::Manifest::parse(&text).with_context(|| manifest_path.display().to_string())?;
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = std::process::Command::new(&cargo)
        .args(["build", "--release", "--target", "wasm32-wasip2", "--message-format=json-render-diagnostics", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", Path::new(&cargo).display()))?;
    if !output.status.success() {
        bail!("cargo build failed ({})", output.status);
    }
    let wasm = built_component(&output.stdout).context("cargo built no .wasm: is the crate a cdylib?")?;
    let folder = dir.join("target").join("kiln-plugin");
    std::fs::create_dir_all(&folder).with_context(|| format!("creating {}", folder.display()))?;
    std::fs::copy(&wasm, folder.join(&manifest.component)).with_context(|| format!("copying {}", wasm.display()))?;
    std::fs::write(folder.join("kiln-plugin.toml"), &text).with_context(|| format!("writing into {}", folder.display()))?;
    folder.canonicalize().with_context(|| folder.display().to_string())
}

/// The `.wasm` of the last `compiler-artifact` message in cargo's JSON output.
fn built_component(messages: &[u8]) -> Option<PathBuf> {
    messages
        .split(|&b| b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact")
        .flat_map(|m| m["filenames"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f.as_str().filter(|f| f.ends_with(".wasm")).map(PathBuf::from))
        .next_back()
}

/// Loads the plugin folder `dir` as a server would, granted what its
/// manifest asks; a summary of it.
pub async fn check(config: &Config, dir: &Path) -> anyhow::Result<String> {
    let dir = dir.canonicalize().with_context(|| format!("the plugin folder {}", dir.display()))?;
    let runtime = PluginRuntime::new(RuntimeConfig::granting_dir(config, &dir)?).map_err(|e| anyhow::anyhow!("{e:#}"))?;
    let mut registry = NodeRegistry::new();
    registry.load_dir(&runtime, &dir).await?;
    let Some(plugin) = registry.plugins().first() else { bail!("{} loaded no plugin", dir.display()) };
    let classes: Vec<&str> = plugin.definitions.iter().map(|d| d.class_type.as_str()).collect();
    Ok(format!("{} {} ok: component blake3:{}, classes: {}", plugin.manifest.name, plugin.manifest.version, plugin.component_hash.to_hex(), classes.join(", ")))
}

/// The files of a new plugin crate.
mod template {
    use std::path::Path;

    /// `(relative path, text)` of each file of the crate `name`.
    pub fn files(name: &str, sdk: &Path) -> Vec<(&'static str, String)> {
        let lib = name.replace('-', "_");
        let class: String = name
            .split('-')
            .filter(|w| !w.is_empty())
            .map(|w| {
                let mut c = w.chars();
                c.next().map(|f| f.to_ascii_uppercase().to_string() + c.as_str()).unwrap_or_default()
            })
            .collect();
        // A TOML basic string: backslashes and quotes escaped.
        let sdk = sdk.display().to_string().replace('\\', "\\\\").replace('"', "\\\"");
        vec![
            (
                "Cargo.toml",
                format!(
                    r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
kiln-sdk = {{ path = "{sdk}" }}

# A workspace of its own, wherever the folder is.
[workspace]
"#
                ),
            ),
            (
                ".cargo/config.toml",
                r#"[build]
target = "wasm32-wasip2"

[target.wasm32-wasip2]
# SIMD for pixel loops; 4 MiB of initial memory, so a small call never grows it.
rustflags = ["-Ctarget-feature=+simd128", "-Clink-arg=--initial-memory=4194304"]
"#
                .to_string(),
            ),
            (
                "kiln-plugin.toml",
                format!(
                    r#"# What kiln needs to load this plugin. `kiln plugin build` puts this file
# beside the component in target/kiln-plugin/.
name = "{name}"
version = "0.1.0"
component = "{lib}.wasm"

# What one node call may use (the operator's ceilings cap both).
[limits]
memory_mb = 256
timeout_ms = 10000
"#
                ),
            ),
            (
                "src/lib.rs",
                format!(
                    r#"//! The `{name}` kiln plugin.

use kiln_sdk::prelude::*;

/// Moves each value towards its inverse by `amount` (1 inverts the image).
#[node(class = "{class}Invert", category = "{name}", display_name = "Invert ({name})")]
pub fn invert(mut image: Image, #[input(default = 1.0, min = 0.0, max = 1.0, step = 0.01)] amount: f64) -> Image {{
    let amount = amount as f32;
    image.data.iter_mut().for_each(|v| *v += amount * (1.0 - 2.0 * *v));
    image
}}

kiln_sdk::export_plugin!(INVERT);
"#
                ),
            ),
            (".gitignore", "/target\n".to_string()),
        ]
    }
}
