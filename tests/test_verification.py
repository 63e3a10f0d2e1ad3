"""Verification: the 10-fold protocol against a brute-force count, and the safe .bin loader."""
import os
import pickle

import cv2
import numpy as np
import pytest

from mxnet_pfc.data import synthetic_set
from mxnet_pfc.eval.verification import (
    BinFormatError,
    embed_pairs,
    load_bin,
    tar_at_far,
    ten_fold_accuracy,
    verify_embeddings,
)


def brute_force_accuracy(embeddings, issame, folds=10):
    """The protocol written out with loops: best threshold on 9 folds, accuracy on the 10th.

    Folds as sklearn's KFold(n_splits=10, shuffle=False) cuts them, which InsightFace's
    evaluation uses: contiguous blocks, the first len % 10 of them one pair longer.
    """
    distance = [float(np.sum((embeddings[2 * i] - embeddings[2 * i + 1]) ** 2)) for i in range(len(issame))]
    accuracies, start = [], 0
    for fold in range(folds):
        size = len(issame) // folds + (1 if fold < len(issame) % folds else 0)
        test = list(range(start, start + size))
        train = [i for i in range(len(issame)) if not start <= i < start + size]
        start += size
        best_t, best_acc = None, -1
        for t in np.arange(0, 4, 0.01):
            acc = sum((distance[i] < t) == issame[i] for i in train) / len(train)
            if acc > best_acc:
                best_t, best_acc = t, acc
        accuracies.append(sum((distance[i] < best_t) == issame[i] for i in test) / len(test))
    return np.mean(accuracies), np.std(accuracies)


def test_ten_fold_accuracy_matches_brute_force():
    rng = np.random.default_rng(0)
    pairs = 203            # not a multiple of 10: uneven folds
    issame = rng.random(pairs) < 0.5
    a = rng.normal(size=(pairs, 16))
    b = np.where(issame[:, None], a + rng.normal(0, 0.9, (pairs, 16)), rng.normal(size=(pairs, 16)))
    embeddings = np.stack([a, b], axis=1).reshape(2 * pairs, 16)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    result = ten_fold_accuracy(embeddings, issame)
    mean, std = brute_force_accuracy(embeddings, issame)
    assert (result.accuracy, result.std) == pytest.approx((mean, std))
    assert 0.6 < result.accuracy < 1.0


def test_perfect_and_useless_embeddings():
    issame = np.array([True, False] * 50)
    basis = np.eye(200)
    # same pairs: (e_i, e_i), distance 0; different pairs: (e_i, e_{i+100}), distance 2
    perfect = np.concatenate([[basis[i], basis[i] if same else basis[i + 100]] for i, same in enumerate(issame)])
    assert ten_fold_accuracy(perfect, issame).accuracy == 1.0
    # constant embeddings carry no information: no better than always answering the majority
    issame = np.array([True, True, False] * 40)
    constant = np.ones((240, 4)) / 2
    assert ten_fold_accuracy(constant, issame).accuracy <= 2 / 3 + 1e-9


def test_embed_pairs_adds_the_flip_and_normalises():
    images = np.random.default_rng(1).uniform(0, 255, (4, 3, 2, 3)).astype(np.float32)
    def embed(x):
        return x[:, 0, 0, :]         # the first row: flipping reverses it
    done = []
    got, xnorm = embed_pairs(embed, images, batch_size=3, progress=done.append)
    expected = images[:, 0, 0, :] + images[:, 0, 0, ::-1]
    np.testing.assert_allclose(got, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-6)
    # XNorm: the mean norm of the raw, unflipped embeddings
    assert xnorm == pytest.approx(np.linalg.norm(images[:, 0, 0, :].astype(np.float64), axis=1).mean())
    assert done == [3, 1]


def brute_force_tar(similarity, issame, far):
    """Try every observed score as threshold; keep the lowest one whose FAR is <= far."""
    best = None
    for t in sorted(set(similarity.tolist()) | {-np.inf}):
        false_accepts = sum(1 for s, same in zip(similarity, issame) if not same and s > t)
        if false_accepts <= far * (~issame).sum() + 1e-9:
            best = t
            break
    accepted = sum(1 for s, same in zip(similarity, issame) if same and s > best)
    return accepted / issame.sum(), best


@pytest.mark.parametrize("far", [1e-3, 1e-2, 0.1, 0.25])
def test_tar_at_far_matches_brute_force(far):
    rng = np.random.default_rng(3)
    issame = rng.random(2400) < 0.5
    similarity = np.where(issame, rng.normal(0.5, 0.2, 2400), rng.normal(0.0, 0.2, 2400))
    found = tar_at_far(similarity, issame, far)
    tar, threshold = brute_force_tar(similarity, issame, far)
    assert (found.tar, found.threshold) == pytest.approx((tar, threshold))
    assert found.achieved_far <= far and found.resolved == (far * (~issame).sum() >= 1)


def test_tar_at_far_below_the_resolution_is_tar_at_far_zero():
    issame = np.array([True] * 10 + [False] * 10)
    similarity = np.concatenate([np.linspace(0.3, 0.9, 10), np.linspace(-0.5, 0.5, 10)])
    found = tar_at_far(similarity, issame, 1e-4)
    assert not found.resolved and found.achieved_far == 0 and found.threshold == 0.5
    assert found.tar == pytest.approx(np.mean(similarity[:10] > 0.5))
    # every pair made of two equal embeddings: nothing separates same from different
    alternating = np.array([True, False] * 10)          # every fold holds one of each
    result = verify_embeddings(np.eye(40)[np.repeat(np.arange(20), 2)], alternating)
    assert result.accuracy == 0.5 and result.tar[0].tar == 0.0
    assert "at FAR 0: only 10 different pairs" in str(result)


def test_synthetic_bin_loads(tmp_path):
    synthetic_set.write_verification_set(str(tmp_path / "val.bin"), identities=5, pairs=10, seed=0)
    images, issame = load_bin(str(tmp_path / "val.bin"))
    assert images.shape == (20, 3, 112, 112) and issame.tolist().count(True) == 5


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch exploited",))


def test_bin_that_would_run_code_is_refused_without_running_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("evil.bin", "wb") as f:
        pickle.dump(([b"x", b"y"], [Exploit()]), f)
    with pytest.raises(BinFormatError, match="refusing to load posix.system"):
        load_bin("evil.bin")
    assert not os.path.exists("exploited")


def test_bin_with_wrong_structure_is_refused(tmp_path):
    path = str(tmp_path / "bad.bin")
    with open(path, "wb") as f:
        pickle.dump(([b"x"], [True]), f)
    with pytest.raises(BinFormatError, match="expected 2 images for 1 booleans"):
        load_bin(path)
    with open(path, "wb") as f:
        f.write(b"garbage")
    with pytest.raises(BinFormatError, match="not a pickle"):
        load_bin(path)


def bins_as_build_eval_pack_writes_them(folder) -> "tuple[list, list]":
    """(bins, issame) as insightface's recognition/arcface_mxnet/common/build_eval_pack.py makes them: each
    image the numpy array cv2.imencode('.jpg', im) returns; issame a list of Python booleans."""
    synthetic_set.write_verification_set(str(folder / "ours.bin"), identities=5, pairs=10, seed=0)
    images, issame = load_bin(str(folder / "ours.bin"))
    faces = [np.ascontiguousarray(image.transpose(1, 2, 0)[:, :, ::-1]).astype(np.uint8) for image in images]
    return [cv2.imencode(".jpg", face)[1] for face in faces], [bool(same) for same in issame]


@pytest.mark.parametrize("protocol", [2, 4, pickle.HIGHEST_PROTOCOL])
def test_bins_of_the_fields_writers_load_as_their_bytes_do(tmp_path, protocol):
    """build_eval_pack.py's pickle (arrays of cv2.imencode, protocol HIGHEST_PROTOCOL: numpy's _frombuffer),
    and protocols 2 and 4 (numpy's _reconstruct; protocol 2's bytes as _codecs.encode) give the same images and
    labels as the same JPEG bytes pickled as bytes; so does a protocol-2 pickle of bytes with numpy booleans."""
    bins, issame = bins_as_build_eval_pack_writes_them(tmp_path)
    with open(tmp_path / "bytes.bin", "wb") as f:
        pickle.dump(([b.tobytes() for b in bins], issame), f)
    expected_images, expected_issame = load_bin(str(tmp_path / "bytes.bin"))
    with open(tmp_path / "theirs.bin", "wb") as f:
        pickle.dump((bins, issame), f, protocol=protocol)
    images, same = load_bin(str(tmp_path / "theirs.bin"))
    assert np.array_equal(images, expected_images) and np.array_equal(same, expected_issame)
    with open(tmp_path / "numpy-bools.bin", "wb") as f:
        pickle.dump(([b.tobytes() for b in bins], [np.bool_(s) for s in issame]), f, protocol=2)
    assert np.array_equal(load_bin(str(tmp_path / "numpy-bools.bin"))[1], expected_issame)


def test_numpy_2s_names_load_and_arrays_of_other_types_or_classes_are_refused(tmp_path):
    """numpy 2 pickles arrays under numpy._core; an object array, a float array or a call of numpy.ndarray
    itself is refused without being built."""
    bins, issame = bins_as_build_eval_pack_writes_them(tmp_path)
    raw = pickle.dumps((bins, issame), protocol=2)
    assert b"numpy.core.multiarray\n_reconstruct" in raw
    (tmp_path / "numpy2.bin").write_bytes(raw.replace(b"numpy.core.multiarray", b"numpy._core.multiarray"))
    assert load_bin(str(tmp_path / "numpy2.bin"))[0].shape == (20, 3, 112, 112)
    for name, payload in (("objects", np.array([b"x", None], dtype=object)),
                          ("floats", np.zeros(4, dtype=np.float64))):
        with open(tmp_path / f"{name}.bin", "wb") as f:
            pickle.dump(([payload, payload], [True]), f, protocol=2)
        with pytest.raises(BinFormatError, match="a verification .bin holds uint8 images and booleans"):
            load_bin(str(tmp_path / f"{name}.bin"))

    class HugeArray:
        def __reduce__(self):
            return (np.ndarray, ((1 << 40,),))
    with open(tmp_path / "huge.bin", "wb") as f:
        pickle.dump(([HugeArray(), HugeArray()], [True]), f, protocol=2)
    with pytest.raises(BinFormatError, match="not a pickle"):
        load_bin(str(tmp_path / "huge.bin"))
