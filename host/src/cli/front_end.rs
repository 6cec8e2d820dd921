//! `kiln serve --fetch-front-end`: the official ComfyUI web frontend,
//! fetched once from PyPI into the data directory. kiln shells out to
//! `python3 -m pip download --no-deps comfyui-frontend-package==<version>`
//! (the version is [`FRONT_END_VERSION`]; `KILN_PYTHON` names another
//! interpreter) and unpacks the wheel with `python3 -m zipfile`, into
//! `<data_dir>/frontend/<version>/` through a temporary directory renamed
//! into place, so an interrupted fetch is fetched again at the next start.

use std::path::{Path, PathBuf};
use std::process::Command;

pub use crate::api::compat::FRONT_END_VERSION;

/// Why the frontend could not be fetched.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot run {python} (set KILN_PYTHON to a Python with pip): {source}")]
    Spawn { python: String, source: std::io::Error },
    #[error("`{python} {args}` failed ({status}): {stderr}")]
    Failed { python: String, args: String, status: std::process::ExitStatus, stderr: String },
    #[error("the downloaded package has no {0}")]
    Layout(PathBuf),
    #[error("cannot prepare {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// The `static/` directory of `comfyui-frontend-package==version` under
/// `data_dir`, fetched first when absent.
pub fn ensure(data_dir: &Path, version: &str) -> Result<PathBuf, FetchError> {
    let python = std::env::var("KILN_PYTHON").unwrap_or_else(|_| "python3".into());
    ensure_with(&python, data_dir, version)
}

fn ensure_with(python: &str, data_dir: &Path, version: &str) -> Result<PathBuf, FetchError> {
    let dir = data_dir.join("frontend").join(version);
    let root = dir.join("comfyui_frontend_package").join("static");
    if root.join("index.html").is_file() {
        return Ok(root);
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| FetchError::Io { path, source }
    };
    let tmp = data_dir.join("frontend").join(format!(".fetch-{version}"));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(io(&tmp))?;
    tracing::info!(version, dir = %dir.display(), "fetching comfyui-frontend-package from PyPI");
    let dest = tmp.to_string_lossy().into_owned();
    let spec = format!("comfyui-frontend-package=={version}");
    run(python, &["-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps", "--dest", &dest, &spec])?;
    let wheel = std::fs::read_dir(&tmp)
        .map_err(io(&tmp))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| FetchError::Layout(tmp.join("*.whl")))?;
    run(python, &["-m", "zipfile", "-e", &wheel.to_string_lossy(), &dest])?;
    std::fs::remove_file(&wheel).map_err(io(&wheel))?;
    if !tmp.join("comfyui_frontend_package/static/index.html").is_file() {
        return Err(FetchError::Layout(PathBuf::from("comfyui_frontend_package/static/index.html")));
    }
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(io(&dir))?;
    Ok(root)
}

fn run(python: &str, args: &[&str]) -> Result<(), FetchError> {
    let out = Command::new(python).args(args).output().map_err(|source| FetchError::Spawn { python: python.into(), source })?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(FetchError::Failed {
        python: python.into(),
        args: args.join(" "),
        status: out.status,
        stderr: stderr.chars().rev().take(2000).collect::<Vec<_>>().into_iter().rev().collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stand-in for python3: `pip download` drops a wheel (a zip made by
    /// the real python3), `zipfile -e` is the real one.
    #[test]
    #[cfg(unix)]
    fn fetches_once_into_the_data_dir() {
        use std::os::unix::fs::PermissionsExt;
        let Ok(status) = Command::new("python3").arg("--version").status() else { return eprintln!("SKIPPED: no python3") };
        assert!(status.success());
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("python");
        let script = r#"#!/bin/sh
if [ "$2" = pip ]; then
  for a in "$@"; do case "$prev" in --dest) dest="$a";; esac; prev="$a"; done
  echo "$@" >> "$(dirname "$0")/calls"
  exec python3 -c 'import sys, zipfile; z = zipfile.ZipFile(sys.argv[1] + "/comfyui_frontend_package-1.0-py3-none-any.whl", "w"); z.writestr("comfyui_frontend_package/static/index.html", "<html></html>"); z.close()' "$dest"
fi
exec python3 "$@"
"#;
        std::fs::write(&fake, script).unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let data = dir.path().join("data");
        let root = ensure_with(fake.to_str().unwrap(), &data, "1.0").unwrap();
        assert_eq!(root, data.join("frontend/1.0/comfyui_frontend_package/static"));
        assert_eq!(std::fs::read_to_string(root.join("index.html")).unwrap(), "<html></html>");
        assert!(std::fs::read_to_string(dir.path().join("calls")).unwrap().contains("comfyui-frontend-package==1.0"));
        // Present: not fetched again.
        ensure_with(fake.to_str().unwrap(), &data, "1.0").unwrap();
        assert_eq!(std::fs::read_to_string(dir.path().join("calls")).unwrap().lines().count(), 1);
        // A failing pip is reported with its output.
        let err = ensure_with("false", &data, "2.0").unwrap_err();
        assert!(matches!(err, FetchError::Failed { .. }), "{err}");
    }
}
