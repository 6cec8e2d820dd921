//! Encoding on the host: one image of a tensor as an 8-bit PNG, the way
//! SaveImage writes it (values truncated as [`crate::convert::to_u8`],
//! the Up filter, fdeflate's fast compression on one core, text chunks for
//! the workflow); a large image on several cores is compressed in pieces
//! ([`crate::deflate`]). Only trusted data is handled here: the pixels are numbers the
//! host already holds and the text is copied into chunks, never parsed.
//! Decoding untrusted files stays inside the sandbox.

use std::io::Write;

use crate::bands::Stop;
use crate::convert::to_u8;
use crate::{Dims, KernelError};

/// Input bytes compressed between two stop checks.
const BAND_BYTES: usize = 1 << 20;

/// Output bytes per `IDAT` chunk.
const CHUNK_BYTES: usize = 1 << 18;

/// Most text, in all chunks together, a PNG may carry (a workflow is a few
/// MiB at most).
pub const MAX_TEXT_BYTES: usize = 64 << 20;

fn failed(e: impl std::fmt::Display) -> KernelError {
    KernelError::Invalid(format!("cannot encode the PNG: {e}"))
}

/// Encodes image `index` of the `B×H×W×C` tensor `data` (C of 1, 3 or 4)
/// as a PNG carrying `text` as `(keyword, text)` chunks. Gives up between
/// bands of rows once `stop` says so.
pub fn encode_png(data: &[f32], dims: Dims, index: usize, text: Vec<(String, String)>, stop: Stop<'_>) -> Result<Vec<u8>, KernelError> {
    dims.check(data)?;
    check_image(dims, index, &text)?;
    let frame = dims.frame_len();
    let pixels = to_u8(&data[index * frame..(index + 1) * frame], stop)?;
    encode_png_parts([Ok(&pixels[..])], dims, text, stop)
}

/// Encodes one image's 8-bit values (`H×W×C` of `dims`, already converted
/// as [`to_u8`] does: the GPU path converts on the device and reads back a
/// quarter of the bytes) as [`encode_png`] does.
pub fn encode_png_u8(pixels: &[u8], dims: Dims, text: Vec<(String, String)>, stop: Stop<'_>) -> Result<Vec<u8>, KernelError> {
    check_image(dims, 0, &text)?;
    if pixels.len() != dims.frame_len() {
        return Err(KernelError::Invalid(format!("{} bytes for a {}×{}×{} image", pixels.len(), dims.height, dims.width, dims.channels)));
    }
    encode_png_parts([Ok(pixels)], dims, text, stop)
}

/// What every encode checks first: the text's size, the channels, the index.
fn check_image(dims: Dims, index: usize, text: &[(String, String)]) -> Result<(), KernelError> {
    let text_bytes: usize = text.iter().map(|(k, v)| k.len() + v.len()).sum();
    if text_bytes > MAX_TEXT_BYTES {
        return Err(KernelError::Invalid(format!("{text_bytes} bytes of PNG text; at most {MAX_TEXT_BYTES}")));
    }
    if !matches!(dims.channels, 1 | 3 | 4) {
        return Err(KernelError::Invalid(format!("cannot encode an image with {} channels as a PNG", dims.channels)));
    }
    if index >= dims.batch {
        return Err(KernelError::Invalid(format!("image {index} of a batch of {}", dims.batch)));
    }
    if u32::try_from(dims.width).is_err() || u32::try_from(dims.height).is_err() {
        return Err(KernelError::Invalid(format!("cannot encode a {}×{} PNG", dims.width, dims.height)));
    }
    Ok(())
}

/// Encodes one image's 8-bit values as [`encode_png_u8`] does, from `parts`
/// of whole rows that arrive in order (a GPU read-back in parts): the
/// compression of the rows that arrived overlaps the wait for the next.
pub fn encode_png_parts<P>(
    parts: impl IntoIterator<Item = Result<P, KernelError>>,
    dims: Dims,
    text: Vec<(String, String)>,
    stop: Stop<'_>,
) -> Result<Vec<u8>, KernelError>
where
    P: AsRef<[u8]> + Send + Sync,
{
    check_image(dims, 0, &text)?;
    let color = match dims.channels {
        1 => png::ColorType::Grayscale,
        3 => png::ColorType::Rgb,
        _ => png::ColorType::Rgba,
    };
    let (width, height) = (dims.width as u32, dims.height as u32);
    let bytes = dims.frame_len();
    let mut out = Vec::with_capacity(bytes / 2 + 1024);
    let mut encoder = png::Encoder::new(&mut out, width, height);
    encoder.set_color(color);
    encoder.set_depth(png::BitDepth::Eight);
    // fdeflate with a fixed Up filter: the adaptive filter costs more than
    // the compression it buys on photographs.
    encoder.set_compression(png::Compression::Fast);
    encoder.set_filter(png::Filter::Up);
    for (keyword, value) in text {
        // Latin-1 text as `tEXt`, anything else as UTF-8 `iTXt` (as Pillow
        // does for ComfyUI's workflow chunks).
        let added = if value.chars().all(|c| u32::from(c) < 256) { encoder.add_text_chunk(keyword, value) } else { encoder.add_itxt_chunk(keyword, value) };
        added.map_err(failed)?;
    }
    // Keywords are checked here: 1–79 Latin-1 characters.
    let mut writer = encoder.write_header().map_err(failed)?;
    #[cfg(feature = "parallel")]
    if bytes >= 2 * crate::deflate::PIECE_BYTES && crate::threads() > 1 {
        let stream = crate::deflate::zlib_stream(parts, dims.row_len(), dims.height, stop)?;
        for chunk in stream.chunks(CHUNK_BYTES) {
            writer.write_chunk(png::chunk::IDAT, chunk).map_err(failed)?;
        }
        writer.finish().map_err(failed)?;
        return Ok(out);
    }
    let mut stream = writer.stream_writer_with_size(CHUNK_BYTES.min(bytes).max(1)).map_err(failed)?;
    let rows_per_band = (BAND_BYTES / dims.row_len().max(1)).max(1);
    let mut written = 0;
    for part in parts {
        let part = part?;
        let part = part.as_ref();
        written += part.len();
        if written > bytes {
            return Err(KernelError::Invalid(format!("more than the image's {bytes} bytes")));
        }
        for band in part.chunks(rows_per_band * dims.row_len().max(1)) {
            if stop() {
                return Err(KernelError::Stopped);
            }
            stream.write_all(band).map_err(failed)?;
        }
    }
    if written != bytes {
        return Err(KernelError::Invalid(format!("{written} of the image's {bytes} bytes")));
    }
    stream.finish().map_err(failed)?;
    writer.finish().map_err(failed)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(png: &[u8]) -> (png::OutputInfo, Vec<u8>, Vec<(String, String)>) {
        let mut reader = png::Decoder::new(std::io::Cursor::new(png)).read_info().unwrap();
        let mut buf = vec![0; reader.output_buffer_size().unwrap()];
        let info = reader.next_frame(&mut buf).unwrap();
        buf.truncate(info.buffer_size());
        let chunks = reader.info();
        let mut text: Vec<(String, String)> = chunks.uncompressed_latin1_text.iter().map(|t| (t.keyword.clone(), t.text.clone())).collect();
        text.extend(chunks.utf8_text.iter().map(|t| (t.keyword.clone(), t.get_text().unwrap())));
        (info, buf, text)
    }

    #[test]
    fn round_trips_each_image_of_a_batch_with_its_text() {
        // Two 300×700 RGB images, different content; several bands each.
        let dims = Dims { batch: 2, height: 700, width: 300, channels: 3 };
        let data: Vec<f32> = (0..dims.len().unwrap()).map(|i| ((i * 7919) % 1013) as f32 / 1012.0).collect();
        // Latin-1 text goes into tEXt, the rest into iTXt (written after).
        let text = vec![("prompt".to_string(), "{\"1\": \"café\"}".to_string()), ("workflow".to_string(), "{\"t\": \"夕焼け\"}".to_string())];
        for index in 0..2 {
            let png = encode_png(&data, dims, index, text.clone(), &|| false).unwrap();
            let (info, pixels, got_text) = decode(&png);
            assert_eq!((info.width, info.height, info.color_type), (300, 700, png::ColorType::Rgb));
            let frame = dims.frame_len();
            assert_eq!(pixels, to_u8(&data[index * frame..(index + 1) * frame], &|| false).unwrap());
            assert_eq!(got_text, text);
        }
    }

    #[cfg(feature = "parallel")]
    #[test]
    fn a_large_image_on_several_cores_is_compressed_in_pieces_to_the_same_pixels() {
        // 1100×900 RGB: ~3 MiB of rows, several pieces of ~1 MiB.
        let dims = Dims { batch: 1, height: 1100, width: 900, channels: 3 };
        let data: Vec<f32> = (0..dims.len().unwrap()).map(|i| ((i * 7919) % 1013) as f32 / 1012.0).collect();
        let text = vec![("prompt".to_string(), "{}".to_string())];
        let encode = |threads| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| encode_png(&data, dims, 0, text.clone(), &|| false).unwrap())
        };
        let (one, two) = (encode(1), encode(2));
        assert_ne!(one, two, "two cores take the other path");
        let want = to_u8(&data, &|| false).unwrap();
        for png in [one, two] {
            let (info, pixels, got_text) = decode(&png);
            assert_eq!((info.width, info.height), (900, 1100));
            assert_eq!(pixels, want);
            assert_eq!(got_text, text);
        }
    }

    #[test]
    fn gray_and_rgba_encode_and_bad_arguments_are_refused() {
        for channels in [1, 4] {
            let dims = Dims { batch: 1, height: 5, width: 3, channels };
            let data = vec![0.25; dims.len().unwrap()];
            let (info, pixels, _) = decode(&encode_png(&data, dims, 0, vec![], &|| false).unwrap());
            assert_eq!(info.color_type, if channels == 1 { png::ColorType::Grayscale } else { png::ColorType::Rgba });
            assert!(pixels.iter().all(|&v| v == 63));
        }
        let dims = Dims { batch: 1, height: 2, width: 2, channels: 2 };
        assert!(matches!(encode_png(&[0.0; 8], dims, 0, vec![], &|| false), Err(KernelError::Invalid(_))));
        let dims = Dims { batch: 1, height: 2, width: 2, channels: 3 };
        assert!(matches!(encode_png(&[0.0; 12], dims, 1, vec![], &|| false), Err(KernelError::Invalid(_))), "index past the batch");
        assert!(matches!(encode_png(&[0.0; 11], dims, 0, vec![], &|| false), Err(KernelError::Invalid(_))), "data of another shape");
        let bad_keyword = vec![(String::new(), "x".to_string())];
        assert!(matches!(encode_png(&[0.0; 12], dims, 0, bad_keyword, &|| false), Err(KernelError::Invalid(_))));
        let too_much = vec![("prompt".to_string(), "x".repeat(MAX_TEXT_BYTES))];
        assert!(matches!(encode_png(&[0.0; 12], dims, 0, too_much, &|| false), Err(KernelError::Invalid(_))));
    }

    #[test]
    fn stops_between_bands() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let dims = Dims { batch: 1, height: 2048, width: 1024, channels: 3 };
        let data = vec![0.5; dims.len().unwrap()];
        // Count the stop checks of a whole run; the last ones come between
        // bands of the compression.
        let calls = AtomicUsize::new(0);
        encode_png(&data, dims, 0, vec![], &|| calls.fetch_add(1, Ordering::Relaxed) == usize::MAX).unwrap();
        let total = calls.load(Ordering::Relaxed);
        assert!(total > 4, "{total} stop checks");
        let left = AtomicUsize::new(total - 2);
        let stop = || left.fetch_sub(1, Ordering::Relaxed) == 0;
        assert_eq!(encode_png(&data, dims, 0, vec![], &stop), Err(KernelError::Stopped));
    }
}
