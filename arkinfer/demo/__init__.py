"""The embedded demo model: weights, config and tokenizer files (see arkinfer.frontend.demo).

The tokenizer files are written by examples/demo_model/train_tokenizer.py, the weights by
examples/demo_model/train_demo_model.py.
"""
