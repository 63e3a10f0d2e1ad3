"""Every registered backbone builds, maps 3x112x112 to the embedding, and is the published size."""
import mxnet as mx
import numpy as np
import pytest

import symbols


def count_params(symbol, batch=2):
    arg_shapes, out_shapes, aux_shapes = symbol.infer_shape(data=(batch, *symbols.INPUT_SHAPE))
    names = symbol.list_arguments()
    return out_shapes, sum(int(np.prod(s)) for n, s in zip(names, arg_shapes) if n != "data")


@pytest.mark.parametrize("name", symbols.names())
@pytest.mark.parametrize("embedding", [128, 512])
def test_every_network_maps_faces_to_embeddings(name, embedding):
    out_shapes, params = count_params(symbols.get_symbol(name, embedding))
    assert out_shapes == [(2, embedding)]
    assert params > 0


# published parameter counts: (embedding size, millions); MobileFaceNet's paper uses 128-d
PUBLISHED = {"r18": (512, 24.0), "r34": (512, 34.1), "r50": (512, 43.6), "r100": (512, 65.2), "mbf": (128, 0.99)}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_parameter_counts_match_the_published_networks(name):
    embedding, millions = PUBLISHED[name]
    _, params = count_params(symbols.get_symbol(name, embedding))
    assert params / 1e6 == pytest.approx(millions, rel=0.03)


def test_fp16_body_gives_float32_embedding():
    symbol = symbols.get_symbol("r18", 64, fp16=True)
    arg_types, out_types, _ = symbol.infer_type(data=np.float32)
    assert out_types == [np.float32]
    conv_types = [t for n, t in zip(symbol.list_arguments(), arg_types) if n.endswith("conv1_weight")]
    assert conv_types and all(t == np.float16 for t in conv_types)


def test_cpu_network_runs_forward_and_backward():
    symbol = symbols.get_symbol("r18-lite", 32, dropout=0.2)
    module = mx.mod.Module(symbol, data_names=["data"], label_names=None)
    module.bind(data_shapes=[("data", (2, *symbols.INPUT_SHAPE))])
    module.init_params(mx.init.Xavier())
    module.forward(mx.io.DataBatch([mx.nd.random.uniform(0, 255, (2, *symbols.INPUT_SHAPE))]), is_train=True)
    out = module.get_outputs()[0]
    module.backward([mx.nd.ones_like(out)])
    assert out.shape == (2, 32) and np.isfinite(out.asnumpy()).all()


def test_unknown_network_lists_the_registered_ones():
    with pytest.raises(ValueError, match="unknown network 'r7'.*mbf.*r100"):
        symbols.get_symbol("r7")
