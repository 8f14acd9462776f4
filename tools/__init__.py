"""Scripts and checks run from the repository's root, outside the installed ``autotuner`` package
(``python -m tools.gpu_check``); a regular package so that no other ``tools`` on sys.path shadows it."""
