"""The pooling checkpoints of tests/models/conftest.py (tiny random encoders and
decoder classifiers, the real all-MiniLM-L6-v2), for the engine and server tests here."""

from tests.models.conftest import minilm_dir, pooling_checkpoint, wordpiece_dir  # noqa: F401
