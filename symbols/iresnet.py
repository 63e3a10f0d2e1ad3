"""iResNet (ArcFace's improved ResNet): BN-conv-BN-PReLU-conv-BN residual units.

Depth is data: units per stage for each registered depth. The first unit of each
stage halves the resolution (112 -> 56 -> 28 -> 14 -> 7).
"""
import mxnet as mx

from .common import bn, conv, conv_bn, embedding_head, prelu, scaled_input

UNITS_PER_STAGE = {18: (2, 2, 2, 2), 34: (3, 4, 6, 3), 50: (3, 4, 14, 3), 100: (3, 13, 30, 3)}
STAGE_WIDTHS = (64, 128, 256, 512)


def residual_unit(x, channels, stride, needs_projection, name):
    body = bn(x, name + "_bn1")
    body = conv(body, channels, 3, 1, name + "_conv1")
    body = prelu(bn(body, name + "_bn2"), name + "_relu1")
    body = bn(conv(body, channels, 3, stride, name + "_conv2"), name + "_bn3")
    shortcut = x
    if needs_projection:
        shortcut = bn(conv(x, channels, 1, stride, name + "_conv1sc"), name + "_sc")
    return body + shortcut


def get_symbol(depth, embedding_size=512, dropout=0.0, fp16=False, width_mult=1.0, stem_stride=1):
    """The embedding symbol of iResNet-`depth` for 3x112x112 input.

    The published networks have width_mult 1 and stem_stride 1. A stem stride of
    2 or 4 (with narrower stages) makes the same design cheap enough to train on
    a CPU: 16x fewer operations at stride 4.
    """
    if depth not in UNITS_PER_STAGE:
        raise ValueError(f"iResNet depth {depth} not in {sorted(UNITS_PER_STAGE)}")
    widths = [max(8, int(w * width_mult)) for w in STAGE_WIDTHS]
    if stem_stride not in (1, 2, 4):
        raise ValueError(f"stem_stride must be 1, 2 or 4, not {stem_stride}")
    x = conv_bn(scaled_input(fp16), widths[0], 3, min(stem_stride, 2), "stem")
    if stem_stride == 4:
        x = mx.sym.Pooling(x, kernel=(2, 2), stride=(2, 2), pool_type="max", name="stem_pool")
    in_channels = widths[0]
    for stage, (units, channels) in enumerate(zip(UNITS_PER_STAGE[depth], widths), start=1):
        for unit in range(units):
            stride = 2 if unit == 0 else 1
            needs_projection = unit == 0 and (stride != 1 or in_channels != channels)
            x = residual_unit(x, channels, stride, needs_projection, f"stage{stage}_unit{unit + 1}")
            in_channels = channels
    return embedding_head(x, embedding_size, dropout, fp16)
