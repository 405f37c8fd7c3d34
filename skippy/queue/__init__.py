"""The patch queue and the workdir it is applied to: the queue's model and validation, the upstream
pin and the source archives that stand in for it offline, prepare as small steps (checkout, apply,
recover), status, triage and the workdir's guards.

It never builds and never runs the spot check (an import-linter contract).
"""
