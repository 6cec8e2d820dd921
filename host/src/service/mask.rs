//! ComfyUI's mask upload (`/upload/mask`): the original image as RGBA with
//! its alpha replaced by the mask's, encoded as PNG. A small PNG can claim
//! a huge canvas, so the composition streams: both images are decoded a
//! row at a time and each composed row goes straight to the encoder, which
//! writes into the blob upload — memory grows with the width, not the
//! area. An interlaced PNG cannot be read by rows; it is decoded whole
//! (each image within [`DECODE_LIMIT`]). What a composition holds is
//! estimated from the headers before any pixel is decoded
//! ([`Composition::memory`]) and taken from the service's intake budget.

use std::io::{BufRead, Seek, Write};

/// Most bytes one image of a mask upload may decode to when it must be
/// decoded whole (an interlaced PNG).
pub const DECODE_LIMIT: usize = 256 << 20;

/// What a row-by-row encoder keeps besides the row (deflate's window and
/// buffers), rounded up.
const ENCODER_STATE: u64 = 1 << 20;

/// 8-bit RGBA rows of a PNG, one at a time.
struct Rows<R: BufRead + Seek> {
    reader: png::Reader<R>,
    color: png::ColorType,
    width: u32,
    height: u32,
    /// The whole frame, for an interlaced image, and the next row in it.
    whole: Option<(Vec<u8>, usize)>,
    rgba: Vec<u8>,
}

impl<R: BufRead + Seek> Rows<R> {
    /// Reads the header (no pixels yet).
    fn open(source: R) -> Result<Rows<R>, String> {
        let mut decoder = png::Decoder::new_with_limits(source, png::Limits { bytes: DECODE_LIMIT });
        decoder.set_transformations(png::Transformations::EXPAND | png::Transformations::STRIP_16);
        let reader = decoder.read_info().map_err(|e| format!("not a PNG image: {e}"))?;
        let (color, _) = reader.output_color_type();
        let (width, height) = (reader.info().width, reader.info().height);
        if color == png::ColorType::Indexed {
            return Err("cannot expand an indexed PNG".into());
        }
        Ok(Rows { reader, color, width, height, whole: None, rgba: Vec::new() })
    }

    fn interlaced(&self) -> bool {
        self.reader.info().interlaced
    }

    /// The bytes this decode holds: two rows (the decoder's and the RGBA
    /// one), or the whole frame when it is interlaced.
    fn memory(&self) -> u64 {
        let row = u64::from(self.width) * 4;
        if self.interlaced() { row * u64::from(self.height) + row } else { row * 3 }
    }

    /// The next row as RGBA (`None` past the last one).
    fn next(&mut self) -> Result<Option<&[u8]>, String> {
        if self.interlaced() && self.whole.is_none() {
            let size = self.reader.output_buffer_size().ok_or("the image is too large")?;
            let mut frame = vec![0u8; size];
            self.reader.next_frame(&mut frame).map_err(|e| format!("cannot decode the PNG image: {e}"))?;
            self.whole = Some((frame, 0));
        }
        let channels = self.color.samples();
        let line = self.width as usize * channels;
        let row: &[u8] = match &mut self.whole {
            Some((frame, at)) => {
                let Some(row) = frame.get(*at * line..(*at + 1) * line) else { return Ok(None) };
                *at += 1;
                row
            }
            None => match self.reader.next_row().map_err(|e| format!("cannot decode the PNG image: {e}"))? {
                Some(row) => row.data(),
                None => return Ok(None),
            },
        };
        self.rgba.clear();
        let px = self.width as usize;
        match self.color {
            png::ColorType::Rgba => self.rgba.extend_from_slice(&row[..px * 4]),
            png::ColorType::Rgb => self.rgba.extend(row.chunks_exact(3).take(px).flat_map(|p| [p[0], p[1], p[2], 255])),
            png::ColorType::GrayscaleAlpha => self.rgba.extend(row.chunks_exact(2).take(px).flat_map(|p| [p[0], p[0], p[0], p[1]])),
            png::ColorType::Grayscale => self.rgba.extend(row.iter().take(px).flat_map(|&g| [g, g, g, 255])),
            png::ColorType::Indexed => return Err("cannot expand an indexed PNG".into()),
        }
        Ok(Some(&self.rgba))
    }

    fn has_alpha(&self) -> bool {
        matches!(self.color, png::ColorType::Rgba | png::ColorType::GrayscaleAlpha)
    }
}

/// An original image and a mask of the same size, headers read.
pub struct Composition<A: BufRead + Seek, B: BufRead + Seek> {
    original: Rows<A>,
    mask: Rows<B>,
}

impl<A: BufRead + Seek, B: BufRead + Seek> Composition<A, B> {
    /// Reads both headers; the sizes must agree.
    pub fn open(original: A, mask: B) -> Result<Self, String> {
        let original = Rows::open(original)?;
        let mask = Rows::open(mask)?;
        let (w, h, mw, mh) = (original.width, original.height, mask.width, mask.height);
        if (w, h) != (mw, mh) {
            return Err(format!("the mask is {mw}x{mh}, the image {w}x{h}"));
        }
        Ok(Composition { original, mask })
    }

    /// The most memory composing holds at once, bytes.
    pub fn memory(&self) -> u64 {
        self.original.memory() + self.mask.memory() + u64::from(self.original.width) * 4 + ENCODER_STATE
    }

    /// Composes row by row into `out` as an RGBA PNG.
    pub fn write(mut self, out: impl Write) -> Result<(), String> {
        let (w, h) = (self.original.width, self.original.height);
        let mut encoder = png::Encoder::new(out, w, h);
        encoder.set_color(png::ColorType::Rgba);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(|e| e.to_string())?;
        let mut stream = writer.stream_writer().map_err(|e| e.to_string())?;
        let mask_alpha = self.mask.has_alpha();
        let mut row = Vec::with_capacity(w as usize * 4);
        for _ in 0..h {
            row.clear();
            row.extend_from_slice(self.original.next()?.ok_or("the image ended early")?);
            let mask = self.mask.next()?.ok_or("the mask ended early")?;
            for (p, m) in row.chunks_exact_mut(4).zip(mask.chunks_exact(4)) {
                p[3] = if mask_alpha { m[3] } else { 255 };
            }
            stream.write_all(&row).map_err(|e| e.to_string())?;
        }
        stream.finish().map_err(|e| e.to_string())?;
        writer.finish().map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn png(w: u32, h: u32, color: png::ColorType, pixels: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        let mut e = png::Encoder::new(&mut out, w, h);
        e.set_color(color);
        e.set_depth(png::BitDepth::Eight);
        let mut wr = e.write_header().unwrap();
        wr.write_image_data(pixels).unwrap();
        wr.finish().unwrap();
        out
    }

    /// A 1×1 PNG marked interlaced (Adam7's first pass is then the whole
    /// image, so the data is the same): its header byte set, its CRC redone.
    fn interlaced_1x1(pixel: [u8; 3]) -> Vec<u8> {
        let mut bytes = png(1, 1, png::ColorType::Rgb, &pixel);
        // Signature (8), length (4), "IHDR" (4), then 13 bytes; interlace is the last.
        bytes[8 + 8 + 12] = 1;
        let crc = crc32(&bytes[12..8 + 8 + 13]);
        bytes[29..33].copy_from_slice(&crc.to_be_bytes());
        bytes
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }

    fn compose(original: &[u8], mask: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        Composition::open(Cursor::new(original), Cursor::new(mask))?.write(&mut out)?;
        Ok(out)
    }

    fn decode(bytes: &[u8]) -> (u32, u32, Vec<u8>) {
        let mut rows = Rows::open(Cursor::new(bytes)).unwrap();
        let (w, h) = (rows.width, rows.height);
        let mut all = Vec::new();
        while let Some(r) = rows.next().unwrap() {
            all.extend_from_slice(r);
        }
        (w, h, all)
    }

    #[test]
    fn a_mask_replaces_the_alpha_of_the_image() {
        let original = png(2, 2, png::ColorType::Rgb, &[10, 20, 30, 40, 50, 60, 1, 2, 3, 4, 5, 6]);
        let mask = png(2, 2, png::ColorType::Rgba, &[0, 0, 0, 7, 0, 0, 0, 200, 0, 0, 0, 1, 0, 0, 0, 2]);
        let (w, h, pixels) = decode(&compose(&original, &mask).unwrap());
        assert_eq!((w, h), (2, 2));
        assert_eq!(pixels, [10, 20, 30, 7, 40, 50, 60, 200, 1, 2, 3, 1, 4, 5, 6, 2]);
        let gray = png(2, 2, png::ColorType::Grayscale, &[9, 8, 7, 6]);
        assert_eq!(decode(&compose(&gray, &gray).unwrap()).2, [9, 9, 9, 255, 8, 8, 8, 255, 7, 7, 7, 255, 6, 6, 6, 255], "a mask without alpha keeps it opaque");
        assert!(compose(&original, &png(1, 1, png::ColorType::Rgba, &[0, 0, 0, 0])).is_err(), "sizes differ");
        assert!(compose(b"not a png", &mask).is_err());
    }

    #[test]
    fn interlaced_images_are_decoded_whole_and_charged_so() {
        let interlaced = interlaced_1x1([1, 2, 3]);
        let mask = png(1, 1, png::ColorType::Rgba, &[0, 0, 0, 99]);
        let rows = Rows::open(std::io::Cursor::new(&interlaced)).unwrap();
        assert!(rows.interlaced());
        assert_eq!(rows.memory(), 8, "the whole frame and a row");
        assert_eq!(decode(&compose(&interlaced, &mask).unwrap()).2, [1, 2, 3, 99]);
        let plain = Rows::open(std::io::Cursor::new(png(1000, 1000, png::ColorType::Rgb, &vec![0; 3_000_000]))).unwrap();
        assert_eq!(plain.memory(), 12_000, "three rows, however tall");
    }

    #[test]
    fn a_huge_canvas_is_estimated_by_its_rows_not_its_area() {
        // 6000×6000 of one color: a small file, a 144 MB canvas.
        let (w, h) = (6000u32, 6000u32);
        let row = vec![200u8; w as usize * 4];
        let mut big = Vec::new();
        {
            let mut e = png::Encoder::new(&mut big, w, h);
            e.set_color(png::ColorType::Rgba);
            e.set_depth(png::BitDepth::Eight);
            let mut writer = e.write_header().unwrap();
            let mut s = writer.stream_writer().unwrap();
            for _ in 0..h {
                s.write_all(&row).unwrap();
            }
            s.finish().unwrap();
            writer.finish().unwrap();
        }
        assert!(big.len() < 1 << 20, "{}", big.len());
        let c = Composition::open(Cursor::new(&big), Cursor::new(&big)).unwrap();
        assert!(c.memory() < 2 << 20, "{}", c.memory());
        let mut out = Vec::new();
        c.write(&mut out).unwrap();
        assert!(out.len() < 4 << 20);
    }
}
