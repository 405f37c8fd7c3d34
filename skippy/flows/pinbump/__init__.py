"""Moving the pin: ``invoke bisect``, ``invoke summary``, ``invoke pin-bump``.

``bisect`` (:mod:`.bisect`) finds the newest upstream commit between the pin and a target on
which the whole queue still applies, and for each patch that fails at the target the first
upstream commit that breaks it.  ``summary`` (:mod:`.sides`) is the pull-request Markdown of
an upstream move.  ``pin-bump`` (:mod:`.bump`) looks for patches the target already carries,
prepares the target, builds and spot-checks it, runs the parity audit, writes the new pin
(:mod:`.pinfile`) and the numerics reference (:mod:`.numerics`), and reports
(:mod:`.report`); why it stops before writing is :mod:`.refusals`.
"""
