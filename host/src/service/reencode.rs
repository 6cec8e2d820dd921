//! ComfyUI's `/view` conversions of a stored image: `preview=FMT[;Q]`
//! re-encodes it as WebP or JPEG, `channel=rgb` drops its alpha and
//! `channel=a` keeps only its alpha (see [`Conversion::parse`] for the
//! rules). Everything else serves the stored bytes untouched and never
//! comes here.
//!
//! A conversion decodes the whole image, so it is bounded and charged like
//! a mask upload: [`Decoding::memory`] estimates what it holds from the
//! header, before any pixel is decoded, and the caller takes that from the
//! service's intake budget; an image that would decode to more than
//! [`DECODE_LIMIT`] is refused. WebP is written lossless (the pure-Rust
//! encoder has no lossy mode), so a WebP preview's quality is not used;
//! JPEG honours it.

use std::io::{BufRead, Cursor, Seek};

use image::{DynamicImage, ExtendedColorType, ImageDecoder, ImageEncoder, ImageReader};

/// Most bytes an image may decode to for a conversion.
pub const DECODE_LIMIT: u64 = 256 << 20;

/// The quality of a preview that names none (ComfyUI's default).
const DEFAULT_QUALITY: u8 = 90;

/// What a `/view` request asks of the image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Conversion {
    /// `preview`: re-encoded, without alpha when `opaque`.
    Preview { format: PreviewFormat, quality: u8, opaque: bool },
    /// `channel=rgb` alone: a PNG without the alpha channel.
    Rgb,
    /// `channel=a` alone: a PNG whose colour is black and whose alpha is
    /// the image's (opaque everywhere when it has none).
    Alpha,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreviewFormat {
    Webp,
    Jpeg,
}

/// A converted image: its bytes and their media type.
pub struct Converted {
    pub bytes: Vec<u8>,
    pub content_type: &'static str,
}

impl Conversion {
    /// The conversion `preview` and `channel` ask for, as ComfyUI reads
    /// them: a `preview` format other than `webp` or `jpeg` is WebP, and so
    /// is any preview whose `channel` contains `a`; its quality is the last
    /// `;`-separated part when that is a number (0–100, default 90); a JPEG
    /// preview or `channel=rgb` drops the alpha. Without `preview`, `rgb`
    /// and `a` convert and any other channel (`rgba`, the default) serves
    /// the stored bytes: `None`.
    pub fn parse(preview: Option<&str>, channel: Option<&str>) -> Option<Conversion> {
        // (A `channel` left out contains no `a` here, though it means rgba.)
        let channel = channel.unwrap_or_default();
        if let Some(preview) = preview {
            let mut parts = preview.split(';');
            let named = parts.next().unwrap_or_default();
            let format = if named == "jpeg" && !channel.contains('a') { PreviewFormat::Jpeg } else { PreviewFormat::Webp };
            let quality = preview.rsplit(';').next().filter(|q| !q.is_empty() && q.bytes().all(|b| b.is_ascii_digit()));
            let quality = quality.map_or(DEFAULT_QUALITY, |q| q.parse::<u32>().map_or(100, |q| q.min(100) as u8));
            return Some(Conversion::Preview { format, quality, opaque: format == PreviewFormat::Jpeg || channel == "rgb" });
        }
        match channel {
            "rgb" => Some(Conversion::Rgb),
            "a" => Some(Conversion::Alpha),
            _ => None,
        }
    }
}

/// An image whose header is read, ready to decode.
pub struct Decoding<'a> {
    decoder: Box<dyn ImageDecoder + 'a>,
}

impl<'a> Decoding<'a> {
    /// Reads the header (the format guessed from the bytes). `Err` when the
    /// bytes are no image this server decodes (PNG, JPEG, WebP) or would
    /// decode to more than [`DECODE_LIMIT`].
    pub fn open<R: BufRead + Seek + 'a>(source: R) -> Result<Decoding<'a>, String> {
        let mut reader = ImageReader::new(source).with_guessed_format().map_err(|e| format!("cannot read the file: {e}"))?;
        if reader.format().is_none() {
            return Err("the file is not a PNG, JPEG or WebP image".into());
        }
        let mut limits = image::Limits::default();
        limits.max_alloc = Some(DECODE_LIMIT);
        reader.limits(limits);
        let decoder = reader.into_decoder().map_err(|e| format!("not a readable image: {e}"))?;
        if decoder.total_bytes() > DECODE_LIMIT {
            let (w, h) = decoder.dimensions();
            return Err(format!("a {w}×{h} image is larger than this server converts ({} MiB decoded)", DECODE_LIMIT >> 20));
        }
        Ok(Decoding { decoder: Box::new(decoder) })
    }

    /// The bytes a conversion holds at most: the decoded image, an 8-bit
    /// RGBA copy of it and the encoded result (no larger than that copy
    /// for the formats written here, plus headers).
    pub fn memory(&self) -> u64 {
        let (w, h) = self.decoder.dimensions();
        let rgba = u64::from(w) * u64::from(h) * 4;
        self.decoder.total_bytes() + 2 * rgba + (64 << 10)
    }

    /// Decodes and converts.
    pub fn convert(self, conversion: Conversion) -> Result<Converted, String> {
        let image = DynamicImage::from_decoder(self.decoder).map_err(|e| format!("cannot decode the image: {e}"))?;
        let (w, h) = (image.width(), image.height());
        let mut out = Cursor::new(Vec::new());
        let encoded = match conversion {
            Conversion::Preview { format: PreviewFormat::Jpeg, quality, .. } => {
                let rgb = image.into_rgb8();
                image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality.max(1)).write_image(&rgb, w, h, ExtendedColorType::Rgb8)
            }
            Conversion::Preview { format: PreviewFormat::Webp, opaque, .. } => {
                let encoder = image::codecs::webp::WebPEncoder::new_lossless(&mut out);
                if opaque || !image.color().has_alpha() {
                    encoder.write_image(&image.into_rgb8(), w, h, ExtendedColorType::Rgb8)
                } else {
                    encoder.write_image(&image.into_rgba8(), w, h, ExtendedColorType::Rgba8)
                }
            }
            Conversion::Rgb => png(&mut out).write_image(&image.into_rgb8(), w, h, ExtendedColorType::Rgb8),
            Conversion::Alpha => {
                let alpha = image.color().has_alpha();
                let mut rgba = image.into_rgba8();
                for px in rgba.pixels_mut() {
                    *px = image::Rgba([0, 0, 0, if alpha { px[3] } else { 255 }]);
                }
                png(&mut out).write_image(&rgba, w, h, ExtendedColorType::Rgba8)
            }
        };
        encoded.map_err(|e| format!("cannot encode the image: {e}"))?;
        let content_type = match conversion {
            Conversion::Preview { format: PreviewFormat::Jpeg, .. } => "image/jpeg",
            Conversion::Preview { format: PreviewFormat::Webp, .. } => "image/webp",
            Conversion::Rgb | Conversion::Alpha => "image/png",
        };
        Ok(Converted { bytes: out.into_inner(), content_type })
    }
}

fn png(out: &mut Cursor<Vec<u8>>) -> image::codecs::png::PngEncoder<&mut Cursor<Vec<u8>>> {
    image::codecs::png::PngEncoder::new_with_quality(out, image::codecs::png::CompressionType::Fast, image::codecs::png::FilterType::Adaptive)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png_of(w: u32, h: u32, color: ExtendedColorType, pixels: &[u8]) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        image::codecs::png::PngEncoder::new(&mut out).write_image(pixels, w, h, color).unwrap();
        out.into_inner()
    }

    fn convert(bytes: &[u8], conversion: Conversion) -> Converted {
        Decoding::open(Cursor::new(bytes)).unwrap().convert(conversion).unwrap()
    }

    #[test]
    fn requests_read_as_comfyui_reads_them() {
        use PreviewFormat::*;
        let p = |preview, channel| Conversion::parse(preview, channel);
        assert_eq!(p(None, None), None);
        assert_eq!(p(None, Some("rgba")), None);
        assert_eq!(p(None, Some("bogus")), None);
        assert_eq!(p(None, Some("rgb")), Some(Conversion::Rgb));
        assert_eq!(p(None, Some("a")), Some(Conversion::Alpha));
        assert_eq!(p(Some("webp;50"), None), Some(Conversion::Preview { format: Webp, quality: 50, opaque: false }));
        assert_eq!(p(Some("jpeg;50"), None), Some(Conversion::Preview { format: Jpeg, quality: 50, opaque: true }));
        assert_eq!(p(Some("jpeg"), None), Some(Conversion::Preview { format: Jpeg, quality: 90, opaque: true }));
        assert_eq!(p(Some("gif;10"), None), Some(Conversion::Preview { format: Webp, quality: 10, opaque: false }));
        assert_eq!(p(Some("jpeg;50"), Some("a")), Some(Conversion::Preview { format: Webp, quality: 50, opaque: false }));
        assert_eq!(p(Some("jpeg;50"), Some("rgba")), Some(Conversion::Preview { format: Webp, quality: 50, opaque: false }));
        assert_eq!(p(Some("webp"), Some("rgb")), Some(Conversion::Preview { format: Webp, quality: 90, opaque: true }));
        assert_eq!(p(Some("jpeg;x"), None), Some(Conversion::Preview { format: Jpeg, quality: 90, opaque: true }));
        assert_eq!(p(Some("jpeg;999999999999"), None), Some(Conversion::Preview { format: Jpeg, quality: 100, opaque: true }));
    }

    #[test]
    fn conversions_keep_the_pixels_they_promise() {
        // 2×1 RGBA: a half-transparent red and an opaque blue.
        let source = png_of(2, 1, ExtendedColorType::Rgba8, &[255, 0, 0, 128, 0, 0, 255, 255]);
        let rgb = convert(&source, Conversion::Rgb);
        assert_eq!(rgb.content_type, "image/png");
        let decoded = image::load_from_memory(&rgb.bytes).unwrap();
        assert!(!decoded.color().has_alpha());
        assert_eq!(decoded.into_rgb8().into_raw(), vec![255, 0, 0, 0, 0, 255]);

        let alpha = image::load_from_memory(&convert(&source, Conversion::Alpha).bytes).unwrap();
        assert_eq!(alpha.into_rgba8().into_raw(), vec![0, 0, 0, 128, 0, 0, 0, 255]);
        let opaque = png_of(1, 1, ExtendedColorType::Rgb8, &[9, 9, 9]);
        let alpha = image::load_from_memory(&convert(&opaque, Conversion::Alpha).bytes).unwrap();
        assert_eq!(alpha.into_rgba8().into_raw(), vec![0, 0, 0, 255]);

        let webp = convert(&source, Conversion::Preview { format: PreviewFormat::Webp, quality: 90, opaque: false });
        assert_eq!(webp.content_type, "image/webp");
        assert_eq!(image::guess_format(&webp.bytes).unwrap(), image::ImageFormat::WebP);
        // Lossless: the very pixels, alpha included.
        assert_eq!(image::load_from_memory(&webp.bytes).unwrap().into_rgba8().into_raw(), vec![255, 0, 0, 128, 0, 0, 255, 255]);

        let jpeg = convert(&source, Conversion::Preview { format: PreviewFormat::Jpeg, quality: 50, opaque: true });
        assert_eq!(jpeg.content_type, "image/jpeg");
        assert_eq!(image::guess_format(&jpeg.bytes).unwrap(), image::ImageFormat::Jpeg);
        assert!(!image::load_from_memory(&jpeg.bytes).unwrap().color().has_alpha());
    }

    #[test]
    fn what_cannot_be_converted_is_refused_before_decoding() {
        assert!(Decoding::open(Cursor::new(b"not an image at all".to_vec())).is_err());
        // A valid header claiming 20000×20000 RGBA (1.6 GB decoded).
        let mut huge = png_of(1, 1, ExtendedColorType::Rgba8, &[0, 0, 0, 0]);
        huge[16..20].copy_from_slice(&20_000u32.to_be_bytes());
        huge[20..24].copy_from_slice(&20_000u32.to_be_bytes());
        let crc = crc32(&huge[12..29]);
        huge[29..33].copy_from_slice(&crc.to_be_bytes());
        let err = Decoding::open(Cursor::new(huge)).err().unwrap();
        assert!(err.contains("20000×20000") || err.contains("limit"), "{err}");
        let small = png_of(64, 64, ExtendedColorType::Rgba8, &[7; 64 * 64 * 4]);
        let memory = Decoding::open(Cursor::new(small)).unwrap().memory();
        assert!((3 * 64 * 64 * 4..=3 * 64 * 64 * 4 + (64 << 10)).contains(&memory), "{memory}");
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0xEDB8_8320 } else { crc >> 1 };
            }
        }
        !crc
    }
}
