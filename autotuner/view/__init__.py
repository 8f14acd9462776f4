"""Every terminal view, in one package above the parts they show: a measured trial (trial), the live
view of a running study (live), the replay's request bar (requests) and `autotuner status` (status).
Nothing below the command line imports this package: the tuner and the replay feed these views
through their event callbacks."""
