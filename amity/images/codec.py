"""Image bytes in and out: decoding what a client sent, encoding what it gets back.

`raw` is lossless PNG (the spec calls the format raw; PNG carries the exact pixels and
every client can open it), `jpeg` is baseline JPEG at quality 95."""

import base64
import io
import warnings

from PIL import Image, UnidentifiedImageError

JPEG_QUALITY = 95


class BadImage(ValueError):
    """Input that is not an image we can use: a 422 naming the field."""

    def __init__(self, msg: str, loc: tuple = ("body",)):
        super().__init__(msg)
        self.msg, self.loc = msg, loc


def decode(data: bytes, loc: tuple) -> Image.Image:
    """Bytes to an RGB image, or BadImage. PIL's decompression-bomb guard (an image of
    more than ~179 M pixels) counts as undecodable."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            image.load()
    except UnidentifiedImageError:
        raise BadImage("the image could not be decoded: not a format we read (send PNG, "
                       "JPEG, WebP, ...)", loc) from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError,
            Image.DecompressionBombWarning) as err:
        raise BadImage(f"the image could not be decoded ({err})", loc) from None
    return image.convert("RGB")


def encode(image: Image.Image, response_format: str) -> str:
    """An image as base64 text: PNG for `raw`, JPEG for `jpeg`."""
    out = io.BytesIO()
    if response_format == "raw":
        image.save(out, format="PNG")
    else:
        image.save(out, format="JPEG", quality=JPEG_QUALITY)
    return base64.b64encode(out.getvalue()).decode("ascii")
