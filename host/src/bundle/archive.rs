//! A bundle's bytes: a gzip-compressed tar of plain files. Written
//! reproducibly (entries in the order given, every header field fixed:
//! mode 0644, owner 0, time 0), so one bundle is one byte string; read
//! under bounds (the decompressed size, the entry count, plain files only,
//! each path once), since a bundle may come from anyone.

use std::io::{Read, Write};

use super::BundleError;

/// Most files in one bundle (its descriptor, workflows, inputs, two files
/// per component, with room to spare).
pub const MAX_ENTRIES: usize = 512;

/// Writes `files` (path, bytes), in order, as a gzip-compressed tar.
pub fn write(files: &[(String, &[u8])]) -> Result<Vec<u8>, BundleError> {
    let gz = flate2::GzBuilder::new().mtime(0).write(Vec::new(), flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    for (path, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, path, *bytes).map_err(BundleError::Write)?;
    }
    let gz = tar.into_inner().map_err(BundleError::Write)?;
    let mut out = gz.finish().map_err(BundleError::Write)?;
    out.flush().map_err(BundleError::Write)?;
    Ok(out)
}

/// The files of a bundle's bytes, in archive order: refused when it is not
/// a gzip-compressed tar, decompresses to over `max_bytes`, holds anything
/// but plain files, more than [`MAX_ENTRIES`], or a path twice.
pub fn read(bytes: &[u8], max_bytes: u64) -> Result<Vec<(String, Vec<u8>)>, BundleError> {
    let mut tar_bytes = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(max_bytes.saturating_add(1))
        .read_to_end(&mut tar_bytes)
        .map_err(|e| BundleError::Malformed(format!("not a gzip-compressed bundle: {e}")))?;
    if tar_bytes.len() as u64 > max_bytes {
        return Err(BundleError::TooLarge { limit: max_bytes });
    }
    let malformed = |e: std::io::Error| BundleError::Malformed(format!("not a readable tar archive: {e}"));
    let mut archive = tar::Archive::new(tar_bytes.as_slice());
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for entry in archive.entries().map_err(malformed)? {
        let mut entry = entry.map_err(malformed)?;
        let path = entry.path().map_err(malformed)?.to_str().map(str::to_string).ok_or_else(|| BundleError::Malformed("a file name is not UTF-8".into()))?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            return Err(BundleError::Malformed(format!("{path:?} is not a plain file (a bundle holds only files)")));
        }
        if files.len() == MAX_ENTRIES {
            return Err(BundleError::Malformed(format!("more than {MAX_ENTRIES} files")));
        }
        if !seen.insert(path.clone()) {
            return Err(BundleError::Malformed(format!("{path:?} appears twice")));
        }
        // Bounded: the whole archive is `tar_bytes`, already bounded.
        let mut data = Vec::with_capacity(usize::try_from(entry.size()).unwrap_or(0).min(tar_bytes.len()));
        entry.read_to_end(&mut data).map_err(malformed)?;
        files.push((path, data));
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_same_bytes_every_time_and_reads_them_back() {
        let files = [("bundle.json".to_string(), &b"{}"[..]), ("inputs/a.png".to_string(), &b"\x89PNG"[..])];
        let one = write(&files).unwrap();
        assert_eq!(one, write(&files).unwrap(), "reproducible");
        let back = read(&one, 1 << 20).unwrap();
        assert_eq!(back, vec![("bundle.json".to_string(), b"{}".to_vec()), ("inputs/a.png".to_string(), b"\x89PNG".to_vec())]);
    }

    #[test]
    fn refuses_oversized_duplicate_and_non_file_entries_and_garbage() {
        let big = vec![0u8; 100_000];
        let bytes = write(&[("big".to_string(), &big[..])]).unwrap();
        assert!(bytes.len() < 10_000, "zeros compress");
        assert!(matches!(read(&bytes, 50_000), Err(BundleError::TooLarge { limit: 50_000 })), "the decompressed size is bounded");

        let twice = write(&[("a".to_string(), &b"1"[..]), ("a".to_string(), &b"2"[..])]).unwrap();
        assert!(matches!(read(&twice, 1 << 20), Err(BundleError::Malformed(m)) if m.contains("twice")));

        // A symlink entry, written by hand.
        let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        let mut tar = tar::Builder::new(gz);
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        tar.append_link(&mut header, "inputs/a.png", "/etc/passwd").unwrap();
        let link = tar.into_inner().unwrap().finish().unwrap();
        assert!(matches!(read(&link, 1 << 20), Err(BundleError::Malformed(m)) if m.contains("not a plain file")));

        assert!(matches!(read(b"{\"not\": \"a bundle\"}", 1 << 20), Err(BundleError::Malformed(_))));
    }
}
