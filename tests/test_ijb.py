"""IJB-B / IJB-C evaluation (mxnet_pfc.ijb) on a small synthetic set in InsightFace's layout."""
import json
import os
import shutil
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

from launch import REPO, rank_env
from mxnet_pfc import ijb
from mxnet_pfc.data.synthetic_ijb import write_ijb
from mxnet_pfc.eval import align, ijb_metrics
from mxnet_pfc.eval import ijb_set as ijb_report
from mxnet_pfc.eval.verification import tar_at_far


@pytest.fixture(scope="module")
def ijb_set(tmp_path_factory):
    root = tmp_path_factory.mktemp("ijb") / "IJBC"
    truth = write_ijb(str(root), "IJBC", subjects=24, templates_per_subject=3, seed=0)
    return root, truth


def colour_grid_model(prefix, informative=True):
    """An MXNet model without training: block means of the face (7x7 grid of 16x16 blocks, 3 colours).

    informative=False keeps the network and sets every weight to 0 and the bias
    to a constant: each face gets the same embedding, as from a collapsed model.
    """
    data = mx.sym.Variable("data")
    grid = mx.sym.Pooling(data - 127.5, kernel=(16, 16), stride=(16, 16), pool_type="avg")
    embedding = mx.sym.FullyConnected(mx.sym.Flatten(grid), num_hidden=147, name="fc1")
    weight = np.eye(147, dtype=np.float32) if informative else np.zeros((147, 147), np.float32)
    bias = np.zeros(147, np.float32) if informative else np.ones(147, np.float32)
    mx.model.save_checkpoint(str(prefix), 0, embedding, {"fc1_weight": mx.nd.array(weight),
                                                         "fc1_bias": mx.nd.array(bias)}, {})
    return str(prefix)


def run(root, model, output, *extra):
    code = ijb.main([model, "--root", str(root), "--target", "IJBC", "--output", str(output),
                     "--batch-size", "32", *extra])
    return code, (json.load(open(output / "ijb-ijbc.json")) if code == 0 else None)


# --- alignment -------------------------------------------------------------------------------------

def test_similarity_transform_recovers_a_known_similarity():
    rng = np.random.default_rng(0)
    scale, angle, shift = 1.7, 0.4, np.array([12.0, -5.0])
    known = np.hstack([scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]]),
                       shift[:, None]])
    src = rng.uniform(0, 100, (5, 2))
    dst = src @ known[:, :2].T + known[:, 2]
    np.testing.assert_allclose(align.similarity_transform(src, dst), known, atol=1e-9)
    # mirrored points: the best similarity still has no reflection
    assert np.linalg.det(align.similarity_transform(src, dst * [-1, 1])[:, :2]) > 0


@pytest.mark.parametrize("points, words", [
    (np.full((5, 2), 40.0), "coincide"),
    (np.stack([np.arange(5.0) * 10, np.arange(5.0) * 5 + 3], axis=1), "on a line"),
    (np.where(np.eye(5, 2) > 0, np.nan, 50.0) + np.arange(10).reshape(5, 2), "finite"),
])
def test_degenerate_landmarks_are_refused(points, words):
    with pytest.raises(align.LandmarkError, match=words):
        align.similarity_transform(points)


def test_alignment_recovers_the_render(ijb_set):
    """(a) aligning a loose crop by its written points = aligning the 112 render by its true points."""
    root, truth = ijb_set
    lines = open(root / "meta" / "ijbc_name_5pts_score.txt").read().split("\n")
    errors = []
    for i in range(12):
        written = np.array(lines[i].split()[1:11], float).reshape(5, 2)
        to_template = align.similarity_transform(truth["landmarks"][i])       # render -> template
        placed = np.vstack([truth["matrices"][i], [0, 0, 1]])                  # render -> loose crop
        expected = np.vstack([to_template, [0, 0, 1]]) @ np.linalg.inv(placed)
        np.testing.assert_allclose(align.similarity_transform(written), expected[:2], atol=2e-3, rtol=1e-3)
        crop = cv2.imread(str(root / "loose_crop" / truth["names"][i]))[:, :, ::-1]
        aligned = align.align(crop, written).astype(float)
        direct = align.align(truth["renders"][i], truth["landmarks"][i]).astype(float)
        errors.append(np.abs(aligned - direct)[24:96, 24:96].mean())     # the face; borders differ by design
    assert max(errors) < 6.0, errors          # JPEG + two bilinear resamplings, on 0..255


def test_landmarks_are_on_the_features(ijb_set):
    """The eye points of a render fall on the eye colour (the generator knows where the features are)."""
    root, truth = ijb_set
    render, points = truth["renders"][0].astype(float), truth["landmarks"][0]
    x, y = np.round(points[0]).astype(int)
    centre = render[y - 1:y + 2, x - 1:x + 2].mean(axis=(0, 1))
    x2, y2 = np.round(points[0] + [0, 25]).astype(int)         # below the eye: skin
    assert np.abs(centre - render[y2, x2]).sum() > 30


# --- metrics against brute force --------------------------------------------------------------------

def brute_roc(labels, scores):
    points = []
    for t in [np.inf, *sorted(set(scores), reverse=True)]:
        accepted = scores >= t
        points.append((np.mean(accepted[labels == 0]), np.mean(accepted[labels == 1])))
    return np.array(points)


@pytest.mark.parametrize("seed", [0, 1])
def test_roc_and_tar_at_far_equal_brute_force(seed):
    rng = np.random.default_rng(seed)
    labels = (rng.random(3000) < 0.3).astype(int)
    scores = np.round(rng.normal(labels * 1.5, 1.0), 2)        # rounded: many ties
    fpr, tpr, thresholds = ijb_metrics.roc_curve(labels, scores, drop_intermediate=False)
    np.testing.assert_allclose(np.stack([fpr, tpr], 1), brute_roc(labels, scores))
    kept_fpr, kept_tpr, kept_thresholds = ijb_metrics.roc_curve(labels, scores)
    kept = np.nonzero(np.isin(thresholds, kept_thresholds))[0]
    assert len(kept) == len(kept_fpr) < len(fpr)
    for i in range(len(fpr)):           # each dropped point is on the line between the kept points around it
        a, b = kept[kept <= i][-1], kept[kept >= i][0]
        cross = (fpr[b] - fpr[a]) * (tpr[i] - tpr[a]) - (tpr[b] - tpr[a]) * (fpr[i] - fpr[a])
        assert abs(cross) < 1e-12
    for far in ijb_metrics.FARS:
        allowed = [t for f, t in brute_roc(labels, scores) if f <= far]
        exact = tar_at_far(scores, labels == 1, far)        # the .bin sets' TAR@FAR: one definition for both
        assert exact.tar == max(allowed) and exact.achieved_far <= far
        nearest = ijb_metrics.tar_at_far_nearest(labels, scores, far)
        distance = np.abs(kept_fpr - far)
        assert nearest[0] == max(t for d, t in zip(distance, kept_tpr) if d == distance.min())


def test_template_features_equal_a_loop():
    rng = np.random.default_rng(2)
    feats = rng.normal(size=(40, 6))
    templates, medias = rng.integers(0, 5, 40), rng.integers(0, 8, 40)
    wanted = np.unique(templates)
    got = ijb_metrics.template_features(feats, templates, medias, wanted)
    for row, t in enumerate(wanted):
        total = sum(np.mean([feats[i] for i in range(40) if templates[i] == t and medias[i] == m], axis=0)
                    for m in set(medias[templates == t]))
        np.testing.assert_allclose(got[row], total / np.linalg.norm(total))


def brute_top_k(similarity, probes, gallery, k):
    """Share of mated probes whose mate is among the k best-scoring gallery entries (ties against the mate)."""
    mated = [i for i in range(len(probes)) if probes[i] in gallery]
    hits = 0
    for i in mated:
        mate = similarity[i][gallery == probes[i]].max()
        hits += sum(similarity[i][j] >= mate for j in range(len(gallery)) if gallery[j] != probes[i]) < k
    return hits / len(mated)


def brute_tpir(similarity, probes, gallery, fpir):
    """(TPIR, threshold): the lowest threshold that at most fpir of the non-mated probes' best scores exceed;
    the share of mated probes whose best match is their mate and above it."""
    non_mated_tops = [similarity[i].max() for i in range(len(probes)) if probes[i] not in gallery]
    for best in sorted(set(non_mated_tops) | {-np.inf}):     # lowest threshold first
        if np.mean([s > best for s in non_mated_tops]) <= fpir:
            break
    mated = [i for i in range(len(probes)) if probes[i] in gallery]
    hits = 0
    for i in mated:
        mate = similarity[i][gallery == probes[i]].max()
        top_is_mate = all(similarity[i][j] < mate for j in range(len(gallery)) if gallery[j] != probes[i])
        hits += top_is_mate and mate > best
    return hits / len(mated), best


def test_cmc_and_tpir_equal_loops():
    rng = np.random.default_rng(4)
    gallery = np.arange(30)
    probes = rng.integers(0, 45, 400)                          # subjects 30.. are not enrolled
    similarity = np.round(rng.normal(size=(400, 30)) + (probes[:, None] == gallery) * 2.0, 1)
    cmc = ijb_metrics.cmc(similarity, probes, gallery, ranks=(1, 5, 10))
    for k in (1, 5, 10):
        assert cmc[k] == brute_top_k(similarity, probes, gallery, k)
    for fpir in (0.01, 0.1, 0.3):
        tpir, achieved, threshold = ijb_metrics.tpir_at_fpir(similarity, probes, gallery, fpir)
        assert (tpir, threshold) == brute_tpir(similarity, probes, gallery, fpir) and achieved <= fpir


def their_evaluation_1N(similarity, query_ids, reg_ids, fars):
    """InsightFace's recognition/_evaluation_/ijb/ijb_evals.py evaluation_1N (at 7fadd420), its loop and
    threshold as written there, on a similarity matrix instead of the features it multiplies."""
    top_1_count, top_5_count, top_10_count = 0, 0, 0
    pos_sims, neg_sims, non_gallery_sims = [], [], []
    for index, query_id in enumerate(query_ids):
        if query_id in reg_ids:
            gallery_label = np.argwhere(reg_ids == query_id)[0, 0]
            index_sorted = np.argsort(similarity[index])[::-1]
            top_1_count += gallery_label in index_sorted[:1]
            top_5_count += gallery_label in index_sorted[:5]
            top_10_count += gallery_label in index_sorted[:10]
            pos_sims.append(similarity[index][reg_ids == query_id][0])
            neg_sims.append(similarity[index][reg_ids != query_id])
        else:
            non_gallery_sims.append(similarity[index])
    pos_sims, neg_sims, non_gallery_sims = np.array(pos_sims), np.array(neg_sims), np.array(non_gallery_sims)
    correct_pos_cond = pos_sims > neg_sims.max(1)
    non_gallery_sims_sorted = np.sort(non_gallery_sims.max(1))[::-1]
    recalls = []
    for far in fars:
        thresh = non_gallery_sims_sorted[max(int((non_gallery_sims_sorted.shape[0]) * far) - 1, 0)]
        recalls.append(np.logical_and(correct_pos_cond, pos_sims > thresh).sum() / pos_sims.shape[0])
    return top_1_count, top_5_count, top_10_count, recalls


def test_insightfaces_1n_figures_are_reproduced_and_printed_beside_ours(ijb_set, tmp_path, capsys):
    """Galleries of 40 and 25 subjects, every probe mated in one of them (IJB-C's mixed protocol): the counts
    and TPIRs equal ijb_evals' loop; its mean top-1 is pooled (hits of both over all probes), ours the mean of
    the galleries' rates, and the two differ because the galleries differ in size."""
    rng = np.random.default_rng(5)
    g1, g2 = np.arange(40), np.arange(40, 65)
    probes = rng.integers(0, 65, 900)
    report = {}
    for name, gallery in (("G1", g1), ("G2", g2)):
        similarity = rng.normal(size=(900, len(gallery))) + (probes[:, None] == gallery) * 1.6
        theirs = ijb_metrics.identification_as_ijb_evals(similarity, probes, gallery, fpirs=(0.01, 0.1))
        counts = their_evaluation_1N(similarity, probes, gallery, (0.01, 0.1))
        assert [theirs["hits"][k] for k in (1, 5, 10)] == list(counts[:3])
        assert [theirs["fpir"][f] for f in ("0.01", "0.1")] == [float(r) for r in counts[3]]
        report[name] = (theirs, ijb_metrics.cmc(similarity, probes, gallery)[1])
    pooled = (report["G1"][0]["hits"][1] + report["G2"][0]["hits"][1]) / len(probes)
    mean_of_rates = (report["G1"][1] + report["G2"][1]) / 2
    assert abs(pooled - mean_of_rates) > 1e-4
    # the command prints both
    root, _ = ijb_set
    code, found = run(root, colour_grid_model(tmp_path / "grid"), tmp_path / "out")
    assert code == 0
    printed = capsys.readouterr().out
    mean = found["identification"]["mean"]
    assert f"mean: top-1 {mean['top1']:.4f}" in printed
    assert f"(as InsightFace's ijb_evals prints, pooled over all probes: top-1 {mean['insightface']['top1']:.4f}" \
        in printed


# --- the command ---------------------------------------------------------------------------------------

def test_an_informative_model_beats_a_collapsed_one(ijb_set, tmp_path, capsys):
    """(c) the command end to end: figures move with the information in the embedding.

    No trained network fits in this test's time; the informative model is a
    fixed colour-grid reader, the baseline the same network giving every face
    one embedding. Both are MXNet checkpoints loaded as any model is.
    """
    root, _ = ijb_set
    code, good = run(root, colour_grid_model(tmp_path / "grid"), tmp_path / "good")
    assert code == 0
    printed = capsys.readouterr().out
    assert "[flip-sum, detector-score weighted] TAR@FAR=0.01" in printed and "1:N [flip-sum" in printed
    code, bad = run(root, colour_grid_model(tmp_path / "flat", informative=False), tmp_path / "bad")
    assert code == 0
    for far in ("0.01", "0.1"):
        assert good["verification"]["far"][far]["tar"] > bad["verification"]["far"][far]["tar"] + 0.3
    assert good["identification"]["mean"]["top1"] > 0.5 > bad["identification"]["mean"]["top1"]
    assert good["identification"]["mean"]["fpir"]["0.1"]["tpir"] > bad["identification"]["mean"]["fpir"]["0.1"]["tpir"]
    for name in ("ijb-ijbc-roc.png", "ijb-ijbc-cmc.png"):
        assert os.path.getsize(tmp_path / "good" / name) > 1000
    print(json.dumps({"weighted": good["verification"], "identification": good["identification"]}, indent=1))


def grid_features(face):
    """What colour_grid_model computes, in float64: 16x16 block means of the centred face, C x 7 x 7 order."""
    blocks = (face.astype(np.float64) - 127.5).reshape(7, 16, 7, 16, 3).mean(axis=(1, 3))
    return blocks.transpose(2, 0, 1).ravel()


def lines_of(path):
    return [line.split() for line in open(path).read().splitlines() if line.strip()]


def brute_force_report(root, prefix, weighted):
    """The IJB protocol written out by hand from the meta files: {far: TAR} and {gallery: (top-k, TPIR)}."""
    meta = root / "meta"
    landmarks = {row[0]: (np.array(row[1:11], float).reshape(5, 2), float(row[11]))
                 for row in lines_of(meta / f"{prefix}_name_5pts_score.txt")}
    media_features = {}
    for name, template, media in lines_of(meta / f"{prefix}_face_tid_mid.txt"):
        points, score = landmarks[name]
        face = align.align(cv2.imread(str(root / "loose_crop" / name))[:, :, ::-1], points)
        feature = (grid_features(face) + grid_features(face[:, ::-1])) * (score if weighted else 1.0)
        media_features.setdefault(int(template), {}).setdefault(int(media), []).append(feature)
    template_feature = {}
    for template, medias in media_features.items():
        total = sum(np.mean(features, axis=0) for features in medias.values())
        template_feature[template] = total / np.linalg.norm(total)
    pairs = [tuple(map(int, row)) for row in lines_of(meta / f"{prefix}_template_pair_label.txt")]
    labels = np.array([label for _, _, label in pairs])
    scores = np.array([template_feature[a] @ template_feature[b] for a, b, _ in pairs])
    roc = brute_roc(labels, scores)
    tars = {far: max(tar for f, tar in roc if f <= far) for far in ijb_metrics.FARS}

    def enrolled(csv):
        rows = {int(r.split(",")[0]): int(r.split(",")[1]) for r in open(csv).read().splitlines()[1:] if r}
        return list(rows), np.array(list(rows.values()))

    probe_templates, probe_subjects = enrolled(meta / f"{prefix}_1N_probe_mixed.csv")
    one_to_n = {}
    for gallery in ("G1", "G2") if prefix == "ijbc" else ("S1", "S2"):
        gallery_templates, gallery_subjects = enrolled(meta / f"{prefix}_1N_gallery_{gallery}.csv")
        similarity = np.array([[template_feature[p] @ template_feature[g] for g in gallery_templates]
                               for p in probe_templates])
        one_to_n[gallery] = ({k: brute_top_k(similarity, probe_subjects, gallery_subjects, k) for k in (1, 5, 10)},
                             {f: brute_tpir(similarity, probe_subjects, gallery_subjects, f)[0] for f in (0.01, 0.1)})
    return tars, one_to_n


@pytest.mark.parametrize("target, weighting", [("IJBC", []), ("IJBB", ["--no-score-weight"])])
def test_the_commands_figures_equal_a_count_by_hand(ijb_set, tmp_path, target, weighting):
    """The command end to end on a generated set (IJB-C layout weighted by detector score, IJB-B unweighted):
    every TAR@FAR and 1:N figure equals the protocol computed by hand from the meta files and images."""
    if target == "IJBC":
        root = ijb_set[0]
    else:
        root = tmp_path / "IJBB"
        write_ijb(str(root), "IJBB", subjects=12, templates_per_subject=3, seed=1)
    prefix = target.lower()
    code = ijb.main([colour_grid_model(tmp_path / "grid"), "--root", str(root), "--target", target,
                     "--output", str(tmp_path / "out"), "--batch-size", "32", *weighting])
    assert code == 0
    report = json.load(open(tmp_path / "out" / f"ijb-{prefix}.json"))
    assert report["mode"] == "flip-sum, " + ("unweighted" if weighting else "detector-score weighted")
    tars, one_to_n = brute_force_report(root, prefix, weighted=not weighting)
    for far, tar in tars.items():
        assert report["verification"]["far"][f"{far:g}"]["tar"] == pytest.approx(tar, abs=1e-12), far
    assert set(report["identification"]) == {*one_to_n, "mean"}
    for gallery, (tops, tpirs) in one_to_n.items():
        got = report["identification"][gallery]
        assert [got[f"top{k}"] for k in (1, 5, 10)] == pytest.approx([tops[k] for k in (1, 5, 10)], abs=1e-12)
        assert [got["fpir"][f"{f:g}"]["tpir"] for f in (0.01, 0.1)] == pytest.approx([tpirs[0.01], tpirs[0.1]],
                                                                                      abs=1e-12)


# --- bad input ---------------------------------------------------------------------------------------------

@pytest.fixture
def broken(ijb_set, tmp_path):
    root, _ = ijb_set
    copy = tmp_path / "IJBC"
    shutil.copytree(root, copy)
    return copy


def edit_line(path, number, new):
    lines = open(path).read().split("\n")
    lines[number - 1] = new(lines[number - 1])
    open(path, "w").write("\n".join(lines))


def failure(broken, tmp_path, capsys):
    code, _ = run(broken, colour_grid_model(tmp_path / "grid"), tmp_path / "out")
    assert code == 1
    return capsys.readouterr().err


def test_missing_meta_file(broken, tmp_path, capsys):
    os.remove(broken / "meta" / "ijbc_template_pair_label.txt")
    assert "ijbc_template_pair_label.txt: cannot be read" in failure(broken, tmp_path, capsys)


def test_image_listed_but_absent(broken, tmp_path, capsys):
    os.remove(broken / "loose_crop" / "7.jpg")
    err = failure(broken, tmp_path, capsys)
    assert "loose_crop/7.jpg (listed at " in err and "ijbc_name_5pts_score.txt:7): no such file" in err
    assert "IJB images" not in err          # found while reading the lists, before any image is embedded


def test_malformed_line(broken, tmp_path, capsys):
    edit_line(broken / "meta" / "ijbc_face_tid_mid.txt", 5, lambda line: line + " extra")
    assert "ijbc_face_tid_mid.txt:5: expected 3 fields" in failure(broken, tmp_path, capsys)
    edit_line(broken / "meta" / "ijbc_face_tid_mid.txt", 5, lambda line: line.rsplit(" ", 1)[0])
    edit_line(broken / "meta" / "ijbc_template_pair_label.txt", 3, lambda line: line.replace(" 1", " x"))
    assert "ijbc_template_pair_label.txt:3:" in failure(broken, tmp_path, capsys)


def test_degenerate_landmarks_name_file_and_line(broken, tmp_path, capsys):
    path = broken / "meta" / "ijbc_name_5pts_score.txt"
    edit_line(path, 9, lambda line: " ".join([line.split()[0]] + ["50"] * 10 + [line.split()[-1]]))
    assert "ijbc_name_5pts_score.txt:9: 9.jpg: the five landmarks coincide" in failure(broken, tmp_path, capsys)


@pytest.mark.parametrize("score", ["nan", "-0.5", "inf"])
def test_a_detector_score_that_is_not_a_weight_names_file_and_line(broken, tmp_path, capsys, score):
    """A NaN score used to turn TAR@FAR=1e-4 from 0.45 to 0.00 (all NaN: a top-1 of 1.0000, NaN in the JSON),
    exit 0; the score weights the image's feature, so it must be a finite number of at least 0."""
    path = broken / "meta" / "ijbc_name_5pts_score.txt"
    edit_line(path, 4, lambda line: " ".join(line.split()[:-1] + [score]))
    assert (f"ijbc_name_5pts_score.txt:4: 4.jpg: detector score {score}: expected a finite number of at least 0"
            in failure(broken, tmp_path, capsys))


# --- during training -------------------------------------------------------------------------------

def test_training_verifies_an_ijb_set_every_verbose_steps(ijb_set, tmp_path):
    """--ijb_targets: rank 0 logs the set's headline figures with each verification and in the metrics,
    and the final report of the exported model includes the set's whole report."""
    root, _ = ijb_set
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "mxnet_pfc.train", "--dataset", "speed-1m", "--network", "r18-lite",
                           "--num_classes", "100", "--batch_size", "4", "--max_update", "2", "--verbose", "1",
                           "--ijb_targets", f"{root}:IJBC", "--output", str(out)],
                          cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "IJB set IJBC" in proc.stdout and "step 1: IJB IJBC [flip-sum, detector-score weighted]: " \
        "tar_at_far_0.0001 " in proc.stdout
    records = [json.loads(line) for line in open(out / "metrics.jsonl")]
    assert [r["step"] for r in records if "ijb/ijbc/tar_at_far_0.0001" in r] == [1, 2]
    final = json.load(open(out / "model-verification.json"))
    assert final["ijb-ijbc"]["verification"]["pairs"] > 0 and "identification" in final["ijb-ijbc"]


def test_training_refuses_a_missing_ijb_set_at_setup(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mxnet_pfc.train", "--dataset", "speed-1m", "--network", "r18-lite",
                           "--num_classes", "100", "--max_update", "2", "--ijb_targets", str(tmp_path / "nowhere"),
                           "--output", str(tmp_path / "run")],
                          cwd=REPO, env=rank_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "nowhere" in proc.stderr and "ijbc_face_tid_mid.txt" in proc.stderr, \
        proc.stderr[-2000:]


def test_the_reported_threshold_accepts_exactly_the_counted_pairs():
    """The JSON's 1:1 threshold is a ROC threshold, as InsightFace's: accepting score >= it gives the TAR and
    FAR reported beside it (ties and a target below one different pair included)."""
    rng = np.random.default_rng(5)
    features = rng.normal(size=(60, 8)).round(1)          # rounded: many tied scores
    features /= np.linalg.norm(features, axis=1, keepdims=True)
    templates = np.arange(60)
    first, second = rng.integers(0, 60, 400), rng.integers(0, 60, 400)
    labels = (rng.random(400) < 0.3).astype(int)
    report, _ = ijb_report.verification_report(features, templates, (first, second, labels))
    scores = np.sum(features[first] * features[second], axis=1)
    for far, row in report["far"].items():
        accepted = scores >= row["threshold"]
        assert np.mean(accepted[labels == 1]) == row["tar"], far
        assert np.mean(accepted[labels == 0]) == row["achieved_far"], far
