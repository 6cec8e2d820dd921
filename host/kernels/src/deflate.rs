//! A PNG's image data compressed on several cores (the host only, with the
//! `parallel` feature).
//!
//! The rows are filtered with Up (each byte less the byte above it, as the
//! one-core path does) and cut into pieces of whole rows. Each piece is
//! deflated on its own on rayon's pool: a raw deflate stream ending in a
//! sync flush (an empty stored block, so the next piece starts on a byte
//! boundary), the last one finished. Joined behind a zlib header and
//! followed by the Adler-32 of all the filtered bytes (combined from the
//! pieces' own), they make one ordinary zlib stream; each piece starts with
//! an empty window, which costs a little compression at its first bytes.

use rayon::prelude::*;

use crate::KernelError;
use crate::bands::Stop;

/// Filtered bytes per piece: enough that a fresh window costs little,
/// small enough that every core gets several pieces of a large image.
pub(crate) const PIECE_BYTES: usize = 1 << 20;

/// zlib's deflate level. Level 1 codes with fixed Huffman tables and
/// loses to the one-core path on smooth images (a blurred 3072² RGB result:
/// 10.9 MB against 7.9); level 2 builds tables per block and is smaller on
/// both smooth (6.9 MB) and noisy images (a 4096² gradient with noise: 5.8
/// MB against 27.2), at about the one-core path's time on two cores.
const LEVEL: u32 = 2;

/// The modulus of Adler-32 (the largest prime below 2¹⁶).
const ADLER_MOD: u64 = 65521;

/// The zlib stream of `pixels` (rows of `row_len` bytes), Up-filtered.
pub(crate) fn zlib_stream(pixels: &[u8], row_len: usize, stop: Stop<'_>) -> Result<Vec<u8>, KernelError> {
    if row_len == 0 || pixels.is_empty() || !pixels.len().is_multiple_of(row_len) {
        return Err(KernelError::Invalid(format!("{} bytes are not whole rows of {row_len}", pixels.len())));
    }
    let rows = pixels.len() / row_len;
    let rows_per_piece = (PIECE_BYTES / (row_len + 1)).max(1);
    let pieces = rows.div_ceil(rows_per_piece);
    let compressed: Vec<Result<Piece, KernelError>> = (0..pieces)
        .into_par_iter()
        .map(|i| {
            if stop() {
                return Err(KernelError::Stopped);
            }
            let first = i * rows_per_piece;
            let end = (first + rows_per_piece).min(rows);
            let filtered = filter_up(pixels, row_len, first, end);
            Ok(Piece { adler: adler32(&filtered), len: filtered.len() as u64, deflated: deflate(&filtered, i + 1 == pieces)? })
        })
        .collect();
    // zlib header: deflate with a 32 KiB window, "fastest" level, no
    // dictionary (0x7801 is a multiple of 31, as the header's check asks).
    let total: usize = compressed.iter().map(|p| p.as_ref().map_or(0, |p| p.deflated.len())).sum();
    let mut out = Vec::with_capacity(total + 6);
    out.extend_from_slice(&[0x78, 0x01]);
    let mut adler = 1u32;
    for piece in compressed {
        let piece = piece?;
        out.extend_from_slice(&piece.deflated);
        adler = adler32_combine(adler, piece.adler, piece.len);
    }
    out.extend_from_slice(&adler.to_be_bytes());
    Ok(out)
}

/// One piece's raw deflate bytes, and its filtered bytes' length and Adler-32.
struct Piece {
    deflated: Vec<u8>,
    adler: u32,
    len: u64,
}

/// Rows `first..end` of `pixels`, each behind filter type 2 (Up): a byte
/// less the one above it (nothing above the first row of the image).
fn filter_up(pixels: &[u8], row_len: usize, first: usize, end: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity((end - first) * (row_len + 1));
    for row in first..end {
        let this = &pixels[row * row_len..(row + 1) * row_len];
        out.push(2);
        if row == 0 {
            out.extend_from_slice(this);
        } else {
            let above = &pixels[(row - 1) * row_len..row * row_len];
            out.extend(this.iter().zip(above).map(|(&b, &a)| b.wrapping_sub(a)));
        }
    }
    out
}

/// `input` as raw deflate: ending in a sync flush, or finished when `last`.
fn deflate(input: &[u8], last: bool) -> Result<Vec<u8>, KernelError> {
    use flate2::{Compress, Compression, FlushCompress, Status};
    let failed = |e: flate2::CompressError| KernelError::Invalid(format!("cannot compress the PNG: {e}"));
    let mut compress = Compress::new(Compression::new(LEVEL), false);
    let mut out = Vec::with_capacity(input.len() / 4 + 1024);
    let flush = if last { FlushCompress::Finish } else { FlushCompress::Sync };
    loop {
        let read = compress.total_in() as usize;
        let status = compress.compress_vec(&input[read..], &mut out, flush).map_err(failed)?;
        let done = compress.total_in() as usize == input.len()
            && match flush {
                FlushCompress::Finish => status == Status::StreamEnd,
                // The flush is complete once output space was left over.
                _ => out.len() < out.capacity(),
            };
        if done {
            return Ok(out);
        }
        out.reserve(out.capacity().max(4096));
    }
}

/// The Adler-32 of `bytes`.
fn adler32(bytes: &[u8]) -> u32 {
    let mut hash = simd_adler32::Adler32::new();
    hash.write(bytes);
    hash.finish()
}

/// The Adler-32 of `x` then `y`, from `x`'s (`a`), `y`'s (`b`) and `y`'s
/// length. With A = 1 + Σ bytes and B = Σ of A after each byte: running
/// through `y` after `x` adds `A(x) - 1` to each of `y`'s `len` partial A
/// sums, so A = A(x) + A(y) - 1 and B = B(x) + B(y) + len·(A(x) - 1).
fn adler32_combine(a: u32, b: u32, len: u64) -> u32 {
    let (a_lo, a_hi) = (u64::from(a & 0xffff), u64::from(a >> 16));
    let (b_lo, b_hi) = (u64::from(b & 0xffff), u64::from(b >> 16));
    let lo = (a_lo + b_lo + ADLER_MOD - 1) % ADLER_MOD;
    let hi = (a_hi + b_hi + (len % ADLER_MOD) * ((a_lo + ADLER_MOD - 1) % ADLER_MOD)) % ADLER_MOD;
    ((hi << 16) | lo) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inflate(stream: &[u8]) -> Vec<u8> {
        use std::io::Read;
        let mut out = Vec::new();
        // Decoding checks the header and the trailing Adler-32.
        flate2::read::ZlibDecoder::new(stream).read_to_end(&mut out).unwrap();
        out
    }

    #[test]
    fn adler_of_a_join_is_combined_from_the_parts() {
        let data: Vec<u8> = (0..300_000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for cut in [0, 1, 5552, 65521, 100_000, 299_999, 300_000] {
            let (x, y) = data.split_at(cut);
            assert_eq!(adler32_combine(adler32(x), adler32(y), y.len() as u64), adler32(&data), "cut at {cut}");
        }
        // All-0xff bytes push both sums towards the modulus.
        let ones = vec![0xffu8; 200_000];
        assert_eq!(adler32_combine(adler32(&ones[..70_001]), adler32(&ones[70_001..]), 129_999), adler32(&ones));
    }

    #[test]
    fn the_pieces_make_one_stream_of_the_up_filtered_rows() {
        // Enough rows for several pieces, a short last one; one-row images too.
        for (rows, row_len) in [(3000, 1001), (1, 7), (2, 3), (5000, 300)] {
            let pixels: Vec<u8> = (0..rows * row_len).map(|i| ((i / 7) ^ (i % 251)) as u8).collect();
            let stream = zlib_stream(&pixels, row_len, &|| false).unwrap();
            let rows_back = inflate(&stream);
            assert_eq!(rows_back.len(), rows * (row_len + 1));
            for (r, row) in rows_back.chunks(row_len + 1).enumerate() {
                assert_eq!(row[0], 2, "Up filter on row {r}");
                for (i, &v) in row[1..].iter().enumerate() {
                    let above = if r == 0 { 0 } else { pixels[(r - 1) * row_len + i] };
                    assert_eq!(v.wrapping_add(above), pixels[r * row_len + i], "row {r}, byte {i}");
                }
            }
        }
    }

    #[test]
    fn a_stop_ends_the_work_and_partial_rows_are_refused() {
        let pixels = vec![7u8; 4000 * 1000];
        assert!(matches!(zlib_stream(&pixels, 1000, &|| true), Err(KernelError::Stopped)));
        assert!(matches!(zlib_stream(&pixels[..1500], 1000, &|| false), Err(KernelError::Invalid(_))));
    }
}
