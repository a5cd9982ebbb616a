"""Fused packs: K same-shape models trained as one set of kernels (fused.py: the mechanism and
its registry; optim.py: the pack's AdamW; pack_run.py: its step; rows.py: under the epoch loop; train.py: fit_pack)."""
