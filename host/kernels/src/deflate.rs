//! A PNG's image data compressed on several cores (the host only, with the
//! `parallel` feature).
//!
//! The rows are filtered with Up (each byte less the byte above it, as the
//! one-core path does) and cut into pieces of whole rows as they arrive (in
//! parts: a GPU read-back hands rows over as each part lands). Each piece
//! is deflated on its own on rayon's pool, while the caller's thread waits
//! for the next part: a raw deflate stream ending in a
//! sync flush (an empty stored block, so the next piece starts on a byte
//! boundary), the last one finished. Joined behind a zlib header and
//! followed by the Adler-32 of all the filtered bytes (combined from the
//! pieces' own), they make one ordinary zlib stream; each piece starts with
//! an empty window, which costs a little compression at its first bytes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

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

/// The zlib stream of an image of `rows` rows of `row_len` bytes,
/// Up-filtered, whose bytes arrive in `parts` (whole rows, in order: a GPU
/// read-back hands them over as each lands). Each part's pieces are
/// compressed on rayon's pool while this thread waits for the next part;
/// a part's last row is kept for the next one's first filter.
pub(crate) fn zlib_stream<P>(
    parts: impl IntoIterator<Item = Result<P, KernelError>>,
    row_len: usize,
    rows: usize,
    stop: Stop<'_>,
) -> Result<Vec<u8>, KernelError>
where
    P: AsRef<[u8]> + Send + Sync,
{
    if row_len == 0 || rows == 0 {
        return Err(KernelError::Invalid(format!("an image of {rows} rows of {row_len} bytes")));
    }
    let rows_per_piece = (PIECE_BYTES / (row_len + 1)).max(1);
    let (sender, finished) = std::sync::mpsc::channel::<(usize, Result<Piece, KernelError>)>();
    // Set when a part fails: its pieces already queued end at once.
    let abandoned = AtomicBool::new(false);
    let halt = || abandoned.load(Ordering::Relaxed) || stop();
    let mut pieces = 0;
    let arrived = rayon::in_place_scope(|scope| {
        let (mut done, mut above): (usize, Option<Arc<P>>) = (0, None);
        for part in parts {
            // Stopped (cancelled, past the deadline): no waiting for more parts.
            if halt() {
                abandoned.store(true, Ordering::Relaxed);
                return Err(KernelError::Stopped);
            }
            let part = Arc::new(part.inspect_err(|_| abandoned.store(true, Ordering::Relaxed))?);
            let len = (*part).as_ref().len();
            let part_rows = len / row_len;
            if len == 0 || !len.is_multiple_of(row_len) || done + part_rows > rows {
                abandoned.store(true, Ordering::Relaxed);
                return Err(KernelError::Invalid(format!("{len} bytes are not whole rows of {row_len} within {rows} rows")));
            }
            for first in (0..part_rows).step_by(rows_per_piece) {
                let end = (first + rows_per_piece).min(part_rows);
                let last = done + end == rows;
                let (part, before, sender, index, halt) = (part.clone(), above.clone(), sender.clone(), pieces, &halt);
                scope.spawn(move |_| {
                    let made = if halt() {
                        Err(KernelError::Stopped)
                    } else {
                        let bytes = (*part).as_ref();
                        let row_above = match (first, &before) {
                            (0, Some(before)) => (**before).as_ref().rchunks_exact(row_len).next(),
                            (0, None) => None,
                            _ => bytes.get((first - 1) * row_len..first * row_len),
                        };
                        let filtered = filter_up(&bytes[first * row_len..end * row_len], row_above, row_len);
                        deflate(&filtered, last).map(|deflated| Piece { adler: adler32(&filtered), len: filtered.len() as u64, deflated })
                    };
                    let _ = sender.send((index, made));
                });
                pieces += 1;
            }
            done += part_rows;
            above = Some(part);
        }
        if done == rows { Ok(()) } else { Err(KernelError::Invalid(format!("{done} of an image's {rows} rows arrived"))) }
    });
    drop(sender);
    arrived?;
    let mut compressed: Vec<Option<Piece>> = (0..pieces).map(|_| None).collect();
    for (index, piece) in finished {
        compressed[index] = Some(piece?);
    }
    // zlib header: deflate with a 32 KiB window, "fastest" level, no
    // dictionary (0x7801 is a multiple of 31, as the header's check asks).
    let total: usize = compressed.iter().flatten().map(|p| p.deflated.len()).sum();
    let mut out = Vec::with_capacity(total + 6);
    out.extend_from_slice(&[0x78, 0x01]);
    let mut adler = 1u32;
    for piece in compressed {
        let piece = piece.ok_or_else(|| KernelError::Invalid("a compressed piece went missing".into()))?;
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

/// `rows` (whole rows of `row_len` bytes), each behind filter type 2 (Up):
/// a byte less the one above it (`above` for the first row; nothing above
/// the image's first row).
fn filter_up(rows: &[u8], above: Option<&[u8]>, row_len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() / row_len * (row_len + 1));
    let mut previous = above;
    for this in rows.chunks_exact(row_len) {
        out.push(2);
        match previous {
            None => out.extend_from_slice(this),
            Some(above) => out.extend(this.iter().zip(above).map(|(&b, &a)| b.wrapping_sub(a))),
        }
        previous = Some(this);
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
            let stream = zlib_stream([Ok(&pixels[..])], row_len, rows, &|| false).unwrap();
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
        assert!(matches!(zlib_stream([Ok(&pixels[..])], 1000, 4000, &|| true), Err(KernelError::Stopped)));
        assert!(matches!(zlib_stream([Ok(&pixels[..1500])], 1000, 2, &|| false), Err(KernelError::Invalid(_))));
        assert!(matches!(zlib_stream([Ok(&pixels[..2000])], 1000, 3, &|| false), Err(KernelError::Invalid(_))), "rows missing");
        assert!(matches!(zlib_stream([Ok(&pixels[..]), Ok(&pixels[..1000])], 1000, 4000, &|| false), Err(KernelError::Invalid(_))), "rows over");
        let failed = [Ok(&pixels[..3000]), Err(KernelError::Stopped)];
        assert!(matches!(zlib_stream(failed, 1000, 4000, &|| false), Err(KernelError::Stopped)), "a part that fails ends the stream");
    }

    #[test]
    fn rows_arriving_in_parts_make_the_same_stream_as_rows_at_once() {
        // Parts that cut pieces short, of one row, and of uneven sizes: the
        // first row of each part is filtered against the last of the one before.
        let (rows, row_len) = (2500, 999);
        let pixels: Vec<u8> = (0..rows * row_len).map(|i| ((i / 5) ^ (i % 241)) as u8).collect();
        let whole = inflate(&zlib_stream([Ok(&pixels[..])], row_len, rows, &|| false).unwrap());
        for cuts in [vec![1, 2, 1000, 2500], vec![1049, 1050, 2098, 2499, 2500], vec![7, 2500]] {
            let mut parts = Vec::new();
            let mut at = 0;
            for cut in cuts {
                parts.push(Ok(&pixels[at * row_len..cut * row_len]));
                at = cut;
            }
            assert_eq!(inflate(&zlib_stream(parts, row_len, rows, &|| false).unwrap()), whole);
        }
    }
}
