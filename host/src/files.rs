//! Input and output files of a job, as nodes see them.
//!
//! Nodes name inputs (`LoadImage`'s `image`) and never see host paths;
//! [`InputFiles`] resolves those names. Saved files go through
//! [`OutputFiles`], which applies ComfyUI's naming
//! (`<prefix>_<counter:05>_.<ext>`, subfolders from the prefix) and refuses
//! paths that would leave the output directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use parking_lot::Mutex;
use serde::Serialize;

/// Which area a saved file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    /// A job output.
    Output,
    /// A temporary preview.
    Temp,
}

/// A file a node saved, as ComfyUI reports it (`filename`, `subfolder`, `type`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct SavedFile {
    pub filename: String,
    pub subfolder: String,
    #[serde(rename = "type")]
    pub kind: FileKind,
    /// Size in bytes.
    #[serde(skip)]
    pub size: u64,
    /// The file written, for sinks that write one into a directory; empty
    /// for the blob store, whose outputs are named by `hash`.
    #[serde(skip)]
    pub path: PathBuf,
    /// The content hash, when the sink computed one (the blob store does).
    #[serde(skip)]
    pub hash: Option<blake3::Hash>,
}

/// Why a file operation failed.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("no input file named `{0}`")]
    NotFound(String),
    #[error("invalid file name `{0}`")]
    InvalidName(String),
    #[error("file name prefix too long: {0}")]
    NameTooLong(String),
    #[error("saving outside the output folder is not allowed: `{0}`")]
    OutsideOutputDir(String),
    #[error("input `{name}` is {size} bytes, over the limit of {limit}")]
    TooLarge { name: String, size: u64, limit: u64 },
    #[error("file i/o: {0}")]
    Io(#[from] std::io::Error),
}

/// Input files a job's nodes may read, by name.
pub trait InputFiles: Send + Sync {
    /// The bytes of the file called `name`.
    fn read(&self, name: &str) -> Result<Vec<u8>, FileError>;
    /// Whether a file called `name` exists.
    fn contains(&self, name: &str) -> bool;
    /// A content hash of `name`, so cached results are invalidated when a file
    /// under the same name changes.
    fn content_hash(&self, name: &str) -> Option<blake3::Hash>;
    /// Names of the image files, sorted (the choices of image combos).
    fn image_names(&self) -> Vec<String>;
}

/// Where a job's nodes save files.
pub trait OutputFiles: Send + Sync {
    /// Stores `data` under a fresh ComfyUI-style name derived from `prefix`.
    fn save(&self, kind: FileKind, prefix: &str, extension: &str, data: &[u8]) -> Result<SavedFile, FileError>;
    /// Takes over a file an earlier run saved (a cached output served
    /// again), so it stays while this job needs it; false when it is gone.
    fn adopt(&self, file: &SavedFile) -> bool;
}

/// Largest input file a node may read.
pub const MAX_INPUT_BYTES: u64 = 512 << 20;

/// Input files given as explicit `name → path` pairs (the CLI's `--input`),
/// or as bytes in memory (a bundle's default inputs).
#[derive(Default)]
pub struct NamedInputs {
    files: BTreeMap<String, InputSource>,
}

enum InputSource {
    Path(PathBuf),
    Bytes(std::sync::Arc<[u8]>),
}

impl NamedInputs {
    /// No inputs.
    pub fn new() -> NamedInputs {
        NamedInputs::default()
    }
    /// Makes `path` readable under `name`.
    pub fn insert(&mut self, name: impl Into<String>, path: impl Into<PathBuf>) {
        self.files.insert(name.into(), InputSource::Path(path.into()));
    }
    /// Makes `bytes` readable under `name`.
    pub fn insert_bytes(&mut self, name: impl Into<String>, bytes: std::sync::Arc<[u8]>) {
        self.files.insert(name.into(), InputSource::Bytes(bytes));
    }
    /// The names given, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.files.keys().map(String::as_str)
    }
    /// Every image file directly inside `dir`, under its file name.
    pub fn from_dir(dir: &Path) -> Result<NamedInputs, FileError> {
        let mut inputs = NamedInputs::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if entry.file_type()?.is_file()
                && let Some(name) = entry.file_name().to_str()
            {
                inputs.insert(name, entry.path());
            }
        }
        Ok(inputs)
    }
}

/// Whether a file name looks like an image ComfyUI would list.
pub fn is_image_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    [".png", ".jpg", ".jpeg", ".webp", ".bmp", ".gif", ".tif", ".tiff"].iter().any(|ext| lower.ends_with(ext))
}

impl InputFiles for NamedInputs {
    fn read(&self, name: &str) -> Result<Vec<u8>, FileError> {
        let path = match self.files.get(name).ok_or_else(|| FileError::NotFound(name.to_string()))? {
            InputSource::Bytes(bytes) => return Ok(bytes.to_vec()),
            InputSource::Path(path) => path,
        };
        let size = std::fs::metadata(path)?.len();
        if size > MAX_INPUT_BYTES {
            return Err(FileError::TooLarge { name: name.to_string(), size, limit: MAX_INPUT_BYTES });
        }
        Ok(std::fs::read(path)?)
    }
    fn contains(&self, name: &str) -> bool {
        match self.files.get(name) {
            Some(InputSource::Path(p)) => p.is_file(),
            Some(InputSource::Bytes(_)) => true,
            None => false,
        }
    }
    fn content_hash(&self, name: &str) -> Option<blake3::Hash> {
        match self.files.get(name)? {
            InputSource::Bytes(bytes) => Some(blake3::hash(bytes)),
            InputSource::Path(path) => {
                let mut hasher = blake3::Hasher::new();
                hasher.update_reader(std::fs::File::open(path).ok()?).ok()?;
                Some(hasher.finalize())
            }
        }
    }
    fn image_names(&self) -> Vec<String> {
        self.files.keys().filter(|n| is_image_name(n)).cloned().collect()
    }
}

/// Saves files under an output and a temp directory with ComfyUI's naming.
pub struct DirOutputs {
    output_dir: PathBuf,
    temp_dir: PathBuf,
    /// Serializes counter allocation so concurrent nodes never pick one name.
    lock: Mutex<()>,
}

impl DirOutputs {
    /// Outputs under `output_dir`, previews under `temp_dir`.
    pub fn new(output_dir: impl Into<PathBuf>, temp_dir: impl Into<PathBuf>) -> DirOutputs {
        DirOutputs { output_dir: output_dir.into(), temp_dir: temp_dir.into(), lock: Mutex::new(()) }
    }
    /// The output directory.
    pub fn output_dir(&self) -> &Path {
        &self.output_dir
    }
}

/// Longest filename prefix (subfolders and base name), in bytes.
pub const MAX_PREFIX_BYTES: usize = 512;
/// Longest single name in a prefix: the saved name adds `_<counter>_.<ext>`
/// (≤ 25 bytes) and must stay within a file system's 255.
pub const MAX_NAME_BYTES: usize = 200;
/// Most subfolders a prefix may nest.
pub const MAX_SUBFOLDER_DEPTH: usize = 16;

/// Whether `ext` may end a saved file's name: 1–8 ASCII letters and digits.
pub fn check_extension(ext: &str) -> Result<(), FileError> {
    if ext.is_empty() || ext.len() > 8 || !ext.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(FileError::InvalidName(format!("extension `{}`", ext.chars().take(16).collect::<String>())));
    }
    Ok(())
}

/// Splits a ComfyUI filename prefix into a checked subfolder and a base name.
/// Prefixes come from workflows and plugins: their length and depth are
/// bounded, and the error quotes at most the start of one.
pub fn split_prefix(prefix: &str) -> Result<(PathBuf, String), FileError> {
    let shown = || {
        let mut end = prefix.len().min(64);
        while !prefix.is_char_boundary(end) {
            end -= 1;
        }
        if end < prefix.len() { format!("{}…", &prefix[..end]) } else { prefix.to_string() }
    };
    if prefix.len() > MAX_PREFIX_BYTES {
        return Err(FileError::NameTooLong(format!("{} bytes, at most {MAX_PREFIX_BYTES} (`{}`)", prefix.len(), shown())));
    }
    let normalized = prefix.replace('\\', "/");
    let (sub, base) = match normalized.rsplit_once('/') {
        Some((sub, base)) => (sub.to_string(), base.to_string()),
        None => (String::new(), normalized.clone()),
    };
    if base.is_empty() || base.contains('\0') || base == "." || base == ".." {
        return Err(FileError::InvalidName(shown()));
    }
    let sub_path = PathBuf::from(&sub);
    let mut depth = 0;
    for comp in sub_path.components() {
        match comp {
            Component::Normal(name) if name.len() > MAX_NAME_BYTES => {
                return Err(FileError::NameTooLong(format!("a subfolder name is over {MAX_NAME_BYTES} bytes (`{}`)", shown())));
            }
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            _ => return Err(FileError::OutsideOutputDir(shown())),
        }
    }
    if depth > MAX_SUBFOLDER_DEPTH {
        return Err(FileError::NameTooLong(format!("{depth} subfolders, at most {MAX_SUBFOLDER_DEPTH} (`{}`)", shown())));
    }
    if base.len() > MAX_NAME_BYTES {
        return Err(FileError::NameTooLong(format!("a {}-byte name, at most {MAX_NAME_BYTES} (`{}`)", base.len(), shown())));
    }
    Ok((sub_path, base))
}

/// ComfyUI's name of a saved file: `<base>_<counter:05>_.<extension>`.
pub fn output_name(base: &str, counter: u64, extension: &str) -> String {
    format!("{base}_{counter:05}_.{extension}")
}

/// The next free counter for `base` in `dir`: one more than the largest
/// `<base>_<digits>_...` present.
fn next_counter(dir: &Path, base: &str) -> Result<u64, FileError> {
    let mut max = 0u64;
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(1),
        Err(e) => return Err(e.into()),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix(base).and_then(|r| r.strip_prefix('_')) else { continue };
        let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        if !digits.is_empty()
            && rest[digits.len()..].starts_with('_')
            && let Ok(n) = digits.parse::<u64>()
        {
            max = max.max(n);
        }
    }
    Ok(max + 1)
}

impl OutputFiles for DirOutputs {
    fn save(&self, kind: FileKind, prefix: &str, extension: &str, data: &[u8]) -> Result<SavedFile, FileError> {
        check_extension(extension)?;
        let (sub, base) = split_prefix(prefix)?;
        let root = match kind {
            FileKind::Output => &self.output_dir,
            FileKind::Temp => &self.temp_dir,
        };
        let dir = root.join(&sub);
        let _guard = self.lock.lock();
        std::fs::create_dir_all(&dir)?;
        let counter = next_counter(&dir, &base)?;
        let filename = output_name(&base, counter, extension);
        let path = dir.join(&filename);
        // Write beside, then rename: a reader never sees a half-written file.
        let tmp = dir.join(format!(".{filename}.partial"));
        {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(data)?;
            f.sync_data()?;
        }
        std::fs::rename(&tmp, &path)?;
        let subfolder = sub.to_string_lossy().replace('\\', "/");
        Ok(SavedFile { filename, subfolder, kind, size: data.len() as u64, path, hash: None })
    }

    fn adopt(&self, file: &SavedFile) -> bool {
        file.path.is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comfy_naming_counts_up_per_prefix_and_subfolder() {
        let dir = tempfile::tempdir().unwrap();
        let out = DirOutputs::new(dir.path().join("out"), dir.path().join("temp"));
        let a = out.save(FileKind::Output, "ComfyUI", "png", b"1").unwrap();
        let b = out.save(FileKind::Output, "ComfyUI", "png", b"2").unwrap();
        let c = out.save(FileKind::Output, "shots/run", "png", b"3").unwrap();
        let t = out.save(FileKind::Temp, "ComfyUI", "png", b"4").unwrap();
        assert_eq!((a.filename.as_str(), a.subfolder.as_str()), ("ComfyUI_00001_.png", ""));
        assert_eq!(b.filename, "ComfyUI_00002_.png");
        assert_eq!((c.filename.as_str(), c.subfolder.as_str()), ("run_00001_.png", "shots"));
        assert_eq!(t.filename, "ComfyUI_00001_.png");
        assert_eq!(std::fs::read(dir.path().join("out/shots/run_00001_.png")).unwrap(), b"3");
        assert!(dir.path().join("temp/ComfyUI_00001_.png").is_file());
    }

    #[test]
    fn refuses_paths_outside_the_output_dir() {
        for prefix in ["../evil", "/abs/x", "a/../../b", "sub/", ".."] {
            assert!(split_prefix(prefix).is_err(), "{prefix}");
        }
        assert!(split_prefix("a/./b").is_ok());
    }

    #[test]
    fn long_or_deep_prefixes_are_refused_with_a_short_message() {
        let long = "x".repeat(1 << 20);
        let err = split_prefix(&long).unwrap_err();
        assert!(matches!(err, FileError::NameTooLong(_)), "{err}");
        assert!(err.to_string().len() < 200, "the message quotes only the start: {} bytes", err.to_string().len());
        assert!(matches!(split_prefix(&"y".repeat(MAX_NAME_BYTES + 1)), Err(FileError::NameTooLong(_))));
        assert!(split_prefix(&"y".repeat(MAX_NAME_BYTES)).is_ok());
        let deep = vec!["d"; MAX_SUBFOLDER_DEPTH + 1].join("/") + "/name";
        assert!(matches!(split_prefix(&deep), Err(FileError::NameTooLong(_))));
        let ok = vec!["d"; MAX_SUBFOLDER_DEPTH].join("/") + "/name";
        assert!(split_prefix(&ok).is_ok());
        let multibyte = "é".repeat(300);
        assert!(split_prefix(&multibyte).unwrap_err().to_string().contains('…'));
        assert!(check_extension("png").is_ok());
        for bad in ["", "p/g", "toolongext", "p.g"] {
            assert!(check_extension(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn named_inputs_resolve_only_registered_names() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.png"), b"x").unwrap();
        std::fs::write(dir.path().join("notes.txt"), b"y").unwrap();
        let inputs = NamedInputs::from_dir(dir.path()).unwrap();
        assert_eq!(inputs.read("a.png").unwrap(), b"x");
        assert!(matches!(inputs.read("../a.png"), Err(FileError::NotFound(_))));
        assert_eq!(inputs.image_names(), vec!["a.png".to_string()]);
        assert!(inputs.content_hash("a.png").is_some());
    }
}
