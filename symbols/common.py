"""Building blocks shared by the backbones: BN/conv/PReLU units, input scaling, embedding head."""
import mxnet as mx

BN_EPS = 2e-5
BN_MOM = 0.9


def bn(x, name, fix_gamma=False):
    return mx.sym.BatchNorm(x, fix_gamma=fix_gamma, eps=BN_EPS, momentum=BN_MOM, name=name)


def prelu(x, name):
    return mx.sym.LeakyReLU(x, act_type="prelu", name=name)


def conv(x, channels, kernel, stride, name, groups=1, pad=None):
    pad = (kernel // 2,) * 2 if pad is None else (pad, pad)
    return mx.sym.Convolution(x, num_filter=channels, kernel=(kernel, kernel), stride=(stride, stride),
                              pad=pad, num_group=groups, no_bias=True, name=name)


def conv_bn(x, channels, kernel, stride, name, groups=1, act=True, pad=None):
    """conv -> BN (-> PReLU): the unit every backbone here is made of."""
    x = bn(conv(x, channels, kernel, stride, name + "_conv", groups, pad), name + "_bn")
    return prelu(x, name + "_relu") if act else x


def scaled_input(fp16):
    """Raw 0..255 pixels in, (x - 127.5) / 128 out; cast to float16 when asked."""
    data = mx.sym.Variable("data")
    x = (data - 127.5) * 0.0078125
    return mx.sym.Cast(x, dtype="float16") if fp16 else x


def embedding_head(x, embedding_size, dropout, fp16):
    """BN -> dropout -> FC -> BN (fixed gamma): the ArcFace "E" output block.

    The output is float32 whatever the body's precision: the head normalises it.
    """
    x = bn(x, "bn1")
    if dropout > 0:
        x = mx.sym.Dropout(x, p=dropout)
    # Flattened explicitly: MXNet 1.9's ONNX exporter gets FullyConnected's own flattening wrong for 4-D input
    x = mx.sym.FullyConnected(mx.sym.Flatten(x), num_hidden=embedding_size, name="pre_fc1")
    if fp16:
        x = mx.sym.Cast(x, dtype="float32")
    return bn(x, "fc1", fix_gamma=True)
