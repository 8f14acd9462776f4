"""Terminal views shared by the commands (the study's live view is autotuner.tuner.progress)."""
