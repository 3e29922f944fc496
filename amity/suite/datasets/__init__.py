"""Datasets (`/beta/dataset...`): datasets, splits, samples and versions."""
