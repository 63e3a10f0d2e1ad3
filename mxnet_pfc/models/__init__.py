"""Trained models outside training: loading one for inference, exporting it
(MXNet, ONNX) and checking an ONNX export as insightface's MFR server does.
"""
