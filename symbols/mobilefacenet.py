"""MobileFaceNet (Chen et al. 2018): inverted-residual bottlenecks and a global
depthwise (GDC) 7x7 layer instead of global pooling.

Stages as data: (expanded channels, output channels, units, first stride).
"""
from .common import conv_bn, embedding_head, scaled_input

# the first unit of each stage may downsample; the rest are residual
STAGES = ((128, 64, 5, 2), (256, 128, 1, 2), (256, 128, 6, 1), (512, 128, 1, 2), (256, 128, 2, 1))


def bottleneck(x, expanded, out_channels, stride, residual, name):
    body = conv_bn(x, expanded, 1, 1, name + "_expand")
    body = conv_bn(body, expanded, 3, stride, name + "_dw", groups=expanded)
    body = conv_bn(body, out_channels, 1, 1, name + "_project", act=False)
    return body + x if residual else body


def get_symbol(embedding_size=512, dropout=0.0, fp16=False, width_mult=1.0):
    """The embedding symbol of MobileFaceNet for 3x112x112 input."""
    def scale(c):
        return max(8, int(c * width_mult))
    x = conv_bn(scaled_input(fp16), scale(64), 3, 2, "conv1")                       # 56x56
    x = conv_bn(x, scale(64), 3, 1, "conv2_dw", groups=scale(64))
    channels = scale(64)
    for stage, (expanded, out_channels, units, stride) in enumerate(STAGES, start=1):
        expanded, out_channels = scale(expanded), scale(out_channels)
        for unit in range(units):
            first = unit == 0
            residual = not first or (stride == 1 and channels == out_channels)
            x = bottleneck(x, expanded, out_channels, stride if first else 1, residual,
                           f"stage{stage}_unit{unit + 1}")
            channels = out_channels
    x = conv_bn(x, scale(512), 1, 1, "conv6_sep")                                   # 7x7
    x = conv_bn(x, scale(512), 7, 1, "conv6_dw", groups=scale(512), act=False, pad=0)  # GDC -> 1x1
    return embedding_head(x, embedding_size, dropout, fp16)
