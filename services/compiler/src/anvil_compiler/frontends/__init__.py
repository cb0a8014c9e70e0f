"""Model frontends: ONNX files and Hugging Face BERT-family checkpoints, both to `ir.Graph`."""
