"""Verification on InsightFace .bin pair sets."""
