"""The spot check: a build's llama-server started on tiny models, its chat answer, the compute
fingerprint against the CPU reference, the evidence that a GPU build computes on its device, and
the proofs kept beside the build.

It checks what the build made and never touches the queue (an import-linter contract).
"""
