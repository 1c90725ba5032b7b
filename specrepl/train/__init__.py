"""Training draft heads: `distill`'s data (answers the target writes, its
features) and the training loop, checkpoints included.
"""
