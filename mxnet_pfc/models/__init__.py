"""Trained models outside training: inference (loading one: an exported prefix, or a checkpoint's
backbone, which the trainer's resume reads here too), formats (writing one for MXNet and as ONNX),
export_target (where an export goes, and which verification figures go with it) and onnx_rules (the
checks an evaluation server makes of an ONNX export, as insightface's MFR server does).
"""
