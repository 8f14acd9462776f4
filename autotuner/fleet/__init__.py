"""A fleet on one database: daemons on several boxes share one storage (PostgreSQL; SQLite on one
machine). Boxes with the same fingerprint form a group; one of them tunes for the group, decided by a row
claimed in a transaction (lease.py); the others adopt its winner one at a time, a canary first
(rollout.py). membership.py is each box's row, status.py what `autotuner fleet status` prints, and
coordinator.py the few calls the daemon makes."""
