"""Whether a PNG's pixel data can hold the size its header declares, from its chunk lengths
alone (nothing decompressed): the check that keeps a forged or cut-short size from being
counted as a real image's."""

from __future__ import annotations

# The most bytes deflate can expand one compressed byte to (a 258-byte match in 2 bits): a PNG
# whose IDAT chunks hold fewer than its pixels' bytes / this cannot hold its declared size.
_DEFLATE_MAX_RATIO = 1032
# Channels per pixel of each PNG colour type (grey, RGB, palette, grey + alpha, RGBA).
_PNG_CHANNELS = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}


def png_pixels_short(data: bytes, size: tuple[int, int]) -> str | None:
    """Why a PNG's pixel data cannot hold the size its header declares, or None. Read from the
    chunk lengths alone, never decompressed: a header claiming 100000x100000 over a few bytes
    of IDAT (a forged or cut-short file) would be counted as the processor's largest image,
    though no server can decode it."""
    if len(data) < 29:
        return None
    bit_depth, colour = data[24], data[25]
    channels = _PNG_CHANNELS.get(colour)
    if channels is None:
        return None
    idat = 0
    at = 8
    while at + 8 <= len(data):
        length = int.from_bytes(data[at:at + 4], "big")
        if data[at + 4:at + 8] == b"IDAT":
            idat += length
        at += 12 + length
    pixel_bytes = (size[0] * size[1] * channels * bit_depth + 7) // 8
    if idat * _DEFLATE_MAX_RATIO + 64 < pixel_bytes:
        return (f"a PNG declaring {size[0]}x{size[1]} pixels with only {idat:,} bytes of pixel data "
                f"(at least {pixel_bytes // _DEFLATE_MAX_RATIO:,} needed): cut short, or a forged size?")
    return None
