"""Fused packs: K same-shape models trained as one set of kernels (fused.py: the mechanism and
its registry; optim.py: the pack's AdamW; train.py: fit_pack)."""
