"""The project's own tooling, not shipped in the wheel: the docs generator, what the GitHub workflows
call besides nox and invoke, and the test-bed the tests and the bench build on.

It imports the product (``skippy``); the product never imports it (an import-linter contract in
pyproject.toml).
"""
