"""The source kinds the converter reads: each turns a file into the layers and names that
:mod:`policyport.converter.build` writes as ONNX."""
