"""Collectives on real torch.distributed ranks: a launcher, hand-written all-reduce algorithms."""
