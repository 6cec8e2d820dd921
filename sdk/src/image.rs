//! CPU copies of IMAGE and MASK tensors, in ComfyUI's layout.

/// An IMAGE on the CPU: `batch × height × width × channels` f32 values in 0..1,
/// channels last (3 = RGB, 4 = RGBA).
#[derive(Clone, Debug, PartialEq)]
pub struct Image {
    /// Number of images in the batch.
    pub batch: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Channels per pixel.
    pub channels: usize,
    /// Row-major values, `((b·H + y)·W + x)·C + c`.
    pub data: Vec<f32>,
}

impl Image {
    /// An image batch filled with `value`.
    pub fn filled(batch: usize, height: usize, width: usize, channels: usize, value: f32) -> Image {
        Image { batch, height, width, channels, data: vec![value; batch * height * width * channels] }
    }
    /// Wraps `data`; `None` if its length does not match the dimensions.
    pub fn from_vec(batch: usize, height: usize, width: usize, channels: usize, data: Vec<f32>) -> Option<Image> {
        (data.len() == batch * height * width * channels).then_some(Image { batch, height, width, channels, data })
    }
    /// Index of element (b, y, x, c).
    #[inline]
    pub fn index(&self, b: usize, y: usize, x: usize, c: usize) -> usize {
        ((b * self.height + y) * self.width + x) * self.channels + c
    }
    /// Element (b, y, x, c).
    #[inline]
    pub fn get(&self, b: usize, y: usize, x: usize, c: usize) -> f32 {
        self.data[self.index(b, y, x, c)]
    }
    /// Values of one image of the batch.
    pub fn frame(&self, b: usize) -> &[f32] {
        let n = self.height * self.width * self.channels;
        &self.data[b * n..(b + 1) * n]
    }
    /// The shape as the host stores it.
    pub fn shape(&self) -> [usize; 4] {
        [self.batch, self.height, self.width, self.channels]
    }
}

/// A MASK on the CPU: `batch × height × width` f32 values in 0..1.
#[derive(Clone, Debug, PartialEq)]
pub struct Mask {
    /// Number of masks in the batch.
    pub batch: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// Row-major values, `(b·H + y)·W + x`.
    pub data: Vec<f32>,
}

impl Mask {
    /// A mask batch filled with `value`.
    pub fn filled(batch: usize, height: usize, width: usize, value: f32) -> Mask {
        Mask { batch, height, width, data: vec![value; batch * height * width] }
    }
    /// Wraps `data`; `None` if its length does not match the dimensions.
    pub fn from_vec(batch: usize, height: usize, width: usize, data: Vec<f32>) -> Option<Mask> {
        (data.len() == batch * height * width).then_some(Mask { batch, height, width, data })
    }
    /// Index of element (b, y, x).
    #[inline]
    pub fn index(&self, b: usize, y: usize, x: usize) -> usize {
        (b * self.height + y) * self.width + x
    }
    /// Element (b, y, x).
    #[inline]
    pub fn get(&self, b: usize, y: usize, x: usize) -> f32 {
        self.data[self.index(b, y, x)]
    }
    /// The shape as the host stores it.
    pub fn shape(&self) -> [usize; 3] {
        [self.batch, self.height, self.width]
    }
}
