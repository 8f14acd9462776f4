"""The catalog of model and GPU descriptions: presets, and the files that describe others (a model's
`config.json`, a GPU's YAML), read and validated at the boundary.

Separate from the simulator so that the scenario validates `engine.model` and `engine.sim.gpu`
without importing it; the simulator, the tuner's memory model and the preflight read them from here.
Imports only the base layer (errors, filelines).
"""
