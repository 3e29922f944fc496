"""Dedicated endpoints: lifecycle, controller, model resolution, W&B artifacts."""
