"""Evaluation: verification on InsightFace .bin pair sets, IJB-B / IJB-C (data,
alignment, metrics, plots), and the evaluation the trainer runs between steps.
"""
