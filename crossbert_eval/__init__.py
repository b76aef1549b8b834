"""Frozen evaluation of text encoders: layer-wise features, linear / kNN probes, MTEB, sweeps, plots."""
