"""Verification: the 10-fold protocol against a brute-force count, and the safe .bin loader."""
import os
import pickle

import numpy as np
import pytest

from mxnet_pfc.data import synthetic
from mxnet_pfc.eval.verification import BinFormatError, embed_pairs, load_bin, ten_fold_accuracy


def brute_force_accuracy(embeddings, issame, folds=10):
    """The protocol written out with loops: best threshold on 9 folds, accuracy on the 10th."""
    distance = [float(np.sum((embeddings[2 * i] - embeddings[2 * i + 1]) ** 2)) for i in range(len(issame))]
    accuracies = []
    for fold in range(folds):
        test = [i for i in range(len(issame)) if i % folds == fold]
        train = [i for i in range(len(issame)) if i % folds != fold]
        best_t, best_acc = None, -1
        for t in np.arange(0, 4, 0.01):
            acc = sum((distance[i] < t) == issame[i] for i in train) / len(train)
            if acc > best_acc:
                best_t, best_acc = t, acc
        accuracies.append(sum((distance[i] < best_t) == issame[i] for i in test) / len(test))
    return np.mean(accuracies), np.std(accuracies)


def test_ten_fold_accuracy_matches_brute_force():
    rng = np.random.default_rng(0)
    pairs = 200
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
    embed = lambda x: x[:, 0, 0, :]         # the first row: flipping reverses it
    got = embed_pairs(embed, images, batch_size=3)
    expected = images[:, 0, 0, :] + images[:, 0, 0, ::-1]
    np.testing.assert_allclose(got, expected / np.linalg.norm(expected, axis=1, keepdims=True), rtol=1e-6)


def test_synthetic_bin_loads(tmp_path):
    synthetic.write_verification_set(str(tmp_path / "val.bin"), identities=5, pairs=10, seed=0)
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
