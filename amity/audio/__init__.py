"""Audio in: decoding any common container to 16 kHz mono, Whisper's log-mel
features, and the windows (chunks) a recording is transcribed in."""
