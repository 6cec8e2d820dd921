#!/usr/bin/env python3
"""Independent parity oracle for kiln's core image nodes.

Writes ``tests/fixtures/parity/<ClassType>.json`` (run from the repository root:
``python3 tests/parity/generate.py``). Every case gives a node's inputs and the
outputs ComfyUI computes for them, re-derived here from ComfyUI's formulas
(the compatibility protocol spec, sections 5.4, 6.1b, 6.2; edge details
checked against ComfyUI's public node source) and written independently of it.

Dependencies: numpy, Pillow (what ComfyUI itself uses for lanczos resizing and
ImageQuantize) and torch (``F.interpolate``, ``F.pad(mode="reflect")`` +
``conv2d``, ``rot90`` -- the calls ComfyUI makes). Install them into a venv
outside the repository, e.g.
``python3 -m venv ~/.cache/kiln-parity-venv && ~/.cache/kiln-parity-venv/bin/pip
install numpy pillow torch`` (PyTorch's CPU-only wheel
index gives a much smaller install where it is reachable). Optional cross-checks, used when importable: scipy
(GrowMask against ``scipy.ndimage.grey_dilation``/``grey_erosion``, which
ComfyUI calls) and OpenCV (bilinear/bicubic against ``cv2.resize``, blur and
sharpen against ``cv2.filter2D`` with BORDER_REFLECT_101).

Every torch call is also re-derived in numpy from the formulas below; the two
must agree to 1e-5 (asserted), and the numpy version stands in when torch is
not installed (the fixtures then differ at most in the 6th decimal):

* ``interpolate(mode="nearest-exact")``: ``src = min(floor((dst + 0.5) * scale),
  in - 1)`` with ``scale = float32(in) / out`` and the product done in float32
  (this is what makes 14 -> 23 map output 11 to source 6, not 7).
* ``bilinear``, ``align_corners=False``: ``src = scale * (dst + 0.5) - 0.5`` in
  float32, clamped at 0; ``i0 = floor(src)``, ``i1 = i0 + 1`` clamped to the last
  index, ``w1 = min(src - i0, 1)``; separable.
* ``bicubic``, ``align_corners=False``: same source index without the clamp,
  ``i = min(floor(src), in - 1)``, ``t = clamp(src - i, 0, 1)``, Keys kernel with
  ``A = -0.75``, taps ``i-1 .. i+2`` clamped to the image (replicate border);
  no clamping of the result.
* ``area``: ``adaptive_avg_pool2d``: output cell i averages input
  ``[floor(i*in/out), ceil((i+1)*in/out))`` in each axis.
* ``F.pad(mode="reflect")`` = numpy ``pad(mode="reflect")`` (mirror without
  repeating the edge); ``conv2d`` is a cross-correlation (kernels here are
  symmetric anyway).
* ``rot90(k, dims=[2, 1])`` = ``numpy.rot90(k, axes=(2, 1))``: "90 degrees" is a
  clockwise turn on screen, ``new[y][x] = old[H-1-x][y]``.
* ``torch.round`` rounds half to even (``numpy.round`` does too); Python's
  ``round()`` (used by ComfyUI for target sizes) is also half-to-even.
* comparisons of a float32 tensor with a Python float (ThresholdMask) happen in
  float32.

Float inputs are written with the shortest decimal that reads back (via f64,
then cast to f32, as kiln's test does) as the exact float32 value; outputs are
rounded to 6 decimals.
"""

import json
import math
import os
import sys

import numpy as np
from PIL import Image

try:  # computes interpolate / conv2d / rot90 when installed (numpy stands in otherwise)
    import torch
    import torch.nn.functional as TF

    torch.set_num_threads(1)  # deterministic reductions
except Exception:  # pragma: no cover
    torch = None
try:
    import scipy.ndimage as ndi
except Exception:  # pragma: no cover
    ndi = None
try:  # OpenCV's INTER_LINEAR / INTER_CUBIC use the same half-pixel mapping, A=-0.75, replicate border
    import cv2
except Exception:  # pragma: no cover
    cv2 = None

F32 = np.float32
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT_DIR = os.path.join(ROOT, "tests", "fixtures", "parity")
OBJECT_INFO = os.environ.get("KILN_OBJECT_INFO", os.path.join(ROOT, "tests", "fixtures", "comfyui", "object_info-core.json"))

TOL_PIXEL = 1.0 / 255.0
TOL_RESAMPLE = 2.0 / 255.0

CHECKS = {"torch": 0, "scipy": 0, "opencv": 0}


# ---------------------------------------------------------------- inputs


class T:
    """A tensor value; `exact` inputs are written losslessly, outputs rounded."""

    def __init__(self, array, exact):
        self.a = np.ascontiguousarray(np.asarray(array, dtype=F32))
        self.exact = exact


def image(seed, b, h, w, c=3, levels=None):
    """A deterministic 8-bit-like image in [0, 1] (multiples of 1/255)."""
    rng = np.random.default_rng(seed)
    if levels is None:
        q = rng.integers(0, 256, size=(b, h, w, c))
    else:
        q = rng.choice(np.asarray(levels), size=(b, h, w, c))
    return q.astype(F32) / F32(255)


def smooth_image(seed, b, h, w):
    """Gradients plus a little noise, quantized to 8 bits: many close colours, like a photo."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w] / max(h, w)
    out = []
    for _ in range(b):
        ph = rng.random(3) * 6
        img = np.stack([np.sin(3 * x + ph[0]), np.cos(4 * y + 2 * x + ph[1]), np.sin(2 * x * y + ph[2])], -1) * 0.5 + 0.5
        img = img + rng.normal(0, 0.04, img.shape)
        out.append(np.clip(np.round(img * 255), 0, 255))
    return (np.stack(out) / 255).astype(F32)


def palette_image(seed, b, h, w, colors):
    """An RGB image whose pixels are drawn from a few (r, g, b) byte colours."""
    rng = np.random.default_rng(seed)
    pal = np.asarray(colors, dtype=np.int64)
    idx = rng.integers(0, len(pal), size=(b, h, w))
    return pal[idx].astype(F32) / F32(255)


def mask(seed, b, h, w, levels=None):
    rng = np.random.default_rng(seed)
    if levels is None:
        q = rng.integers(0, 256, size=(b, h, w))
        return q.astype(F32) / F32(255)
    return rng.choice(np.asarray(levels, dtype=F32), size=(b, h, w)).astype(F32)


# ---------------------------------------------------------------- torch semantics in numpy


def _lin_src(in_size, out_size, cubic):
    scale = F32(in_size) / F32(out_size)
    d = np.arange(out_size, dtype=F32)
    src = (scale * (d + F32(0.5)) - F32(0.5)).astype(F32)
    if not cubic:
        src = np.maximum(src, F32(0))
    return src


def _axis_take(x, idx, w, axis):
    """sum_k w[k][o] * x.take(idx[k][o], axis) -- a 1-D resampling along `axis`."""
    out = None
    for k in range(len(idx)):
        part = np.take(x, idx[k], axis=axis).astype(np.float64)
        shape = [1] * x.ndim
        shape[axis] = -1
        part = part * np.asarray(w[k], dtype=np.float64).reshape(shape)
        out = part if out is None else out + part
    return out


def _nearest_exact_idx(in_size, out_size):
    scale = F32(in_size) / F32(out_size)
    d = np.arange(out_size, dtype=F32)
    prod = ((d + F32(0.5)) * scale).astype(F32)
    return np.minimum(np.floor(prod).astype(np.int64), in_size - 1)


def _linear_weights(in_size, out_size):
    src = _lin_src(in_size, out_size, cubic=False)
    i0 = np.floor(src).astype(np.int64)
    lam = np.minimum(src - i0.astype(F32), F32(1)).astype(F32)
    i1 = i0 + (i0 < in_size - 1).astype(np.int64)
    return [i0, i1], [F32(1) - lam, lam]


def _cubic_coeffs(t, A=-0.75):
    t = t.astype(np.float64)

    def c1(x):
        return ((A + 2) * x - (A + 3)) * x * x + 1

    def c2(x):
        return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A

    return [c2(t + 1.0), c1(t), c1(1.0 - t), c2(2.0 - t)]


def _cubic_weights(in_size, out_size):
    src = _lin_src(in_size, out_size, cubic=True)
    i = np.minimum(np.floor(src).astype(np.int64), in_size - 1)
    t = np.clip(src - i.astype(F32), F32(0), F32(1)).astype(F32)
    w = _cubic_coeffs(t)
    idx = [np.clip(i - 1 + j, 0, in_size - 1) for j in range(4)]
    return idx, w


def _area_matrix(in_size, out_size):
    m = np.zeros((out_size, in_size), dtype=np.float64)
    for o in range(out_size):
        s = (o * in_size) // out_size
        e = ((o + 1) * in_size + out_size - 1) // out_size
        m[o, s:e] = 1.0 / (e - s)
    return m


def interpolate_numpy(x, oh, ow, mode):
    """torch.nn.functional.interpolate(x [B,C,H,W], size=(oh, ow), mode) re-derived in numpy."""
    x = np.asarray(x, dtype=F32)
    ih, iw = x.shape[-2], x.shape[-1]
    if mode == "nearest-exact":
        out = x[..., _nearest_exact_idx(ih, oh), :][..., _nearest_exact_idx(iw, ow)]
    elif mode == "bilinear":
        idx, w = _linear_weights(ih, oh)
        y = _axis_take(x, idx, w, axis=x.ndim - 2)
        idx, w = _linear_weights(iw, ow)
        out = _axis_take(y, idx, w, axis=x.ndim - 1)
    elif mode == "bicubic":
        idx, w = _cubic_weights(ih, oh)
        y = _axis_take(x, idx, w, axis=x.ndim - 2)
        idx, w = _cubic_weights(iw, ow)
        out = _axis_take(y, idx, w, axis=x.ndim - 1)
    elif mode == "area":
        mh, mw = _area_matrix(ih, oh), _area_matrix(iw, ow)
        out = np.einsum("oh,...hw,pw->...op", mh, x.astype(np.float64), mw)
    else:
        raise ValueError(mode)
    return np.asarray(out, dtype=F32)


def interpolate(x, oh, ow, mode):
    """torch.nn.functional.interpolate(x [B,C,H,W], size=(oh, ow), mode), as ComfyUI calls it
    (antialias off; align_corners=False for bilinear/bicubic; "area" is adaptive average pooling).

    torch computes the result when it is installed; the numpy re-derivation must agree with it
    (and with OpenCV for bilinear/bicubic), and stands in for it when torch is missing."""
    x = np.asarray(x, dtype=F32)
    ours = interpolate_numpy(x, oh, ow, mode)
    if cv2 is not None and mode in ("bilinear", "bicubic"):
        flag = cv2.INTER_LINEAR if mode == "bilinear" else cv2.INTER_CUBIC
        for idx in np.ndindex(*x.shape[:-2]):
            ref = cv2.resize(np.ascontiguousarray(x[idx]), (ow, oh), interpolation=flag)
            assert np.abs(ref - ours[idx]).max() < 1e-5, ("opencv mismatch", mode, x.shape, oh, ow)
        CHECKS["opencv"] += 1
    if torch is None:
        return ours
    out = TF.interpolate(torch.from_numpy(np.ascontiguousarray(x)), size=(oh, ow), mode=mode).numpy()
    assert np.abs(out - ours).max() < 1e-5, ("torch/numpy mismatch", mode, x.shape, oh, ow)
    CHECKS["torch"] += 1
    return np.asarray(out, dtype=F32)


def to_u8_trunc(x):
    """ComfyUI's float -> uint8: np.clip(255. * x, 0, 255).astype(uint8) (truncation, f32)."""
    return np.clip(F32(255.0) * np.asarray(x, dtype=F32), 0, 255).astype(np.uint8)


def lanczos(samples, width, height):
    """comfy.utils.lanczos: PIL LANCZOS on truncated 8-bit data (RGBA goes premultiplied in PIL)."""
    out = []
    for im in samples:  # [C,H,W]
        hwc = np.moveaxis(im, 0, -1)
        if hwc.shape[-1] == 1:
            hwc = hwc[..., 0]
        pil = Image.fromarray(to_u8_trunc(hwc))
        pil = pil.resize((width, height), resample=Image.Resampling.LANCZOS)
        arr = np.asarray(pil).astype(F32) / F32(255.0)
        if arr.ndim == 2:
            arr = arr[..., None]
        out.append(np.moveaxis(arr, -1, 0))
    return np.stack(out).astype(F32)


def common_upscale(samples, width, height, method, crop):
    """comfy.utils.common_upscale on [B,C,H,W]."""
    if crop == "center":
        ow, oh = samples.shape[3], samples.shape[2]
        old_aspect = ow / oh
        new_aspect = width / height
        x = y = 0
        if old_aspect > new_aspect:
            x = round((ow - ow * (new_aspect / old_aspect)) / 2)
        elif old_aspect < new_aspect:
            y = round((oh - oh * (old_aspect / new_aspect)) / 2)
        s = samples[:, :, y:oh - y, x:ow - x]
    else:
        s = samples
    if method == "lanczos":
        return lanczos(s, width, height)
    return interpolate(s, height, width, method)


def nchw(x):
    return np.moveaxis(np.asarray(x, dtype=F32), -1, 1)


def nhwc(x):
    return np.moveaxis(np.asarray(x, dtype=F32), 1, -1)


def torch_linspace(start, end, steps):
    start, end = F32(start), F32(end)
    step = F32((end - start) / F32(steps - 1))
    out = np.empty(steps, dtype=F32)
    half = steps // 2
    for i in range(steps):
        out[i] = start + step * F32(i) if i < half else end - step * F32(steps - i - 1)
    return out


def gaussian_kernel(size, sigma):
    ls = torch_linspace(-1, 1, size)
    x, y = np.meshgrid(ls, ls, indexing="ij")
    d = np.sqrt(x * x + y * y).astype(F32)
    g = np.exp(-(d * d) / F32(2.0 * sigma * sigma)).astype(F32)
    return (g / g.sum(dtype=F32)).astype(F32)


def conv_reflect(img_bhwc, kernel, r):
    """Depthwise: F.pad(reflect, r) then conv2d(kernel) per channel, as ComfyUI's blur and sharpen
    do. torch computes it when installed; the numpy (float64) sum must agree with it, and with
    OpenCV's filter2D (BORDER_REFLECT_101 is torch's "reflect")."""
    x = nchw(img_bhwc).astype(np.float64)
    p = np.pad(x, ((0, 0), (0, 0), (r, r), (r, r)), mode="reflect")
    h, w = x.shape[2], x.shape[3]
    ours = np.zeros_like(x)
    k = kernel.astype(np.float64)
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            ours += k[dy, dx] * p[:, :, dy:dy + h, dx:dx + w]
    ours = ours.astype(F32)
    if cv2 is not None:
        xs = nchw(img_bhwc)
        for idx in np.ndindex(*xs.shape[:2]):
            ref = cv2.filter2D(np.ascontiguousarray(xs[idx]), -1, kernel, borderType=cv2.BORDER_REFLECT_101)
            assert np.abs(ref - ours[idx]).max() < 1e-5, "opencv filter2D mismatch"
        CHECKS["opencv"] += 1
    if torch is None:
        return nhwc(ours)
    c = x.shape[1]
    tk = torch.from_numpy(np.ascontiguousarray(kernel, dtype=F32)).repeat(c, 1, 1).unsqueeze(1)
    ti = TF.pad(torch.from_numpy(np.ascontiguousarray(nchw(img_bhwc))), (r, r, r, r), "reflect")
    out = TF.conv2d(ti, tk, groups=c).numpy()
    assert out.shape == ours.shape and np.abs(out - ours).max() < 1e-5, "torch/numpy conv mismatch"
    CHECKS["torch"] += 1
    return nhwc(out)


def repeat_to_batch_size(t, n):
    if t.shape[0] > n:
        return t[:n]
    if t.shape[0] < n:
        reps = [math.ceil(n / t.shape[0])] + [1] * (t.ndim - 1)
        return np.tile(t, reps)[:n]
    return t


def alpha_fix(dst, src):
    """node_helpers.image_alpha_fix as the spec states it: src follows dst's channel count."""
    if dst.shape[-1] < src.shape[-1]:
        src = src[..., :dst.shape[-1]]
    elif dst.shape[-1] > src.shape[-1]:
        src = np.concatenate([src, np.ones(src.shape[:-1] + (1,), dtype=F32)], axis=-1)
    return dst, src


# ---------------------------------------------------------------- nodes


def n_image_scale(image, upscale_method, width, height, crop):
    if width == 0 and height == 0:
        return [image]
    s = nchw(image)
    if width == 0:
        width = max(1, round(s.shape[3] * height / s.shape[2]))
    elif height == 0:
        height = max(1, round(s.shape[2] * width / s.shape[3]))
    return [nhwc(common_upscale(s, width, height, upscale_method, crop))]


def n_image_scale_by(image, upscale_method, scale_by):
    s = nchw(image)
    width = round(s.shape[3] * scale_by)
    height = round(s.shape[2] * scale_by)
    return [nhwc(common_upscale(s, width, height, upscale_method, "disabled"))]


def n_image_scale_total(image, upscale_method, megapixels, resolution_steps):
    s = nchw(image)
    total = megapixels * 1024 * 1024
    scale_by = math.sqrt(total / (s.shape[3] * s.shape[2]))
    width = round(s.shape[3] * scale_by / resolution_steps) * resolution_steps
    height = round(s.shape[2] * scale_by / resolution_steps) * resolution_steps
    return [nhwc(common_upscale(s, int(width), int(height), upscale_method, "disabled"))]


def n_invert(image):
    return [F32(1.0) - image]


def n_empty_image(width, height, batch_size, color):
    rgb = [((color >> 16) & 0xFF) / 0xFF, ((color >> 8) & 0xFF) / 0xFF, (color & 0xFF) / 0xFF]
    out = np.empty((batch_size, height, width, 3), dtype=F32)
    out[...] = np.asarray(rgb, dtype=F32)
    return [out]


def n_image_batch(image1, image2):
    if image1.shape[-1] != image2.shape[-1]:
        if image1.shape[-1] > image2.shape[-1]:
            image2 = np.concatenate([image2, np.ones(image2.shape[:-1] + (1,), F32)], -1)
        else:
            image1 = np.concatenate([image1, np.ones(image1.shape[:-1] + (1,), F32)], -1)
    if image1.shape[1:] != image2.shape[1:]:
        image2 = nhwc(common_upscale(nchw(image2), image1.shape[2], image1.shape[1], "bilinear", "center"))
    return [np.concatenate([image1, image2], 0)]


def n_pad_outpaint(image, left, top, right, bottom, feathering):
    b, h, w, c = image.shape
    new = np.full((b, h + top + bottom, w + left + right, c), 0.5, dtype=F32)
    new[:, top:top + h, left:left + w, :] = image
    m = np.ones((h + top + bottom, w + left + right), dtype=F32)
    t = np.zeros((h, w), dtype=F32)
    if feathering > 0 and feathering * 2 < h and feathering * 2 < w:
        for i in range(h):
            for j in range(w):
                dt = i if top != 0 else h
                db = h - i if bottom != 0 else h
                dl = j if left != 0 else w
                dr = w - j if right != 0 else w
                d = min(dt, db, dl, dr)
                if d >= feathering:
                    continue
                v = (feathering - d) / feathering
                t[i, j] = v * v
    m[top:top + h, left:left + w] = t
    return [new, m[None]]


def n_image_crop(image, width, height, x, y):
    x = min(x, image.shape[2] - 1)
    y = min(y, image.shape[1] - 1)
    return [image[:, y:y + height, x:x + width, :]]


def _g(x):
    return np.where(x <= 0.25, ((16 * x - 12) * x + 4) * x, np.sqrt(np.maximum(x, 0)))


def n_image_blend(image1, image2, blend_factor, blend_mode):
    image1, image2 = alpha_fix(image1, image2)
    if image1.shape != image2.shape:
        image2 = nhwc(common_upscale(nchw(image2), image1.shape[2], image1.shape[1], "bicubic", "center"))
    i1, i2 = image1.astype(F32), image2.astype(F32)
    one = F32(1)
    if blend_mode == "normal":
        bl = i2
    elif blend_mode == "multiply":
        bl = i1 * i2
    elif blend_mode == "screen":
        bl = one - (one - i1) * (one - i2)
    elif blend_mode == "overlay":
        bl = np.where(i1 <= 0.5, 2 * i1 * i2, one - 2 * (one - i1) * (one - i2))
    elif blend_mode == "soft_light":
        bl = np.where(i2 <= 0.5, i1 - (one - 2 * i2) * i1 * (one - i1), i1 + (2 * i2 - one) * (_g(i1) - i1))
    elif blend_mode == "difference":
        bl = i1 - i2
    else:
        raise ValueError(blend_mode)
    f = F32(blend_factor)
    out = i1 * (one - f) + bl.astype(F32) * f
    return [np.clip(out, 0, 1).astype(F32)]


def n_blur(image, blur_radius, sigma):
    k = gaussian_kernel(2 * blur_radius + 1, sigma)
    return [conv_reflect(image, k, blur_radius)]


def n_sharpen(image, sharpen_radius, sigma, alpha):
    size = 2 * sharpen_radius + 1
    k = (gaussian_kernel(size, sigma) * F32(-(alpha * 10))).astype(F32)
    c = size // 2
    k[c, c] = k[c, c] - k.sum(dtype=F32) + F32(1.0)
    return [np.clip(conv_reflect(image, k, sharpen_radius), 0, 1).astype(F32)]


def n_quantize(image, colors, dither):
    out = np.zeros_like(image)
    for b in range(image.shape[0]):
        arr = (image[b] * F32(255)).astype(np.uint8)  # torch .to(uint8): truncation
        im = Image.fromarray(arr, mode="RGB")
        pal = im.quantize(colors=colors)
        if dither == "none":
            q = im.quantize(palette=pal, dither=Image.Dither.NONE)
        elif dither == "floyd-steinberg":
            q = im.quantize(palette=pal, dither=Image.Dither.FLOYDSTEINBERG)
        else:
            order = int(dither.split("-")[-1])
            q = _bayer(im, pal, order)
        out[b] = np.asarray(q.convert("RGB")).astype(F32) / F32(255)
    return [out]


def _bayer(im, pal_im, order):
    def nbm(n):
        if n == 0:
            return np.zeros((1, 1), "float32")
        q = 4 ** n
        m = q * nbm(n - 1)
        return np.block([[m - 1.5, m + 0.5], [m + 1.5, m - 0.5]]) / q

    num_colors = len(pal_im.getpalette()) // 3
    spread = 2 * 256 / num_colors
    bm = spread * nbm(int(math.log2(order))) + 0.5  # float64, like torch.from_numpy of it
    res = np.asarray(im).astype(np.float32)
    th = math.ceil(res.shape[0] / bm.shape[0])
    tw = math.ceil(res.shape[1] / bm.shape[1])
    tiled = np.tile(bm, (th, tw))[:res.shape[0], :res.shape[1], None]
    res = np.clip(res + tiled, 0, 255).astype(np.uint8)
    return Image.fromarray(res).quantize(palette=pal_im, dither=Image.Dither.NONE)


def n_composite_masked(destination, source, x, y, resize_source, mask=None):
    destination, source = alpha_fix(destination, source)
    dst = nchw(destination).copy()
    src = nchw(source)
    if resize_source:
        src = interpolate(src, dst.shape[2], dst.shape[3], "bilinear")
    src = repeat_to_batch_size(src, dst.shape[0])
    x = max(-src.shape[3], min(x, dst.shape[3]))
    y = max(-src.shape[2], min(y, dst.shape[2]))
    left, top = x, y
    right, bottom = left + src.shape[3], top + src.shape[2]
    if mask is None:
        m = np.ones_like(src)
    else:
        m = interpolate(mask.reshape((-1, 1) + mask.shape[-2:]), src.shape[2], src.shape[3], "bilinear")
        m = repeat_to_batch_size(m, src.shape[0])
    vw = dst.shape[3] - left + min(0, x)
    vh = dst.shape[2] - top + min(0, y)
    m = m[:, :, :vh, :vw]
    region = dst[:, :, top:bottom, left:right]
    dst[:, :, top:bottom, left:right] = m * src[:, :, :vh, :vw] + (F32(1) - m) * region
    return [nhwc(dst)]


def n_image_to_mask(image, channel):
    return [image[..., ["red", "green", "blue", "alpha"].index(channel)]]


def n_color_to_mask(image, color):
    t = np.round(np.clip(image, 0, 1) * F32(255)).astype(np.int64)
    packed = (t[..., 0] << 16) + (t[..., 1] << 8) + t[..., 2]
    return [(packed == color).astype(F32)]


def n_mask_to_image(mask):
    m = mask.reshape((-1,) + mask.shape[-2:])
    return [np.repeat(m[..., None], 3, axis=-1)]


def n_solid_mask(value, width, height):
    return [np.full((1, height, width), value, dtype=F32)]


def n_invert_mask(mask):
    return [F32(1.0) - mask]


def n_crop_mask(mask, x, y, width, height):
    m = mask.reshape((-1,) + mask.shape[-2:])
    return [m[:, y:y + height, x:x + width]]


def n_mask_composite(destination, source, x, y, operation):
    out = destination.reshape((-1,) + destination.shape[-2:]).copy()
    src = source.reshape((-1,) + source.shape[-2:])
    left, top = x, y
    right = min(left + src.shape[-1], out.shape[-1])
    bottom = min(top + src.shape[-2], out.shape[-2])
    sp = src[:, :bottom - top, :right - left]
    dp = out[:, top:bottom, left:right]
    if operation == "multiply":
        r = dp * sp
    elif operation == "add":
        r = dp + sp
    elif operation == "subtract":
        r = dp - sp
    else:
        a, b = np.round(dp) != 0, np.round(sp) != 0  # torch.round: half to even
        r = {"and": a & b, "or": a | b, "xor": a ^ b}[operation].astype(F32)
    out[:, top:bottom, left:right] = r
    return [np.clip(out, 0, 1).astype(F32)]


def n_feather_mask(mask, left, top, right, bottom):
    out = mask.reshape((-1,) + mask.shape[-2:]).copy()
    h, w = out.shape[-2], out.shape[-1]
    left, right = min(left, w), min(right, w)
    top, bottom = min(top, h), min(bottom, h)
    for x in range(left):
        out[:, :, x] *= F32((x + 1.0) / left)
    for x in range(right):  # note: -0 is column 0, so the ramp starts on the far side
        out[:, :, -x] *= F32((x + 1) / right)
    for yy in range(top):
        out[:, yy, :] *= F32((yy + 1) / top)
    for yy in range(bottom):
        out[:, -yy, :] *= F32((yy + 1) / bottom)
    return [out]


def _morph(m, kernel, dilate):
    h, w = m.shape
    fill = -np.inf if dilate else np.inf
    p = np.pad(m.astype(np.float64), 1, constant_values=fill)
    acc = np.full((h, w), fill)
    for dy in range(3):
        for dx in range(3):
            if kernel[dy][dx]:
                win = p[dy:dy + h, dx:dx + w]
                acc = np.maximum(acc, win) if dilate else np.minimum(acc, win)
    return acc.astype(F32)


def n_grow_mask(mask, expand, tapered_corners):
    c = 0 if tapered_corners else 1
    kernel = np.array([[c, 1, c], [1, 1, 1], [c, 1, c]])
    m = mask.reshape((-1,) + mask.shape[-2:])
    out = []
    for one in m:
        o = one.copy()
        r = one.copy()
        for _ in range(abs(expand)):
            o = _morph(o, kernel, expand > 0)
            if ndi is not None:
                r = ndi.grey_dilation(r, footprint=kernel) if expand > 0 else ndi.grey_erosion(r, footprint=kernel)
        if ndi is not None:
            assert np.array_equal(o, r), "scipy grey morphology mismatch"
            CHECKS["scipy"] += 1
        out.append(o)
    return [np.stack(out)]


def n_threshold_mask(mask, value):
    return [(mask > F32(value)).astype(F32)]  # float32 comparison, as torch does


def n_repeat_batch(image, amount):
    return [np.tile(image, (amount, 1, 1, 1))]


def n_from_batch(image, batch_index, length):
    n = image.shape[0]
    if batch_index < 0:
        batch_index += n
    batch_index = max(0, min(n - 1, batch_index))
    length = min(n - batch_index, length)
    return [image[batch_index:batch_index + length]]


def n_rotate(image, rotation):
    k = {"none": 0, "90 degrees": 1, "180 degrees": 2, "270 degrees": 3}[rotation]
    ours = np.rot90(image, k=k, axes=(2, 1))
    if torch is None:
        return [ours]
    out = torch.rot90(torch.from_numpy(np.ascontiguousarray(image)), k=k, dims=[2, 1]).numpy()
    assert np.array_equal(out, ours)
    CHECKS["torch"] += 1
    return [out]


def n_flip(image, flip_method):
    if flip_method.startswith("x"):
        return [image[:, ::-1]]
    return [image[:, :, ::-1]]


def n_split_alpha(image):
    rgb = image[..., :3]
    alpha = image[..., 3] if image.shape[-1] > 3 else np.ones(image.shape[:-1], F32)
    return [rgb, F32(1.0) - alpha]


def n_join_alpha(image, alpha):
    n = max(len(image), len(alpha))
    image = repeat_to_batch_size(image, n)
    alpha = repeat_to_batch_size(alpha, n)
    a = interpolate(alpha.reshape((-1, 1) + alpha.shape[-2:]), image.shape[1], image.shape[2], "bilinear")[:, 0]
    return [np.concatenate([image[..., :3], (F32(1.0) - a)[..., None]], -1)]


def n_image_size(image):
    return [int(image.shape[2]), int(image.shape[1]), int(image.shape[0])]


def n_identity(value):
    return [value]


NODES = {
    "ImageScale": n_image_scale,
    "ImageScaleBy": n_image_scale_by,
    "ImageScaleToTotalPixels": n_image_scale_total,
    "ImageInvert": n_invert,
    "EmptyImage": n_empty_image,
    "ImageBatch": n_image_batch,
    "ImagePadForOutpaint": n_pad_outpaint,
    "ImageCrop": n_image_crop,
    "ImageBlend": n_image_blend,
    "ImageBlur": n_blur,
    "ImageSharpen": n_sharpen,
    "ImageQuantize": n_quantize,
    "ImageCompositeMasked": n_composite_masked,
    "ImageToMask": n_image_to_mask,
    "ImageColorToMask": n_color_to_mask,
    "MaskToImage": n_mask_to_image,
    "SolidMask": n_solid_mask,
    "InvertMask": n_invert_mask,
    "CropMask": n_crop_mask,
    "MaskComposite": n_mask_composite,
    "FeatherMask": n_feather_mask,
    "GrowMask": n_grow_mask,
    "ThresholdMask": n_threshold_mask,
    "RepeatImageBatch": n_repeat_batch,
    "ImageFromBatch": n_from_batch,
    "ImageRotate": n_rotate,
    "ImageFlip": n_flip,
    "SplitImageWithAlpha": n_split_alpha,
    "JoinImageWithAlpha": n_join_alpha,
    "GetImageSize": n_image_size,
    "PrimitiveInt": n_identity,
    "PrimitiveFloat": n_identity,
    "PrimitiveString": n_identity,
    "PrimitiveStringMultiline": n_identity,
    "PrimitiveBoolean": n_identity,
}


# ---------------------------------------------------------------- cases

CASES = {k: [] for k in NODES}


def case(cls, name, inputs, tolerance=TOL_PIXEL):
    CASES[cls].append((name, inputs, tolerance))


def build_cases():
    I = image
    P = TOL_PIXEL
    R = TOL_RESAMPLE

    # ImageScale -- every method, crop center, zero width/height, RGBA, batch
    a = I(101, 1, 6, 8)
    case("ImageScale", "nearest_exact_up_6x8_to_11x13", dict(image=a, upscale_method="nearest-exact", width=13, height=11, crop="disabled"), R)
    case("ImageScale", "nearest_exact_f32_index_14_to_23", dict(image=I(102, 1, 3, 14), upscale_method="nearest-exact", width=23, height=4, crop="disabled"), R)
    case("ImageScale", "nearest_exact_down_batch2", dict(image=I(103, 2, 9, 12), upscale_method="nearest-exact", width=5, height=4, crop="disabled"), R)
    case("ImageScale", "bilinear_up", dict(image=a, upscale_method="bilinear", width=13, height=10, crop="disabled"), R)
    case("ImageScale", "bilinear_down", dict(image=I(104, 1, 9, 12), upscale_method="bilinear", width=5, height=4, crop="disabled"), R)
    case("ImageScale", "area_down", dict(image=I(105, 1, 9, 12), upscale_method="area", width=5, height=4, crop="disabled"), R)
    case("ImageScale", "area_up", dict(image=I(106, 1, 5, 7), upscale_method="area", width=10, height=8, crop="disabled"), R)
    case("ImageScale", "bicubic_up", dict(image=a, upscale_method="bicubic", width=11, height=9, crop="disabled"), R)
    case("ImageScale", "bicubic_down", dict(image=I(107, 1, 9, 12), upscale_method="bicubic", width=7, height=5, crop="disabled"), R)
    case("ImageScale", "lanczos_up", dict(image=a, upscale_method="lanczos", width=11, height=9, crop="disabled"), R)
    case("ImageScale", "lanczos_down", dict(image=I(108, 1, 12, 16), upscale_method="lanczos", width=7, height=5, crop="disabled"), R)
    case("ImageScale", "bilinear_crop_center_wider_source", dict(image=I(109, 1, 6, 12), upscale_method="bilinear", width=5, height=5, crop="center"), R)
    case("ImageScale", "nearest_exact_crop_center_taller_source", dict(image=I(110, 1, 12, 6), upscale_method="nearest-exact", width=8, height=4, crop="center"), R)
    case("ImageScale", "bicubic_crop_center", dict(image=I(111, 1, 9, 12), upscale_method="bicubic", width=6, height=7, crop="center"), R)
    case("ImageScale", "area_crop_center", dict(image=I(112, 1, 7, 16), upscale_method="area", width=6, height=4, crop="center"), R)
    case("ImageScale", "lanczos_crop_center", dict(image=I(113, 1, 9, 12), upscale_method="lanczos", width=5, height=6, crop="center"), R)
    case("ImageScale", "width_0_keeps_aspect", dict(image=I(114, 1, 6, 8), upscale_method="bilinear", width=0, height=9, crop="disabled"), R)
    case("ImageScale", "height_0_keeps_aspect", dict(image=I(115, 1, 6, 8), upscale_method="nearest-exact", width=5, height=0, crop="disabled"), R)
    case("ImageScale", "both_0_unchanged", dict(image=I(116, 1, 5, 7), upscale_method="bicubic", width=0, height=0, crop="disabled"), R)
    case("ImageScale", "rgba_bilinear", dict(image=I(117, 1, 6, 8, 4), upscale_method="bilinear", width=9, height=7, crop="disabled"), R)
    case("ImageScale", "rgba_bicubic_batch2", dict(image=I(118, 2, 5, 7, 4), upscale_method="bicubic", width=4, height=8, crop="disabled"), R)
    case("ImageScale", "lanczos_rgba_opaque", dict(image=np.concatenate([I(119, 1, 6, 8), np.ones((1, 6, 8, 1), F32)], -1), upscale_method="lanczos", width=10, height=5, crop="disabled"), R)
    case("ImageScale", "lanczos_down_both_16x12_to_5x4", dict(image=I(121, 1, 12, 16), upscale_method="lanczos", width=5, height=4, crop="disabled"), R)
    case("ImageScale", "lanczos_width_down_height_up", dict(image=I(122, 1, 6, 12), upscale_method="lanczos", width=7, height=9, crop="disabled"), R)
    case("ImageScale", "area_down_non_integer_rgba_batch2", dict(image=I(123, 2, 11, 13, 4), upscale_method="area", width=4, height=5, crop="disabled"), R)
    case("ImageScale", "bicubic_down_3x_clamps_taps", dict(image=I(124, 1, 12, 15), upscale_method="bicubic", width=5, height=4, crop="disabled"), R)
    case("ImageScale", "lanczos_rgba_premultiplied_by_pil", dict(image=I(120, 1, 6, 8, 4), upscale_method="lanczos", width=10, height=5, crop="disabled"), R)

    # ImageScaleBy
    case("ImageScaleBy", "bilinear_1_5", dict(image=I(130, 1, 6, 8), upscale_method="bilinear", scale_by=1.5), R)
    case("ImageScaleBy", "nearest_exact_half_rounds_half_to_even", dict(image=I(131, 1, 5, 7), upscale_method="nearest-exact", scale_by=0.5), R)
    case("ImageScaleBy", "area_0_75", dict(image=I(132, 1, 9, 12), upscale_method="area", scale_by=0.75), R)
    case("ImageScaleBy", "bicubic_2_batch2", dict(image=I(133, 2, 5, 7), upscale_method="bicubic", scale_by=2.0), R)
    case("ImageScaleBy", "lanczos_1_3", dict(image=I(134, 1, 6, 8), upscale_method="lanczos", scale_by=1.3), R)
    case("ImageScaleBy", "identity_1_0", dict(image=I(135, 1, 5, 7, 4), upscale_method="bilinear", scale_by=1.0), R)

    # ImageScaleToTotalPixels (0.01 MP minimum => ~10k pixels: binary / flat images keep files small)
    checker = I(140, 1, 5, 7, levels=[0, 255])
    case("ImageScaleToTotalPixels", "nearest_exact_0_01mp_steps1", dict(image=checker, upscale_method="nearest-exact", megapixels=0.01, resolution_steps=1), R)
    flat = np.full((1, 4, 9, 3), F32(51) / F32(255), dtype=F32)
    case("ImageScaleToTotalPixels", "area_0_01mp_steps16_flat", dict(image=flat, upscale_method="area", megapixels=0.01, resolution_steps=16), R)
    flat2 = np.full((1, 2, 3, 3), F32(204) / F32(255), dtype=F32)
    case("ImageScaleToTotalPixels", "bilinear_0_01mp_steps8_flat", dict(image=flat2, upscale_method="bilinear", megapixels=0.01, resolution_steps=8), R)
    case("ImageScaleToTotalPixels", "nearest_exact_0_01mp_steps5_binary_wide", dict(image=I(141, 1, 2, 9, levels=[0, 255]), upscale_method="nearest-exact", megapixels=0.01, resolution_steps=5), R)

    # ImageInvert
    case("ImageInvert", "rgb", dict(image=I(150, 1, 5, 7)))
    case("ImageInvert", "rgba_batch2_inverts_alpha_too", dict(image=I(151, 2, 4, 6, 4)))
    case("ImageInvert", "extremes", dict(image=I(152, 1, 3, 4, levels=[0, 255])))

    # EmptyImage
    case("EmptyImage", "black_default_color", dict(width=5, height=3, batch_size=1, color=0))
    case("EmptyImage", "packed_color", dict(width=4, height=6, batch_size=2, color=0x12AB7F))
    case("EmptyImage", "white", dict(width=3, height=2, batch_size=1, color=0xFFFFFF))
    case("EmptyImage", "pure_red", dict(width=2, height=2, batch_size=3, color=0xFF0000))

    # ImageBatch
    case("ImageBatch", "same_size", dict(image1=I(160, 1, 5, 7), image2=I(161, 2, 5, 7)))
    case("ImageBatch", "resize_bilinear_center_crop", dict(image1=I(162, 1, 6, 8), image2=I(163, 1, 9, 9)), R)
    case("ImageBatch", "rgb_plus_rgba_pads_alpha", dict(image1=I(164, 1, 5, 7), image2=I(165, 1, 5, 7, 4)))
    case("ImageBatch", "rgba_plus_rgb_resized", dict(image1=I(166, 2, 6, 8, 4), image2=I(167, 1, 4, 10)), R)

    # ImagePadForOutpaint
    case("ImagePadForOutpaint", "all_sides_feather2", dict(image=I(170, 1, 6, 8), left=2, top=1, right=3, bottom=2, feathering=2))
    case("ImagePadForOutpaint", "left_only_feather1", dict(image=I(171, 1, 5, 7), left=3, top=0, right=0, bottom=0, feathering=1))
    case("ImagePadForOutpaint", "no_feather", dict(image=I(172, 1, 5, 7), left=1, top=2, right=0, bottom=1, feathering=0))
    case("ImagePadForOutpaint", "feather_too_large_ignored", dict(image=I(173, 1, 6, 8), left=1, top=1, right=1, bottom=1, feathering=3))
    case("ImagePadForOutpaint", "step8_right_bottom_feather3", dict(image=I(174, 1, 7, 9), left=0, top=0, right=8, bottom=8, feathering=3))
    case("ImagePadForOutpaint", "rgba_batch2_alpha_filled_half", dict(image=I(175, 2, 6, 7, 4), left=1, top=0, right=2, bottom=1, feathering=2))
    case("ImagePadForOutpaint", "nothing_padded_default_feather", dict(image=I(176, 1, 5, 6), left=0, top=0, right=0, bottom=0, feathering=40))

    # ImageCrop
    case("ImageCrop", "inside", dict(image=I(180, 1, 6, 8), width=3, height=2, x=2, y=1))
    case("ImageCrop", "clipped_at_border", dict(image=I(181, 1, 6, 8), width=5, height=5, x=5, y=3))
    case("ImageCrop", "x_y_beyond_clamped", dict(image=I(182, 1, 6, 8), width=4, height=4, x=20, y=9))
    case("ImageCrop", "rgba_batch2_default_size", dict(image=I(183, 2, 5, 7, 4), width=512, height=512, x=1, y=2))

    # ImageBlend -- every mode
    b1, b2 = I(190, 1, 5, 7), I(191, 1, 5, 7)
    for mode, f in [("normal", 0.5), ("multiply", 0.7), ("screen", 0.5), ("overlay", 0.6), ("soft_light", 0.8), ("difference", 0.5)]:
        case("ImageBlend", f"{mode}_{f}", dict(image1=b1, image2=b2, blend_factor=f, blend_mode=mode))
    case("ImageBlend", "difference_full_clamps_negative", dict(image1=b1, image2=b2, blend_factor=1.0, blend_mode="difference"))
    case("ImageBlend", "soft_light_factor_0", dict(image1=b1, image2=b2, blend_factor=0.0, blend_mode="soft_light"))
    case("ImageBlend", "resize_bicubic_center_crop", dict(image1=I(192, 1, 6, 8), image2=I(193, 1, 9, 9), blend_factor=0.5, blend_mode="normal"), R)
    case("ImageBlend", "overlay_rgba_batch2", dict(image1=I(194, 2, 4, 6, 4), image2=I(195, 2, 4, 6, 4), blend_factor=0.5, blend_mode="overlay"))
    case("ImageBlend", "rgba_image2_truncated_to_rgb", dict(image1=I(196, 1, 4, 6), image2=I(197, 1, 4, 6, 4), blend_factor=0.4, blend_mode="screen"))
    # torch broadcasting: a batch of one pairs with every image of the other input
    case("ImageBlend", "image1_batch1_image2_batch2_broadcasts", dict(image1=I(198, 1, 4, 5), image2=I(199, 2, 4, 5), blend_factor=0.7, blend_mode="multiply"))
    case("ImageBlend", "image1_batch2_image2_batch1_rgb_gets_alpha", dict(image1=I(185, 2, 4, 5, 4), image2=I(186, 1, 4, 5), blend_factor=0.3, blend_mode="soft_light"))

    # ImageBlur
    case("ImageBlur", "r1_sigma1", dict(image=I(200, 1, 6, 8), blur_radius=1, sigma=1.0), R)
    case("ImageBlur", "r2_sigma0_5", dict(image=I(201, 1, 6, 8), blur_radius=2, sigma=0.5), R)
    case("ImageBlur", "r3_sigma2_9x12", dict(image=I(202, 1, 9, 12), blur_radius=3, sigma=2.0), R)
    case("ImageBlur", "r4_near_side_limit", dict(image=I(203, 1, 5, 7), blur_radius=4, sigma=1.5), R)
    case("ImageBlur", "rgba_batch2", dict(image=I(204, 2, 5, 6, 4), blur_radius=1, sigma=0.3), R)
    # The corners of ComfyUI's ranges (radius 1..31, sigma 0.1..10): at radius
    # 31 and sigma 0.1 the tails are ~1e-23 of the centre.
    case("ImageBlur", "r1_sigma_min", dict(image=I(205, 1, 6, 8), blur_radius=1, sigma=0.1), R)
    case("ImageBlur", "r1_sigma_max", dict(image=I(206, 1, 6, 8), blur_radius=1, sigma=10.0), R)
    case("ImageBlur", "r31_sigma_min", dict(image=I(207, 1, 32, 34), blur_radius=31, sigma=0.1), R)
    case("ImageBlur", "r31_sigma_max", dict(image=I(208, 1, 33, 32), blur_radius=31, sigma=10.0), R)

    # ImageSharpen
    case("ImageSharpen", "defaults", dict(image=I(210, 1, 6, 8), sharpen_radius=1, sigma=1.0, alpha=1.0), R)
    case("ImageSharpen", "r2_sigma0_5_alpha0_3", dict(image=I(211, 1, 6, 8), sharpen_radius=2, sigma=0.5, alpha=0.3), R)
    case("ImageSharpen", "alpha0_identity", dict(image=I(212, 1, 5, 7), sharpen_radius=1, sigma=1.0, alpha=0.0), R)
    case("ImageSharpen", "r3_sigma2_alpha2_clamps", dict(image=I(213, 1, 9, 12), sharpen_radius=3, sigma=2.0, alpha=2.0), R)
    case("ImageSharpen", "rgba_batch2", dict(image=I(214, 2, 5, 6, 4), sharpen_radius=1, sigma=0.7, alpha=0.5), R)
    # The corners of ComfyUI's ranges (radius 1..31, sigma 0.1..10, alpha 0..5).
    case("ImageSharpen", "r1_sigma_min_alpha_max", dict(image=I(215, 1, 6, 8), sharpen_radius=1, sigma=0.1, alpha=5.0), R)
    case("ImageSharpen", "r1_sigma_max_alpha_max", dict(image=I(216, 1, 6, 8), sharpen_radius=1, sigma=10.0, alpha=5.0), R)
    case("ImageSharpen", "r31_sigma_min_alpha_max", dict(image=I(217, 1, 32, 34), sharpen_radius=31, sigma=0.1, alpha=5.0), R)
    case("ImageSharpen", "r31_sigma_max_alpha_0_3", dict(image=I(218, 1, 33, 32), sharpen_radius=31, sigma=10.0, alpha=0.3), R)

    # ImageQuantize -- unambiguous palettes only (distinct colours <= colors)
    four = [(0, 0, 0), (255, 255, 255), (200, 30, 40), (20, 120, 220)]
    case("ImageQuantize", "four_colors_palette4_none", dict(image=palette_image(220, 1, 6, 8, four), colors=4, dither="none"))
    case("ImageQuantize", "four_colors_palette8_floyd_steinberg", dict(image=palette_image(221, 1, 6, 8, four), colors=8, dither="floyd-steinberg"))
    case("ImageQuantize", "three_colors_default256_batch2", dict(image=palette_image(222, 2, 5, 7, [(10, 20, 30), (128, 128, 0), (250, 5, 99)]), colors=256, dither="none"))
    bw = [(0, 0, 0), (255, 255, 255)]
    case("ImageQuantize", "two_colors_bayer2", dict(image=palette_image(223, 1, 6, 8, bw), colors=2, dither="bayer-2"))
    case("ImageQuantize", "two_colors_bayer4", dict(image=palette_image(224, 1, 6, 8, bw), colors=2, dither="bayer-4"))
    case("ImageQuantize", "one_color", dict(image=palette_image(225, 1, 4, 5, [(77, 88, 99)]), colors=1, dither="floyd-steinberg"))
    # general images: Pillow's median-cut palette (heap order, luminance-weighted axis, means
    # rounded half up), its 4x4x4 cached lookup and its Floyd-Steinberg buffers
    smooth = smooth_image(226, 1, 12, 16)
    case("ImageQuantize", "general_smooth_8_none", dict(image=smooth, colors=8, dither="none"))
    case("ImageQuantize", "general_smooth_6_floyd_steinberg", dict(image=smooth, colors=6, dither="floyd-steinberg"))
    case("ImageQuantize", "general_smooth_5_bayer4", dict(image=smooth, colors=5, dither="bayer-4"))
    case("ImageQuantize", "general_noise_16_none_batch2", dict(image=I(227, 2, 9, 11), colors=16, dither="none"))
    case("ImageQuantize", "general_noise_3_floyd_steinberg_one_column", dict(image=I(228, 1, 10, 1), colors=3, dither="floyd-steinberg"))
    case("ImageQuantize", "general_levels_ties_4_floyd_steinberg", dict(image=I(229, 1, 8, 9, levels=[0, 60, 61, 200, 255]), colors=4, dither="floyd-steinberg"))

    # ImageCompositeMasked
    d, s = I(230, 1, 6, 8), I(231, 1, 3, 4)
    case("ImageCompositeMasked", "no_mask_offset", dict(destination=d, source=s, x=2, y=1, resize_source=False))
    case("ImageCompositeMasked", "mask_same_size", dict(destination=d, source=s, x=3, y=2, resize_source=False, mask=mask(232, 1, 3, 4)))
    case("ImageCompositeMasked", "mask_resized_bilinear", dict(destination=d, source=s, x=1, y=1, resize_source=False, mask=mask(233, 1, 5, 7)), R)
    case("ImageCompositeMasked", "resize_source_bilinear", dict(destination=d, source=I(234, 1, 4, 5), x=0, y=0, resize_source=True), R)
    case("ImageCompositeMasked", "source_clipped_at_border", dict(destination=d, source=s, x=6, y=4, resize_source=False, mask=mask(235, 1, 3, 4)))
    case("ImageCompositeMasked", "x_beyond_destination_noop", dict(destination=d, source=s, x=50, y=0, resize_source=False))
    case("ImageCompositeMasked", "dest_batch2_source_batch1", dict(destination=I(236, 2, 5, 6), source=I(237, 1, 2, 3), x=1, y=2, resize_source=False))
    case("ImageCompositeMasked", "rgba_dest_rgb_source_gets_alpha1", dict(destination=I(238, 1, 5, 6, 4), source=I(239, 1, 3, 3), x=2, y=1, resize_source=False, mask=mask(240, 1, 3, 3)))
    # the mask is repeated to the destination's batch, not to the source's
    case("ImageCompositeMasked", "dest_batch3_source_batch2_mask_batch3", dict(destination=I(243, 3, 4, 5), source=I(244, 2, 3, 3), x=1, y=1, resize_source=False, mask=mask(245, 3, 3, 3)))
    case("ImageCompositeMasked", "rgb_dest_rgba_source_truncated", dict(destination=I(241, 1, 5, 6), source=I(242, 1, 3, 3, 4), x=0, y=2, resize_source=False))

    # ImageToMask
    rgba = I(250, 2, 4, 6, 4)
    for ch in ["red", "green", "blue", "alpha"]:
        case("ImageToMask", ch, dict(image=rgba, channel=ch))

    # ImageColorToMask
    cols = [(0, 0, 0), (18, 171, 127), (255, 255, 255), (18, 171, 128)]
    pimg = palette_image(260, 1, 5, 7, cols)
    case("ImageColorToMask", "exact_match", dict(image=pimg, color=0x12AB7F))
    case("ImageColorToMask", "black_default", dict(image=pimg, color=0))
    case("ImageColorToMask", "no_match", dict(image=pimg, color=0x123456))
    rgba_p = np.concatenate([palette_image(261, 2, 4, 5, cols), image(262, 2, 4, 5, 1)], -1)
    case("ImageColorToMask", "rgba_batch2_ignores_alpha", dict(image=rgba_p, color=0xFFFFFF))

    # MaskToImage
    case("MaskToImage", "single", dict(mask=mask(270, 1, 5, 7)))
    case("MaskToImage", "batch2", dict(mask=mask(271, 2, 3, 4)))

    # SolidMask
    case("SolidMask", "half", dict(value=0.5, width=4, height=3))
    case("SolidMask", "default_value_one", dict(value=1.0, width=2, height=5))
    case("SolidMask", "quarter", dict(value=0.25, width=6, height=1))

    # InvertMask
    case("InvertMask", "single", dict(mask=mask(280, 1, 5, 7)))
    case("InvertMask", "batch2", dict(mask=mask(281, 2, 3, 4)))

    # CropMask
    m = mask(290, 1, 6, 8)
    case("CropMask", "inside", dict(mask=m, x=2, y=1, width=3, height=4))
    case("CropMask", "clipped_at_border", dict(mask=m, x=5, y=3, width=10, height=10))
    case("CropMask", "batch2_default_size", dict(mask=mask(291, 2, 4, 5), x=0, y=0, width=512, height=512))

    # MaskComposite -- every operation
    dm, sm = mask(300, 1, 5, 7), mask(301, 1, 3, 4)
    for op in ["multiply", "add", "subtract", "and", "or", "xor"]:
        case("MaskComposite", f"{op}_offset", dict(destination=dm, source=sm, x=2, y=1, operation=op))
    case("MaskComposite", "add_clipped_at_border", dict(destination=dm, source=sm, x=5, y=3, operation="add"))
    case("MaskComposite", "multiply_dest_batch2_source_batch1", dict(destination=mask(302, 2, 4, 5), source=mask(303, 1, 3, 3), x=1, y=1, operation="multiply"))
    halves = mask(304, 1, 4, 5, levels=[0.0, 0.5, 1.0])
    halves2 = mask(305, 1, 4, 5, levels=[0.0, 0.5, 1.0])
    case("MaskComposite", "or_round_half_to_even", dict(destination=halves, source=halves2, x=0, y=0, operation="or"))
    case("MaskComposite", "xor_round_half_to_even", dict(destination=halves, source=halves2, x=0, y=0, operation="xor"))
    case("MaskComposite", "subtract_larger_source_clamps", dict(destination=mask(306, 1, 3, 4), source=mask(307, 1, 5, 6), x=0, y=0, operation="subtract"))

    # FeatherMask
    ones = np.ones((1, 6, 8), F32)
    case("FeatherMask", "left_only", dict(mask=ones, left=3, top=0, right=0, bottom=0))
    case("FeatherMask", "right_only_asymmetric", dict(mask=ones, left=0, top=0, right=3, bottom=0))
    case("FeatherMask", "top_only", dict(mask=ones, left=0, top=2, right=0, bottom=0))
    case("FeatherMask", "bottom_only_asymmetric", dict(mask=ones, left=0, top=0, right=0, bottom=4))
    case("FeatherMask", "all_sides_random_mask", dict(mask=mask(310, 1, 6, 8), left=2, top=1, right=2, bottom=3))
    case("FeatherMask", "larger_than_mask_clamped_batch2", dict(mask=mask(311, 2, 4, 5), left=9, top=9, right=9, bottom=9))

    # GrowMask
    dot = np.zeros((1, 7, 8), F32)
    dot[0, 3, 3] = 1.0
    dot[0, 0, 7] = 0.6
    case("GrowMask", "expand1_tapered", dict(mask=dot, expand=1, tapered_corners=True))
    case("GrowMask", "expand2_square", dict(mask=dot, expand=2, tapered_corners=False))
    case("GrowMask", "expand3_tapered_grey", dict(mask=mask(320, 1, 6, 8), expand=3, tapered_corners=True))
    blob = np.zeros((1, 7, 8), F32)
    blob[0, 1:6, 1:7] = 1.0
    blob[0, 3, 4] = 0.4
    case("GrowMask", "shrink1_tapered", dict(mask=blob, expand=-1, tapered_corners=True))
    case("GrowMask", "shrink2_square", dict(mask=blob, expand=-2, tapered_corners=False))
    case("GrowMask", "zero_unchanged", dict(mask=mask(321, 1, 4, 5), expand=0, tapered_corners=True))
    case("GrowMask", "batch2_shrink1_border", dict(mask=mask(322, 2, 5, 6), expand=-1, tapered_corners=False))

    # ThresholdMask
    case("ThresholdMask", "default_0_5", dict(mask=mask(330, 1, 5, 7), value=0.5))
    eq = np.array([[[0.2, 0.1, 0.3], [0.2, 0.25, 0.19999]]], dtype=F32)
    case("ThresholdMask", "equal_to_value_is_not_above_f32", dict(mask=eq, value=0.2))
    case("ThresholdMask", "zero_batch2", dict(mask=mask(331, 2, 3, 4, levels=[0.0, 0.1, 1.0]), value=0.0))
    case("ThresholdMask", "one_nothing_above", dict(mask=mask(332, 1, 3, 4, levels=[0.0, 0.5, 1.0]), value=1.0))

    # RepeatImageBatch
    case("RepeatImageBatch", "amount1", dict(image=I(340, 1, 3, 4), amount=1))
    case("RepeatImageBatch", "amount3", dict(image=I(341, 1, 3, 4), amount=3))
    case("RepeatImageBatch", "batch2_amount2_rgba", dict(image=I(342, 2, 2, 3, 4), amount=2))

    # ImageFromBatch
    fb = I(350, 3, 2, 3)
    case("ImageFromBatch", "index1_length1", dict(image=fb, batch_index=1, length=1))
    case("ImageFromBatch", "index_beyond_batch_clamped", dict(image=fb, batch_index=5, length=1))
    case("ImageFromBatch", "last_index_length2_clamped", dict(image=fb, batch_index=2, length=2))
    # (negative batch_index, which ComfyUI 0.27 counts from the end, is outside the
    # reference object_info's range min=0, so it has no case here)
    case("ImageFromBatch", "length_clamped", dict(image=fb, batch_index=1, length=10))

    # ImageRotate
    rot = I(360, 1, 3, 5)
    for r in ["none", "90 degrees", "180 degrees", "270 degrees"]:
        case("ImageRotate", r.replace(" ", "_"), dict(image=rot, rotation=r))
    case("ImageRotate", "90_degrees_rgba_batch2", dict(image=I(361, 2, 2, 4, 4), rotation="90 degrees"))

    # ImageFlip
    fl = I(370, 1, 3, 5)
    case("ImageFlip", "x_axis_vertically", dict(image=fl, flip_method="x-axis: vertically"))
    case("ImageFlip", "y_axis_horizontally", dict(image=fl, flip_method="y-axis: horizontally"))
    case("ImageFlip", "y_axis_rgba_batch2", dict(image=I(371, 2, 3, 4, 4), flip_method="y-axis: horizontally"))

    # SplitImageWithAlpha
    case("SplitImageWithAlpha", "rgba", dict(image=I(380, 1, 4, 5, 4)))
    case("SplitImageWithAlpha", "rgb_mask_zeros", dict(image=I(381, 1, 3, 4)))
    case("SplitImageWithAlpha", "rgba_batch2", dict(image=I(382, 2, 3, 4, 4)))

    # JoinImageWithAlpha
    case("JoinImageWithAlpha", "same_size", dict(image=I(390, 1, 4, 5), alpha=mask(391, 1, 4, 5)))
    case("JoinImageWithAlpha", "mask_resized_bilinear", dict(image=I(392, 1, 6, 8), alpha=mask(393, 1, 3, 5)), R)
    case("JoinImageWithAlpha", "mask_batch1_image_batch2", dict(image=I(394, 2, 3, 4), alpha=mask(395, 1, 3, 4)))
    case("JoinImageWithAlpha", "rgba_input_alpha_replaced", dict(image=I(396, 1, 3, 4, 4), alpha=mask(397, 1, 3, 4)))

    # GetImageSize
    case("GetImageSize", "rgb_5x7", dict(image=I(400, 1, 5, 7)))
    case("GetImageSize", "rgba_batch3", dict(image=I(401, 3, 2, 6, 4)))
    case("GetImageSize", "one_pixel", dict(image=I(402, 1, 1, 1)))

    # Primitives
    for i, v in enumerate([0, 42, -7, 9007199254740993, -9223372036854775807]):
        case("PrimitiveInt", f"int_{i}", dict(value=v))
    for i, v in enumerate([0.0, 3.14159, -2.5, 1e10, 0.1]):
        case("PrimitiveFloat", f"float_{i}", dict(value=v))
    for i, v in enumerate(["", "hello", "héllo ✓ \"quoted\" \\ back"]):
        case("PrimitiveString", f"string_{i}", dict(value=v))
    for i, v in enumerate(["line one\nline two\n", "", "a\ttab\r\nwindows"]):
        case("PrimitiveStringMultiline", f"multiline_{i}", dict(value=v))
    case("PrimitiveBoolean", "true", dict(value=True))
    case("PrimitiveBoolean", "false", dict(value=False))


# ---------------------------------------------------------------- sanity checks


def sanity(cls, name, inputs, outputs):
    if cls == "ImageQuantize" and not name.startswith("general_") and not inputs["dither"].startswith("bayer"):
        assert np.array_equal(outputs[0], inputs["image"]), f"{name}: palette not exact"
    if cls == "ImageScale" and name == "nearest_exact_f32_index_14_to_23":
        # float32 index math: output column 11 reads source column 6 (exact math says 7)
        src = inputs["image"]
        cols = _nearest_exact_idx(14, 23)
        assert cols[11] == 6, cols
        assert np.array_equal(outputs[0][0, 0, 11], src[0, 0, 6])


# ---------------------------------------------------------------- JSON writing


def fmt_exact(v):
    s = np.format_float_positional(F32(v), unique=True, trim="-")
    assert F32(float(s)) == F32(v), (s, v)  # reads back exactly through f64 -> f32
    return s


def fmt_rounded(v):
    v = float(v)
    if not math.isfinite(v):
        raise ValueError("non-finite output")
    s = "%.6f" % v
    s = s.rstrip("0").rstrip(".") if "." in s else s
    if s in ("-0", ""):
        s = "0"
    return s


def dump(value, exact):
    if isinstance(value, np.ndarray):
        value = T(value, exact)
    if isinstance(value, T):
        f = fmt_exact if value.exact else fmt_rounded
        data = ",".join(f(v) for v in value.a.reshape(-1))
        return '{"shape":%s,"data":[%s]}' % (json.dumps(list(value.a.shape)), data)
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, float):
        return json.dumps(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(k) + ":" + dump(v, exact) for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(dump(v, exact) for v in value) + "]"
    raise TypeError(type(value))


def validate_against_object_info(cls, name, inputs, n_outputs):
    if not os.path.exists(OBJECT_INFO):
        return
    info = validate_against_object_info.cache
    if info is None:
        with open(OBJECT_INFO) as f:
            info = validate_against_object_info.cache = json.load(f)
    node = info[cls]
    req = node["input"].get("required", {})
    opt = node["input"].get("optional", {})
    for k, spec in req.items():
        assert k in inputs, f"{cls}/{name}: missing required input {k}"
    for k, v in inputs.items():
        assert k in req or k in opt, f"{cls}/{name}: unknown input {k}"
        spec = (req.get(k) or opt.get(k))
        if isinstance(spec[0], list):
            assert v in spec[0], f"{cls}/{name}: {v!r} not an option of {k}"
        elif spec[0] == "COMBO":
            assert v in spec[1]["options"], f"{cls}/{name}: {v!r} not an option of {k}"
        elif spec[0] in ("INT", "FLOAT") and len(spec) > 1:
            lo, hi = spec[1].get("min"), spec[1].get("max")
            assert (lo is None or v >= lo) and (hi is None or v <= hi), f"{cls}/{name}: {k}={v} out of range"
    assert n_outputs == len(node["output"]), f"{cls}/{name}: output count"


validate_against_object_info.cache = None


def main():
    build_cases()
    os.makedirs(OUT_DIR, exist_ok=True)
    total = 0
    for cls, cases in CASES.items():
        assert cases, cls
        entries = []
        for name, inputs, tol in cases:
            call = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in inputs.items()}
            outputs = NODES[cls](**call)
            outputs = [np.ascontiguousarray(o, dtype=F32) if isinstance(o, np.ndarray) else o for o in outputs]
            sanity(cls, name, inputs, outputs)
            validate_against_object_info(cls, name, inputs, len(outputs))
            entries.append(
                '{"name":%s,"class_type":%s,"inputs":%s,"outputs":%s,"tolerance":%s}'
                % (json.dumps(name), json.dumps(cls), dump(inputs, True), dump(outputs, False), repr(float(tol)))
            )
        text = "[\n" + ",\n".join(entries) + "\n]\n"
        json.loads(text)  # must parse
        with open(os.path.join(OUT_DIR, cls + ".json"), "w", encoding="utf-8") as f:
            f.write(text)
        total += len(cases)
    print(f"wrote {total} cases over {len(CASES)} classes to {os.path.relpath(OUT_DIR, ROOT)}")
    print(f"cross-checks: torch {CHECKS['torch'] if torch is not None else 'unavailable'}, "
          f"scipy {CHECKS['scipy'] if ndi is not None else 'unavailable'}, "
          f"opencv {CHECKS['opencv'] if cv2 is not None else 'unavailable'}")


if __name__ == "__main__":
    sys.exit(main())
