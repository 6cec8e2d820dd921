//! `kiln pack`, `kiln inspect`, `kiln unpack`: making bundles and looking
//! inside them (the format and its rules are `crate::bundle`'s).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;

use crate::bundle::{Bundle, Include, PackError, PackOptions};
use crate::config::Config;
use crate::workflow::WorkflowLimits;

/// Arguments of `kiln pack`.
#[derive(Debug, clap::Args)]
pub struct PackArgs {
    /// The workflows (API format); each is named by its file's stem.
    #[arg(required = true)]
    pub workflows: Vec<PathBuf>,
    /// The bundle to write. Default: `<first workflow's stem>.kiln`.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// The bundle's name. Default: the first workflow's stem.
    #[arg(long)]
    pub name: Option<String>,
    /// The bundle's version.
    #[arg(long = "bundle-version", default_value = "1.0.0")]
    pub version: String,
    /// A default input file, named as the workflows' image inputs name it (repeatable).
    #[arg(long = "input", value_name = "NAME=PATH", value_parser = super::run::parse_input)]
    pub inputs: Vec<(String, PathBuf)>,
    /// An input callers may not replace (repeatable; the others they may).
    #[arg(long = "fixed", value_name = "NAME")]
    pub fixed: Vec<String>,
    /// Which components' bytes go into the bundle; the others are pinned by hash only.
    #[arg(long, value_enum, default_value_t = Include::Installed)]
    pub include: Include,
}

/// Arguments of `kiln inspect` and `kiln unpack`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// The bundle.
    pub bundle: PathBuf,
}

/// Arguments of `kiln unpack`.
#[derive(Debug, clap::Args)]
pub struct UnpackArgs {
    /// The bundle.
    pub bundle: PathBuf,
    /// An empty or new directory. Default: the bundle's file stem.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

fn stem(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "bundle".into())
}

/// Reads the bundle at `path`, its size checked first (`max_bundle_mb`).
pub fn read_bundle(path: &Path, config: &Config) -> anyhow::Result<Bundle> {
    let max = config.max_bundle_mb.saturating_mul(1 << 20);
    let size = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?.len();
    anyhow::ensure!(size <= max, "{} is over max_bundle_mb ({} MiB)", path.display(), config.max_bundle_mb);
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Bundle::read(&bytes, max).with_context(|| format!("{} is refused", path.display()))
}

/// `kiln pack`: prints the bundle's path and hash; exit 2 when a workflow
/// does not validate.
pub async fn pack(config: Config, args: PackArgs) -> anyhow::Result<i32> {
    let limits = WorkflowLimits::from_config(&config);
    let mut workflows = Vec::new();
    for path in &args.workflows {
        let Some(json) = super::run::read_workflow(path, &limits)? else { return Ok(super::run::EXIT_INVALID) };
        let name = stem(path);
        anyhow::ensure!(!workflows.iter().any(|(n, _)| n == &name), "two workflows are named `{name}` (by their file stems)");
        workflows.push((name, json));
    }
    let mut inputs: BTreeMap<String, Arc<[u8]>> = BTreeMap::new();
    for (name, path) in &args.inputs {
        let size = std::fs::metadata(path).with_context(|| format!("--input {name}: {}", path.display()))?.len();
        anyhow::ensure!(size <= crate::files::MAX_INPUT_BYTES, "--input {name}: {} is over {} MiB", path.display(), crate::files::MAX_INPUT_BYTES >> 20);
        inputs.insert(name.clone(), Arc::from(std::fs::read(path).with_context(|| format!("--input {name}: {}", path.display()))?));
    }
    let first = stem(&args.workflows[0]);
    let options = PackOptions {
        name: args.name.clone().unwrap_or_else(|| first.clone()),
        version: args.version.clone(),
        include: args.include,
        fixed: args.fixed.iter().cloned().collect::<BTreeSet<_>>(),
    };
    let engine = crate::Engine::new(config).await?;
    let bundle = match engine.pack(&workflows, &inputs, &options) {
        Ok(bundle) => bundle,
        Err(PackError::Invalid { workflow, error }) => {
            eprintln!("workflow `{workflow}`:");
            super::run::print_validation(&error);
            return Ok(super::run::EXIT_INVALID);
        }
        Err(e) => return Err(e.into()),
    };
    let out = args.out.unwrap_or_else(|| PathBuf::from(format!("{first}.kiln")));
    let bytes = bundle.to_bytes()?;
    crate::atomic_file::write(&out, &bytes, None).with_context(|| format!("writing {}", out.display()))?;
    let d = bundle.descriptor();
    let included = d.components.iter().filter(|c| c.included).count();
    eprintln!(
        "{} {}: {} workflow(s), {} input(s), {} component(s) ({included} carried, {} pinned by hash), {} bytes",
        d.name,
        d.version,
        d.workflows.len(),
        d.inputs.len(),
        d.components.len(),
        d.components.len() - included,
        bytes.len()
    );
    println!("{}", out.display());
    println!("{}", bundle.hash_string());
    Ok(0)
}

/// `kiln inspect`: the descriptor, with the bundle's hash and its files'
/// sizes, as JSON; the bundle is checked whole first.
pub fn inspect(config: &Config, args: &InspectArgs) -> anyhow::Result<i32> {
    let bundle = read_bundle(&args.bundle, config)?;
    println!("{}", serde_json::to_string_pretty(&bundle.summary())?);
    Ok(0)
}

/// `kiln unpack`: the bundle's files, checked, into a directory.
pub fn unpack(config: &Config, args: &UnpackArgs) -> anyhow::Result<i32> {
    let bundle = read_bundle(&args.bundle, config)?;
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from(stem(&args.bundle)));
    bundle.unpack(&out).with_context(|| format!("unpacking into {}", out.display()))?;
    println!("{}", out.display());
    Ok(0)
}
