"""The twin: the simulator configured as this study's box, calibrated on what the box measured.

It answers "what would this config do here?" in a fraction of a second, so the tuner searches it over
the whole space and spends engine runs only on the candidates it ranks best (twin-first search),
recalibrating after each. Modules: what the twin simulates (box.py), the box parameters it fits and
their priors (params.py), the fit (calibrate.py), the search over it (search.py), and the tuner's use
of it (guide.py).
"""

# Twin-first is the default of `tune` and of the daemon's re-tune (docs/twin.md says on what evidence);
# `Tuner` itself defaults to the sampler's search, which the benchmarks compare it with.
TWIN_FIRST = True
