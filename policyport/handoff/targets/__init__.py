"""Targets: a policy policyport reads, handed on to another framework as trainable layers.

:mod:`.plan` recovers the layer plan of any ONNX model (dense layers under their source names, the
observation normaliser, the head); each target writes it in its framework and checks the written
model, run by that framework, against the numpy backend before anything is written:
:func:`~.to_torch.to_torch` (a generated ``nn.Module``), :func:`~.to_keras.to_keras` (a Keras 3
functional model) and :func:`~.to_sb3.to_sb3` (a Stable-Baselines3 zip).
"""
