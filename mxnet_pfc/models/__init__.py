"""Trained models outside training: loading one for inference (an exported prefix, or a
checkpoint's backbone: the trainer's resume reads it here too), exporting it
(MXNet, ONNX) and checking an ONNX export as insightface's MFR server does.
"""
