"""Names of the dummy model presets, for command lines (no torch import, unlike
:mod:`zerolayer.checkpoints.dummy`, whose ``PRESETS`` they name)."""

PRESET_NAMES = ("tiny", "small", "medium", "1b")
