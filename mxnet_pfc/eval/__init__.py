"""Evaluation: verification (pairs of .bin sets, read by bin_file without unpickling), IJB-B / IJB-C
(ijb_data reads a set, align crops its faces, ijb_set embeds and scores, ijb_metrics and plots report),
embedding (face image files embedded as verification does: the embed command's library), and
during_training (what the trainer evaluates between steps).
"""
