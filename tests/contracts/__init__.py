"""Contract suites: one suite of behaviour per seam, run over every implementation of that seam."""
