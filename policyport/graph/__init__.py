"""The model as a graph: policyport's graph of nodes and tensors (:mod:`.model`), the ONNX
operator schemas it checks nodes against (:mod:`.schemas`), the two files that hold it (an ONNX
model, :mod:`.onnx_files`; a packed folder, :mod:`.folder`) and the passes over it
(:mod:`.passes`: shape inference, exposing intermediate tensors, weights by source name)."""
